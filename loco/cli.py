"""The error boundary every command shares: one line, a non-zero exit, no traceback.

Each command's `main(argv)` parses its flags with `Parser` and returns
`cli.run(PROG, body)`, where `body()` does the work and returns an exit code. What a user
can cause ends in one line on stderr:

  PROG: error: MESSAGE      exit 1 (a LocoError, an OSError such as a read-only or full
                            disk, a file where a directory is expected)
  PROG: error: MESSAGE      exit 2 (bad arguments, from `Parser`, or a UsageError)
  PROG: stopped: ...        exit 130 (Ctrl-C, SIGTERM)

A bug (any other exception) still shows its traceback: it is not the user's to fix.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import signal
import sys
from typing import Callable, NoReturn, Sequence

from loco.errors import LocoError


class Parser(argparse.ArgumentParser):
  """argparse whose errors are one line (`PROG: error: ...`, exit 2), not usage + error.

  A prog of 'python -m loco.x' (what the usage line shows) is named 'loco.x' in the
  error, as the command's other errors are.
  """

  def error(self, message: str) -> NoReturn:
    print(f'{self.prog.removeprefix("python -m ")}: error: {message} (see --help)',
          file=sys.stderr)
    sys.exit(2)


def config_overrides(argv: Sequence[str], prog: str) -> tuple[list[str], list[str]]:
  """Splits loco.main's override form, `--config.KEY=VALUE`, out of a command's `argv`:
  returns (['KEY=VALUE', ...], the other arguments). Every command that takes settings
  takes them this way; a `--config.KEY` without `=VALUE` is a usage error (one line)."""
  overrides, rest = [], []
  for arg in argv:
    if arg.startswith('--config.'):
      key, eq, value = arg.removeprefix('--config.').partition('=')
      if not eq or not key:
        print(f'{prog}: error: {arg} takes a value: --config.KEY=VALUE (see --help)',
              file=sys.stderr)
        sys.exit(2)
      overrides.append(f'{key}={value}')
    else:
      rest.append(arg)
  return overrides, rest


def positive_int(text: str) -> int:
  """An argparse type: a whole number >= 1."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not a whole number') from None
  if value < 1:
    raise argparse.ArgumentTypeError(f'{text!r} must be at least 1')
  return value


def finite_float(text: str) -> float:
  """An argparse type: a finite number (not nan or inf)."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not a number') from None
  if not math.isfinite(value):
    raise argparse.ArgumentTypeError(f'{text!r} must be a finite number')
  return value


def non_negative_float(text: str) -> float:
  """An argparse type: a finite number >= 0."""
  value = finite_float(text)
  if value < 0:
    raise argparse.ArgumentTypeError(f'{text!r} must be >= 0')
  return value


def positive_float(text: str) -> float:
  """An argparse type: a finite number > 0."""
  value = finite_float(text)
  if value <= 0:
    raise argparse.ArgumentTypeError(f'{text!r} must be positive')
  return value


def describe_os_error(e: OSError) -> str:
  """An OSError as one sentence naming the file: 'cannot write runs/x/a.json: No space
  left on device'."""
  what = e.strerror or str(e) or type(e).__name__
  if e.errno == errno.ENOSPC:
    what = 'the disk is full'
  elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
    what = f'{what} (read-only or not writable)'
  name = e.filename if e.filename is not None else ''
  return f'{name}: {what}' if name else what


def _terminate(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


def run(prog: str, body: Callable[[], int | None]) -> int:
  """Runs `body()` inside the boundary; returns the process's exit code."""
  previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    signal.signal(signal.SIGTERM, _terminate)   # a scheduler's stop reads like Ctrl-C
    # A process started in the background of a script inherits SIGINT ignored, and
    # Python then never raises KeyboardInterrupt: Ctrl-C must stop every command.
    signal.signal(signal.SIGINT, signal.default_int_handler)
  except ValueError:   # not the main thread: leave the signals alone
    previous = {}
  try:
    return int(body() or 0)
  except KeyboardInterrupt:
    print(f'{prog}: stopped: interrupted; what was finished before is kept, and the same '
          'command starts again from there.', file=sys.stderr)
    return 130
  except LocoError as e:
    print(f'{prog}: error: {e}', file=sys.stderr)
    return getattr(e, 'exit_code', 1)
  except OSError as e:
    print(f'{prog}: error: {describe_os_error(e)}', file=sys.stderr)
    return 1
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    sys.stdout.flush()


def exit(code: int) -> NoReturn:   # pylint: disable=redefined-builtin
  """The one way every command's `__main__` ends: flush, then leave at once. Everything
  durable is on disk when a command's `main` returns (files written through
  `workdir.write_json` or closed, checkpoints committed); skipping interpreter shutdown
  avoids tearing down JAX's, orbax's and grain's threads, which can crash (exit 139) or
  hang after an interrupt."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):    # a closed pipe or stream: nothing more to say
      pass
  os._exit(code)


def check_output_dir(path: str, what: str = '--out') -> None:
  """Raises LocoError unless `path` is (or can be made) a writable directory."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise LocoError(f'{what} {path} is a file, not a directory.')
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise LocoError(f'{what} {path} cannot be created: {describe_os_error(e)}.') from None
  if not os.access(path, os.W_OK):
    raise LocoError(f'{what} {path} is not writable (read-only?).')

