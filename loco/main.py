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


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # orbax and tfds are chatty at INFO
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
