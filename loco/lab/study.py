"""The equal-budget protocol: tune, pick, run finals, score, compare.

A study compares methods (`Method`: fixed keys plus one knob of their own) at equal
tokens and equal tuning budgets. Every method gets the same budget by construction:

1. the shared inner-lr grid (`Budget.inner_lrs`, three values) at the middle of its own
   knob's grid;
2. its own knob's other two values at the best inner lr of step 1 (a method without a
   knob of its own gets the inner-lr grid extended one step at each end instead), so
   five settings each;
3. once: where the best of those sits at the edge of a knob's grid, one more step past
   that edge (the DiLoCo scaling-law paper's rule, arXiv 2503.09799: extend until the
   minimum is interior), if the knob's range allows it;
4. once: where the best so far has moved its knob away from step 1's value, the inner lr
   was never tried at that knob, so its two neighbours (one grid step down and up) train at
   the picked knob, and where the best of them is beyond the pick, one more step that way
   (coordinate-wise tuning otherwise picks an inner lr for the wrong knob: an outer lr
   that halves wants a larger inner lr).

Each setting trains once (`Budget.tune_seed`) and is scored by its final eval loss on
the tuning split (the in-loop eval, whose windows cover the split). The pick, the lowest
final loss (a diverged setting scores +inf), then trains at every seed of `Budget.seeds`
(distinct from the tuning seed) per final (`Final`: a method at its pick, with some keys
changed), and each final model is scored by `loco.evaluate` on `Budget.score_batches` x
16 windows of the final split, per window with its document. Runs of one seed share the
init and data order across methods, so finals compare paired by seed (`compare`). A
final that diverges at a seed is a result, not a gap: its group names the seed
(`Group.diverged`), and a comparison whose first method diverged where the second
finished does not hold (`Comparison.verdict`).
Warm-up is `Budget.warmup_frac` of each run's own length.

Runs are `loco.sweep` runs under OUT/tune/METHOD/LABEL and OUT/final/FINAL/seedS: the
same call resumes after an interruption and skips what is finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import glob
import json
import math
import os
import shutil
import time
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from loco.run import evaluate
from loco.files import runs as runs_lib
from loco import stats
from loco.errors import LocoError
from loco.lab import sweep as sweep_lib
from loco.lab.sweep import Run, retime_runs, run_sweep

LR = 'optimizer.lr'


@dataclasses.dataclass(frozen=True)
class Knob:
  """A method's own knob: its config key, a grid of three ascending values, and the
  open/closed range an edge extension must stay in."""
  key: str
  values: tuple[float, float, float]
  low: float = 0.0              # extensions stay > low (or >= with low_closed)
  high: float = math.inf        # and <= high
  low_closed: bool = False
  geometric: bool = False       # an edge extension multiplies (an lr) instead of adding


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  keys: Mapping[str, Any]
  knob: Knob | None = None      # None: the inner lr is its only knob
  h1: bool = False              # one step per communication: the shorter runs


MOMENTUM = 'algorithm.outer_momentum'
OUTER_LR = 'algorithm.outer_lr'


@dataclasses.dataclass(frozen=True)
class Retune:
  """How a variant re-tunes the knob its change moves: `key` at `factors` x the parent's
  pick, laid out on the effective step eta / (1 - mu) where the variant changes the outer
  momentum (the same effective steps as the parent's), one more geometric step past an
  edge pick, at most `high`. The inner lr and every other key stay the parent's pick."""
  key: str = OUTER_LR
  factors: tuple[float, float, float] = (0.5, 1.0, 2.0)
  high: float = math.inf


@dataclasses.dataclass(frozen=True)
class Final:
  """A method at its pick with some keys changed (a variant), run at every seed (or at
  `seeds`, a figure's cheaper series). A string value may name `{seed}` and `{out}`
  (the study's directory), e.g. a warm start from the same seed's run. A variant that
  changes what moves the optimum (M, H, momentum, topology, the communication form) sets
  `retune`: it tunes that knob around the parent's pick under OUT/tune/NAME first."""
  name: str
  method: str
  keys: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seeds: tuple[int, ...] | None = None
  retune: Retune | None = None

  def seeds_of(self, budget: 'Budget') -> tuple[int, ...]:
    return budget.seeds if self.seeds is None else self.seeds

  def keys_for(self, seed: int, out: str) -> dict[str, Any]:
    return {k: v.format(seed=seed, out=out) if isinstance(v, str) else v
            for k, v in self.keys.items()}


@dataclasses.dataclass(frozen=True)
class Budget:
  base: str                             # the config file every run starts from
  steps: int                            # a run with H > 1
  steps_h1: int                         # a run at one step per communication
  common: Mapping[str, Any]             # keys of every run (seq_len, eval, logging, ...)
  inner_lrs: tuple[float, float, float]
  seeds: tuple[int, ...]
  tune_seed: int = 0
  tuning_split: str = 'validation[:50%]'
  final_split: str = 'validation[50%:]'
  score_batches: int = 512              # loco.evaluate batches of 16 for the finals
  warmup_frac: float = 1 / 6
  tune_fraction: float = 1.0            # tuning runs train this fraction of the steps
  check_seed: int | None = None         # the pick and its neighbour train again at this
  # seed; a pick that diverges there is passed over, one whose neighbour diverges flagged


def label(setting: Mapping[str, Any]) -> str:
  return '_'.join(f'{k.split(".")[-1]}{v:g}' if isinstance(v, float) else
                  f'{k.split(".")[-1]}{v}' for k, v in setting.items()) or 'default'


def run_keys(method: Method, budget: Budget, tuning: bool = False) -> dict[str, Any]:
  steps = budget.steps_h1 if method.h1 else budget.steps
  if tuning:
    steps = int(round(steps * budget.tune_fraction))
  return {**budget.common, 'steps': steps,
          'optimizer.warmup_steps': int(round(budget.warmup_frac * steps)), **method.keys}


def _extend(values: Sequence[float], upward: bool, geometric: bool) -> float:
  a, b = (values[-2], values[-1]) if upward else (values[1], values[0])
  return b * (b / a) if geometric else b + (b - a)


def _allowed(knob: Knob, x: float) -> bool:
  return (x >= knob.low if knob.low_closed else x > knob.low) and x <= knob.high


def settings(method: Method, budget: Budget,
             scores: Mapping[str, float]) -> tuple[list[dict[str, Any]], bool]:
  """The settings `method` has to have trained so far, given the tuning scores known
  (label -> final loss), and whether its tuning is complete (see the module doc)."""
  lrs, knob = list(budget.inner_lrs), method.knob
  mid = {} if knob is None else {knob.key: knob.values[1]}
  out = [{LR: lr, **mid} for lr in lrs]
  if any(label(s) not in scores for s in out):
    return out, False
  best_lr = min(out, key=lambda s: scores[label(s)])[LR]
  if knob is None:
    out += [{LR: _extend(lrs, False, True)}, {LR: _extend(lrs, True, True)}]
  else:
    out += [{LR: best_lr, knob.key: v} for v in (knob.values[0], knob.values[2])]
  if any(label(s) not in scores for s in out):
    return out, False
  pick = min(out, key=lambda s: scores[label(s)])
  tried_lrs = sorted({s[LR] for s in out})
  more = []
  if pick[LR] in (tried_lrs[0], tried_lrs[-1]):
    more.append({**pick, LR: _extend(tried_lrs, pick[LR] == tried_lrs[-1], True)})
  if knob is not None and pick[knob.key] in (knob.values[0], knob.values[2]):
    x = float(f'{_extend(knob.values, pick[knob.key] == knob.values[2], knob.geometric):.6g}')
    if _allowed(knob, x):
      more.append({**pick, knob.key: x})
  out += more
  complete = all(label(s) in scores for s in out)
  if not complete or knob is None:
    return out, complete
  pick = min(out, key=lambda s: scores[label(s)])
  if pick[knob.key] == mid[knob.key]:
    return out, True
  # Step 4: the inner lr's neighbours at the picked knob, then one more step past the
  # better of them where it beats the pick.
  seen = {label(s) for s in out}
  step = lrs[1] / lrs[0]
  near = [{LR: _round(pick[LR] * f), knob.key: pick[knob.key]} for f in (1 / step, step)]
  out += [s for s in near if label(s) not in seen]
  if any(label(s) not in scores for s in out):
    return out, False
  better = min(near, key=lambda s: scores[label(s)])
  if scores[label(better)] < scores[label(pick)]:
    past = {LR: _round(better[LR] * (better[LR] / pick[LR])), knob.key: pick[knob.key]}
    if label(past) not in seen:
      out.append(past)
  return out, all(label(s) in scores for s in out)


def _round(x: float) -> float:
  """A grid value as the labels write it (six significant digits)."""
  return float(f'{x:.6g}')


def tuning_score(workdir: str) -> float | None:
  """A tuning run's score: its last eval loss (+inf if it diverged), None if unfinished."""
  if not os.path.isdir(workdir):
    return None
  run = runs_lib.read_run(workdir)
  if run.status == 'diverged':
    return math.inf
  if run.status != 'finished':
    return None
  evals = [r['eval_loss'] for r in run.metrics if 'eval_loss' in r]
  if not evals or run.metrics[-1].get('eval_loss') is None:
    raise LocoError(f'{workdir} finished without an eval at its last step; tuning needs '
                    'eval.every to divide steps.')
  return float(evals[-1])


@dataclasses.dataclass(frozen=True)
class Problem:
  """One tuning problem: a method's own grid, or a variant's re-tune around its
  parent's pick. Its runs are OUT/tune/NAME/LABEL (LABEL_seedS at the check seed)."""
  name: str
  keys: Mapping[str, Any]                       # every run's keys but the setting's
  plan: Callable[[Mapping[str, float]], tuple[list[dict[str, Any]], bool]]
  knob: str                                     # whose neighbour the check trains


def method_problem(method: Method, budget: Budget) -> Problem:
  return Problem(method.name, run_keys(method, budget, tuning=True),
                 functools.partial(settings, method, budget),
                 method.knob.key if method.knob else LR)


def retune_values(final: Final, method: Method, pick: Mapping[str, Any]
                  ) -> tuple[float, float, float]:
  """The three values a re-tuned variant tries: `factors` x the parent's value of the
  key, moved to the same effective step eta / (1 - mu) where the variant sets another
  outer momentum, and scaled down together where the largest would pass `high` (a
  gossip step picked at 1, its range's top, tries 0.25, 0.5 and 1).

  Raises:
    LocoError: the parent sets no value of the key (or of the momentum it would move).
  """
  r, parent = final.retune, {**method.keys, **pick}
  if r.key not in parent:
    raise LocoError(f'{final.name} re-tunes {r.key}, which its method {method.name} '
                    'neither tunes nor sets.')
  center = float(parent[r.key])
  if r.key == OUTER_LR and MOMENTUM in final.keys:
    if MOMENTUM not in parent:
      raise LocoError(f'{final.name} changes {MOMENTUM}, which {method.name} does not set: '
                      'its outer lr cannot be moved to the same effective step.')
    center *= (1 - float(final.keys[MOMENTUM])) / (1 - float(parent[MOMENTUM]))
  values = [center * f for f in r.factors]
  if values[-1] > r.high:   # a parent picked near the top of the range: the same ratios,
    values = [v * r.high / values[-1] for v in values]   # the largest at the top
  return tuple(float(f'{v:.6g}') for v in values)


def retune_settings(values: Sequence[float], key: str, high: float,
                    scores: Mapping[str, float]) -> tuple[list[dict[str, Any]], bool]:
  """A re-tune's settings so far: the three values, then once one geometric step past
  the edge the best of them sits at (if it stays <= high); complete when all scored."""
  out = [{key: v} for v in values]
  if any(label(x) not in scores for x in out):
    return out, False
  best = min(out, key=lambda x: scores[label(x)])[key]
  if best in (values[0], values[-1]):
    x = float(f'{_extend(values, best == values[-1], True):.6g}')
    if x <= high:
      out.append({key: x})
  return out, all(label(x) in scores for x in out)


def variant_problem(final: Final, method: Method, pick: Mapping[str, Any], budget: Budget,
                    out: str = '') -> Problem:
  values = retune_values(final, method, pick)
  base = {k: v for k, v in pick.items() if k != final.retune.key}
  keys = {**run_keys(method, budget, tuning=True), **base,
          **final.keys_for(budget.tune_seed, out)}
  if keys['steps'] % keys.get('eval.every', keys['steps']):
    keys['eval.every'] = keys['steps']   # a score needs the eval at the last step (a
    # final's own eval.every may be its own, longer length)
  return Problem(final.name, keys,
                 functools.partial(retune_settings, values, final.retune.key,
                                   final.retune.high), final.retune.key)


def tuning_run(method: Method | Problem, budget: Budget, setting: Mapping[str, Any],
               seed: int | None = None) -> Run:
  """The run of one setting of a tuning problem (a `Method` stands for its own) at the
  tuning seed, or at `seed` (the check seed's runs are LABEL_seedS)."""
  problem = method_problem(method, budget) if isinstance(method, Method) else method
  seed = budget.tune_seed if seed is None else seed
  return Run(f'{problem.name}/{_run_label(setting, seed, budget)}', budget.base,
             {**problem.keys, **setting, 'data.eval_split': budget.tuning_split,
              'seed': seed})


def _run_label(setting: Mapping[str, Any], seed: int, budget: Budget) -> str:
  """A tuning run's folder: LABEL at the tuning seed, LABEL_seedS at another."""
  return label(setting) + ('' if seed == budget.tune_seed else f'_seed{seed}')


def _score(tune_dir: str, problem: Problem, setting: Mapping[str, Any], seed: int,
           budget: Budget) -> float | None:
  return tuning_score(os.path.join(tune_dir, problem.name, _run_label(setting, seed, budget)))


def _known(tune_dir: str, problem: Problem | Method, budget: Budget
           ) -> tuple[list[dict[str, Any]], bool, dict[str, float]]:
  """(the settings wanted so far, whether the grid is complete, label -> score at the
  tuning seed)."""
  if isinstance(problem, Method):
    problem = method_problem(problem, budget)
  known: dict[str, float] = {}
  while True:
    wanted, complete = problem.plan(known)
    new = False
    for s in wanted:
      if label(s) not in known:
        loss = _score(tune_dir, problem, s, budget.tune_seed, budget)
        if loss is not None:
          known[label(s)], new = loss, True
    if complete or not new:
      return wanted, complete, known


def neighbour(setting: Mapping[str, Any], wanted: Sequence[Mapping[str, Any]], knob: str
              ) -> dict[str, Any] | None:
  """The setting next to `setting` along `knob` among `wanted` (every other key equal):
  the next larger value (the larger step, the divergence risk), else the next smaller."""
  same = [dict(x) for x in wanted if knob in x and x[knob] != setting[knob]
          and all(x.get(k) == v for k, v in setting.items() if k != knob)]
  larger = [x for x in same if x[knob] > setting[knob]]
  if larger:
    return min(larger, key=lambda x: x[knob])
  smaller = [x for x in same if x[knob] < setting[knob]]
  return max(smaller, key=lambda x: x[knob]) if smaller else None


def pick_checked(wanted: Sequence[Mapping[str, Any]], known: Mapping[str, float],
                 checked: Mapping[str, float], knob: str
                 ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
  """The pick rule that sees divergence risk. Candidates in order of their tuning-seed
  score; a candidate and its `neighbour` (where that finished at the tuning seed) train
  at the check seed (`checked`: label -> score there); a candidate that diverges there is
  passed over; the first that does not is the pick, flagged where its neighbour diverged
  at either seed. Returns (the settings still to train at the check seed, the pick's
  record {setting, passed, flag} or None until they have).

  Raises:
    LocoError: every setting diverged at one seed or the other.
  """
  passed = []
  for cand in sorted((x for x in wanted if math.isfinite(known[label(x)])),
                     key=lambda x: known[label(x)]):
    nb = neighbour(cand, wanted, knob)
    need = [x for x in (cand, nb) if x is not None and math.isfinite(known[label(x)])]
    missing = [dict(x) for x in need if label(x) not in checked]
    if missing:
      return missing, None
    if not math.isfinite(checked[label(cand)]):
      passed.append(label(cand))
      continue
    flag = ''
    if nb is not None and not (math.isfinite(known[label(nb)]) and
                               math.isfinite(checked.get(label(nb), 0.0))):
      flag = f'its neighbour {label(nb)} diverged'
    return [], dict(setting=dict(cand), passed=passed, flag=flag)
  raise LocoError('every setting diverged at the tuning seed or the check seed: '
                  f'{", ".join(label(x) for x in wanted)}')


def _resolve(tune_dir: str, problem: Problem, budget: Budget
             ) -> tuple[list[tuple[dict[str, Any], int]], list[tuple[dict[str, Any], int]],
                        dict[str, Any] | None]:
  """(the runs a problem wants trained now, every run it has wanted so far, as
  (setting, seed); its pick's record, None until those have trained)."""
  todo, pick = _wanted(tune_dir, problem, budget)
  wanted = _known(tune_dir, problem, budget)[0]
  seen = [(s, budget.tune_seed) for s in wanted]
  if budget.check_seed is not None:
    seen += [(s, budget.check_seed) for s in wanted
             if _score(tune_dir, problem, s, budget.check_seed, budget) is not None]
  names = {label(s) + str(seed) for s, seed in seen}
  return todo, seen + [r for r in todo if label(r[0]) + str(r[1]) not in names], pick


def _wanted(tune_dir: str, problem: Problem, budget: Budget
            ) -> tuple[list[tuple[dict[str, Any], int]], dict[str, Any] | None]:
  """(the runs a problem wants trained now as (setting, seed), its pick's record or
  None)."""
  wanted, complete, known = _known(tune_dir, problem, budget)
  if not complete:
    return [(s, budget.tune_seed) for s in wanted if label(s) not in known], None
  if not any(math.isfinite(known[label(s)]) for s in wanted):
    raise LocoError(f'every tuning run of {problem.name} diverged in {tune_dir}.')
  checked: dict[str, float] = {}
  if budget.check_seed is None:
    chosen = dict(setting=min(wanted, key=lambda s: known[label(s)]), passed=[], flag='')
  else:
    for s in wanted:
      loss = _score(tune_dir, problem, s, budget.check_seed, budget)
      if loss is not None:
        checked[label(s)] = loss
    try:
      missing, chosen = pick_checked(wanted, known, checked, problem.knob)
    except LocoError as e:
      raise LocoError(f'{problem.name} in {tune_dir}: {e}') from None
    if chosen is None:
      return [(s, budget.check_seed) for s in missing], None
  pick = chosen['setting']
  edge = [k for k in pick
          if pick[k] in (min(s[k] for s in wanted), max(s[k] for s in wanted))
          and len({s[k] for s in wanted}) > 1]
  return [], dict(chosen, label=label(pick), loss=known[label(pick)],
                  grid=[(label(s), known[label(s)]) for s in wanted],
                  tried=[(dict(s), known[label(s)]) for s in wanted], edge=edge,
                  check={k: v for k, v in checked.items()})


def add_families(picks: dict[str, dict[str, Any]],
                 families: Mapping[str, Sequence[str]]) -> None:
  """Each family (name -> member methods) whose members all have picks gets the best
  member's pick (lowest tuning loss) under its own name, with `member` naming it: a
  final of the family trains that member's method at its pick."""
  for family, members in families.items():
    if all(m in picks for m in members):
      best = min(members, key=lambda m: picks[m]['loss'])
      picks[family] = {**picks[best], 'member': best}


def _method_of(final: Final, by_name: Mapping[str, Method],
               picks: Mapping[str, Mapping[str, Any]]) -> Method:
  return by_name[picks[final.method].get('member', final.method)]


def _problems(methods: Sequence[Method], finals: Sequence[Final], budget: Budget,
              picks: Mapping[str, Mapping[str, Any]], out: str) -> list[Problem]:
  """The methods' problems, and each re-tuned variant's once its parent has a pick."""
  by_name = {m.name: m for m in methods}
  found = [method_problem(m, budget) for m in methods]
  for f in finals:
    if f.retune is not None and f.method in picks:
      found.append(variant_problem(f, _method_of(f, by_name, picks),
                                   picks[f.method]['setting'], budget, out))
  return found


def _check_names(methods: Sequence[Method], finals: Sequence[Final],
                 families: Mapping[str, Sequence[str]]) -> None:
  names = {m.name for m in methods}
  for family, members in families.items():
    if family in names or not set(members) <= names:
      raise LocoError(f'the family {family} must be a new name over tuned methods, got '
                      f'{", ".join(members)}.')
  for f in finals:
    if f.method not in names and f.method not in families:
      raise LocoError(f'final {f.name} names the method {f.method}, which is not tuned.')
    if f.retune is not None and (f.name in names or f.name in families):
      raise LocoError(f'the re-tuned final {f.name} has a method\'s name: its tuning '
                      'runs would mix with the method\'s.')


def tune(out: str, methods: Sequence[Method], budget: Budget, parallel: int = 1,
         train: bool = True, batch_runs: int = 1, finals: Sequence[Final] = (),
         families: Mapping[str, Sequence[str]] | None = None
         ) -> dict[str, dict[str, Any]]:
  """Trains the tuning stages in OUT/tune until every method's budget is spent, then
  each re-tuned variant's (`Final.retune`) around its parent's pick; returns name ->
  {setting, label, loss, grid: [(label, loss)], tried: [(setting, loss)], edge: the knobs
  whose pick is still at
  the edge of what was tried, check: label -> score at the check seed, passed: the
  labels passed over for diverging there, flag: '' or why the pick is on a knife edge},
  per method and per re-tuned variant; and per family (`add_families`) its best member's.

  Raises:
    LocoError: a tuning run failed, every setting of a problem diverged, or (with
      `train=False`) a tuning run is not finished.
  """
  families = dict(families or {})
  _check_names(methods, finals, families)
  tune_dir = os.path.join(out, 'tune')
  tried: set[str] = set()
  while True:
    picks: dict[str, dict[str, Any]] = {}
    for _ in range(2):   # the methods, then the variants their picks allow
      todo, every = [], []
      for problem in _problems(methods, finals, budget, picks, out):
        runs, seen, pick = _resolve(tune_dir, problem, budget)
        todo += [tuning_run(problem, budget, s, seed) for s, seed in runs]
        every += [tuning_run(problem, budget, s, seed) for s, seed in seen]
        if pick is not None:
          picks[problem.name] = pick
      add_families(picks, families)
    if not todo:
      break
    if not train:
      raise LocoError(f'{len(todo)} tuning runs are not finished in {tune_dir}.')
    if tried >= {r.name for r in todo}:   # a sweep ran them and they did not finish
      raise LocoError(f'tuning runs failed in {tune_dir}: '
                      f'{", ".join(sorted(r.name for r in todo))} (see their log.txt); '
                      'fix them and run the same command again (loco.sweep '
                      '--retry_failed re-runs failed ones).')
    tried |= {r.name for r in todo}
    # Every run wanted so far (finished ones are skipped), so that sweep.json lists the
    # whole tuning sweep.
    code = run_sweep(every, tune_dir, parallel, report=False, batch_runs=batch_runs)
    drop_checkpoints(tune_dir, [r.name for r in every])
    if code == 130:
      raise KeyboardInterrupt
  return picks


def drop_checkpoints(folder: str, names: Sequence[str]) -> int:
  """Removes the checkpoints of the finished runs `names` under `folder`; returns the
  bytes freed. A pick reads a tuning run's metrics, never its model, so a finished tuning
  run's checkpoints only take space (about 26 MB each for an M = 8 micro run: the quick
  claims page's tuning wrote 13 GB). Runs that are interrupted or failed keep theirs, to
  resume from."""
  freed = 0
  for name in names:
    workdir = os.path.join(folder, name)
    checkpoints = os.path.join(workdir, 'checkpoints')
    if (runs_lib.read_status(workdir) or {}).get('state') != 'finished' or \
        not os.path.isdir(checkpoints):
      continue
    for root, _, files in os.walk(checkpoints):
      freed += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    shutil.rmtree(checkpoints)
  return freed


def final_runs(methods: Sequence[Method], finals: Sequence[Final], budget: Budget,
               picks: Mapping[str, Mapping[str, Any]], out: str = '') -> list[Run]:
  """Every final at every seed: its method's pick with its keys (a family's: its best
  member's), a re-tuned variant at its own pick."""
  by_name = {m.name: m for m in methods}
  return [Run(f'{f.name}/seed{seed}', budget.base,
              {**run_keys(_method_of(f, by_name, picks), budget), **picks[f.method]['setting'],
               **f.keys_for(seed, out),
               **(picks[f.name]['setting'] if f.retune is not None else {}),
               'data.eval_split': budget.final_split, 'seed': seed})
          for f in finals for seed in f.seeds_of(budget)]


def stale(runs: Sequence[Run], folder: str) -> list[str]:
  """The runs under `folder` that finished with other keys than `runs` now give them (a
  pick that moved since, e.g. after a re-tune or a check seed): the sweep would skip
  them as finished, and their results would stand for a setting they did not train."""
  found = []
  for r in runs:
    status = runs_lib.read_status(os.path.join(folder, r.name)) or {}
    kept = status.get('overrides')
    if status.get('state') == 'finished' and isinstance(kept, dict) and \
        kept != json.loads(json.dumps(r.overrides)):
      found.append(r.name)
  return found


def _final_run(out: str, name: str, seed: int) -> runs_lib.Run | None:
  """A final's run as its files tell it, None if it is not there."""
  d = os.path.join(out, 'final', name, f'seed{seed}')
  return runs_lib.read_run(d) if os.path.isdir(d) else None


def _final(out: str, name: str, seed: int, budget: Budget):
  """(the final's run, its loco.evaluate result if that scored its last step), or None
  if the run is not there or not finished."""
  run = _final_run(out, name, seed)
  if run is None or run.status != 'finished':
    return None
  scored = runs_lib.read_json_object(
      evaluate.result_path(run.path, budget.final_split, budget.score_batches, 16))
  return run, (scored if (scored or {}).get('step') == run.last.get('step') else None)


def score_finals(out: str, finals: Sequence[Final], budget: Budget) -> None:
  """Scores every finished final with loco.evaluate (kept in RUN/evals; redone only
  after more training)."""
  for f in finals:
    for seed in f.seeds_of(budget):
      found = _final(out, f.name, seed, budget)
      if found and found[1] is None:
        evaluate.evaluate_run(found[0].path, budget.score_batches, 16, budget.final_split)


@dataclasses.dataclass
class Group:
  """One final over its seeds: per seed its score and per-window losses."""
  name: str
  losses: dict[int, float]                   # seed -> final model's loss on the final split
  windows: dict[int, np.ndarray]             # seed -> per-window losses
  docs: np.ndarray | None                    # the windows' documents (shared)
  bytes_sent: float                          # per worker, mean over seeds
  bytes_received: float
  peak_bytes: float
  curves: list[list[tuple[float, float]]]    # per seed: (tokens, eval loss) while training
  last: dict[str, float] = dataclasses.field(default_factory=dict)  # the last in-loop
  # eval's numbers, mean over seeds (worker_spread, eval_loss_workers, sim_seconds, ...)
  diverged: dict[int, int] = dataclasses.field(default_factory=dict)  # seed -> the step
  # its run diverged at (no loss: mean, std and tests are over the other seeds)

  @property
  def values(self) -> list[float]:
    return [self.losses[s] for s in sorted(self.losses)]

  @property
  def mean(self) -> float:
    return float(np.mean(self.values)) if self.values else math.nan

  @property
  def std(self) -> float:
    return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan

  def diverged_text(self) -> str:
    """'seed 3 diverged at step 234' (several joined), '' if none did."""
    return '; '.join(f'seed {s} diverged at step {self.diverged[s]}'
                     for s in sorted(self.diverged))

  def text(self, digits: int = 4, unit: str = '') -> str:
    """'mean ± std' (or '(1 seed)') with the seeds that diverged; `unit` after the
    numbers (' s' for seconds)."""
    if not self.losses:
      return f'every seed diverged ({self.diverged_text()})' if self.diverged else 'no seed'
    note = (f' over {len(self.losses)} of {len(self.losses) + len(self.diverged)} seeds '
            f'({self.diverged_text()})' if self.diverged else '')
    spread = (f' ± {self.std:.{digits}f}{unit}' if len(self.losses) > 1 else
              unit if self.diverged else f'{unit} (1 seed)')
    return f'{self.mean:.{digits}f}{spread}{note}'

  def restrict(self, seeds: Collection[int]) -> 'Group':
    """This group with only `seeds` (a look at the first seeds of a sequential test)."""
    keep = set(seeds)
    return dataclasses.replace(
        self, losses={s: v for s, v in self.losses.items() if s in keep},
        windows={s: v for s, v in self.windows.items() if s in keep},
        diverged={s: v for s, v in self.diverged.items() if s in keep})

  def per_seed(self) -> str:
    return ', '.join(f'{self.losses[s]:.4f}' if s in self.losses
                     else f'diverged at step {self.diverged[s]}'
                     for s in sorted({*self.losses, *self.diverged}))


def _diverged_at(out: str, name: str, seed: int) -> int | None:
  """The step a final's run diverged at, None if it did not (or is not there)."""
  run = _final_run(out, name, seed)
  if run is None or run.status != 'diverged':
    return None
  return int((run.diverged or {}).get('step', run.last.get('step', 0)))


def groups(out: str, finals: Sequence[Final], budget: Budget) -> dict[str, Group]:
  """Per final with a seed scored or diverged: its `Group`."""
  result = {}
  for f in finals:
    losses, windows, docs, done, diverged = {}, {}, None, [], {}
    for seed in f.seeds_of(budget):
      found = _final(out, f.name, seed, budget)
      if not found:
        step = _diverged_at(out, f.name, seed)
        if step is not None:
          diverged[seed] = step
        continue
      if found[1] is None:
        continue
      run, scored = found
      losses[seed] = float(scored['loss'])
      windows[seed] = np.asarray(scored['window_losses'], np.float64).ravel()
      docs = np.asarray(scored['window_docs']).ravel()
      done.append(run)
    if not done:
      if diverged:
        result[f.name] = Group(f.name, {}, {}, None, 0.0, 0.0, 0.0, [], {}, diverged)
      continue
    mean = lambda key: float(np.mean([r.last.get(key) or 0.0 for r in done]))  # noqa: E731
    curves = [[(r['tokens'], r['eval_loss']) for r in run.metrics if 'eval_loss' in r]
              for run in done]
    keys = set.intersection(*[{k for k, v in r.last.items() if isinstance(v, (int, float))}
                              for r in done])
    result[f.name] = Group(f.name, losses, windows, docs, mean('bytes_sent'),
                           mean('bytes_received'), mean('peak_bytes'), curves,
                           {k: mean(k) for k in sorted(keys)}, diverged)
  return result


@dataclasses.dataclass(frozen=True)
class Comparison:
  """a against b paired by seed, and Welch. With a relative margin m the paired test is
  of the per-seed relative difference (a_s - b_s) / b_s - m, unit-free (the same number
  per byte and per token); without one (`relative=False`) of a_s - b_s - margin nats."""
  paired: stats.TTest | None
  welch: stats.TTest | None
  eval_se: float | None       # the eval windows' own SE of the mean difference,
                              # clustered by document (held-out text, not seeds)
  margin: float
  diverged_a: tuple[int, ...] = ()  # seeds where a diverged and b finished
  diverged_b: tuple[int, ...] = ()  # seeds where b diverged and a finished
  diverged_note: str = ''           # those seeds in words, with the finals' names
  relative: bool = False
  look: int = 1                     # the look of a sequential test (`sequential`)

  @property
  def ci(self) -> tuple[float, float] | None:
    test = self.paired or self.welch
    return test.ci if test else None

  def verdict(self) -> str:
    """Whether a - b < margin: from the paired test's CI (Welch without pairs).
    Where a diverged at a seed that b finished, a - b is not below any margin at that
    seed: 'not reproduced', whatever the other seeds say."""
    if self.diverged_a:
      return 'not reproduced'
    return 'inconclusive' if self.ci is None else stats.verdict(self.ci, claim='less')

  def text(self) -> str:
    test = self.paired or self.welch
    if test is None:
      return 'fewer than 2 seeds' + self.diverged_note
    extra = f'; Welch p = {self.welch.p:.3f}' if self.paired and self.welch else ''
    se = f'; eval SE {self.eval_se:.4f}' if self.eval_se is not None else ''
    if self.relative and self.paired:
      low, high = test.ci
      main = (f'{test.estimate:+.2%} [{low:+.2%}, {high:+.2%}] {test.level * 100:.3g}% CI '
              f'of (a - b) / b - {self.margin:.2%}, paired t({test.df:.3g}) = {test.t:.2f}')
    else:
      main = test.describe()
    return f'{main}{extra}{self.diverged_note}{se}'


def compare(a: Group, b: Group, margin: float = 0.0, *, relative: bool = False,
            level: float = 0.95) -> Comparison:
  """a - b - margin (nats), or with `relative` (a - b) / b - margin per seed: paired by
  seed over the seeds both finished (Welch over all they finished, as a - (1 + margin) b
  where relative); the seeds where one diverged and the other finished are kept apart.
  `level`: the CIs' level (a sequential test's looks use `LOOK_LEVEL`)."""
  shared = sorted(set(a.losses) & set(b.losses))
  if relative:
    paired = (stats.paired_t([a.losses[s] / b.losses[s] - 1 - margin for s in shared],
                             [0.0] * len(shared), level=level)
              if len(shared) >= 2 else None)
    welch = (stats.welch_t(a.values, b.values, ratio=1 + margin, level=level)
             if len(a.losses) >= 2 and len(b.losses) >= 2 else None)
  else:
    shift = lambda xs: [x - margin for x in xs]  # noqa: E731
    paired = (stats.paired_t(shift([a.losses[s] for s in shared]),
                             [b.losses[s] for s in shared], level=level)
              if len(shared) >= 2 else None)
    welch = (stats.welch_t(shift(a.values), b.values, level=level)
             if len(a.losses) >= 2 and len(b.losses) >= 2 else None)
  eval_se = None
  if shared and a.docs is not None and b.docs is not None and len(a.docs) == len(b.docs):
    wa = np.mean([a.windows[s] for s in shared], axis=0)
    wb = np.mean([b.windows[s] for s in shared], axis=0)
    if len(np.unique(a.docs)) >= 2:
      eval_se = stats.paired_clustered(wa, wb, a.docs)[1]
  only_a = tuple(sorted(set(a.diverged) & set(b.losses)))
  only_b = tuple(sorted(set(b.diverged) & set(a.losses)))
  note = ''.join(f'; {x.name} diverged at seed {", ".join(map(str, seeds))}, '
                 f'{y.name} did not' for x, y, seeds in ((a, b, only_a), (b, a, only_b))
                 if seeds)
  return Comparison(paired, welch, eval_se, margin, only_a, only_b, note, relative)


# ---- the sequential seed rule ---------------------------------------------------------
#
# A comparison is looked at twice: at the first seeds (Budget.seeds), and where its CI
# there straddles the margin (neither side decided), again at those and the extra seeds
# (`extra_seeds`). Looking twice at a 95% CI would let the claim through at the margin
# 4.3% of the time instead of 2.5% (3 then 5 seeds); each look's CI is therefore at
# LOOK_LEVEL, Pocock's constant-level boundary for these two looks, found by simulation
# (`python scripts/protocol_rates.py` prints it: 2.48% passed and 2.50% refuted at the
# margin, from 200,000 simulated comparisons; tests/test_study.py checks it).

LOOK_ALPHA = 0.014                  # one-sided, per look
LOOK_LEVEL = 1 - 2 * LOOK_ALPHA     # the CI of each look: 97.2%
MORE_SEEDS = 2


def two_look_rates(d: np.ndarray, alpha: float = LOOK_ALPHA) -> tuple[np.ndarray, np.ndarray]:
  """The two-look rule on many simulated comparisons at once: `d` holds per-seed
  differences minus the margin, a row per comparison (its columns: the first 3 seeds,
  then the extra ones). Returns (accepted, refuted) per row: the claim's side decided at
  the first look, or at the second where the first straddled. Each look's CI is at
  1 - 2 alpha (`sequential` on Groups decides alike; tests/test_study.py holds them equal)."""
  def ci(x):
    n = x.shape[1]
    half = stats.t_critical(n - 1, 1 - 2 * alpha) * x.std(1, ddof=1) / math.sqrt(n)
    return x.mean(1) - half, x.mean(1) + half
  first = len(d[0]) - MORE_SEEDS
  lo1, hi1 = ci(d[:, :first])
  go_on = (hi1 >= 0) & (lo1 <= 0)
  lo2, hi2 = ci(d)
  return (hi1 < 0) | (go_on & (hi2 < 0)), (lo1 > 0) | (go_on & (lo2 > 0))


def extra_seeds(budget: Budget) -> tuple[int, ...]:
  """The seeds a comparison whose first look straddles its margin adds."""
  last = max(budget.seeds)
  return tuple(range(last + 1, last + 1 + MORE_SEEDS))


def sequential(a: Group, b: Group, budget: Budget, margin: float = 0.0, *,
               relative: bool = False) -> Comparison:
  """a against b by the two-look rule: the first seeds' comparison where it decides
  (its CI on one side of the margin, or a diverged where b finished), else every seed's
  once the extra seeds are in (until then the first look, undecided)."""
  first = set(budget.seeds)
  look1 = compare(a.restrict(first), b.restrict(first), margin, relative=relative,
                  level=LOOK_LEVEL)
  if look1.verdict() != 'inconclusive':
    return look1
  every = first | set(extra_seeds(budget))
  done = lambda g: {*g.losses, *g.diverged} >= every  # noqa: E731
  if not (done(a) and done(b)):
    return look1
  look2 = compare(a.restrict(every), b.restrict(every), margin, relative=relative,
                  level=LOOK_LEVEL)
  return dataclasses.replace(look2, look=2)


def straddles(a: Group, b: Group, budget: Budget, margin: float = 0.0, *,
              relative: bool = False) -> bool:
  """Whether the first look at a against b leaves the claim undecided (its finals then
  train the extra seeds). Only the first seeds decide, so the answer does not move
  once the extra seeds exist; False until both have two first seeds."""
  first = set(budget.seeds)
  ra, rb = a.restrict(first), b.restrict(first)
  if len(set(ra.losses) & set(rb.losses)) < 2 and not (set(ra.diverged) & set(rb.losses)):
    return False
  return compare(ra, rb, margin, relative=relative, level=LOOK_LEVEL).verdict() == \
      'inconclusive'


def seconds_to(curves: Sequence[Sequence[tuple[float, float]]], target: float
               ) -> list[float | None]:
  """Per curve [(x, loss)]: the first x at which the loss reaches `target` (linear
  between evals), None if never."""
  return [stats.time_to_target([x for x, _ in c], [y for _, y in c], target)
          for c in curves]


def read_seconds(clock: str, default: float) -> float:
  """The run time a study keeps in `clock` (seconds summed over the invocations that
  trained); `default` if there is none yet.

  Raises:
    LocoError: the file is not a number (one line naming it).
  """
  text = runs_lib.read_text(clock)
  if text is None:
    return default
  try:
    return float(text)
  except ValueError:
    raise LocoError(f'{clock} is damaged ({text[:40]!r} is not a number of seconds); '
                    'delete it to count the time from this invocation on.') from None


def add_seconds(clock: str, seconds: float) -> float:
  """Adds this invocation's `seconds` to the study's clock file (written atomically);
  returns the total."""
  total = read_seconds(clock, 0.0) + seconds
  runs_lib.write_atomic(clock, str(total))
  return total


def tuning_table(picks: Mapping[str, Any], tune_seed: int, check_seed: int | None,
                 skip: Collection[str] = ()) -> list[str]:
  """A page's tuning table: per method every setting tried with its loss, the pick, the
  check seed's runs (the pick and its neighbour), what was passed over or flagged, and
  the knobs still at an edge. `skip`: names left out (families)."""
  rows = [f'| method | settings tried (final eval loss, seed {tune_seed}, tuning split) | '
          f'pick | at seed {check_seed}: the pick and its neighbour | passed over, flag | '
          'still at an edge |', '|---|---|---|---|---|---|']
  for name, p in picks.items():
    if name in skip:
      continue
    grid = ', '.join(f'{label}: {loss:.4f}' for label, loss in p['grid'])
    check = ', '.join(f'{label}: {loss:.4f}' for label, loss in p.get('check', {}).items())
    risk = '; '.join(x for x in (', '.join(p.get('passed', [])), p.get('flag', '')) if x)
    if check_seed is None:
      check = 'no check seed'
    rows.append(f'| {name} | {grid} | {p["label"]} | {check or "—"} | {risk or "—"} | '
                f'{", ".join(p.get("edge", [])) or "—"} |')
  return rows


# ---- what a study cost ---------------------------------------------------------------

UNIT_TOKENS = 1050 * 8 * 4 * 64     # one M = 8 micro run of 1,050 steps (4 x 64 per worker)


def run_units(overrides: Mapping[str, Any]) -> float:
  """A run's tokens in units of UNIT_TOKENS (on 2 cores tokens decide a run's cost)."""
  return (overrides['steps'] * overrides.get('num_workers', 8) *
          overrides.get('batch_per_worker', 4) * overrides.get('seq_len', 64) / UNIT_TOKENS)


def _finished_statuses(folder: str) -> list[dict[str, Any]]:
  """The status.json of every finished run under `folder`."""
  found = (runs_lib.read_json_object(path) or {} for path in
           glob.glob(os.path.join(folder, '**', 'status.json'), recursive=True))
  return [s for s in found if s.get('state') == 'finished']


def _here(status: Mapping[str, Any]) -> bool:
  """Whether a run trained on this machine: its status.json names this host, or none (a
  sweep before hosts were recorded)."""
  return status.get('host') in (None, sweep_lib.host())


def programs(folder: str) -> list[tuple[float, float]]:
  """(units, seconds) per finished program under `folder` (a batch of runs is one)."""
  return _programs(_finished_statuses(folder))


def _programs(statuses: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
  found: dict[tuple, tuple[float, float]] = {}
  for s in statuses:
    if 'steps' not in (s.get('overrides') or {}):
      continue
    key = tuple(s['batch']) if s.get('batch') else (s.get('name'),)
    u, secs = found.get(key, (0.0, 0.0))
    found[key] = (u + run_units(s['overrides']), max(secs, float(s.get('seconds') or 0.0)))
  return list(found.values())


def in_flight(folder: str) -> float:
  """Wall seconds during which some finished run under `folder` was training: the union
  of their [start, end] (status.json), pauses and other work on the machine included.
  Read from the runs, it spans every invocation that trained them."""
  return _in_flight(_finished_statuses(folder))


def _in_flight(statuses: Sequence[Mapping[str, Any]]) -> float:
  spans = []
  for s in statuses:
    try:
      start, end = (datetime.datetime.fromisoformat(s[k]).timestamp()
                    for k in ('start', 'end'))
    except (KeyError, TypeError, ValueError):
      continue
    if end >= start:
      spans.append((start, end))
  total, reach = 0.0, -math.inf
  for start, end in sorted(spans):
    total += max(0.0, end - max(start, reach))
    reach = max(reach, end)
  return total


def cost(out: str) -> dict[str, Any]:
  """What OUT's finished runs cost on this machine: their units, the median seconds per
  unit over the programs (robust to a program slowed by a pause or by other work beside
  it), and the wall seconds they were in flight (`in_flight`). Runs another machine
  trained (status.json's `host`, `loco.lab.sweep.host`) are counted apart under
  `elsewhere`, {host: {tuning, finals, in_flight}}: their seconds are not this
  machine's."""
  tune_s, final_s = (_finished_statuses(os.path.join(out, d)) for d in ('tune', 'final'))
  of = lambda host, statuses: [  # noqa: E731  (None: this machine's)
      s for s in statuses if (None if _here(s) else s['host']) == host]
  units = lambda found: sum(u for u, _ in found)  # noqa: E731
  tune, final = _programs(of(None, tune_s)), _programs(of(None, final_s))
  every = [(u, secs) for u, secs in tune + final if u > 0]
  per_unit = float(np.median([secs / u for u, secs in every])) if every else math.nan
  hosts = sorted({s['host'] for s in tune_s + final_s if not _here(s)})
  elsewhere = {h: dict(tuning=units(_programs(of(h, tune_s))),
                       finals=units(_programs(of(h, final_s))),
                       in_flight=_in_flight(of(h, tune_s + final_s))) for h in hosts}
  return dict(programs=len(every), per_unit=per_unit, tuning=units(tune),
              finals=units(final), in_flight=_in_flight(of(None, _finished_statuses(out))),
              elsewhere=elsewhere)


@contextlib.contextmanager
def clocked(clock: str, on: bool = True):
  """Adds the block's wall time to the study's clock file when it ends, also when it is
  interrupted (the time was spent); nothing with `on=False`."""
  t0 = time.time()
  try:
    yield
  finally:
    if on:
      add_seconds(clock, time.time() - t0)


def run_all(out: str, methods: Sequence[Method], finals: Sequence[Final], budget: Budget,
            parallel: int = 1, retimes: Mapping[str, Mapping[str, Any]] | None = None,
            train: bool = True, batch_runs: int = 1, retimed: Sequence[str] | None = None,
            families: Mapping[str, Sequence[str]] | None = None
            ) -> tuple[dict[str, Any], dict[str, Group]]:
  """Tunes, runs the finals, scores them; returns (picks, groups). With `train=False`
  nothing trains and the finished finals are scored (a page of what is done so far).
  `batch_runs`: runs that differ only in seed or lr train up to this many in one program
  (`loco.sweep`). `retimes` ({name: network keys}) re-time the finished synchronous finals named in
  `retimed` (all if None) on each network (`loco.retime`). `families` (name -> methods):
  a final may name a family for its best-tuned member (`add_families`)."""
  picks = tune(out, methods, budget, parallel, train, batch_runs, finals, families)
  runs = final_runs(methods, finals, budget, picks, out)
  old = stale(runs, os.path.join(out, 'final'))
  if old:
    raise LocoError(f'{len(old)} finished finals in {os.path.join(out, "final")} were '
                    f'trained with other keys than the picks now give ({", ".join(old[:3])}'
                    f'{", ..." if len(old) > 3 else ""}): a pick moved since. Delete them '
                    'to retrain them, or give another --out.')
  if train:
    code = run_sweep(runs, os.path.join(out, 'final'), parallel, report=False,
                     batch_runs=batch_runs)
    if code == 130:
      raise KeyboardInterrupt
    if retimes:
      chosen = [r for r in runs if retimed is None or r.name.split('/')[0] in retimed]
      retime_runs(chosen, os.path.join(out, 'final'), dict(retimes),
                  lambda text: print(text, flush=True))
  score_finals(out, finals, budget)   # the finished ones, also when nothing trains
  return picks, groups(out, finals, budget)

