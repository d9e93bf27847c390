"""Entry point: python -m loco.main --config=experiments/tiny_gasloc.py --workdir=runs/x."""

import logging as py_logging
import os
import signal
import sys
import threading
import traceback


def _stopped_while_starting(signum, frame):
  del signum, frame
  os.write(2, b'loco: stopped: interrupted while starting; nothing was written.\n')
  os._exit(130)


# Ctrl-C during the imports and config loading: one line, not a traceback. main()
# hands SIGINT back to Python (a KeyboardInterrupt) once the run can report it.
signal.signal(signal.SIGINT, _stopped_while_starting)

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = flags.DEFINE_string(
    'config', None, 'Experiment config file (experiments/*.py, or FILE.py:VARIANT); '
    'override any key with --config.KEY=VALUE.')
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory; re-running in the same one resumes the run.')
_LOADED = {}   # 'config': the ConfigDict that _parse_flags loaded
_DISTRIBUTED = flags.DEFINE_bool(
    'distributed', False, 'Call jax.distributed.initialize() first: one process per '
    'host of a TPU pod slice or a SLURM job (launch/MULTIHOST.md).')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'With --distributed: host:port of process 0 '
    '(default: auto-detected on TPU VMs and SLURM).')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'With --distributed: the number of processes (default: auto).')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, 'With --distributed: this process\'s index (default: auto).')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # orbax and tfds are chatty at INFO
  from loco import configs
  from loco.errors import Interrupted, LocoError
  config = _LOADED['config']   # _parse_flags loaded the file and its overrides
  try:
    configs.validate(config)   # keys, types and ranges, before any process waits
  except LocoError as e:
    print(f'loco: error: {e}', file=sys.stderr)
    sys.exit(1)
  if _DISTRIBUTED.value:   # before anything touches a JAX backend
    _initialize_distributed()
  from loco import train
  train.enable_compilation_cache()
  if _WORKDIR.value is not None and not _WORKDIR.value.strip():
    _exit('loco: error: --workdir is empty; name a directory, or leave the flag out for '
          f'runs/{_config_name()}.', 2)
  workdir = _WORKDIR.value or f'runs/{_config_name()}'
  # SIGTERM (a scheduler, loco.sweep stopping) stops the run like Ctrl-C. The flag
  # stops the loop at the next chunk even where a library swallows the KeyboardInterrupt.
  def interrupt(signum, frame):
    del signum, frame
    train.STOP.set()
    raise KeyboardInterrupt

  signal.signal(signal.SIGTERM, interrupt)
  signal.signal(signal.SIGINT, interrupt)
  _quiet_background_checkpoint_errors()
  try:
    record = train.run(config, workdir)
  except Interrupted as e:
    _exit(f'loco: stopped: {e}', 130)
  except LocoError as e:
    _exit(f'loco: error: {e}', 1)
  train.print_summary(config, workdir, record)


def _exit(line: str, code: int) -> None:
  """Prints `line` and ends the process at once. Everything durable is on disk by now
  (rows synced, the in-flight checkpoint committed or abandoned); skipping interpreter
  shutdown avoids tearing down JAX and orbax threads still inside XLA mid-step, which
  can crash or hang the exit after an interrupt."""
  print(line, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def _quiet_background_checkpoint_errors() -> None:
  """Orbax re-raises a failed background save in the main thread, which loco prints as
  one line; what its worker threads and event loops print and log first is noise."""
  def from_orbax(tb) -> bool:
    return '/orbax/' in ''.join(traceback.format_tb(tb))

  default_hook = threading.excepthook
  threading.excepthook = lambda args: (None if from_orbax(args.exc_traceback)
                                       else default_hook(args))
  default_unraisable = sys.unraisablehook

  def unraisable(args):   # tensorstore callbacks into orbax's closed event loop
    if not (isinstance(args.exc_value, RuntimeError)
            and 'Event loop is closed' in str(args.exc_value)):
      default_unraisable(args)

  sys.unraisablehook = unraisable

  def keep(record) -> bool:
    if record.levelno < py_logging.ERROR:
      return True
    exc = record.exc_info[1] if record.exc_info else None
    return not ('/orbax/' in record.pathname or 'orbax-checkpoint-tmp' in record.getMessage()
                or (exc is not None and from_orbax(exc.__traceback__)))

  logging.get_absl_logger().addFilter(keep)
  py_logging.getLogger('asyncio').addFilter(keep)


def _initialize_distributed() -> None:
  import jax
  given = dict(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
               process_id=_PROCESS_ID.value)
  try:
    jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None})
  except Exception as e:  # jax raises ValueError / RuntimeError / XlaRuntimeError
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    _exit(f'loco: error: --distributed: jax.distributed.initialize() failed ({first}); '
          'outside a TPU VM or a SLURM job give --coordinator_address, --num_processes '
          'and --process_id (launch/MULTIHOST.md).', 1)
  print(f'loco: process {jax.process_index()} of {jax.process_count()}, '
        f'{jax.local_device_count()} local of {jax.device_count()} devices.', flush=True)


def _config_name() -> str:
  return os.path.splitext(os.path.basename(_CONFIG.value.split(':')[0]))[0]


def _parse_flags(argv):
  """Parses flags; a bad flag, config file or override is one line on stderr, exit code 2.

  loco.configs loads the config file with its overrides (once), so that a missing or
  broken file, an unknown key (with the nearest valid ones) or a malformed value reads
  as one sentence; absl parses the other flags.
  """
  from loco import configs
  from loco.errors import ConfigError
  try:
    spec, overrides, rest = configs.split_command_line(argv[1:])
    if spec is not None:
      _LOADED['config'] = configs.load(spec, overrides)
    elif overrides:
      raise ConfigError('--config.KEY=VALUE needs a config file: --config=FILE.')
    return flags.FLAGS([argv[0], *rest] + ([f'--config={spec}'] if spec else []))
  except ConfigError as e:
    print(f'loco: error: {e}', file=sys.stderr)
    sys.exit(2)
  except Exception as e:  # absl's own: an unknown flag, a flag without its value
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    print(f'loco: error: {" ".join(lines) or type(e).__name__}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main, flags_parser=_parse_flags)
