"""The command line of `python -m loco.main`: its flags and the config they load.

`--config=FILE[:VARIANT]` with `--config.KEY=VALUE` overrides is loaded by
`loco.configs` (once, in `parse`), so that a missing or broken file, an unknown key
(with the nearest valid ones) or a malformed value reads as one sentence; absl parses
the other flags. A bad flag is one line on stderr and exit code 2.
"""

import os
import sys

from absl import flags
from ml_collections import config_dict

from loco import configs
from loco.errors import ConfigError

CONFIG = flags.DEFINE_string(
    'config', None, 'Experiment config file (experiments/*.py, or FILE.py:VARIANT); '
    'override any key with --config.KEY=VALUE.')
WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory; re-running in the same one resumes the run.')
DISTRIBUTED = flags.DEFINE_bool(
    'distributed', False, 'Call jax.distributed.initialize() first: one process per '
    'host of a TPU pod slice or a SLURM job (launch/MULTIHOST.md).')
COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'With --distributed: host:port of process 0 '
    '(default: auto-detected on TPU VMs and SLURM).')
NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'With --distributed: the number of processes (default: auto).')
PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, 'With --distributed: this process\'s index (default: auto).')

_LOADED = {}   # 'config': the ConfigDict that `parse` loaded


def config() -> config_dict.ConfigDict:
  """The ConfigDict of --config and its overrides (after `parse`)."""
  return _LOADED['config']


def config_name() -> str:
  """The config file's name without its folder, extension and variant."""
  return os.path.splitext(os.path.basename(CONFIG.value.split(':')[0]))[0]


def distributed() -> dict | None:
  """jax.distributed.initialize's arguments given by flags (None without --distributed)."""
  if not DISTRIBUTED.value:
    return None
  given = dict(coordinator_address=COORDINATOR.value, num_processes=NUM_PROCESSES.value,
               process_id=PROCESS_ID.value)
  return {k: v for k, v in given.items() if v is not None}


def parse(argv):
  """absl's flags parser for `app.run`: loads the config, then parses the other flags."""
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
