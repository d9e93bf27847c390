"""Entry point: python -m loco.main --config=experiments/tiny_gasloc.py --workdir=runs/x."""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file (experiments/*.py).', lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory; re-running in the same one resumes the run.')


def main(argv):
  del argv
  from loco import train
  from loco.errors import LocoError
  config = _CONFIG.value
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


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main)
