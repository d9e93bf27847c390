"""Entry point: python -m loco.main --config=experiments/tiny_gasloc.py --workdir=runs/x.

Flags in (`loco.run.flags`), `train.run(config, workdir)` out. What a user can cause ends
as one line on stderr and a non-zero exit; Ctrl-C and SIGTERM stop the run at its next
chunk boundary and save a checkpoint there, and the same command resumes it.
"""

import os
import signal
import sys


def _stopped_while_starting(signum, frame):
  del signum, frame
  os.write(2, b'loco: stopped: interrupted while starting; nothing was written.\n')
  os._exit(130)


# Ctrl-C during the imports and config loading: one line, not a traceback. main()
# hands SIGINT back to Python (a KeyboardInterrupt) once the run can report it.
signal.signal(signal.SIGINT, _stopped_while_starting)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags as absl_flags
from absl import logging

from loco import configs
from loco.run import flags
from loco.errors import Interrupted, LocoError
# pylint: enable=g-import-not-at-top,wrong-import-position


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # orbax and tfds are chatty at INFO
  config = flags.config()   # flags.parse loaded the file and its overrides
  try:
    configs.validate(config)   # keys, types and ranges, before any process waits
  except LocoError as e:
    print(f'loco: error: {e}', file=sys.stderr)
    sys.exit(1)
  if flags.distributed() is not None:   # before anything touches a JAX backend
    _initialize_distributed()
  from loco.run import checkpoint, experiment, step, train  # pylint: disable=g-import-not-at-top
  step.enable_compilation_cache()
  if flags.WORKDIR.value is not None and not flags.WORKDIR.value.strip():
    _exit('loco: error: --workdir is empty; name a directory, or leave the flag out for '
          f'runs/{flags.config_name()}.', 2)
  workdir = flags.WORKDIR.value or f'runs/{flags.config_name()}'
  # SIGTERM (a scheduler, loco.sweep stopping) stops the run like Ctrl-C: once it
  # trains, at its next chunk boundary with a checkpoint there; a second signal at once.
  def interrupt(signum, frame):
    del signum, frame
    train.on_signal()

  signal.signal(signal.SIGTERM, interrupt)
  signal.signal(signal.SIGINT, interrupt)
  checkpoint.quiet_background_errors()
  try:
    record = train.run(config, workdir)
  except Interrupted as e:
    _exit(f'loco: stopped: {e}', 130)
  except LocoError as e:
    _exit(f'loco: error: {e}', 1)
  experiment.print_summary(config, workdir, record)


def _initialize_distributed() -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from loco.run import placement  # pylint: disable=g-import-not-at-top
  try:
    placement.initialize_distributed(**flags.distributed())
  except LocoError as e:
    _exit(f'loco: error: {e}', 1)
  print(f'loco: process {jax.process_index()} of {jax.process_count()}, '
        f'{jax.local_device_count()} local of {jax.device_count()} devices.', flush=True)


def _exit(line: str, code: int) -> None:
  """Prints `line` and ends the process at once. Everything durable is on disk by now
  (rows synced, the in-flight checkpoint committed or abandoned); skipping interpreter
  shutdown avoids tearing down JAX and orbax threads still inside XLA mid-step, which
  can crash or hang the exit after an interrupt."""
  print(line, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def run() -> None:
  """The `loco-train` console script: the same as `python -m loco.main`."""
  absl_flags.mark_flag_as_required('config')
  app.run(main, flags_parser=flags.parse)


if __name__ == '__main__':
  run()
