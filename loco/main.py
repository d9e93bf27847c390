"""Entry point: python -m loco.main --config=experiments/tiny_gasloc.py --workdir=runs/x."""

import os
import sys

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
  if _DISTRIBUTED.value:   # before anything touches a JAX backend
    _initialize_distributed()
  from loco import train
  from loco.errors import LocoError
  path = config_flags.get_config_filename(flags.FLAGS['config']).split(':')[0]
  if not os.path.isfile(path):
    print(f'loco: error: the config file {path} does not exist.', file=sys.stderr)
    sys.exit(2)
  try:
    config = _CONFIG.value
    config.keys()   # the config file is loaded lazily; make it fail here
  except OSError as e:
    print(f'loco: error: {str(e).splitlines()[0]} ({path}).', file=sys.stderr)
    sys.exit(2)
  workdir = _WORKDIR.value or f'runs/{_config_name()}'
  try:
    record = train.run(config, workdir)
  except LocoError as e:
    print(f'loco: error: {e}', file=sys.stderr)
    sys.exit(1)
  train.print_summary(config, workdir, record)


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
  """Parses flags; a bad flag or config override is one line on stderr, exit code 2."""
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # config_flags raises KeyError/TypeError/ValueError for overrides
    message = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # A config file that raised: keep its own exception line, not the traceback.
    message = lines[-1] if 'Traceback' in message else ' '.join(lines)
    if isinstance(e, KeyError):
      message = f'unknown config key {message}'
    print(f'loco: error: {message}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main, flags_parser=_parse_flags)
