"""Compare runs: the difference of final eval losses with its confidence interval.

  python -m loco.compare REFERENCE OTHER [OTHER ...] [--margin=0.01] [--level=0.95]

Each argument is one side of a comparison, one run or the seeds of one setting:

  runs/ddp                   a run directory (it has a config.json or a status.json)
  runs/sweeps/ddp_seeds      a directory whose runs differ only in their seed (a sweep's --out)
  'runs/ddp_seed*'           a glob, quoted so that loco expands it, not the shell
  runs/ddp_s0,runs/ddp_s1    a comma list of run directories (each may be a glob)
  ddp=SPEC                   any of these, shown as 'ddp'

Every later argument X is compared with the first, the reference R: X - R in nats/token
and relative, (X - R) / R, each with its confidence interval (95% by default):

  paired t   both sides ran the same seeds (at least 2): the per-seed differences, t with
             n - 1 df (`loco.stats.paired_t`). A seed fixes the init and the data order,
             so the seed's luck cancels. The strongest comparison: use it.
  Welch t    both sides have 2+ seeds but not the same ones (`loco.stats.welch_t`).
  eval SE    a side with one run: the final evals' standard errors over the eval windows,
             clustered by document (`eval_loss_se`), combined as sqrt(se_x^2 + se_r^2), a
             normal interval. It says how sure the eval set is about each loss, not how
             much another seed would move it (a group of seeds facing one run adds its
             seed spread, s^2 / n): run seeds to know that.

The relative interval is Fieller's: the ratios rho = X / R that the same test does not
reject for X - rho R (as `loco.stats` puts a relative margin into a difference), so
it and the verdict agree. With --margin=m (relative: 0.01 is 1%) the verdict is one of
"X is better / worse than R by more than the margin" (the whole interval lies beyond
-m / +m), "X is within the margin of R" (the whole interval lies inside +-m) or
"inconclusive: the CI straddles the margin"; without one the bound is 0. Bytes sent
and received per worker and simulated seconds are shown side by side.

Bad input (no such directory, a directory that holds no run, a damaged run file, a run
without eval rows or diverged, sides evaluated on different eval sets, runs of one side
that differ in more than their seed) ends in one `loco.compare: error:` line, exit 1
(2 for bad arguments). A run that did not finish is compared at its last eval, with a
note.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import math
import os
import re
import sys
from typing import Any, Sequence

import numpy as np

from loco import cli
from loco.lab import report
from loco.files import runs
from loco import stats
from loco.files import workdir as workdir_lib
from loco.errors import LocoError, UsageError

PROG = 'loco.compare'
PAIRED, WELCH, EVAL_SE = 'paired t', 'Welch t', 'eval SE'

# What fixes the eval windows (`loco.data.make_eval_windows`): runs that differ in one of
# these were scored on different text, and their losses do not compare.
EVAL_SET_KEYS = ('data.source', 'data.tfds_name', 'data.text_glob', 'data.text_key',
                 'data.eval_split', 'data.tokenizer', 'data.sp_model', 'seq_len',
                 'eval.batches', 'eval.batch_size')
# config.json's record of the corpus: the same content wherever it was read from.
FINGERPRINT_KEYS = ('sha256', 'tokenizer')


class CompareError(LocoError):
  """Runs that cannot be compared; printed as one line."""


@dataclasses.dataclass(frozen=True)
class Side:
  """One side of a comparison: one run, or the seeds of one setting.

  Attributes:
    name: how it is shown.
    spec: the argument it came from.
    runs: its runs, by seed.
    finals: each run's final eval row of metrics.jsonl (the last with an eval_loss).
  """
  name: str
  spec: str
  runs: tuple[runs.Run, ...]
  finals: tuple[dict[str, Any], ...]

  @property
  def n(self) -> int:
    return len(self.runs)

  @property
  def seeds(self) -> tuple[Any, ...]:
    return tuple(r.config.get('seed') for r in self.runs)

  @property
  def losses(self) -> np.ndarray:
    return np.array([f['eval_loss'] for f in self.finals], dtype=np.float64)

  @property
  def loss(self) -> float:
    """The final eval loss; the mean over seeds for a group."""
    return float(np.mean(self.losses))

  def mean_of(self, key: str) -> float | None:
    """The mean over its runs of `key` in each run's last metrics row (bytes_sent,
    bytes_received, sim_seconds); None if a run lacks it."""
    values = [r.last.get(key) for r in self.runs]
    if any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in values):
      return None
    return float(np.mean(values))

  def eval_se(self) -> float | None:
    """The eval SE of its loss (a group: the mean of its runs' SEs, since all score the
    same windows); None if a run's final eval has none."""
    ses = [f.get('eval_loss_se') for f in self.finals]
    if any(not isinstance(s, (int, float)) or not math.isfinite(s) for s in ses):
      return None
    return float(np.mean(ses))


@dataclasses.dataclass(frozen=True)
class Comparison:
  """X - R with its confidence interval, in nats/token and relative.

  Attributes:
    other, reference: the sides (X and R).
    method: PAIRED, WELCH or EVAL_SE.
    estimate, ci: X - R and its interval, nats/token.
    relative, relative_ci: (X - R) / R and its (Fieller) interval.
    se, df: the standard error of X - R and the degrees of freedom (inf: normal).
    level: the confidence level.
    margin: the relative margin of the verdict (None: 0).
    seeds: the seeds paired (paired t), else ().
  """
  other: Side
  reference: Side
  method: str
  estimate: float
  ci: tuple[float, float]
  relative: float
  relative_ci: tuple[float, float]
  se: float
  df: float
  level: float
  margin: float | None
  seeds: tuple[Any, ...] = ()

  @property
  def verdict(self) -> str:
    return verdict(self.other.name, self.reference.name, self.relative_ci, self.margin)


# ---- reading the sides ----------------------------------------------------------------

_GLOB = re.compile(r'[*?[]')
_LABEL = re.compile(r'^([A-Za-z0-9_.+-]+)=(.+)$')


def _expand(spec: str) -> list[str]:
  """The run directories an argument names (see the module docstring)."""
  found: list[str] = []
  for part in (p for p in spec.split(',') if p) if ',' in spec else [spec]:
    if _GLOB.search(part):
      matches = sorted(m for m in glob.glob(part) if os.path.isdir(m))
      if not matches:
        raise CompareError(f'{part} matches no directory.')
      for m in matches:
        found += report.find_workdirs(m)
      continue
    if not os.path.exists(part):
      raise CompareError(f'{part}: no such directory.')
    if not os.path.isdir(part):
      raise CompareError(f'{part} is a file, not a run directory.')
    workdirs = report.find_workdirs(part)
    if not workdirs:
      raise CompareError(f'{part} is not a run directory and holds none (a run is a '
                         'directory with a config.json or a status.json).')
    found += workdirs
  return list(dict.fromkeys(found))


def _final_eval(run: runs.Run) -> dict[str, Any]:
  """The run's last metrics row with an eval_loss, checked."""
  if run.status == 'diverged':
    why = f': {run.error.rstrip(".")}' if run.error else ''
    raise CompareError(f'{run.path} diverged{why}; a diverged run has no loss to compare.')
  evals = [r for r in run.metrics if 'eval_loss' in r]
  if not evals:
    raise CompareError(
        f'{run.path} has no eval rows in its {runs.METRICS} (no row with an eval_loss): '
        'it stopped before its first eval, or eval.every is larger than its steps.')
  return evals[-1]


def _side_name(spec: str, workdirs: Sequence[str]) -> str:
  if len(workdirs) == 1:
    return os.path.basename(os.path.abspath(workdirs[0]))
  path = spec.split(',')[0]
  if not _GLOB.search(path) and ',' not in spec and not runs.is_run(path):
    return os.path.basename(os.path.abspath(path))     # a directory of seeds
  return report.seedless_name(os.path.basename(os.path.abspath(workdirs[0])))


def _value(setting: dict[str, Any], key: str) -> str:
  return repr(setting[key]) if key in setting else 'unset'


def _check_one_setting(spec: str, group: Sequence[runs.Run]) -> None:
  first = report.setting(group[0].config)
  for run in group[1:]:
    other = report.setting(run.config)
    keys = report.differing_keys(first, other)
    if keys:
      shown = '; '.join(f'{k}: {_value(first, k)} in {group[0].path}, {_value(other, k)} '
                        f'in {run.path}' for k in keys[:2])
      more = f' (and {len(keys) - 2} more keys)' if len(keys) > 2 else ''
      raise CompareError(
          f'{spec} holds runs that differ in more than their seed ({shown}{more}); a side '
          'is one run or the seeds of one setting: give the others as separate arguments.')
  seen: dict[Any, str] = {}
  for run in group:
    seed = run.config.get('seed')
    if seed in seen:
      raise CompareError(f'{spec} has two runs of seed {seed} ({seen[seed]} and '
                         f'{run.path}); a group of seeds needs one run per seed.')
    seen[seed] = run.path


def load_side(spec: str) -> Side:
  """Reads one argument (a run, a directory of seeds, a glob or a comma list, with an
  optional NAME= in front) into a Side, its runs sorted by seed.

  Raises:
    CompareError: nothing there, a run without eval rows or diverged, or runs that
      differ in more than their seed (or repeat one).
    RunFileError: a damaged run file (the sentence names it).
  """
  label, path = None, spec
  match = _LABEL.match(spec)
  if match and not os.path.exists(spec):
    label, path = match.groups()
  workdirs = _expand(path)
  group = [runs.read_run(w) for w in workdirs]
  name = label or _side_name(path, workdirs)
  if len(group) > 1:
    _check_one_setting(path, group)
    group.sort(key=lambda r: (r.config.get('seed') is None, r.config.get('seed') or 0))
  finals = tuple(_final_eval(r) for r in group)
  return Side(name=name, spec=spec, runs=tuple(group), finals=finals)


def _eval_set(run: runs.Run) -> dict[str, Any]:
  flat = workdir_lib.flatten(run.config)
  out = {k: flat[k] for k in EVAL_SET_KEYS if k in flat}
  fingerprint = run.stored.get('data_fingerprint')
  if isinstance(fingerprint, dict):
    out.update({f'data_fingerprint.{k}': fingerprint[k] for k in FINGERPRINT_KEYS
                if k in fingerprint})
  return out


def check_eval_sets(sides: Sequence[Side]) -> None:
  """Raises CompareError unless every run was scored on the same eval windows (the keys
  of EVAL_SET_KEYS and the corpus fingerprint, where both runs record them)."""
  first = sides[0].runs[0]
  want = _eval_set(first)
  for side in sides:
    for run in side.runs:
      got = _eval_set(run)
      for key in sorted(set(want) & set(got)):
        if want[key] != got[key]:
          raise CompareError(
              f'{first.path} and {run.path} were scored on different eval sets ({key}: '
              f'{want[key]!r} vs {got[key]!r}); their losses do not compare (loco.evaluate '
              'scores runs again on one eval set).')


def notes(sides: Sequence[Side]) -> list[str]:
  """What the reader should know before trusting the numbers: runs that did not finish,
  final evals at different steps, and single runs that look like the seeds of one
  setting given as separate arguments (an unquoted glob the shell expanded)."""
  out = []
  for side in sides:
    for run, final in zip(side.runs, side.finals):
      if run.status != 'finished':
        steps = run.config.get('steps')
        of = f' of {steps}' if steps else ''
        out.append(f'{run.path} is {run.status} (its last step is {run.last.get("step")}'
                   f'{of}): its last eval, at step {final["step"]}, is used.')
  steps = {f['step'] for side in sides for f in side.finals}
  if len(steps) > 1:
    out.append('the final evals are at different steps (' + ', '.join(
        f'{side.name}: {"/".join(str(s) for s in sorted({f["step"] for f in side.finals}))}'
        for side in sides) + '): the losses are compared as they are.')
  singles = [(i, s) for i, s in enumerate(sides, 1) if s.n == 1]
  by_setting: dict[str, list[tuple[int, Side]]] = {}
  for i, s in singles:
    key = repr(sorted(report.setting(s.runs[0].config).items()))
    by_setting.setdefault(key, []).append((i, s))
  for members in by_setting.values():
    if len({s.seeds[0] for _, s in members}) > 1:
      out.append('arguments ' + ', '.join(str(i) for i, _ in members) + ' are seeds of one '
                 'setting given one by one (an unquoted glob?): to pair seeds, quote the '
                 "glob ('runs/x_seed*') or join the runs with commas.")
  return out


# ---- the statistics --------------------------------------------------------------------

def fieller(x: float, r: float, v_xx: float, v_rr: float, v_xr: float,
            crit: float) -> tuple[float, float]:
  """The confidence interval of the ratio x / r of two estimated means (Fieller): the
  rho for which |x - rho r| <= crit * se(x - rho r), with se^2 = v_xx - 2 rho v_xr +
  rho^2 v_rr (the variances and covariance of the two estimates). (-inf, inf) when r
  itself is not distinguishable from 0."""
  c2 = crit**2
  a = r * r - c2 * v_rr
  b = x * r - c2 * v_xr
  c = x * x - c2 * v_xx
  disc = b * b - a * c
  if a <= 0 or disc < 0:
    return (-math.inf, math.inf)
  root = math.sqrt(disc)
  return ((b - root) / a, (b + root) / a)


def compare(reference: Side, other: Side, *, margin: float | None = None,
            level: float = 0.95) -> Comparison:
  """other - reference, paired by seed where both ran the same seeds (see the module
  docstring for the three methods).

  Raises:
    CompareError: a side with one run whose final eval has no eval_loss_se.
  """
  x, r = other.losses, reference.losses
  seeds: tuple[Any, ...] = ()
  if (other.n >= 2 and reference.n >= 2 and None not in other.seeds
      and sorted(other.seeds) == sorted(reference.seeds)):
    method, seeds = PAIRED, reference.seeds    # both sorted by seed
    test = stats.paired_t(x, r, level=level)
    n = x.size
    cov = np.cov(np.stack([x, r]), ddof=1) / n
    v_xx, v_rr, v_xr = float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])
    estimate, se, df = test.estimate, test.se, test.df
  elif other.n >= 2 and reference.n >= 2:
    method = WELCH
    test = stats.welch_t(x, r, level=level)
    v_xx = float(np.var(x, ddof=1)) / x.size
    v_rr = float(np.var(r, ddof=1)) / r.size
    v_xr = 0.0
    estimate, se, df = test.estimate, test.se, test.df
  else:
    method = EVAL_SE
    variances = []
    for side in (other, reference):
      se_side = side.eval_se()
      if se_side is None:
        run = next(rn for rn, f in zip(side.runs, side.finals)
                   if not isinstance(f.get('eval_loss_se'), (int, float)))
        raise CompareError(
            f'{run.path} has no eval_loss_se in its final eval row, and with one run on a '
            'side the interval rests on it: score the runs again with loco.evaluate, or '
            'run seeds of both (then they pair by seed).')
      seed_var = float(np.var(side.losses, ddof=1)) / side.n if side.n >= 2 else 0.0
      variances.append(se_side**2 + seed_var)
    v_xx, v_rr, v_xr = variances[0], variances[1], 0.0
    estimate = float(np.mean(x) - np.mean(r))
    se, df = math.sqrt(v_xx + v_rr), math.inf
  crit = stats.t_critical(df, level) if df > 0 else math.nan
  if se > 0 and math.isfinite(crit):
    ci = (estimate - crit * se, estimate + crit * se)
    low, high = fieller(float(np.mean(x)), float(np.mean(r)), v_xx, v_rr, v_xr, crit)
    relative_ci = (low - 1, high - 1)
  else:   # no spread at all: the data pin the difference
    ci = (estimate, estimate)
    relative_ci = (estimate / float(np.mean(r)),) * 2
  return Comparison(other=other, reference=reference, method=method, estimate=estimate,
                    ci=(float(ci[0]), float(ci[1])),
                    relative=float(np.mean(x) / np.mean(r) - 1),
                    relative_ci=(float(relative_ci[0]), float(relative_ci[1])), se=se,
                    df=float(df), level=level, margin=margin, seeds=seeds)


def _pct(x: float) -> str:
  return f'{x * 100:+.2f}%' if math.isfinite(x) else ('+inf' if x > 0 else '-inf')


def verdict(name: str, reference: str, relative_ci: tuple[float, float],
            margin: float | None = None) -> str:
  """The one-line verdict on `name` against `reference` from the interval of
  (X - R) / R; lower loss is better."""
  low, high = relative_ci
  m = margin or 0.0
  if margin:
    band, pct = f'the margin ({m * 100:g}%)', f'{m * 100:g}%'
    if high < -m:
      return (f'{name} is better than {reference} by more than {band}: the whole CI lies '
              f'below -{pct}.')
    if low > m:
      return (f'{name} is worse than {reference} by more than {band}: the whole CI lies '
              f'above +{pct}.')
    if -m < low and high < m:
      return f'{name} is within {band} of {reference}: the whole CI lies inside ±{pct}.'
    return (f'inconclusive: the CI straddles {band} ([{_pct(low)}, {_pct(high)}] against '
            f'±{pct}); more seeds narrow it.')
  if high < 0:
    return f'{name} is better than {reference}: the whole CI lies below 0.'
  if low > 0:
    return f'{name} is worse than {reference}: the whole CI lies above 0.'
  return (f'inconclusive: the CI includes 0 (no difference detected between {name} and '
          f'{reference}); more seeds narrow it, --margin says what difference matters.')


# ---- the output ------------------------------------------------------------------------

def _loss_cell(side: Side, level: float) -> str:
  if side.n == 1:
    se = side.eval_se()
    return f'{side.loss:.4f} ± {se:.4f} SE' if se is not None else f'{side.loss:.4f}'
  ci = stats.mean_ci(side.losses, level).ci
  return f'{side.loss:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]'


def _seeds_cell(side: Side) -> str:
  if side.n == 1:
    return f'1 (seed {side.seeds[0]})' if side.seeds[0] is not None else '1'
  return f'{side.n} ({",".join(str(s) for s in side.seeds)})'


def side_table(sides: Sequence[Side], level: float = 0.95) -> str:
  """The sides as a printed table: runs, final eval loss with its uncertainty, bytes
  sent and received per worker, simulated seconds, the step of the final eval."""
  cells = [['', 'runs (seeds)', 'final eval loss', 'sent', 'received', 'sim s', 'at step']]
  for i, side in enumerate(sides):
    steps = sorted({f['step'] for f in side.finals})
    cells.append([side.name + (' (reference)' if i == 0 else ''), _seeds_cell(side),
                  _loss_cell(side, level), report.human_bytes(side.mean_of('bytes_sent')),
                  report.human_bytes(side.mean_of('bytes_received')),
                  report.human_seconds(side.mean_of('sim_seconds')),
                  '/'.join(str(s) for s in steps)])
  return report.aligned(cells, left=2)


def _how(c: Comparison) -> str:
  level = f'{c.level * 100:g}% CI'
  if c.method == PAIRED:
    return f'{level}, paired t over seeds {",".join(map(str, c.seeds))}, {c.df:g} df'
  if c.method == WELCH:
    return f'{level}, Welch t over seeds, {c.df:.3g} df'
  return f'{level}, eval SE (clustered by document), normal'


def _fewer(reference: float | None, value: float | None, key: str) -> str:
  if reference is not None and reference == value:
    return f'the same {report.BYTES_WHAT[key]}'
  return report.fewer(reference, value, key)


def describe(c: Comparison) -> list[str]:
  """The lines of one comparison: the difference, relative, bytes; the verdict."""
  x, r = c.other, c.reference
  sent, received = (_fewer(r.mean_of(key), x.mean_of(key), key)
                    for key in ('bytes_sent', 'bytes_received'))
  lines = [f'{x.name} - {r.name}: {c.estimate:+.4f} nats/token '
           f'[{c.ci[0]:+.4f}, {c.ci[1]:+.4f}] ({_how(c)})',
           f'  relative: {_pct(c.relative)} [{_pct(c.relative_ci[0])}, '
           f'{_pct(c.relative_ci[1])}]; {x.name}: {sent}, {received}']
  t_x, t_r = x.mean_of('sim_seconds'), r.mean_of('sim_seconds')
  if t_x and t_r:
    lines[-1] += f', {t_x / t_r:.2f}x the simulated time'
  lines.append(f'  verdict: {c.verdict}')
  if c.method == EVAL_SE:
    lines.append('  (one run on a side: this interval holds the eval set\'s sampling error '
                 'only, not seed-to-seed variation; run 3+ seeds of each to pair them.)')
  return [report.wrap(line, indent='    ') for line in lines]


def run_compare(specs: Sequence[str], margin: float | None = None, level: float = 0.95,
                stream=None) -> list[Comparison]:
  """Loads the sides, checks them, prints the table and each comparison with the
  first; returns the comparisons.

  Raises:
    UsageError: fewer than two arguments.
    CompareError, RunFileError: see the module docstring.
  """
  stream = stream or sys.stdout
  if len(specs) < 2:
    raise UsageError('needs at least two runs or groups of seeds: REFERENCE OTHER [...]')
  sides = [load_side(s) for s in specs]
  check_eval_sets(sides)
  comparisons = [compare(sides[0], other, margin=margin, level=level) for other in sides[1:]]
  for note in notes(sides):
    print(report.wrap(f'{PROG}: note: {note}'), file=sys.stderr)
  print(side_table(sides, level), file=stream)
  print(report.wrap('final eval loss (nats/token): one run: ± its eval SE (clustered by '
                    f'document); seeds: mean [{level * 100:g}% CI over seeds]. sent, '
                    'received: bytes per worker; sim s: simulated seconds.'), file=stream)
  for c in comparisons:
    print('', file=stream)
    print('\n'.join(describe(c)), file=stream)
  stream.flush()
  return comparisons


def _level(text: str) -> float:
  value = cli.finite_float(text)
  if not 0 < value < 1:
    raise argparse.ArgumentTypeError(f'{text!r} must lie between 0 and 1')
  return value


def _margin(text: str) -> float:
  value = cli.finite_float(text)
  if not 0 <= value < 1:
    raise argparse.ArgumentTypeError(
        f'{text!r} must lie in [0, 1) (relative: 0.01 is 1%)')
  return value


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m loco.compare', description=__doc__.split('\n\n')[0])
  parser.add_argument('specs', nargs='+', metavar='RUNS',
                      help='the reference, then the others: a run dir, a dir of seeds, a '
                      "quoted glob ('runs/x_seed*'), or a comma list; NAME=... names it")
  parser.add_argument('--margin', type=_margin, default=None,
                      help='relative difference that matters, e.g. 0.01 for 1%% (default: '
                      'none, the verdict is against 0)')
  parser.add_argument('--level', type=_level, default=0.95,
                      help='confidence level of the intervals (default 0.95)')
  args = parser.parse_args(argv)

  def body() -> int:
    run_compare(args.specs, args.margin, args.level)
    return 0
  return cli.run(PROG, body)


if __name__ == '__main__':
  cli.exit(main())
