"""Sweeps: many `loco.main` runs from one spec file, resumable, with a report at the end.

  python -m loco.sweep launch/sweeps/main.py --out=runs/sweeps/main [--parallel=1]

A spec is a Python file whose `get_sweep()` returns a list of `Run`s, written out one
by one or built with `grid` (the cartesian product of some config keys):

  from loco.lab.sweep import Run, grid

  def get_sweep():
    return [Run('ddp', 'experiments/tiny_ddp.py'),
            Run('local_sgd', 'experiments/tiny_diloco.py:local_sgd'),
            *grid('experiments/tiny_diloco.py', 'diloco_h{sync_every}_lr{outer_lr}',
                  **{'algorithm.sync_every': [10, 50], 'algorithm.outer_lr': [0.5, 0.7]})]

A spec may also define `get_retimes()`, {name: {'network.KEY': value}}: after
training, every finished synchronous run is re-timed on each of these networks without
training again (`loco.retime`, into OUT/RUN/retimed/NAME; done once, redone only if the
run or the network changed), and the report compares the runs on every network.

Every run is its own process, `python -m loco.main --config=CONFIG --workdir=OUT/NAME
--config.KEY=VALUE ...` (config paths are relative to the current directory, the
repository root), with its output in OUT/NAME/log.txt and its state in
OUT/NAME/status.json (WORKSPACE.md, Workdirs). Running the same
command again skips finished runs, re-launches interrupted ones in their workdir
(`loco.main` resumes them from their last checkpoint) and leaves failed ones alone
unless `--retry_failed` is given or their command changed. At the end it prints a
summary and writes OUT/report.md and plots (`loco.report`).

`--seeds=N` runs every run of the spec N times, as `NAME/seed=0` .. `NAME/seed=N-1` with
config `seed` 0 .. N-1 (the same seeds for every run, so settings pair by seed; they
replace a config file's own seed, and a spec or `--set` that sets `seed` is refused).
`OUT/NAME/seed=*` are one setting's seeds: `loco.report OUT` summarises them as mean and
CI over seeds, and `loco.report OUT/NAME` reports that setting alone. A larger N later
keeps the seeds already finished.

While runs train, the sweep shows each one's progress, read from its metrics.jsonl:
`running NAME  step 40/100  loss 3.123  eval 3.201  eta 0:01:02`. On a terminal these
lines are redrawn in place below the start and finish lines; elsewhere (a log, a pipe)
they are printed every `--progress_every` seconds (default 30; 0: none).

`--launcher=slurm` submits each run (or batch) as a SLURM job through submitit instead
(`--slurm=KEY=VALUE`: partition, timeout_min, nodes, tasks_per_node, gpus_per_node, ...;
`loco.lab.slurm`), with the same plans, statuses, logs, resume and batching; the sweep waits
for its jobs. `--launcher=submitit_local` runs those jobs on this machine.

Runs execute `--parallel` at a time on this machine (or as jobs at once). On a CPU each
run already uses every core, so `--parallel=1` is the fastest there; use more on a
many-core host. A run whose `init_from` lies in another run's workdir (a warm start from
that run's checkpoint) launches after that run has ended.

`--batch_runs=N` trains up to N runs that differ only in seed and the run knobs (inner
lr, weight decay, outer lr: `loco.run.run_axis`) in one process and one compiled program
(`loco.batched`): each still gets its own workdir, log and status, equal to its solo
run's, and resumes alone or batched. The batch's runs file and shared output are in
OUT/.batches/. Runs that cannot be batched run alone as before. A run's seeds are next
to each other in the sweep, so `--seeds=N --batch_runs=N` trains each run's seeds in one
program.
"""

import collections
import dataclasses
import datetime
import fcntl
import importlib.util
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterable, Mapping, Sequence

from loco import cli
from loco import configs
from loco.run import progress as progress_lib
from loco.lab import report as report_lib
from loco.files import runs as runs_lib
from loco.lab import slurm as slurm_lib
from loco.errors import LocoError, UsageError
from loco.files.metrics import duration
from loco.files.runs import LOG, STATUS, SWEEP, read_status  # noqa: F401  (older imports)
from loco.files.workdir import write_json

PROG = 'loco.sweep'
BATCHES = '.batches'     # OUT/.batches/TAG.json, .log, .results.json of batched runs
PROGRESS_EVERY = 30.0    # seconds between progress lines off a terminal
_NAME = re.compile(r'^[A-Za-z0-9_.,=+-]+(/[A-Za-z0-9_.,=+-]+)*$')


class SweepError(UsageError):
  """A spec or command-line mistake; printed as one line (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep.

  Attributes:
    name: its workdir under the sweep's output directory (letters, digits, `_.,=+-`;
      `/` nests runs in subdirectories).
    config: a config file, `experiments/x.py` or `experiments/x.py:variant`.
    overrides: config keys to set, `{'algorithm.sync_every': 50}`, passed to
      `loco.main` as `--config.algorithm.sync_every=50`.
  """
  name: str
  config: str
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)


def grid(config: str | Sequence[str], name_format: str,
         overrides: dict[str, Any] | None = None, **axes: Sequence[Any]) -> list[Run]:
  """The cartesian product of `axes`, one `Run` per combination.

  Args:
    config: a config file (`experiments/x.py[:variant]`), or a list of them, which is
      then the first axis.
    name_format: a `str.format` pattern for the run names; fields are the last part
      of each key (`{sync_every}` for `algorithm.sync_every`), `{config}` (the config
      file's name, `x` or `x-variant`), and positional fields in axis order.
    overrides: keys set in every run of the grid.
    **axes: a list of values per config key; dotted keys go through
      `**{'algorithm.sync_every': [10, 50]}`.

  Returns:
    The runs, the last axis varying fastest.
  """
  configs = [config] if isinstance(config, str) else list(config)
  for key, values in axes.items():
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
      raise SweepError(f'grid axis {key} must be a list of values, got {values!r}.')
  leaves = [key.rsplit('.', 1)[-1] for key in axes]
  runs = []
  for cfg, values in itertools.product(configs, itertools.product(*axes.values())):
    path, _, variant = cfg.partition(':')
    stem = os.path.splitext(os.path.basename(path))[0]
    fields = dict(zip(leaves, values), config=f'{stem}-{variant}' if variant else stem)
    try:
      name = name_format.format(*values, **fields)
    except (KeyError, IndexError) as e:
      raise SweepError(f'grid name_format {name_format!r} uses {e}, which is not one of '
                       f'{sorted(fields)} or an axis position.') from None
    runs.append(Run(name, cfg, {**(overrides or {}), **dict(zip(axes, values))}))
  return runs


def _spec_call(path: str, function: str, missing: Any = None) -> Any:
  """`function()` of the spec file, its errors as one SweepError; `missing` if undefined."""
  if not os.path.isfile(path):
    raise SweepError(f'the sweep spec {path} does not exist.')
  if os.getcwd() not in sys.path:   # specs and configs import experiments.*
    sys.path.insert(0, os.getcwd())
  module_spec = importlib.util.spec_from_file_location('_loco_sweep_spec', path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except SystemExit as e:   # a spec that ends the process would end the sweep silently
    raise SweepError(f'the sweep spec {path} called sys.exit({e.code!r}) while loading; '
                     'a spec only defines get_sweep().') from None
  except Exception as e:  # the spec's own error, as one line
    raise SweepError(f'the sweep spec {path} raised {type(e).__name__}: {e}') from None
  if not callable(getattr(module, function, None)):
    if missing is None:
      raise SweepError(f'the sweep spec {path} does not define {function}().')
    return missing
  try:
    return getattr(module, function)()
  except SweepError:
    raise
  except SystemExit as e:
    raise SweepError(f'{function}() of {path} called sys.exit({e.code!r}); it must '
                     'return its value.') from None
  except Exception as e:
    raise SweepError(f'{function}() of {path} raised {type(e).__name__}: {e}') from None


def load_spec(path: str) -> list[Run]:
  """The runs of a spec file (its `get_sweep()`), checked for names and values."""
  runs = _spec_call(path, 'get_sweep')
  if isinstance(runs, (str, bytes, Mapping, Run)) or not isinstance(runs, Iterable):
    raise SweepError(f'get_sweep() of {path} returned {_short(runs)}; it must return a '
                     'list (or another iterable) of loco.lab.sweep.Run.')
  try:
    runs = list(runs)    # a generator's own error, as one line
  except Exception as e:
    raise SweepError(f'get_sweep() of {path} raised {type(e).__name__}: {e}') from None
  check_runs(runs)
  return runs


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + '...'


def load_retimes(path: str) -> dict[str, dict[str, Any]]:
  """The re-timings of a spec file: its `get_retimes()`, or {} if it has none."""
  retimes = _spec_call(path, 'get_retimes', missing={})
  check_retimes(retimes)
  return dict(retimes)


def check_retimes(retimes: Any) -> None:
  """Raises SweepError unless `retimes` is {name: {'network.KEY': value}} of valid networks."""
  if not isinstance(retimes, dict):
    raise SweepError(f'get_retimes() must return {{name: {{network.KEY: value}}}}, got '
                     f'{type(retimes).__name__}.')
  for name, overrides in retimes.items():
    from loco.lab import retime as retime_lib   # jax, only for a spec with re-timings
    if not isinstance(overrides, dict) or 'network.profile' not in overrides:
      raise SweepError(f're-timing {name!r} must be a dict with network.profile.')
    try:
      retime_lib.check_name(name)
      retime_lib.network_section(overrides)
    except LocoError as e:
      raise SweepError(f're-timing {name!r}: {e}') from None


def check_runs(runs: Sequence[Run]) -> None:
  """Raises SweepError for a non-Run, a bad or duplicate name, or an unpassable value."""
  if not runs:
    raise SweepError('the sweep has no runs.')
  seen = set()
  for run in runs:
    if not isinstance(run, Run):
      raise SweepError(f'get_sweep() must return loco.lab.sweep.Run objects, got {_short(run)}.')
    if not isinstance(run.name, str):
      raise SweepError(f'run name {_short(run.name)} must be a string (its workdir under '
                       f'--out), not {type(run.name).__name__}.')
    parts = run.name.split('/')
    if not _NAME.match(run.name) or any(p in ('.', '..') for p in parts):
      raise SweepError(f'run name {run.name!r} must be letters, digits and _.,=+- '
                       f'(with / between nested parts, none of them . or ..).')
    reserved = [p for p in parts if p in runs_lib.RESERVED]
    if reserved:
      raise SweepError(f'run name {run.name!r} uses {reserved[0]!r}, the name of a file '
                       "loco keeps in a sweep or a run's directory; rename the run.")
    if not isinstance(run.config, str):
      raise SweepError(f'run {run.name!r}: config {_short(run.config)} must be a config '
                       "file path, 'experiments/x.py[:variant]'.")
    if not isinstance(run.overrides, Mapping):
      raise SweepError(f'run {run.name!r}: overrides must be a mapping '
                       f"{{'KEY': value}}, got a {type(run.overrides).__name__}.")
    if run.name in seen:
      raise SweepError(f'duplicate run name {run.name!r}: every run needs its own workdir.')
    seen.add(run.name)
    for key, value in run.overrides.items():
      if not isinstance(key, str):
        raise SweepError(f'run {run.name!r}: override key {_short(key)} must be a string '
                         "such as 'optimizer.lr'.")
      if value is None:
        raise SweepError(f'run {run.name!r}: {key}=None cannot be passed on the command '
                         f'line; unset it in a config variant (experiments/x.py:variant).')
  for run in runs:   # a workdir inside another run's workdir would be found as one run
    parts = run.name.split('/')
    for i in range(1, len(parts)):
      if '/'.join(parts[:i]) in seen:
        raise SweepError(f'run {run.name!r} is nested inside run {"/".join(parts[:i])!r}.')


def with_seeds(runs: Sequence[Run], seeds: int,
               extra: Mapping[str, Any] | None = None) -> list[Run]:
  """Each run as `seeds` runs `NAME/seed=K` with `seed=K`, K = 0 .. seeds - 1.

  The seeds are the same numbers for every run, so that two settings pair by seed
  (`loco.stats.paired_t`), and a larger `seeds` later keeps the runs already done. They
  replace the seed a config file sets; a run or `extra` (`--set`) that sets `seed`
  itself is refused.

  Raises:
    SweepError: `seeds` is not a whole number >= 1, or a run already sets its seed.
  """
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise SweepError(f'--seeds must be a whole number >= 1, got {seeds!r}.')
  if 'seed' in (extra or {}):
    raise SweepError(f'--seeds={seeds} sets every run\'s seed (0 .. {seeds - 1}); drop '
                     f'--config.seed={extra["seed"]}.')
  out = []
  for run in runs:
    if 'seed' in run.overrides:
      raise SweepError(f'--seeds={seeds} sets every run\'s seed (0 .. {seeds - 1}), but run '
                       f'{run.name!r} sets seed={run.overrides["seed"]!r} itself; drop '
                       'the seed from the spec or drop --seeds.')
    out += [Run(f'{run.name}/seed={k}', run.config, {**run.overrides, 'seed': k})
            for k in range(seeds)]
  return out


def parse_sets(sets: Sequence[str]) -> dict[str, str]:
  """`['steps=20', 'config.eval.every=10']` -> `{'steps': '20', 'eval.every': '10'}`:
  the overrides `--config.KEY=VALUE` (or its alias `--set=KEY=VALUE`) gives every run."""
  out = {}
  for item in sets:
    key, eq, value = item.partition('=')
    if not eq or not key:
      raise SweepError(f'--config.KEY=VALUE takes a key and a value, got {item!r}.')
    key = key.removeprefix('config.')
    try:
      configs.parse_value(key, value)
    except LocoError as e:
      raise SweepError(f'--config.{key}={value}: {e}') from None
    out[key] = value
  return out


def _format(value: Any) -> str:
  """A value as `loco.main` reads it: floats exactly, lists as `[1,2,1,1]` (no spaces)."""
  if isinstance(value, (list, tuple)):
    return '[' + ','.join(repr(x) if isinstance(x, str) else _format(x) for x in value) + ']'
  return repr(value) if isinstance(value, float) else str(value)


def command(run: Run, workdir: str, extra: dict[str, Any] | None = None) -> list[str]:
  """The `loco.main` command line of `run`; `extra` overrides apply after its own."""
  overrides = {**run.overrides, **(extra or {})}
  return [sys.executable, '-m', 'loco.main', f'--config={run.config}',
          f'--workdir={workdir}'] + [f'--config.{k}={_format(v)}' for k, v in overrides.items()]


def load_config(argv: Sequence[str]):
  """The checked ConfigDict that `loco.main` would build from `argv` (config + overrides).

  Raises:
    loco.errors.ConfigError: as `loco.main` would report it, in one sentence.
  """
  spec, overrides = configs.split_argv(argv)
  if spec is None:
    raise SweepError('the command has no --config=FILE.')
  config = configs.load(spec, overrides)
  configs.validate(config)
  return config


def host() -> str:
  """Where a run trains, for its status.json: $LOCO_HOST (a label such as the device's
  name) or the machine's host name. A page that gathers runs from several machines costs
  them apart (`loco.lab.study.cost`)."""
  return os.environ.get('LOCO_HOST') or socket.gethostname()


def _now() -> str:
  return datetime.datetime.now().isoformat(timespec='seconds')


def _plan(run: Run, cmd: list[str], workdir: str, retry_failed: bool) -> tuple[str, str]:
  """(action, reason): action is 'skip', 'start' or 'resume'."""
  status = read_status(workdir)
  if status is None:
    return ('resume', 'no status.json') if os.path.isdir(workdir) else ('start', '')
  changed = (status.get('command') or [])[1:] != cmd[1:]   # the interpreter may differ
  if status.get('state') == 'finished':
    note = ' (with a different command; delete its workdir to re-run)' if changed else ''
    return 'skip', f'finished before{note}'
  if status.get('state') == 'failed':
    if retry_failed:
      return 'resume', 'retrying a failed run'
    if changed:
      return 'resume', 'failed before; its command changed'
    return 'skip', f'failed before: {status.get("error")} (--retry_failed re-runs it)'
  return 'resume', 'interrupted'


class _Stop(Exception):
  """SIGTERM or SIGHUP reached the launcher."""


def _raise_stop(signum, _):
  raise _Stop(signal.Signals(signum).name)


def _die_with_parent():
  # Linux: a run gets SIGTERM if the launcher dies, even by SIGKILL, so no orphan keeps
  # writing into a workdir that a relaunch resumes.
  try:
    import ctypes
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def check_inside(out: str, name: str) -> None:
  """Raises SweepError if run `name`'s directory under `out`, or a folder on the way to
  it, is a link: a sweep writes its runs inside `out` only (a link would send a run's
  writes, and its resume's pruning, somewhere else)."""
  path = out
  for part in name.split('/'):
    path = os.path.join(path, part)
    if os.path.islink(path):
      raise SweepError(f'{path} is a link (to {os.readlink(path)}); a sweep writes its '
                       f'runs inside {out} only: move the run there or remove the link.')


def batch_tag(runs: Sequence[Run]) -> str:
  """The file stem of a batch under OUT/.batches: its first run's name with `/` as `%`
  (a character no run name has, so that `x/y` and `x_y` never share a file) and how
  many runs follow it."""
  return f'{runs[0].name.replace("/", "%")}+{len(runs) - 1}'


class _Active:
  """A launched process training one run (`loco.main`) or a batch (`loco.batched`): its
  runs' log files and statuses."""

  def __init__(self, runs: Sequence[Run], cmds: Mapping[str, list[str]], out: str,
               launcher: 'slurm_lib.Launcher | None' = None):
    self.runs = list(runs)
    self.workdirs = {r.name: os.path.join(out, r.name) for r in runs}
    self.results = self.batch_log = None
    if len(runs) == 1:
      proc_cmd = cmds[runs[0].name]
    else:
      folder = os.path.join(out, BATCHES)
      os.makedirs(folder, exist_ok=True)
      tag = batch_tag(runs)
      spec = os.path.join(folder, f'{tag}.json')
      self.results = os.path.join(folder, f'{tag}.results.json')
      self.batch_log = os.path.join(folder, f'{tag}.log')
      write_json(spec, [dict(workdir=self.workdirs[r.name], argv=cmds[r.name][3:])
                        for r in runs])
      if os.path.exists(self.results):
        os.remove(self.results)
      proc_cmd = [sys.executable, '-m', 'loco.batched', f'--runs={spec}',
                  f'--results={self.results}']
    self.status, self.logs = {}, {}
    self.t0 = time.time()
    start = _now()
    for r in runs:
      workdir = self.workdirs[r.name]
      os.makedirs(workdir, exist_ok=True)
      previous = read_status(workdir) or {}
      self.status[r.name] = dict(
          name=r.name, config=r.config, overrides=r.overrides, command=cmds[r.name],
          state='running', start=start, end=None, returncode=None, error=None,
          attempts=previous.get('attempts', 0) + 1, seconds=previous.get('seconds', 0.0),
          pid=None, batch=None if len(runs) == 1 else [x.name for x in runs],
          host=host())
      log = open(os.path.join(workdir, LOG), 'a')
      how = '' if len(runs) == 1 else f' (batched with {len(runs) - 1} other run(s))'
      log.write(f'==> loco.sweep attempt {self.status[r.name]["attempts"]} at {start}'
                f'{how}: {" ".join(proc_cmd)}\n')
      log.flush()
      self.logs[r.name] = log
    if launcher is not None:    # a job writes its output itself (a shared filesystem)
      if len(runs) > 1:
        open(self.batch_log, 'w').close()
      self.proc = launcher.start(proc_cmd, self.batch_log or os.path.join(
          self.workdirs[runs[0].name], LOG), runs[0].name)
    else:
      out_file = (self.logs[runs[0].name] if len(runs) == 1
                  else open(self.batch_log, 'w'))
      self.proc = subprocess.Popen(proc_cmd, stdout=out_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
      if len(runs) > 1:
        out_file.close()
    for r in runs:
      self.status[r.name]['pid'] = self.proc.pid
      write_json(os.path.join(self.workdirs[r.name], STATUS), self.status[r.name])

  def finish(self, code: int | None, interrupted: bool = False) -> dict[str, str]:
    """Records the end of this attempt; returns each run's state."""
    outcomes = {}
    if self.results is not None:
      try:
        outcomes = runs_lib.read_json_object(self.results) or {}
      except (LocoError, OSError):
        outcomes = {}
      text = ''
      try:
        with open(self.batch_log) as f:
          text = f.read()
      except OSError:
        pass
    states = {}
    for r in self.runs:
      log, status, workdir = self.logs[r.name], self.status[r.name], self.workdirs[r.name]
      if self.results is not None:
        log.write(text)
      log.close()
      outcome = outcomes.get(workdir) if isinstance(outcomes, dict) else None
      if interrupted or code is None or code < 0:
        state = 'interrupted'
        error = f'killed by signal {-code}' if code is not None and code < 0 else 'interrupted'
      elif self.results is None:
        state, error = (('finished', None) if code == 0
                        else ('failed', runs_lib.read_error_line(workdir)))
      elif isinstance(outcome, dict) and outcome.get('state') == 'finished':
        state, error = 'finished', None
      elif isinstance(outcome, dict) and outcome.get('state') == 'interrupted':
        state, error = 'interrupted', outcome.get('error') or 'interrupted'
      else:
        state = 'failed'
        error = ((outcome or {}).get('error') if isinstance(outcome, dict) else None) or (
            runs_lib.read_error_line(workdir))
      status.update(state=state, end=_now(), returncode=code, error=error,
                    seconds=round(status['seconds'] + time.time() - self.t0, 1))
      write_json(os.path.join(workdir, STATUS), status)
      states[r.name] = state
    return states


def batches(runs: Sequence[Run], cmds: Mapping[str, list[str]],
            batch_runs: int) -> list[list[Run]]:
  """The runs in launch order, grouped into batches of at most `batch_runs` runs that
  can share a program (`loco.run.run_axis.shape_of`); a run whose config does not load or
  that trains on a mesh goes alone (its own process then reports it)."""
  if batch_runs <= 1:
    return [[r] for r in runs]
  from loco.run import experiment   # pylint: disable=g-import-not-at-top (imports jax)
  from loco.run import run_axis     # pylint: disable=g-import-not-at-top
  groups: list[tuple[Any, list[Run]]] = []
  for r in runs:
    try:
      exp = experiment.parse_config(load_config(cmds[r.name][3:]))
    except Exception:  # noqa: BLE001  loco.main reports it in the run's own log
      groups.append((None, [r]))
      continue
    if exp.run.mesh_workers * exp.run.mesh_fsdp > 1:
      groups.append((None, [r]))
      continue
    shape = run_axis.shape_of(exp)
    for key, members in groups:
      if key is not None and len(members) < batch_runs and key == shape:
        members.append(r)
        break
    else:
      groups.append((shape, [r]))
  return [members for _, members in groups]


def starts_from(runs: Sequence[Run], out: str, extra: dict[str, Any] | None = None
                ) -> dict[str, set[str]]:
  """Per run, the runs of the sweep it starts from: its `init_from` (a warm start) lies in
  their workdir. A sweep launches a run after those have ended, also with --parallel."""
  workdirs = {r.name: os.path.realpath(os.path.join(out, r.name)) for r in runs}
  found: dict[str, set[str]] = {}
  for r in runs:
    path = {**r.overrides, **(extra or {})}.get('init_from')
    if not path:
      continue
    path = os.path.realpath(path if os.path.isabs(path) else os.path.join(os.getcwd(), path))
    found[r.name] = {n for n, w in workdirs.items()
                     if n != r.name and (path == w or path.startswith(w + os.sep))}
  return {n: deps for n, deps in found.items() if deps}


def _next_ready(todo: list[list[Run]], waiting: set[str], needs: Mapping[str, set[str]]
                ) -> list[Run] | None:
  """Pops the first group none of whose runs starts from a run in `waiting` (not ended)."""
  for i, group in enumerate(todo):
    if not any(needs.get(r.name, set()) & waiting for r in group):
      return todo.pop(i)
  return None


def run_sweep(runs: Sequence[Run], out: str, parallel: int = 1,
              extra: dict[str, Any] | None = None, retry_failed: bool = False,
              dry_run: bool = False, spec: str | None = None, report: bool = True,
              stream=None, retimes: dict[str, dict[str, Any]] | None = None,
              batch_runs: int = 1, progress_every: float = PROGRESS_EVERY,
              launcher: str = 'local', slurm: dict[str, Any] | None = None) -> int:
  """Runs (or resumes) a sweep in `out`; returns the exit code (0: all finished).

  Args:
    runs: the sweep's runs (`load_spec`, which checks them).
    out: the sweep directory; run `name` has its workdir in `out/name`.
    parallel: runs at once.
    extra: overrides applied to every run after its own (`--set`).
    retry_failed: also re-run runs that failed before.
    dry_run: print what would run and check that every config loads; run nothing.
    spec: the spec file, recorded in `out/sweep.json`.
    report: write the report (`loco.report`) at the end.
    stream: where the progress lines go (stdout).
    retimes: {name: {'network.KEY': value}} (`load_retimes`): after training, every
      finished synchronous run is re-timed on each of these networks (`loco.retime`)
      into `out/RUN/retimed/NAME`, unless that is already done.
    batch_runs: train up to this many compatible runs in one process (`batches`);
      `parallel` then counts processes.
    progress_every: off a terminal, print each running run's progress line (step,
      loss, ETA) every this many seconds; on a terminal the lines are redrawn in place;
      0: no progress lines.
    launcher: 'local' (processes here), 'slurm' or 'submitit_local' (jobs through
      submitit: `loco.lab.slurm`).
    slurm: submitit parameters of every job (`loco.lab.slurm.parse_options`).

  Returns:
    0 if every run finished (and every re-timing worked), 1 if one failed or a dry run
    found a bad config, 130 if interrupted.
  """
  stream = stream or sys.stdout
  say = lambda text: print(text, file=stream, flush=True)   # noqa: E731
  retimes = retimes or {}
  if parallel < 1:
    raise SweepError(f'--parallel must be >= 1, got {parallel}.')
  if batch_runs < 1:
    raise SweepError(f'--batch_runs must be >= 1, got {batch_runs}.')
  if not progress_every >= 0:    # also nan
    raise SweepError(f'--progress_every must be >= 0 seconds, got {progress_every}.')
  if not dry_run:
    cli.check_output_dir(out)     # a file or a read-only place: one line, nothing started
  for r in runs:
    check_inside(out, r.name)
  cmds = {r.name: command(r, os.path.join(out, r.name), extra) for r in runs}
  plans = {r.name: _plan(r, cmds[r.name], os.path.join(out, r.name), retry_failed)
           for r in runs}
  width = max(len(r.name) for r in runs)
  if dry_run:
    if retimes:
      say(f're-time finished synchronous runs on: {", ".join(retimes)}')
    return _dry_run(runs, cmds, plans, width, say)

  lock = open(os.path.join(out, runs_lib.LOCK), 'w')
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    raise SweepError(f'another loco.sweep is running in {out}.') from None
  jobs = (None if launcher == 'local' else
          slurm_lib.Launcher(launcher, os.path.join(out, slurm_lib.SUBMITIT), slurm))
  write_json(os.path.join(out, SWEEP), dict(
      spec=spec, extra=extra or {}, retimes=retimes,
      runs=[dict(name=r.name, config=r.config, overrides=r.overrides, command=cmds[r.name])
            for r in runs]))

  t0 = time.time()
  results = {r.name: 'skipped' for r in runs if plans[r.name][0] == 'skip'}
  for name in results:
    say(f'skip    {name:<{width}}  {plans[name][1]}')
  todo = batches([r for r in runs if r.name not in results], cmds, batch_runs)
  needs = starts_from(runs, out, extra)
  active: list[_Active] = []
  code = 0
  # Each running run's progress, from its metrics.jsonl; lines said while runs train go
  # above the progress lines (`progress.Board`).
  board = progress_lib.Board(stream, progress_every)
  following: dict[str, progress_lib.Follower] = {}
  old_handlers = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)}
  try:
    while todo or active:
      while todo and len(active) < parallel:
        # A warm start waits for the run it starts from (when nothing else is left to
        # wait on, as in a cycle, the first group goes).
        waiting = {r.name for g in todo for r in g} | {r.name for a in active for r in a.runs}
        group = _next_ready(todo, waiting, needs) or (None if active else todo.pop(0))
        if group is None:
          break
        active.append(_Active(group, cmds, out, jobs))
        for r in group:
          following[r.name] = progress_lib.Follower(os.path.join(out, r.name), time.time())
          how = f' (batch of {len(group)})' if len(group) > 1 else ''
          board.say(f'{plans[r.name][0]:<7} {r.name:<{width}}  {plans[r.name][1]}{how}'
                    .rstrip())
      time.sleep(0.2)
      for a in [a for a in active if a.proc.poll() is not None]:
        active.remove(a)
        for name, state in a.finish(a.proc.returncode).items():
          following.pop(name, None)
          results[name] = state
          status = a.status[name]
          detail = f'{status["seconds"]:.0f} s' if state == 'finished' else status['error']
          board.say(f'{state:<7} {name:<{width}}  {detail}')
      now = time.time()
      for follower in following.values():
        follower.poll(now)
      board.show([f'running {name:<{width}}  {follower.text(now)}'
                  for name, follower in following.items()], now)
  except (KeyboardInterrupt, _Stop) as e:
    code = 130
    board.say(f'stopping ({e or "Ctrl-C"}): interrupting {len(active)} running run(s); '
              f'the same command resumes them.')
  finally:
    board.close()
    for s, handler in old_handlers.items():
      signal.signal(s, handler)
    for a in active:   # stopped, or an unexpected error: do not leave runs behind
      _terminate(a.proc)
      results.update(a.finish(a.proc.returncode, interrupted=True))

  _summary(runs, results, time.time() - t0, out, say)
  failed_retimes = 0 if code else retime_runs(runs, out, retimes, say)
  if report:
    try:
      report_lib.write_report([out], stream=stream)
    except Exception as e:  # a report problem must not hide the runs' results
      say(f'loco.sweep: the report failed: {type(e).__name__}: {e}')
  lock.close()
  if code:
    return code
  states = [_status(os.path.join(out, r.name)).get('state') for r in runs]
  return 0 if all(state == 'finished' for state in states) and not failed_retimes else 1


def retime_runs(runs, out, retimes, say) -> int:
  """Re-times every finished synchronous run on each network; returns the failures."""
  if not retimes:
    return 0
  from loco.lab import retime as retime_lib
  t0, done, failed = time.time(), 0, 0
  for r in runs:
    workdir = os.path.join(out, r.name)
    try:
      if (read_status(workdir) or {}).get('state') != 'finished':
        continue
      config = (runs_lib.read_config(workdir) or {}).get('config', {})
    except LocoError as e:
      failed += 1
      say(f'retime  {r.name}: error: {e}')
      continue
    if (config.get('network') or {}).get('mode') == 'async':
      say(f'retime  {r.name}: not re-timed (asynchronous: its schedule depends on the '
          'network)')
      continue
    for name, overrides in retimes.items():
      try:
        if retime_lib.is_current(workdir, overrides, name):
          continue
        retime_lib.retime(workdir, overrides, name)
        done += 1
      except (LocoError, OSError) as e:
        failed += 1
        say(f'retime  {r.name} on {name}: error: {e}')
  say(f'retime: {done} re-timing(s) written, {failed} failed, {time.time() - t0:.1f} s '
      f'({len(retimes)} networks: {", ".join(retimes)})')
  return failed


def _status(workdir: str) -> dict[str, Any]:
  """status.json for the summary: {} if none; a damaged one is named, not raised (the
  runs are done by then)."""
  try:
    return read_status(workdir) or {}
  except LocoError as e:
    return dict(state='unreadable', error=str(e))


# A run stopped by SIGTERM finishes its chunk in flight and saves a checkpoint at that
# step (loco.run.train): seconds to a minute on CPU. Killed sooner, the save is abandoned
# (the previous checkpoint is kept, but the steps since are lost).
STOP_GRACE_SECONDS = 90


def _terminate(proc: subprocess.Popen) -> None:
  if proc.poll() is not None:
    return
  proc.terminate()
  try:
    proc.wait(timeout=STOP_GRACE_SECONDS)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


def _dry_run(runs, cmds, plans, width, say) -> int:
  bad = 0
  for r in runs:
    action, reason = plans[r.name]
    say(f'{action:<7} {r.name:<{width}}  {reason}'.rstrip())
    say(f'        python {" ".join(cmds[r.name][1:])}')
    if action != 'skip':
      try:
        load_config(cmds[r.name][3:])
      except Exception as e:  # a ConfigError is one sentence, as loco.main prints it
        bad += 1
        say(f'        error: {e}' if isinstance(e, (LocoError, SweepError))
            else f'        error: {type(e).__name__}: {e}')
  say(f'{len(runs)} runs, {sum(p[0] != "skip" for p in plans.values())} to run'
      f'{f", {bad} with a bad config" if bad else ""} (dry run: nothing was started).')
  return 1 if bad else 0


def _summary(runs, results, seconds, out, say) -> None:
  width = max(len(r.name) for r in runs)
  counts = collections.Counter(results.values())
  parts = ', '.join(f'{n} {s}' for s, n in sorted(counts.items()))
  say(f'sweep {out}: {len(runs)} runs: {parts}; wall {duration(seconds)}')
  for r in runs:
    state = results.get(r.name, 'not started')
    status = _status(os.path.join(out, r.name))
    if state == 'skipped':
      state = f'skipped ({status.get("state")})'
    detail = status.get('error') if status.get('state') != 'finished' else (
        f'{status.get("seconds", 0):.0f} s')
    say(f'  {state:<20} {r.name:<{width}}  {detail or ""}'.rstrip())


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m loco.sweep', description=__doc__.split('\n\n')[0])
  parser.add_argument('spec', help='sweep spec file defining get_sweep()')
  parser.add_argument('--out', help='sweep directory (default runs/sweeps/<spec name>)')
  parser.add_argument('--parallel', type=cli.positive_int, default=1,
                      help='runs at once (default 1)')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='the same as --config.KEY=VALUE (an alias kept for older '
                      'scripts)')
  parser.add_argument('--batch_runs', type=cli.positive_int, default=1,
                      help='train up to N runs that differ only in seed, lr, weight '
                      'decay or outer lr in one process (default 1: each alone)')
  parser.add_argument('--seeds', type=cli.positive_int, default=None, metavar='N',
                      help='run every run of the spec with seeds 0 .. N-1, as NAME/seed=K '
                      '(the spec must not set seed itself)')
  parser.add_argument('--progress_every', type=cli.non_negative_float, default=PROGRESS_EVERY,
                      metavar='S', help='off a terminal, a progress line per running run '
                      f'every S seconds (default {PROGRESS_EVERY:g}; 0: none); on a '
                      'terminal the lines update in place')
  parser.add_argument('--launcher', choices=slurm_lib.LAUNCHERS, default='local',
                      help='local: processes here (default); slurm: a SLURM job per run '
                      'through submitit; submitit_local: those jobs on this machine')
  parser.add_argument('--slurm', action='append', default=[], metavar='KEY=VALUE',
                      help='a submitit parameter of every job (partition=gpu, '
                      'timeout_min=600, nodes=2, tasks_per_node=1, gpus_per_node=8; '
                      'repeatable)')
  parser.add_argument('--retry_failed', action='store_true', help='re-run failed runs')
  parser.add_argument('--dry_run', action='store_true',
                      help='print the plan and check the configs; run nothing')
  parser.add_argument('--no_report', action='store_true', help='skip report.md and plots')
  parser.epilog = ('--config.KEY=VALUE (repeatable): a config override for every run, '
                   'after its own, as loco.main takes it')
  overrides, rest = cli.config_overrides(sys.argv[1:] if argv is None else argv, PROG)
  args = parser.parse_args(rest)
  out = args.out or os.path.join('runs', 'sweeps',
                                 os.path.splitext(os.path.basename(args.spec))[0])

  def body() -> int:
    runs, extra = load_spec(args.spec), parse_sets(args.set + overrides)
    if args.seeds is not None:
      runs = with_seeds(runs, args.seeds, extra)
      check_runs(runs)
    return run_sweep(runs, out, parallel=args.parallel, extra=extra,
                     retry_failed=args.retry_failed, dry_run=args.dry_run,
                     spec=args.spec, report=not args.no_report,
                     retimes=load_retimes(args.spec), batch_runs=args.batch_runs,
                     progress_every=args.progress_every, launcher=args.launcher,
                     slurm=slurm_lib.parse_options(args.slurm))

  return cli.run(PROG, body)


if __name__ == '__main__':
  # Run the importable loco.sweep, not this __main__ copy: specs import Run from it.
  from loco.lab import sweep as _sweep
  _sweep.cli.exit(_sweep.main())
