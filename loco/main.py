"""Entry point: python -m loco.main --config=experiments/tiny_gasloc.py --workdir=runs/x."""

import logging as py_logging
import os
import signal
import sys
import threading
import traceback

from absl import app
from absl import logging
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file (experiments/*.py).', lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory; re-running in the same one resumes the run.')
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
  config = _CONFIG.value   # _parse_flags checked that the file and overrides load
  try:
    configs.validate(config)   # keys, types and ranges, before any process waits
  except LocoError as e:
    print(f'loco: error: {e}', file=sys.stderr)
    sys.exit(1)
  if _DISTRIBUTED.value:   # before anything touches a JAX backend
    _initialize_distributed()
  from loco import train
  workdir = _WORKDIR.value or f'runs/{_config_name()}'
  # SIGTERM (a scheduler, loco.sweep stopping) stops the run like Ctrl-C.
  signal.signal(signal.SIGTERM, _interrupt)
  _quiet_background_checkpoint_errors()
  try:
    record = train.run(config, workdir)
  except Interrupted as e:
    print(f'loco: stopped: {e}', file=sys.stderr)
    sys.exit(130)
  except LocoError as e:
    print(f'loco: error: {e}', file=sys.stderr)
    sys.exit(1)
  train.print_summary(config, workdir, record)


def _quiet_background_checkpoint_errors() -> None:
  """Orbax re-raises a failed background save in the main thread, which loco prints as
  one line; the tracebacks its worker threads print and log first are noise."""
  default = threading.excepthook

  def hook(args):
    if '/orbax/' not in ''.join(traceback.format_tb(args.exc_traceback)):
      default(args)

  threading.excepthook = hook
  default_unraisable = sys.unraisablehook

  def unraisable(args):   # tensorstore callbacks into orbax's closed event loop
    if not (isinstance(args.exc_value, RuntimeError)
            and 'Event loop is closed' in str(args.exc_value)):
      default_unraisable(args)

  sys.unraisablehook = unraisable
  logging.get_absl_logger().addFilter(
      lambda record: not ('/orbax/' in record.pathname and record.levelno >= py_logging.ERROR))


def _interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


def _initialize_distributed() -> None:
  import jax
  given = dict(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
               process_id=_PROCESS_ID.value)
  jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None})
  print(f'loco: process {jax.process_index()} of {jax.process_count()}, '
        f'{jax.local_device_count()} local of {jax.device_count()} devices.', flush=True)


def _config_name() -> str:
  path = config_flags.get_config_filename(flags.FLAGS['config'])
  return os.path.splitext(os.path.basename(path.split(':')[0]))[0]


def _parse_flags(argv):
  """Parses flags; a bad flag, config file or override is one line on stderr, exit code 2.

  loco.configs loads the config file with its overrides first, so that a missing or
  broken file, an unknown key (with the nearest valid ones) or a malformed value reads
  as one sentence; the --config flag then builds the same config.
  """
  from loco import configs   # also gives config_flags a parser for list-valued keys
  from loco.errors import ConfigError
  try:
    spec, overrides = configs.split_argv(argv[1:])
    if spec is not None:
      configs.load(spec, overrides)
    elif overrides:
      raise ConfigError('--config.KEY=VALUE needs a config file: --config=FILE.')
    return flags.FLAGS(argv)
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
