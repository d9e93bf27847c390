"""The claims page: the seed papers' claims tested at equal tokens and tuning budgets.

  python -m launch.claims --out=runs/claims                 # writes docs/claims.md
  python -m launch.claims --quick --out=runs/claims_quick   # the pipeline, end to end

Every method of a comparison gets the same tuning budget: three settings of its own
main knob (outer lr x momentum for the outer optimizers, the gossip step for D-AdamW,
the inner lr for the methods without an outer setting), each trained once (seed 0) and
scored on the first half of the validation split. The best setting per method (lowest
final eval loss) is then run at seeds 1, 2, 3 and scored on the other half; claims are
judged on those finals as mean +- std over the seeds, each final model scored on the
same 512 x 16 windows of the final split (`loco.evaluate`; 524k tokens). Variants
(dropout, E3M0 outer gradients, other graphs, an asynchronous replay) reuse their
method's pick. Verdicts compare means with two standard errors of the difference (the
seeds' spread, sqrt(s_a^2/n + s_b^2/n), and the evaluation's own from the paired
per-window losses): "reproduced" if the claim holds by more than that, "not reproduced"
if its opposite does, "inconclusive" otherwise.

Scale (`SCALES`): the micro model (experiments/micro.py), 8 workers x 4 sequences x 64
tokens per step, 600 steps = 40 rounds of H = 15 (claims at one step per communication:
300 steps). Runs are `loco.sweep` runs under OUT/tune and OUT/final: the same command
resumes after an interruption and skips what is finished; the page is rewritten from
the runs each time. `--quick` is the same pipeline with 36-step runs, two settings per
method and two seeds (a pipeline check, not evidence); it writes OUT/claims.md.
"""

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

from loco import evaluate
from loco import report
from loco import stats
from loco.metrics import read_metrics
from loco.sweep import Run, SweepError, run_sweep
from loco.workdir import read_json
from loco.errors import LocoError

BASE = 'experiments/micro.py:ddp'      # no algorithm keys set: any algorithm on top
TUNING_SPLIT, FINAL_SPLIT = 'validation[:50%]', 'validation[50%:]'
PAGE = os.path.join('docs', 'claims.md')
FIGURES = os.path.join('docs', 'figures', 'claims')
COMMAND = 'python -m launch.claims --out=runs/claims'

# The heterogeneous network of claim 9 (tiny_hetero.py's): 1 Gbit/s links with 10 ms
# latency, every link of 2 of the 8 workers 100x slower, 0.1 s per inner step.
SLOW_LINKS = {'network.profile': 'slow_links', 'network.slow_workers': 2,
              'network.slow_factor': 100.0, 'network.bandwidth': 1.25e8,
              'network.latency': 0.01, 'network.step_seconds': 0.1}


@dataclasses.dataclass(frozen=True)
class Scale:
  steps: int                  # steps of a run with H > 1
  steps_h1: int               # steps of a run at one step per communication
  sync_every: int             # H
  eval_every: int
  eval_batches: int
  grid_size: int | None       # settings per method (None: all)
  seeds: tuple[int, ...]
  final_eval_batches: int     # the finals' scoring (`loco.evaluate`): batches of 16


SCALES = {
    'full': Scale(steps=600, steps_h1=300, sync_every=15, eval_every=150, eval_batches=32,
                  grid_size=None, seeds=(1, 2, 3), final_eval_batches=512),
    'quick': Scale(steps=36, steps_h1=24, sync_every=6, eval_every=12, eval_batches=4,
                   grid_size=2, seeds=(1, 2), final_eval_batches=16),
}


def _common(scale: Scale) -> dict[str, Any]:
  return {'seq_len': 64, 'optimizer.warmup_steps': min(100, scale.steps // 6),
          'eval.batches': scale.eval_batches, 'eval.batch_size': 16, 'eval.per_worker': False,
          'log_every': scale.sync_every, 'checkpoint.every': scale.steps // 2,
          'progress': False}


@dataclasses.dataclass(frozen=True)
class Method:
  """A method of some comparison: its keys and its tuning grid (equal sizes)."""
  name: str
  keys: dict[str, Any]
  grid: tuple[dict[str, Any], ...]
  h1: bool = False            # one step per communication: the shorter runs


def _outer(lr_mu):
  return tuple({'algorithm.outer_lr': lr, 'algorithm.outer_momentum': mu} for lr, mu in lr_mu)


NESTEROV_GRID = _outer([(0.5, 0.5), (0.7, 0.5), (0.7, 0.9)])
H1_OUTER_GRID = _outer([(0.5, 0.5), (0.7, 0.5), (1.0, 0.5)])
INNER_LR_GRID = tuple({'optimizer.lr': lr} for lr in (1.5e-3, 3e-3, 6e-3))


def methods(scale: Scale) -> dict[str, Method]:
  h = scale.sync_every
  diloco = {'algorithm.name': 'diloco', 'algorithm.sync_every': h}
  gasloc = {'algorithm.name': 'gasloc', 'algorithm.topology': 'ring',
            'algorithm.weights': 'metropolis', 'algorithm.mix': 'models',
            'algorithm.outer_optimizer': 'nesterov'}
  pp = {**gasloc, 'algorithm.form': 'proposed_points', 'algorithm.gossip_step': 1.0}
  out = [
      Method('ddp', {}, ({},)),
      Method('diloco_nesterov', {**diloco, 'algorithm.outer_optimizer': 'nesterov'},
             NESTEROV_GRID),
      Method('diloco_sgd', {**diloco, 'algorithm.outer_optimizer': 'sgd',
                            'algorithm.outer_momentum': 0.0},
             tuple({'algorithm.outer_lr': lr} for lr in (0.7, 1.0, 1.3))),
      Method('streaming', {'algorithm.name': 'streaming_diloco', 'algorithm.sync_every': h,
                           'algorithm.num_fragments': 2, 'algorithm.fragment_pattern': 'strided',
                           'algorithm.non_block': 'own', 'algorithm.overlap_steps': 1,
                           'algorithm.merge_alpha': 0.5, 'algorithm.compression': 'none',
                           'algorithm.eager': False, 'algorithm.outer_optimizer': 'nesterov'},
             NESTEROV_GRID),
      Method('sparseloco', {'algorithm.name': 'sparseloco', 'algorithm.sync_every': h,
                            'algorithm.error_decay': 0.95, 'algorithm.topk': 64,
                            'algorithm.chunk_size': 4096, 'algorithm.compression': '2bit',
                            'algorithm.aggregation': 'contributors'},
             tuple({'algorithm.outer_lr': lr} for lr in (0.7, 1.0, 1.3))),
      Method('gasloc', {**gasloc, 'algorithm.sync_every': h}, NESTEROV_GRID),
      Method('gasloc_pp', {**pp, 'algorithm.sync_every': h}, NESTEROV_GRID),
      # One step per communication (claim 7), tuned on the ring.
      Method('gasloc_h1', {**gasloc, 'algorithm.sync_every': 1}, H1_OUTER_GRID, h1=True),
      Method('gasloc_pp_h1', {**pp, 'algorithm.sync_every': 1}, H1_OUTER_GRID, h1=True),
      Method('dadamw', {'algorithm.name': 'dsgd', 'algorithm.topology': 'ring',
                        'algorithm.weights': 'metropolis'},
             tuple({'algorithm.gossip_step': g} for g in (0.25, 0.5, 1.0)), h1=True),
      Method('adpsgd', {'algorithm.name': 'adpsgd', 'algorithm.topology': 'ring'},
             INNER_LR_GRID, h1=True),
      Method('a2cid2', {'algorithm.name': 'a2cid2', 'algorithm.topology': 'ring'},
             INNER_LR_GRID, h1=True),
      Method('noloco_h1', {'algorithm.name': 'noloco', 'algorithm.sync_every': 1,
                           'algorithm.topology': 'ring', 'algorithm.outer_momentum': 0.5},
             tuple({'algorithm.outer_lr': lr} for lr in (0.5, 0.7, 1.0)), h1=True),
  ]
  return {m.name: m for m in out}


H1_METHODS = ('gasloc_h1', 'gasloc_pp_h1', 'dadamw', 'adpsgd', 'a2cid2', 'noloco_h1')
GRAPHS = ('ring', 'torus', 'exponential')


@dataclasses.dataclass(frozen=True)
class Final:
  """A final: a method at its pick, with some keys changed (a variant), over seeds."""
  name: str
  method: str
  keys: dict[str, Any] = dataclasses.field(default_factory=dict)


def finals() -> list[Final]:
  out = [Final(m, m) for m in ('ddp', 'diloco_nesterov', 'diloco_sgd', 'streaming',
                               'sparseloco', 'gasloc', 'gasloc_pp')]
  out += [Final(f'diloco_nesterov_drop{p}', 'diloco_nesterov',
                {'network.profile': 'homogeneous', 'network.dropout': p / 100})
          for p in (25, 50)]
  out.append(Final('diloco_nesterov_e3m0', 'diloco_nesterov',
                   {'algorithm.compression': 'e3m0'}))
  asynchronous = {**SLOW_LINKS, 'network.mode': 'async', 'algorithm.topology': 'matching'}
  out.append(Final('gasloc_async', 'gasloc', asynchronous))
  # Each worker waits for a random peer instead of taking whoever is ready, so that the
  # workers behind slow links are not left to pair only with each other.
  out.append(Final('gasloc_async_sampled', 'gasloc',
                   {**asynchronous, 'network.peer_choice': 'sampled'}))
  out += [Final(f'{m}_{g}', m, {'algorithm.topology': g}) for m in H1_METHODS for g in GRAPHS]
  return out


def _label(setting: dict[str, Any]) -> str:
  return '_'.join(f'{k.split(".")[-1]}{v}' for k, v in setting.items()) or 'default'


def _grid(method: Method, scale: Scale):
  return method.grid[:scale.grid_size] if scale.grid_size else method.grid


def _keys(method: Method, scale: Scale) -> dict[str, Any]:
  return {**_common(scale), 'steps': scale.steps_h1 if method.h1 else scale.steps,
          'eval.every': scale.eval_every, **method.keys}


def tuning_runs(scale: Scale) -> list[Run]:
  return [Run(f'{m.name}/{_label(s)}', BASE,
              {**_keys(m, scale), **s, 'data.eval_split': TUNING_SPLIT, 'seed': 0})
          for m in methods(scale).values() for s in _grid(m, scale)]


def picks(out: str, scale: Scale) -> dict[str, dict[str, Any]]:
  """method -> {setting, label, loss (seed 0, tuning split), grid: [(label, loss)]}."""
  runs = {r.name: r for r in tuning_runs(scale)}
  rows = {r['name']: r for r in report.summarize(
      [os.path.join(out, 'tune', n) for n in runs], names=list(runs))}
  result = {}
  for m in methods(scale).values():
    grid = [(s, _label(s), rows[f'{m.name}/{_label(s)}']) for s in _grid(m, scale)]
    unfinished = [label for _, label, row in grid if row['status'] != 'finished']
    if any(row['status'] == 'incomplete' for _, _, row in grid):
      raise SweepError(f'the tuning runs of {m.name} ({", ".join(unfinished)}) are not '
                       f'finished in {out}/tune.')
    scored = [(s, label, row['final_eval_loss']) for s, label, row in grid
              if row['status'] == 'finished']
    if not scored:
      raise SweepError(f'every tuning run of {m.name} failed or diverged in {out}/tune.')
    best = min(scored, key=lambda x: x[2])
    result[m.name] = dict(setting=best[0], label=best[1], loss=best[2],
                          grid=[(label, row['final_eval_loss'] if row['status'] == 'finished'
                                 else row['status']) for _, label, row in grid])
  return result


def final_runs(scale: Scale, chosen: dict[str, dict[str, Any]]) -> list[Run]:
  ms = methods(scale)
  return [Run(f'{f.name}/seed{seed}', BASE,
              {**_keys(ms[f.method], scale), **chosen[f.method]['setting'], **f.keys,
               'data.eval_split': FINAL_SPLIT, 'seed': seed})
          for f in finals() for seed in scale.seeds]


# ---- results --------------------------------------------------------------------------

@dataclasses.dataclass
class Group:
  """One final over its seeds."""
  name: str
  losses: list[float]          # per seed: the final model on FINAL_EVAL windows
  eval_se: float               # mean over seeds of that evaluation's standard error
  bytes_sent: float            # per worker, mean over seeds
  peak_bytes: float
  curves: list[list[tuple[float, float]]]     # per seed: (tokens, eval loss) while training
  per_batch: list[float] | None = None        # per eval batch: the mean over seeds

  @property
  def mean(self) -> float:
    return statistics.mean(self.losses)

  @property
  def std(self) -> float:
    return statistics.stdev(self.losses) if len(self.losses) > 1 else math.nan

  def text(self) -> str:
    return f'{self.mean:.4f} ± {self.std:.4f}'


def score_finals(out: str, scale: Scale) -> None:
  """Scores every finished final on `scale.final_eval_batches` fixed windows of
  FINAL_SPLIT (`loco.evaluate`; kept in RUN/evals, redone only after more training)."""
  for f in finals():
    for seed in scale.seeds:
      d = os.path.join(out, 'final', f.name, f'seed{seed}')
      if (report.read_status(d) or {}).get('state') != 'finished':
        continue
      path = evaluate.result_path(d, FINAL_SPLIT, scale.final_eval_batches, 16)
      last = read_metrics(d)[-1]['step']
      if (read_json(path) or {}).get('step') != last:
        evaluate.evaluate_run(d, scale.final_eval_batches, 16, FINAL_SPLIT)


def groups(out: str, scale: Scale) -> dict[str, Group]:
  result = {}
  for f in finals():
    dirs = [os.path.join(out, 'final', f.name, f'seed{s}') for s in scale.seeds]
    rows = report.summarize(dirs, names=[f'{f.name}/seed{s}' for s in scale.seeds])
    scored = [read_json(evaluate.result_path(d, FINAL_SPLIT, scale.final_eval_batches,
                                                    16)) for d in dirs]
    done = [(d, r, e) for d, r, e in zip(dirs, rows, scored)
            if r['status'] == 'finished' and e and e.get('step') == r['step']]
    if not done:
      continue
    curves = [[(r['tokens'], r['eval_loss']) for r in read_metrics(d) if 'eval_loss' in r]
              for d, _, _ in done]
    per_batch = [statistics.mean(b) for b in zip(*(e['per_batch'] for _, _, e in done))]
    result[f.name] = Group(f.name, [e['loss'] for _, _, e in done],
                           statistics.mean(e['se'] for _, _, e in done),
                           statistics.mean(r['bytes_sent'] or 0.0 for _, r, _ in done),
                           statistics.mean(r['peak_bytes'] or 0.0 for _, r, _ in done),
                           curves, per_batch)
  return result


def compare(a: Group, b: Group, margin: float = 0.0) -> tuple[float, float]:
  """(mean(a) - (1 + margin) mean(b), two standard errors of that difference): the
  seeds' spread (sqrt(s_a^2/n_a + s_b^2/n_b)) and, when both were scored on the same
  windows, the evaluation's own, from the paired per-batch differences."""
  var = a.std ** 2 / len(a.losses) + ((1 + margin) * b.std) ** 2 / len(b.losses)
  if a.per_batch and b.per_batch and len(a.per_batch) == len(b.per_batch) > 1:
    var += _paired(a.per_batch, [(1 + margin) * x for x in b.per_batch])[1] ** 2
  return a.mean - (1 + margin) * b.mean, 2 * math.sqrt(var)


def verdict_at_most(a: Group, b: Group, margin: float = 0.0) -> tuple[str, str]:
  """Is mean(a) <= (1 + margin) mean(b)? (verdict, reason)."""
  d, two_se = compare(a, b, margin)
  if not math.isfinite(two_se):
    return 'inconclusive', 'one seed only'
  rel = f'{a.name} - {1 + margin:g} x {b.name} = {d:+.4f} (2 SE {two_se:.4f})'
  if d < -two_se:
    return 'reproduced', rel
  if d > two_se:
    return 'not reproduced', rel
  return 'inconclusive', rel + ': within noise'


# ---- the claims -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Claim:
  number: int
  statement: str
  source: str
  finals: tuple[str, ...]           # plotted and tabled
  judge: Callable[[dict[str, Group], dict[str, Any]], tuple[str, str, str]]
  x: str = 'tokens'                 # 'tokens' or 'sim_seconds'


def _need(g, *names):
  missing = [n for n in names if n not in g]
  if missing:
    raise KeyError(', '.join(missing))
  return [g[n] for n in names]


def _matches(name: str, reference: str, measured: Callable[[Group, Group], str]):
  """A judge: is final `name` within 2% of `reference` (or better)?"""
  def judge(g, _ctx):
    ref, a = _need(g, reference, name)
    return (measured(ref, a), *verdict_at_most(a, ref, 0.02))
  return judge


def _fewer(ref: Group, a: Group, field: str = 'bytes_sent') -> str:
  return f'{getattr(ref, field) / max(getattr(a, field), 1.0):.1f}x'


_judge_1 = _matches('diloco_nesterov', 'ddp', lambda ddp, dil: (
    f'DDP {ddp.text()}; DiLoCo {dil.text()} ({dil.mean / ddp.mean - 1:+.1%}) with '
    f'{_fewer(ddp, dil)} fewer bytes'))
_judge_4 = _matches('streaming', 'diloco_nesterov', lambda dil, st: (
    f'DiLoCo {dil.text()}; Streaming (2 fragments) {st.text()}; peak bytes per step '
    f'{_fewer(dil, st, "peak_bytes")} lower'))
_judge_5 = _matches('diloco_nesterov_e3m0', 'diloco_nesterov', lambda dil, q: (
    f'float32 {dil.text()}; E3M0 {q.text()} with {_fewer(dil, q)} fewer bytes'))
_judge_6 = _matches('sparseloco', 'diloco_nesterov', lambda dil, sp: (
    f'DiLoCo {dil.text()}; SparseLoCo (top-64 of 4096 = 1.6%, 2-bit) {sp.text()} with '
    f'{_fewer(dil, sp)} fewer bytes'))


def _judge_2(g, _ctx):
  nes, sgd = _need(g, 'diloco_nesterov', 'diloco_sgd')
  verdict, why = verdict_at_most(nes, sgd)
  return f'Nesterov {nes.text()}; SGD {sgd.text()}', verdict, why


def _judge_3(g, _ctx):
  d0, d25, d50 = _need(g, 'diloco_nesterov', 'diloco_nesterov_drop25',
                       'diloco_nesterov_drop50')
  v25, w25 = verdict_at_most(d25, d0, 0.02)
  v50, w50 = verdict_at_most(d50, d0, 0.05)
  verdicts = {v25, v50}
  verdict = ('reproduced' if verdicts == {'reproduced'} else 'not reproduced'
             if 'not reproduced' in verdicts else 'inconclusive')
  return (f'0%: {d0.text()}; 25%: {d25.text()}; 50%: {d50.text()}', verdict,
          f'graceful = within 2% at 25% and 5% at 50% dropout. {w25}; {w50}')


def _form(ctx, pair: tuple[str, str]) -> str:
  """The GASLoC form whose best setting scored lower on the tuning split."""
  return min(pair, key=lambda m: ctx['picks'][m]['loss'])


def _judge_7(g, ctx):
  form = _form(ctx, ('gasloc_h1', 'gasloc_pp_h1'))
  cells, results = [], []
  for graph in GRAPHS:
    gasloc = _need(g, f'{form}_{graph}')[0]
    for b in ('dadamw', 'adpsgd', 'a2cid2', 'noloco_h1'):
      v, _ = verdict_at_most(gasloc, _need(g, f'{b}_{graph}')[0])
      results.append(v)
      cells.append(f'{graph} vs {b}: {v}')
  counts = {v: results.count(v) for v in ('reproduced', 'inconclusive', 'not reproduced')}
  verdict = ('reproduced' if counts['reproduced'] == len(results) else 'not reproduced'
             if counts['not reproduced'] else 'inconclusive')
  return (f'{form} (the form chosen on the tuning split) won {counts["reproduced"]} of '
          f'{len(results)} (graph, baseline) pairs beyond 2 SE and lost '
          f'{counts["not reproduced"]} (table below)', verdict, '; '.join(cells))


def _judge_8(g, ctx):
  dil, rec, pp = _need(g, 'diloco_nesterov', 'gasloc', 'gasloc_pp')
  form = _form(ctx, ('gasloc', 'gasloc_pp'))
  verdict, why = verdict_at_most(g[form], dil, 0.02)
  return (f'DiLoCo {dil.text()}; GASLoC reconstruction {rec.text()}; GASLoC proposed '
          f'points {pp.text()} ({form} chosen on the tuning split)', verdict, why)


def _judge_9(g, ctx):
  times = ctx['times']
  if not times:
    raise KeyError('re-timed runs')
  dil = times['diloco_nesterov']
  text = lambda n: (f'{times[n].mean:.1f} ± {times[n].std:.1f}' if n in times  # noqa: E731
                    else 'never (some seed)')
  measured = (f'simulated seconds to eval {times["_target"]:.3f} on slow links: DiLoCo '
              f'{text("diloco_nesterov")}; asynchronous GASLoC {text("gasloc_async")} '
              f'(with sampled peers: {text("gasloc_async_sampled")}); '
              f'synchronous, re-timed: GASLoC {text("gasloc")}, proposed points '
              f'{text("gasloc_pp")}')
  if 'gasloc_async' not in times:
    return (measured, 'not reproduced', 'asynchronous GASLoC does not reach the loss that '
            'every synchronous run reaches within the same tokens')
  return (measured, *verdict_at_most(times['gasloc_async'], dil))


CLAIMS = (
    Claim(1, 'DiLoCo reaches DDP\'s loss (within 2%) at equal tokens with H x fewer bytes.',
          '2311.08105', ('ddp', 'diloco_nesterov'), _judge_1),
    Claim(2, 'A Nesterov outer optimizer beats SGD / FedAvg outer.', '2311.08105, ablation',
          ('diloco_nesterov', 'diloco_sgd'), _judge_2),
    Claim(3, 'DiLoCo degrades gracefully when workers drop out (0 / 25 / 50%).',
          '2311.08105', ('diloco_nesterov', 'diloco_nesterov_drop25', 'diloco_nesterov_drop50'),
          _judge_3),
    Claim(4, 'Streaming DiLoCo matches DiLoCo\'s loss with P x lower peak bandwidth.',
          '2501.18512', ('diloco_nesterov', 'streaming'), _judge_4),
    Claim(5, '4-bit (E3M0) outer gradients cost no loss.', '2501.18512',
          ('diloco_nesterov', 'diloco_nesterov_e3m0'), _judge_5),
    Claim(6, 'SparseLoCo at 1-3% density with 2-bit values matches or beats DiLoCo.',
          '2508.15706', ('diloco_nesterov', 'sparseloco'), _judge_6),
    Claim(7, 'GASLoC beats D-AdamW, AD-PSGD, A2CiD2 and NoLoCo at one step per '
          'communication on ring, torus and exponential graphs.', '2606.11081',
          tuple(f'{m}_{g}' for g in GRAPHS for m in H1_METHODS), _judge_7),
    Claim(8, 'GASLoC with multiple local steps is competitive with DiLoCo (within 2%).',
          '2606.11081', ('diloco_nesterov', 'gasloc', 'gasloc_pp'), _judge_8),
    Claim(9, 'Under heterogeneous bandwidth, GASLoC reaches a target loss significantly '
          'sooner in simulated time than DiLoCo.', '2606.11081',
          ('diloco_nesterov', 'gasloc', 'gasloc_pp', 'gasloc_async', 'gasloc_async_sampled'),
          _judge_9,
          x='sim_seconds'),
)


def seconds_to(curve: Sequence[tuple[float, float]], target: float) -> float:
  """Simulated seconds at which an eval curve [(seconds, loss)] first reaches `target`,
  linear between evals (from (0, the first loss) before the first one); inf if never."""
  previous = (0.0, curve[0][1]) if curve else None
  for seconds, loss in curve:
    if loss <= target:
      (s0, l0) = previous
      return seconds if l0 <= loss else s0 + (seconds - s0) * (l0 - target) / (l0 - loss)
    previous = (seconds, loss)
  return math.inf


def times_to_target(out: str, scale: Scale, g: dict[str, Group]) -> dict[str, Any]:
  """Claim 9: per final, simulated seconds on SLOW_LINKS (the synchronous runs re-timed,
  the asynchronous one as it ran) to the highest final eval loss of the synchronous runs
  (as logged while training), which each of those reaches; '_target': that loss, and
  '_unreached': the finals of which some seed never reaches it."""
  curves = {n: sim_curves(out, scale, n) for n in CLAIMS[8].finals if n in g}
  if not curves.get('diloco_nesterov') or not all(curves.values()):
    return {}
  target = max(c[-1][1] for n, cs in curves.items() if not _asynchronous(n)
               for c in cs)
  result: dict[str, Any] = {'_target': target, '_unreached': []}
  for n, cs in curves.items():
    seconds = [seconds_to(c, target) for c in cs]
    if all(math.isfinite(x) for x in seconds):
      result[n] = Group(n, seconds, math.nan, 0.0, 0.0, [])
    else:
      result['_unreached'].append(n)
  return result


def _asynchronous(name: str) -> bool:
  return name.startswith('gasloc_async')


def sim_curves(out: str, scale: Scale, name: str) -> list[list[tuple[float, float]]]:
  curves = []
  for s in scale.seeds:
    d = os.path.join(out, 'final', name, f'seed{s}')
    if not _asynchronous(name):
      d = os.path.join(d, 'retimed', 'slow_links')
    if os.path.exists(os.path.join(d, 'metrics.jsonl')):
      curves.append([(r['sim_seconds'], r['eval_loss']) for r in read_metrics(d)
                     if 'eval_loss' in r])
  return curves


def plot(claim: Claim, g: dict[str, Group], out: str, scale: Scale, path: str) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  panels = [(graph, [n for n in claim.finals if n.endswith('_' + graph)])
            for graph in GRAPHS] if claim.number == 7 else [('', list(claim.finals))]
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
  for ax, (title, names) in zip(axes[0], panels):
    for n in names:
      curves = sim_curves(out, scale, n) if claim.x == 'sim_seconds' else (
          g[n].curves if n in g else [])
      if not curves:
        continue
      length = min(len(c) for c in curves)
      xs = [statistics.mean(c[i][0] for c in curves) for i in range(length)]
      ys = [statistics.mean(c[i][1] for c in curves) for i in range(length)]
      ax.plot(xs, ys, marker='o', markersize=3, label=n)
    ax.set_xlabel('simulated seconds (slow links)' if claim.x == 'sim_seconds' else 'tokens')
    ax.set_ylabel('eval loss (mean over seeds)')
    ax.set_title(title or f'claim {claim.number}')
    if ax.lines:
      ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def _paired_text(a: Group, b: Group | None) -> str:
  if b is None or a is b or not a.per_batch or not b.per_batch:
    return '—'
  d, se = _paired(a.per_batch, b.per_batch)
  return f'{d:+.4f} ({se:.4f})'


def write_page(out: str, scale: Scale, page: str, figures: str, seconds: float) -> str:
  chosen = picks(out, scale)
  g = groups(out, scale)
  times = times_to_target(out, scale, g)
  os.makedirs(figures, exist_ok=True)
  rel = os.path.relpath(figures, os.path.dirname(page) or '.')
  rows, details = [], []
  for claim in CLAIMS:
    try:
      measured, verdict, why = claim.judge(g, dict(times=times, picks=chosen))
    except KeyError as e:
      measured, verdict, why = '—', 'not run', f'missing finals: {e.args[0]}'
    figure = f'claim{claim.number}.png'
    plot(claim, g, out, scale, os.path.join(figures, figure))
    rows.append(f'| {claim.number} | {claim.statement} ({claim.source}) | {measured} | '
                f'**{verdict}** | [plot]({rel}/{figure}) |')
    table = ['| final | seeds | final eval loss (mean ± std) | its eval SE | '
             f'paired difference to {claim.finals[0]} (eval SE) | bytes / worker | '
             'peak bytes / step |', '|---|---|---|---|---|---|---|']
    table += [f'| {n} | {len(g[n].losses)} | {g[n].text()} | {g[n].eval_se:.4f} | '
              f'{_paired_text(g[n], g.get(claim.finals[0]))} | '
              f'{report._bytes(g[n].bytes_sent)} | {report._bytes(g[n].peak_bytes)} |'
              for n in claim.finals if n in g]
    details.append(f'### Claim {claim.number}\n\n{claim.statement} ({claim.source})\n\n'
                   f'Verdict: **{verdict}**. {why}\n\n' + '\n'.join(table) +
                   f'\n\n![claim {claim.number}]({rel}/{figure})\n')
  tuning = ['| method | settings (seed 0, final eval on the tuning split) | pick |',
            '|---|---|---|']
  for name, p in chosen.items():
    grid = ', '.join(f'{label}: {loss:.4f}' if isinstance(loss, float) else f'{label}: {loss}'
                     for label, loss in p['grid'])
    tuning.append(f'| {name} | {grid} | {p["label"]} |')
  command = COMMAND if scale is SCALES['full'] else (
      'python -m launch.claims --quick --out=runs/claims_quick')
  text = '\n'.join([
      '# Claims of the seed papers, tested',
      '',
      f'Regenerate: `{command}` ({seconds / 3600:.1f} h of runs on this machine when last '
      'run from nothing; re-running skips finished runs and rewrites this page).',
      '',
      __doc__.split('\n\n', 2)[2].strip(),
      '',
      f'Scale of this page: {scale}.',
      '',
      '| # | claim (source) | measured (final eval loss, mean ± std over seeds) | '
      'verdict | plot |',
      '|---|---|---|---|---|',
      *rows,
      '',
      '## Tuning: equal budgets, the grid and the pick per method',
      '',
      *tuning,
      '',
      '## Per claim',
      '',
      *details,
  ])
  os.makedirs(os.path.dirname(page) or '.', exist_ok=True)
  with open(page, 'w') as f:
    f.write(text + '\n')
  return page


def _paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
  """(mean of a - b, its SE over eval batches) of two groups' per-batch losses."""
  m = stats.mean_ci([x - y for x, y in zip(a, b, strict=True)])
  return m.mean, m.se


def _seconds(clock: str, default: float) -> float:
  """The run time kept in OUT/seconds.txt (summed over the invocations that trained)."""
  if not os.path.exists(clock):
    return default
  with open(clock) as f:
    text = f.read()
  try:
    return float(text)
  except ValueError:
    raise LocoError(f'{clock} is damaged ({text[:40]!r} is not a number of seconds); '
                    'delete it to count the time from this invocation on.') from None


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m launch.claims', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', default=os.path.join('runs', 'claims'))
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--page', help=f'default: {PAGE}, or OUT/claims.md with --quick')
  parser.add_argument('--parallel', type=int, default=1)
  parser.add_argument('--page_only', action='store_true',
                      help='write the page from the finished runs; train nothing')
  args = parser.parse_args(argv)
  scale = SCALES['quick' if args.quick else 'full']
  page = args.page or (os.path.join(args.out, 'claims.md') if args.quick else PAGE)
  figures = os.path.join(args.out, 'figures') if args.quick else FIGURES
  clock = os.path.join(args.out, 'seconds.txt')
  try:
    t0 = time.time()
    if not args.page_only:
      code = run_sweep(tuning_runs(scale), os.path.join(args.out, 'tune'), args.parallel,
                       report=False)
      if code == 130:
        return code
      code = run_sweep(final_runs(scale, picks(args.out, scale)),
                       os.path.join(args.out, 'final'), args.parallel, report=False,
                       retimes={'slow_links': SLOW_LINKS})
      if code == 130:
        return code
      score_finals(args.out, scale)
      total = _seconds(clock, 0.0) + time.time() - t0   # read before the rewrite
      with open(clock + '.tmp', 'w') as f:
        f.write(str(total))
      os.replace(clock + '.tmp', clock)
    seconds = _seconds(clock, math.nan)
    print(f'claims page: {write_page(args.out, scale, page, figures, seconds)}')
    return 0
  except (SweepError, LocoError) as e:
    print(f'launch.claims: error: {e}', file=sys.stderr)
    return 1


if __name__ == '__main__':
  sys.exit(main())
