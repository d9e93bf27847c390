"""Re-timing a finished synchronous run on another network, without training again.

  python -m loco.retime runs/x --network.profile=PROFILE [--network.KEY=VALUE ...] [--name=NAME]

replays `network.Clock` over the run's communication log (comms.jsonl, `commlog.replay`)
on the new network (step time: the run's model FLOPs per step, or network.step_seconds)
and writes, beside the run:

  runs/x/retimed/NAME/config.json    the run's, with this `network` section and
                                     `retimed_from`: the run, its network, the overrides
  runs/x/retimed/NAME/metrics.jsonl  the run's rows with sim_seconds, utilization and
                                     idle_seconds of the new network at each row's step

which `loco.report` reads like a run (NAME: the profile unless given). Dropout and churn
decided which work the run did (comms.jsonl records it), so they stay the run's. An
asynchronous run (network.mode='async') cannot be re-timed: who exchanged with whom,
and when, depended on its network.
"""

import json
import os
import re
import sys
from typing import Any, Mapping, Sequence

from loco import commlog
from loco import configs
from loco import network as network_lib
from loco import timeline as timeline_lib
from loco import workdir as workdir_lib
from loco.errors import ConfigError, LocoError, WorkdirError
from loco.metrics import read_metrics, write_jsonl
from loco.report import RETIMED

_NAME = re.compile(r'^[A-Za-z0-9_.,=+-]+$')


def network_section(overrides: Mapping[str, Any]) -> dict[str, Any]:
  """The whole `network` section of `{'network.KEY': value}`, checked as loco.main checks
  a config (a string is read as on the command line, by the key's type)."""
  for key in overrides:
    if not key.startswith('network.'):
      raise ConfigError(f'{key} is not a network key: re-timing sets only network.KEY.')
  from experiments import base
  config = configs.load(base.__file__, overrides)
  configs.validate(config)
  section = config.network.to_dict()
  network_lib.parse_network(section)
  return section


def check_name(name: Any) -> None:
  if not isinstance(name, str) or not _NAME.match(name) or name in ('.', '..'):
    raise ConfigError(f'the re-timing name {name!r} must be letters, digits and _.,=+-.')


def retime(workdir: str, overrides: Mapping[str, Any], name: str | None = None) -> str:
  """Re-times the run in `workdir` on the network of `overrides`; returns the new dir.

  Raises:
    LocoError: no such run, no communication log, an asynchronous run, or a bad
      network key, value or name; one sentence.
  """
  if not os.path.isdir(workdir):
    raise WorkdirError(f'no such workdir: {workdir}')
  stored = workdir_lib.read_json(os.path.join(workdir, workdir_lib.CONFIG))
  if not isinstance(stored, dict) or 'config' not in stored:
    raise WorkdirError(f'{workdir} is not a loco run (no readable config.json).')
  run = stored['config']
  own = run.get('network') or {}
  if own.get('mode') == 'async':
    raise ConfigError(f"the run in {workdir} was simulated asynchronously (network.mode="
                      "'async'): its schedule depended on its network; train it again.")
  section = network_section(overrides)
  if section['mode'] == 'async' or section['local_work'] or section['peer_choice']:
    raise ConfigError('network.mode, local_work and peer_choice belong to the asynchronous '
                      'mode, which cannot be re-timed.')
  for key in ('dropout', 'churn'):      # facts of the run: in comms.jsonl, not the network
    if section[key] is None:
      section[key] = own.get(key)
    elif (section[key] or None) != (own.get(key) or None):
      raise ConfigError(f'network.{key}={section[key]!r} differs from the run\'s '
                        f'{own.get(key)!r}: it decided which work the run did; train again.')
  if name is not None:
    check_name(name)
  if not os.path.isfile(os.path.join(workdir, commlog.FILE)):
    raise WorkdirError(f'{workdir} has no {commlog.FILE} (runs trained before the '
                       'communication log cannot be re-timed).')
  cfg = network_lib.parse_network(section)
  num_workers, log = commlog.read(workdir)
  seconds = network_lib.nominal_step_seconds(
      cfg, stored['model']['flops_per_token'], run['batch_per_worker'] * run['seq_len'])
  net = network_lib.make_network(cfg, num_workers, seconds)
  rows = read_metrics(workdir)
  if not rows:
    raise WorkdirError(f'{workdir} has no metrics rows to re-time yet.')
  steps = {r['step'] for r in rows}
  clocks = {step: timeline_lib.clock_metrics(clock.seconds, clock.now, clock.compute)
            for step, clock in commlog.replay(net, log, max(steps)) if step in steps}
  out = os.path.join(workdir, RETIMED, name or cfg.profile)
  os.makedirs(out, exist_ok=True)
  write_jsonl(os.path.join(out, 'metrics.jsonl'), [{**r, **clocks[r['step']]} for r in rows])
  workdir_lib.write_json(os.path.join(out, workdir_lib.CONFIG), dict(
      stored, config={**run, 'network': section}, retimed_from=dict(
          workdir=os.path.abspath(workdir), network=own, step=max(steps),
          overrides=json.loads(json.dumps(dict(overrides))))))
  return out


def is_current(workdir: str, overrides: Mapping[str, Any], name: str) -> bool:
  """Whether `retime(workdir, overrides, name)` was done on the run's last metrics row."""
  stored = workdir_lib.read_json(os.path.join(workdir, RETIMED, name, workdir_lib.CONFIG))
  source = (stored or {}).get('retimed_from', {})
  rows = read_metrics(workdir) if os.path.isfile(os.path.join(workdir, 'metrics.jsonl')) else []
  return (source.get('overrides') == json.loads(json.dumps(dict(overrides)))
          and bool(rows) and source.get('step') == rows[-1]['step'])


def main(argv: Sequence[str] | None = None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  if not args or args[0] in ('-h', '--help'):
    print(__doc__)
    return 0 if args else 2
  workdirs, name, overrides = [], None, {}
  for arg in args:
    key, eq, value = arg.partition('=')
    if key == '--name' and eq:
      name = value
    elif key.startswith('--network.') and eq:
      overrides[key[2:]] = value
    else:
      workdirs.append(arg)
  try:
    if len(workdirs) != 1 or workdirs[0].startswith('-'):
      raise ConfigError('takes one WORKDIR, --network.KEY=VALUE ... and --name=NAME; got '
                        f'{" ".join(workdirs) or "no WORKDIR"}.')
    if 'network.profile' not in overrides:
      raise ConfigError('--network.profile=PROFILE is required (one of '
                        f'{", ".join(network_lib.PROFILES)}).')
    out = retime(workdirs[0], overrides, name)
  except (LocoError, OSError) as e:
    print(f'loco.retime: error: {e}', file=sys.stderr)
    return 1
  before, after = read_metrics(workdirs[0])[-1], read_metrics(out)[-1]
  print(f'step {after["step"]}: simulated {before.get("sim_seconds") or 0:,.1f} s -> '
        f'{after["sim_seconds"]:,.1f} s, utilization {after["utilization"]:.1%}: {out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
