"""Re-timing a finished synchronous run on another network, without training again.

  python -m loco.retime runs/x --config.network.profile=PROFILE [--config.network.KEY=VALUE ...]
                                [--name=NAME]

(`--network.KEY=VALUE` is an alias of `--config.network.KEY=VALUE`.)

replays `network.Clock` over the run's communication log (comms.jsonl, `commlog.replay`)
on the new network and writes, beside the run:

  runs/x/retimed/NAME/config.json    the run's, with this `network` section and
                                     `retimed_from`: the run, its network, the overrides
  runs/x/retimed/NAME/metrics.jsonl  the run's rows with sim_seconds, utilization and
                                     idle_seconds of the new network at each row's step

which `loco.report` reads like a run. Only the links change unless named: the compute
side of the run's network stays the run's (COMPUTE_KEYS: its step time, whether
network.step_seconds or model FLOPs / (device_flops x mfu), its per-worker speeds and
stragglers, its seed), and the command says which step time it used and where it came
from. Naming network.device_flops or network.mfu times steps by the model's FLOPs (the
run's step_seconds is then not used). (NAME: the profile unless given; PROFILE+OVERLAP
with a network.overlap other than 'none', then ',buckets=K' with network.overlap_buckets
other than 128, then ',link_efficiency=X' with the calibration term of loco.calibrate).
`--config.network.overlap=backward` times each step's collective overlapped with the
step's backward pass, as loco.overlap_model models it (arXiv 2501.18512 section 3.1;
network.overlap in loco/configs/default.py). Dropout
and churn decided which work the run did (comms.jsonl records it), so they stay the
run's. An asynchronous run (network.mode='async') cannot be re-timed: who exchanged
with whom, and when, depended on its network.
"""

import json
import os
import re
import sys
from typing import Any, Mapping, Sequence

from loco import cli
from loco.sim import commlog
from loco import configs
from loco.sim import network as network_lib
from loco.files import runs
from loco.sim import timeline as timeline_lib
from loco import overlap_model
from loco.files import workdir as workdir_lib
from loco.errors import ConfigError, RunFileError, UsageError, WorkdirError
from loco.files.metrics import write_jsonl
from loco.files.runs import RETIMED  # noqa: F401  (kept for callers of loco.lab.retime.RETIMED)

PROG = 'loco.retime'
_NAME = re.compile(r'^[A-Za-z0-9_.,=+-]+$')


# The compute side of a run's network: a re-timing keeps the run's values unless named.
COMPUTE_KEYS = ('step_seconds', 'device_flops', 'mfu', 'speeds', 'straggler_fraction',
                'straggler_factor', 'seed')


def _run_value(own: Mapping[str, Any], key: str) -> Any:
  """The run's value of network.KEY: set, or its profile's default (None: the default)."""
  if own.get(key) is not None:
    return own[key]
  return network_lib.profile_default(own.get('profile'), key)


def keep_compute(section: dict[str, Any], own: Mapping[str, Any],
                 overrides: Mapping[str, Any]) -> dict[str, str]:
  """Puts the run's compute-side values into `section` where `overrides` does not name
  them; returns {key: 'as named' | "the run's"} for the keys whose value is not a
  default.

  The step time is one choice: a named step_seconds; else, with device_flops or mfu
  named, the model's FLOPs (the run's step_seconds dropped, the other of the two the
  run's); else the run's step_seconds, device_flops and mfu together."""
  named = {key.removeprefix('network.') for key in overrides}
  origin = {}
  flops_named = bool(named & {'device_flops', 'mfu'})
  for key in COMPUTE_KEYS:
    if key in named:
      origin[key] = 'as named'
    elif key == 'step_seconds' and flops_named:
      section[key] = None
    elif _run_value(own, key) is not None:
      section[key] = _run_value(own, key)
      origin[key] = "the run's"
  return origin


def network_section(overrides: Mapping[str, Any]) -> dict[str, Any]:
  """The whole `network` section of `{'network.KEY': value}`, checked as loco.main checks
  a config (a string is read as on the command line, by the key's type)."""
  for key in overrides:
    if not key.startswith('network.'):
      raise ConfigError(f'{key} is not a network key: re-timing sets only network.KEY.')
  from loco.configs import default
  config = configs.load(default.__file__, overrides)
  configs.validate(config)
  section = config.network.to_dict()
  network_lib.parse_network(section)
  return section


def check_name(name: Any) -> None:
  if not isinstance(name, str) or not _NAME.match(name) or name in ('.', '..'):
    raise ConfigError(f'the re-timing name {name!r} must be letters, digits and _.,=+-.')


def default_name(cfg: network_lib.NetworkConfig) -> str:
  """A re-timing's directory name when none is given: the profile, and the overlap
  model unless it is 'none' (so re-timings with and without it sit side by side)."""
  name = cfg.profile
  if cfg.clock_overlap != 'none':
    name = f'{cfg.profile}+{cfg.clock_overlap}'
    if cfg.overlap_buckets != overlap_model.BUCKETS:
      name = f'{name},buckets={cfg.overlap_buckets}'
  if cfg.link_efficiency != 1.0:
    name = f'{name},link_efficiency={cfg.link_efficiency:g}'
  return name


def _need(stored: dict[str, Any], path: str, workdir: str) -> Any:
  """stored[path] ('model.flops_per_token'), a positive number, or a RunFileError."""
  value = stored
  for part in path.split('.'):
    value = value.get(part) if isinstance(value, dict) else None
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise RunFileError(f'{os.path.join(workdir, runs.CONFIG)}: {path} is {value!r}, not a '
                       'positive number; the run cannot be re-timed.')
  return value


def retime(workdir: str, overrides: Mapping[str, Any], name: str | None = None) -> str:
  """Re-times the run in `workdir` on the network of `overrides`; returns the new dir.

  Everything is read and checked before anything is written: a damaged config.json or
  metrics.jsonl, or a communication log that is damaged or does not cover the run's
  metrics rows (a replay of part of it would be silently too fast), writes nothing.

  Raises:
    LocoError: no such run, no communication log, an asynchronous run, a damaged run
      file (RunFileError), or a bad network key, value or name; one sentence.
  """
  if not os.path.isdir(workdir):
    raise WorkdirError(f'no such workdir: {workdir}')
  stored = runs.read_config(workdir)
  if stored is None:
    raise WorkdirError(f'{workdir} is not a loco run (no readable config.json).')
  run = stored['config']
  own = run.get('network') or {}
  if own.get('mode') == 'async':
    raise ConfigError(f"the run in {workdir} was simulated asynchronously (network.mode="
                      "'async'): its schedule depended on its network; train it again.")
  section = network_section(overrides)
  if (section['mode'] == 'async' or section['local_work'] or section['peer_choice']
      or section['overlap'] == 'compute'):
    raise ConfigError('network.mode, local_work, peer_choice and overlap=compute belong to '
                      'the asynchronous mode, which cannot be re-timed.')
  for key in ('dropout', 'churn', 'dropout_mode'):   # facts of the run, not the network
    if section[key] is None:
      section[key] = own.get(key)
    elif (section[key] or None) != (own.get(key) or None):
      raise ConfigError(f'network.{key}={section[key]!r} differs from the run\'s '
                        f'{own.get(key)!r}: it decided which work the run did; train again.')
  origin = keep_compute(section, own, overrides)
  if name is not None:
    check_name(name)
  cfg = network_lib.parse_network(section)
  out = os.path.join(workdir, RETIMED, name or default_name(cfg))
  for path in (os.path.dirname(out), out):     # checked before any work is done
    if os.path.exists(path) and not os.path.isdir(path):
      raise WorkdirError(f'{path} is a file, not a directory: the re-timing cannot be '
                         'written there.')
  if not os.path.isfile(os.path.join(workdir, runs.COMMS)):
    raise WorkdirError(f'{workdir} has no {runs.COMMS} (runs trained before the '
                       'communication log cannot be re-timed).')
  rows = runs.read_metrics(workdir).rows
  if not rows:
    raise WorkdirError(f'{workdir} has no metrics rows to re-time yet.')
  num_workers, log = commlog.read(workdir, steps=rows)
  if run.get('num_workers') not in (None, num_workers):
    raise RunFileError(f'{os.path.join(workdir, runs.COMMS)} is the log of {num_workers} '
                       f'workers, but the run has num_workers={run["num_workers"]}.')
  flops, tokens = 0.0, 0        # a configured step time does not read the model
  if cfg.step_seconds is None:
    flops = _need(stored, 'model.flops_per_token', workdir)
    tokens = (_need(stored, 'config.batch_per_worker', workdir)
              * _need(stored, 'config.seq_len', workdir))
  seconds = network_lib.nominal_step_seconds(cfg, flops, tokens)
  step_time = dict(seconds=seconds, source=_step_time_source(cfg, origin, flops, tokens))
  net = network_lib.make_network(cfg, num_workers, seconds)
  steps = {r['step'] for r in rows}
  clocks = {step: timeline_lib.clock_metrics(clock.seconds, clock.now, clock.compute)
            for step, clock in commlog.replay(net, log, max(steps), cfg.clock_overlap,
                                               cfg.overlap_buckets)
            if step in steps}
  retimed = [{**r, **clocks[r['step']]} for r in rows]
  record = dict(stored, config={**run, 'network': section}, retimed_from=dict(
      workdir=os.path.abspath(workdir), network=own, step=max(steps),
      overrides=json.loads(json.dumps(dict(overrides))), step_time=step_time,
      compute=origin))
  os.makedirs(out, exist_ok=True)
  write_jsonl(os.path.join(out, runs.METRICS), retimed)
  # The config last: `is_current` reads it, so a crash in between redoes the re-timing.
  workdir_lib.write_json(os.path.join(out, runs.CONFIG), record)
  return out


def _step_time_source(cfg: network_lib.NetworkConfig, origin: Mapping[str, str],
                      flops: float, tokens: int) -> str:
  """Where a re-timing's step time came from, in words."""
  def whose(key):
    return origin.get(key, 'the default')
  if cfg.step_seconds is not None:
    return f"network.step_seconds ({whose('step_seconds')})"
  return (f"the model's {flops * tokens:.3g} FLOPs per step at network.device_flops "
          f"{cfg.device_flops:.3g} ({whose('device_flops')}) x network.mfu {cfg.mfu:g} "
          f"({whose('mfu')})")


def is_current(workdir: str, overrides: Mapping[str, Any], name: str) -> bool:
  """Whether `retime(workdir, overrides, name)` was done on the run's last metrics row."""
  stored = runs.read_json_object(os.path.join(workdir, RETIMED, name, runs.CONFIG))
  source = (stored or {}).get('retimed_from') or {}
  rows = runs.read_metrics(workdir).rows
  return (isinstance(source, dict)
          and source.get('overrides') == json.loads(json.dumps(dict(overrides)))
          and bool(rows) and source.get('step') == rows[-1]['step'])


def _parse_args(args: list[str]) -> tuple[str, dict[str, str], str | None]:
  workdirs, name, overrides = [], None, {}
  for arg in args:
    key, eq, value = arg.partition('=')
    key = key.replace('--config.network.', '--network.', 1)
    if key == '--name' and eq:
      name = value
    elif key.startswith('--network.') and eq:
      overrides[key[2:]] = value
    elif key.startswith('--config.'):
      raise UsageError(f'{arg}: re-timing sets only network keys '
                       '(--config.network.KEY=VALUE); the rest of the run is its own.')
    else:
      workdirs.append(arg)
  if len(workdirs) != 1 or workdirs[0].startswith('-'):
    raise UsageError('takes one WORKDIR, --config.network.KEY=VALUE ... and --name=NAME; '
                     f'got {" ".join(workdirs) or "no WORKDIR"}.')
  if 'network.profile' not in overrides:
    raise UsageError('--config.network.profile=PROFILE is required (one of '
                     f'{", ".join(network_lib.PROFILES)}).')
  return workdirs[0], overrides, name


def main(argv: Sequence[str] | None = None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  if not args or args[0] in ('-h', '--help'):
    print(__doc__)
    return 0 if args else 2

  def body() -> int:
    workdir, overrides, name = _parse_args(args)
    out = retime(workdir, overrides, name)
    before, after = runs.read_metrics(workdir).rows[-1], runs.read_metrics(out).rows[-1]
    source = runs.read_config(out)['retimed_from']
    step_time = source['step_time']
    kept = [k for k, v in source['compute'].items() if v != 'as named'
            and k not in ('step_seconds', 'device_flops', 'mfu')]
    print(f'step time {step_time["seconds"]:.4g} s per inner step: {step_time["source"]}'
          + (f"; the run's {', '.join('network.' + k for k in kept)} kept" if kept else ''))
    print(f'step {after["step"]}: simulated {before.get("sim_seconds") or 0:,.1f} s -> '
          f'{after["sim_seconds"]:,.1f} s, utilization {after["utilization"]:.1%}: {out}')
    return 0

  return cli.run(PROG, body)


if __name__ == '__main__':
  cli.exit(main())
