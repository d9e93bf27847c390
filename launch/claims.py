"""The claims page: each seed paper's claim tested in its own regime, as far as 2 CPU cores reach.

  python -m launch.claims --out=runs/claims70                # writes docs/claims.md
  python -m launch.claims --long --out=runs/claims140        # 140 rounds
  python -m launch.claims --quick --out=runs/claims_quick     # the pipeline, end to end

This file is the experiment record: the methods and their knobs, the finals, the claims
with their margins, sources and regimes, the figures and the page. The protocol is
`loco.lab.study`'s:
- Tuning. Every method tunes the shared inner-lr grid (1.5e-3, 3e-3, 6e-3) and then its
  own knob (three values) at the best inner lr, five settings each; an edge pick is
  extended once, and a pick whose knob moved tries the inner lr's neighbours at that knob
  (once, one step past the better); each setting trains once (seed 0) at the final
  length and is scored on `validation[:50%]` by the in-loop eval, whose windows cover
  the split. The pick and its neighbour towards the larger step train again at seed 10:
  a pick that diverges there is passed over, one whose neighbour diverges is flagged.
- The reference. DiLoCo is a family tuned over (outer lr, momentum) jointly: momenta 0
  (SGD), 0.5, 0.8, 0.9 and 0.95, each over the same effective steps eta / (1 - mu). Every
  claim is tested against the member that tuned best; the DiLoCo paper's configuration
  (Nesterov 0.9 at 0.7) trains beside it by name.
- Variants. One that changes M, H, the topology or the communication form re-tunes its
  outer lr (or its own knob) at three points around its parent's pick, extended once.
- Finals. The picks train at seeds 1-3 (one seed = one init and data order for every
  method), each final model scored by `loco.evaluate` on 512 x 16 windows of
  `validation[50%:]`, each window with its document.
- Verdicts. A claim compares finals paired by seed on the relative difference
  (L_a - L_b) / L_b, against a margin in the same unit converted from the paper's number
  with its source: "reproduced" if the confidence interval lies on the claim's side of
  the margin, "not reproduced" if it lies on the other side, "inconclusive" otherwise.
  Where the first look's CI straddles the margin, both finals train seeds 4 and 5 and the
  test looks again at all five; each look's CI is at 97.2% so that the two looks keep
  the 2.5% level (`loco.lab.study.LOOK_LEVEL`). A claim made of several comparisons holds if
  every one holds and fails if any fails after Holm's correction. The eval windows' own
  document-clustered SE of each difference is shown beside (the uncertainty about
  held-out text, which the seed test does not include).

Scale (`SCALES`): the micro model (experiments/micro.py, 0.43M weights), 8 workers x 4
sequences x 64 tokens per step, 1,050 steps = 2.15M tokens = 5 tokens per weight = 70
rounds of H = 15 from scratch (claims at one step per communication: 300 steps).
`python scripts/study_cost.py runs/claims70 --planned` prints what the page costs before
it runs. `--long` doubles the finals (2,100 steps = 140 rounds = 10 tokens per weight; the
same tuning runs, now half length). Each claim's regime card sets the paper's regime
beside this one, and says whether the claim is a mechanism check whose verdict transfers
to scale or a data point at 0.43M weights of a claim that depends on scale. The figures'
series (H, M, Streaming's tau x alpha and P) train at seeds 1-2, the density ladder and
the topology x H table at seed 1. Runs are `loco.sweep` runs under OUT/tune and
OUT/final, those that differ only in seed or lr three at a time in one program
(`--batch_runs`): the same command resumes after an interruption and skips what is
finished; the page is rewritten from the runs each time. `--quick` is the same pipeline
with 36-step runs and one or two points of each ladder (`QUICK_PLAN`): a pipeline check,
not evidence; it writes OUT/claims.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import re
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from launch import claims_figures
from loco import cli
from loco.lab import frontier
from loco.sim import network as network_lib
from loco.lab import plots
from loco.lab import report
from loco.files import runs as runs_lib
from loco import stats
from loco.lab import study
from loco.errors import LocoError
from loco.lab.study import Final, Group, Knob, Method

BASE = 'experiments/micro.py:ddp'      # no algorithm keys set: any algorithm on top
PAGE = os.path.join('docs', 'claims.md')
PREVIOUS_PAGE = os.path.join('docs', 'claims_70_rounds_stream.md')
FIGURES = os.path.join('figures', 'claims')     # beside the page: docs/figures/claims
# The scaling points the page overlays: the micro study's, kept with its page (written by
# `python -m launch.scaling --preset=micro --out=runs/scaling_micro`, points.json copied),
# and the tiny study's where it has run.
SCALING = (os.path.join('docs', 'scaling', 'micro_points.json'),
           os.path.join('runs', 'scaling_tiny'))
COMMAND = 'python -m launch.claims --out=runs/claims70'

# The heterogeneous network of claim 9 (tiny_hetero.py's): 1 Gbit/s links with 10 ms
# latency, every link of 2 of the 8 workers 100x slower, 0.1 s per inner step.
SLOW_LINKS = {'network.profile': 'slow_links', 'network.slow_workers': 2,
              'network.slow_factor': 100.0, 'network.bandwidth': 1.25e8,
              'network.latency': 0.01, 'network.step_seconds': 0.1}

# The networks a method is chosen for (the page's figures against simulated time): every
# synchronous final re-timed on each, with claim 9's compute per inner step. The latency
# falls with the bandwidth as between regions far apart, near, and in one metro area.
NETWORKS = {f'gbit{gbit}_{ms}ms': {
    'network.profile': 'homogeneous', 'network.bandwidth': gbit * network_lib.GBIT,
    'network.latency': ms / 1000, 'network.step_seconds': SLOW_LINKS['network.step_seconds']}
    for gbit, ms in ((1, 100), (10, 30), (100, 10))}


CHECK_SEED = 10     # the pick and its neighbour train again at this seed (study.Budget)


@dataclasses.dataclass(frozen=True)
class Scale:
  budget: study.Budget
  sync_every: int                      # H
  series_seeds: tuple[int, ...]        # the figures' series (H, M, Streaming's grid)
  single_seed: tuple[int, ...]         # the density ladder, the topology x H table
  h_series: tuple[int, ...]            # DiLoCo's H axis (H itself is the claims' run)
  h_table: tuple[int, ...]             # GASLoC's topology x H table
  plan: Plan = dataclasses.field(default_factory=lambda: Plan())
  batch: int = 4                       # sequences per worker
  seq_len: int = 64

  @property
  def rounds(self) -> int:
    return self.budget.steps // self.sync_every

  @property
  def warm_step(self) -> int:
    """The step of the DDP checkpoint a warm start begins from (a quarter, a whole round)."""
    return self.budget.steps // 4 // self.sync_every * self.sync_every

  @property
  def tokens_per_weight(self) -> float:
    return self.budget.steps * 8 * self.batch * self.seq_len / MICRO_WEIGHTS


MICRO_WEIGHTS = 426_752


def _scale(steps, steps_h1, h, eval_every, seeds, score_batches, tune_fraction,
           series_seeds, single_seed, h_series, h_table, check_seed=CHECK_SEED,
           plan: Plan | None = None) -> Scale:
  common = {'seq_len': 64, 'eval.batches': 32, 'eval.batch_size': 16,
            'eval.per_worker': False, 'eval.every': eval_every, 'log_every': h,
            'checkpoint.every': steps // 2, 'progress': False}
  return Scale(study.Budget(base=BASE, steps=steps, steps_h1=steps_h1, common=common,
                            inner_lrs=(1.5e-3, 3e-3, 6e-3), seeds=seeds,
                            score_batches=score_batches, tune_fraction=tune_fraction,
                            check_seed=check_seed),
               h, series_seeds, single_seed, h_series, h_table, plan or Plan())



# Outer Nesterov at the papers' momentum 0.9 for the methods built on it; the outer lr is
# the knob.
NESTEROV = Knob('algorithm.outer_lr', (0.4, 0.7, 1.0))
SGD = Knob('algorithm.outer_lr', (0.7, 1.0, 1.3))
# The reference DiLoCo is a family tuned over (outer lr, momentum) jointly: one member per
# momentum (the DiLoCo paper's Fig. 6 sweeps 0.8 / 0.9 / 0.95; 0 is SGD, 0.5 the 40-round
# page's), each over the same effective steps eta / (1 - mu), a geometric grid extended
# once past an edge. A claim is tested against the member that tuned best; the paper's
# own configuration (Nesterov 0.9 at 0.7) trains beside it by name.
EFFECTIVE = (1.0, 2.0, 4.0)
REFERENCE_MOMENTA = (0.0, 0.5, 0.8, 0.9, 0.95)
PAPER_OUTER = {'algorithm.outer_optimizer': 'nesterov', 'algorithm.outer_momentum': 0.9,
               'algorithm.outer_lr': 0.7}
# DiLoCo with one worker wants a far lower outer lr (2503.09799 Figs. 7-9: the best outer
# lr rises with M; loco's micro scaling point picked 0.1, the lowest it tried, at M = 1).
NESTEROV_M1 = Knob('algorithm.outer_lr', (0.05, 0.1, 0.2), geometric=True)
GOSSIP = Knob('algorithm.gossip_step', (0.25, 0.5, 1.0), high=1.0)
DROPOUTS = (10, 30, 50)                          # % of outer gradients dropped (claim 3)
PRUNED = (25, 50, 75)                            # % of outer-gradient values (claim 10)
REPLICAS = (1, 2, 4, 16)                         # beside 8 (claim 11)
DENSITIES = {4096: 100, 1024: 25, 256: 6.25, 128: 3.125, 64: 1.5625, 32: 0.78125}
# (tau, alpha) beside (1, 0.5). alpha weighs the local parameters: alpha = 1 would never
# adopt a synced fragment (refused by the config), so the grid is alpha in {0, 0.5}.
STREAMING_GRID = ((5, 0.5), (1, 0.0), (5, 0.0))
TOPOLOGIES = ('ring', 'torus', 'exponential', 'matching', 'complete')
BASELINES_H1 = ('dadamw', 'adpsgd', 'a2cid2', 'noloco_h1')   # claim 7, against GASLoC
GRAPHS = ('ring', 'exponential')                             # claim 7's graphs
# A variant that changes M, H, the topology or the communication form re-tunes its
# outer lr (or, without one, its own knob) around its parent's pick.
RETUNE = study.Retune()


@dataclasses.dataclass(frozen=True)
class Plan:
  """The ladders and grids a page trains beside its claims' own runs: the full page's
  are the values above; the quick page's keep one or two of each, enough to run every
  path of the pipeline (tuning, re-tuning, families, extra seeds, figures, tables)."""
  momenta: tuple[float, ...] = REFERENCE_MOMENTA
  dropouts: tuple[int, ...] = DROPOUTS
  pruned: tuple[int, ...] = PRUNED
  replicas: tuple[int, ...] = REPLICAS
  densities: tuple[tuple[int, float], ...] = tuple(DENSITIES.items())
  streaming_grid: tuple[tuple[int, float], ...] = STREAMING_GRID
  topologies: tuple[str, ...] = TOPOLOGIES
  baselines_h1: tuple[str, ...] = BASELINES_H1

  def __post_init__(self):
    # What the claims' tests read (claims 3, 10 and 11) and the topology table's base.
    needs = {'dropouts': (50,), 'pruned': (50,), 'replicas': (4, 16),
             'topologies': ('complete',)}
    for field, values in needs.items():
      if not set(values) <= set(getattr(self, field)):
        raise ValueError(f'Plan.{field} must hold {values}, got {getattr(self, field)}')

  @property
  def reference(self) -> tuple[str, ...]:
    """The reference family's members, one per momentum."""
    return tuple(reference_name(mu) for mu in self.momenta)

  @property
  def families(self) -> dict[str, tuple[str, ...]]:
    """'diloco' is the best-tuned member, 'nesterov' the best with momentum (claim 2)."""
    return {'diloco': self.reference,
            'nesterov': tuple(reference_name(mu) for mu in self.momenta if mu > 0)}

  @property
  def h1_methods(self) -> tuple[str, ...]:
    """Claim 7's methods: GASLoC's two forms and the baselines."""
    return ('gasloc_h1', 'gasloc_h1_peer') + self.baselines_h1


# One or two of each: every kind of run and re-tune, a figure's line from two points, the
# topology slopes from two fixed graphs; the reference family with and without momentum.
QUICK_PLAN = Plan(momenta=(0.0, 0.9), dropouts=(50,), pruned=(50,), replicas=(4, 16),
                  densities=((4096, 100), (64, 1.5625)), streaming_grid=((5, 0.0),),
                  topologies=('ring', 'exponential', 'complete'),
                  baselines_h1=('dadamw', 'adpsgd'))

SCALES = {
    # 70 rounds of H = 15, 5 tokens per weight, tuned at full length: about 2.2 hours here
    # with every claim, figure and table of the page.
    'full': _scale(1050, 300, 15, 150, (1, 2, 3), 512, 1.0, (1, 2), (1,),
                   (1, 5, 30, 60, 150), (1, 15)),
    # 140 rounds, 10 tokens per weight, tuned at half length (the same tuning runs as
    # 'full'): about 3.5 hours here, over the page's 3-hour budget.
    'long': _scale(2100, 600, 15, 150, (1, 2, 3), 512, 0.5, (1, 2), (1,),
                   (1, 5, 30, 60, 150), (1, 15)),
    # The pipeline end to end in minutes: one H beside the claims' in the figure and the
    # table, no check seed (its rule is tested on runs written by hand).
    'quick': _scale(36, 24, 6, 12, (1, 2), 16, 1.0, (1,), (1,), (12,), (6,), None,
                    QUICK_PLAN),
}


def _pct(x: float) -> str:
  return f'{x:g}'.replace('.', 'p')


def reference_name(mu: float) -> str:
  """The reference family's member at outer momentum mu."""
  return {0.0: 'diloco_sgd', 0.9: 'diloco_nesterov'}.get(mu, f'diloco_mu{_pct(mu)}')


# The full page's (the quick one's are its plan's).
REFERENCE = Plan().reference
FAMILIES = Plan().families


def reference_knob(mu: float) -> Knob:
  return Knob('algorithm.outer_lr', tuple(float(f'{e * (1 - mu):.6g}') for e in EFFECTIVE),
              geometric=True)


def methods(scale: Scale) -> list[Method]:
  """The tuned methods of the scale's plan."""
  h, plan = scale.sync_every, scale.plan
  nesterov = {'algorithm.outer_optimizer': 'nesterov', 'algorithm.outer_momentum': 0.9}
  diloco = {'algorithm.name': 'diloco', 'algorithm.sync_every': h}
  gasloc = {'algorithm.name': 'gasloc', 'algorithm.topology': 'ring',
            'algorithm.weights': 'metropolis', 'algorithm.mix': 'models', **nesterov}
  pp = {**gasloc, 'algorithm.form': 'proposed_points', 'algorithm.gossip_step': 1.0}
  # At one step per communication momentum 0.9 compounds with AdamW's (2503.09799
  # Fig. 9): the claim-7 methods keep the 40-round page's 0.5.
  h1_outer = {**gasloc, 'algorithm.outer_momentum': 0.5}
  every = [
      Method('ddp', {}),
      # The reference family (Plan.families): one member per outer momentum.
      *[Method(reference_name(mu), {**diloco, **(
          {'algorithm.outer_optimizer': 'sgd', 'algorithm.outer_momentum': 0.0} if mu == 0
          else {'algorithm.outer_optimizer': 'nesterov', 'algorithm.outer_momentum': mu})},
               reference_knob(mu)) for mu in plan.momenta],
      # Claim 1's control: the whole batch on one worker, tuned on its own.
      Method('diloco_m1', {**diloco, **nesterov, 'num_workers': 1,
                           'batch_per_worker': 8 * scale.batch}, NESTEROV_M1),
      # non_block='first': the embeddings join the first fragment, so exactly P = 2
      # fragments sync (micro has 2 blocks).
      Method('streaming', {'algorithm.name': 'streaming_diloco', 'algorithm.sync_every': h,
                           'algorithm.num_fragments': 2, 'algorithm.fragment_pattern': 'strided',
                           'algorithm.non_block': 'first', 'algorithm.overlap_steps': 1,
                           'algorithm.merge_alpha': 0.5, 'algorithm.compression': 'none',
                           'algorithm.eager': False, **nesterov}, NESTEROV),
      Method('sparseloco', {'algorithm.name': 'sparseloco', 'algorithm.sync_every': h,
                            'algorithm.error_decay': 0.95, 'algorithm.topk': 64,
                            'algorithm.chunk_size': 4096, 'algorithm.compression': '2bit',
                            'algorithm.aggregation': 'contributors'}, SGD),
      Method('gasloc', {**gasloc, 'algorithm.sync_every': h}, NESTEROV),
      Method('gasloc_pp', {**pp, 'algorithm.sync_every': h}, NESTEROV),
      # One step per communication (claim 7), tuned on the ring.
      Method('gasloc_h1', {**h1_outer, 'algorithm.sync_every': 1}, NESTEROV, h1=True),
      Method('dadamw', {'algorithm.name': 'dsgd', 'algorithm.topology': 'ring',
                        'algorithm.weights': 'metropolis'}, GOSSIP, h1=True),
      Method('adpsgd', {'algorithm.name': 'adpsgd', 'algorithm.topology': 'ring'}, h1=True),
      Method('a2cid2', {'algorithm.name': 'a2cid2', 'algorithm.topology': 'ring'}, h1=True),
      Method('noloco_h1', {'algorithm.name': 'noloco', 'algorithm.sync_every': 1,
                           'algorithm.topology': 'ring', 'algorithm.outer_momentum': 0.5},
             NESTEROV, h1=True),
  ]
  left_out = set(BASELINES_H1) - set(plan.baselines_h1)
  return [m for m in every if m.name not in left_out]



def finals(scale: Scale = SCALES['full'], more: Collection[str] = ()) -> list[Final]:
  """Every final of the page; those named in `more` train the extra seeds too."""
  extended = study.extra_seeds(scale.budget)
  return [dataclasses.replace(f, seeds=f.seeds_of(scale.budget) + extended)
          if f.name in more else f for f in _finals(scale)]


def undecided(scale: Scale, g: Mapping[str, Group], picks: Mapping[str, Any]) -> list[str]:
  """The finals of every claim test whose first look (the scale's first seeds) leaves it
  undecided, its CI straddling the margin (`study.straddles`): they train the extra
  seeds and the test looks again at all of them. Only the first seeds decide, so the
  answer does not move once the extra ones exist."""
  names = {f.name for f in _finals(scale)}
  found = set()
  for claim in claims_of(scale.plan):
    if claim.x == 'sim_seconds':
      continue
    try:
      tests = claim.tests(picks, g)
    except KeyError:   # a family or a final it reads is not there yet
      continue
    for t in tests:
      if {t.a, t.b} <= names and t.a in g and t.b in g and study.straddles(
          g[t.a], g[t.b], scale.budget, t.margin.relative, relative=t.relative):
        found |= {t.a, t.b}
  return sorted(found)


def _finals(scale: Scale) -> list[Final]:
  series, single, plan = scale.series_seeds, scale.single_seed, scale.plan
  warm = {'init_from': os.path.join('{out}', 'final', 'ddp', 'seed{seed}', 'checkpoints',
                                    str(scale.warm_step)),
          'init_inner_state': 'carried', 'steps': scale.budget.steps - scale.warm_step,
          'optimizer.warmup_steps': 0}
  out = [
      # Claim 1: DDP keeps its quarter-way checkpoint for the warm starts.
      Final('ddp', 'ddp', {'checkpoint.every': scale.warm_step, 'checkpoint.keep': 8}),
      # The reference family, every member at every seed (its landscape's seed spread),
      # and the DiLoCo paper's configuration at the Nesterov 0.9 member's inner lr.
      *[Final(n, n) for n in plan.reference],
      Final('diloco_paper', 'diloco_nesterov', PAPER_OUTER),
      Final('diloco_m1', 'diloco_m1'),
      Final('diloco_warm', 'diloco', warm), Final('diloco_m1_warm', 'diloco_m1', warm),
      # Claim 3: the paper's dropped outer gradients (keep_local).
      *[Final(f'diloco_keep{p}', 'diloco', {'network.profile': 'homogeneous',
                                            'network.dropout': p / 100,
                                            'network.dropout_mode': 'keep_local'})
        for p in plan.dropouts],
      # Claims 4 and 5: Streaming with exactly P = 2 fragments; E3M0 outer gradients.
      Final('streaming', 'streaming'),
      Final('diloco_e3m0', 'diloco', {'algorithm.compression': 'e3m0'}),
      Final('streaming_e3m0', 'streaming', {'algorithm.compression': 'e3m0'}),
      # Claim 6: SparseLoCo at 1.56% with 2-bit values.
      Final('sparseloco', 'sparseloco'),
      # Claims 8 and 9 (the asynchronous mode on a matching re-tunes its outer lr).
      Final('gasloc', 'gasloc'), Final('gasloc_pp', 'gasloc_pp'),
      Final('gasloc_async_overlap', 'gasloc',
            {**SLOW_LINKS, 'network.mode': 'async', 'algorithm.topology': 'matching',
             'network.overlap': 'compute', 'network.local_work': 'auto',
             'network.peer_choice': 'rotation'}, retune=RETUNE),
      # Claim 10: outer-gradient pruning (TIES).
      *[Final(f'diloco_prune{p}', 'diloco', {'algorithm.prune': p / 100}) for p in plan.pruned],
      # Claim 11: replicas at a fixed batch per worker (more replicas, more tokens), each
      # M with its outer lr re-tuned.
      *[Final(f'diloco_r{m}', 'diloco', {'num_workers': m}, retune=RETUNE)
        for m in plan.replicas],
  ]
  # Claim 7: one step per communication, per graph (tuned on the ring, re-tuned on the
  # other graph); GASLoC with every neighbour and with one random neighbour per round
  # (the paper's "sparse randomized peer communication", re-tuned: another form).
  for g in GRAPHS:
    for m in plan.h1_methods:
      if m == 'gasloc_h1_peer':
        out.append(Final(f'gasloc_h1_peer_{g}', 'gasloc_h1',
                         {'algorithm.topology': g, 'algorithm.pairwise': True},
                         retune=RETUNE))
      else:
        out.append(Final(f'{m}_{g}', m, {'algorithm.topology': g},
                         retune=None if g == 'ring' else _retune_of(m)))
  # Figures: DiLoCo against H (re-tuned per H); Streaming's tau x alpha and P; the density
  # ladder.
  out += [Final(f'diloco_h{h}', 'diloco', {'algorithm.sync_every': h}, series, RETUNE)
          for h in scale.h_series]
  out += [Final(f'streaming_t{t}_a{_pct(a)}', 'streaming',
                {'algorithm.overlap_steps': t, 'algorithm.merge_alpha': a}, series)
          for t, a in plan.streaming_grid]
  out.append(Final('streaming_p1', 'streaming', {'algorithm.num_fragments': 1}, series))
  for k, pct in plan.densities:
    for codec in ('2bit', 'none'):
      if (k, codec) != (64, '2bit'):
        out.append(Final(f'sparse_d{_pct(pct)}_{"2bit" if codec == "2bit" else "f32"}',
                         'sparseloco', {'algorithm.topk': k, 'algorithm.compression': codec},
                         single))
  # GASLoC's topology x H table, each cell re-tuned: averaged and own loss, consensus
  # distance, from the last eval only (the workers' own evals cost 8 forward passes each).
  out += [Final(f'gasloc_{t}_h{h}', 'gasloc',
                {'algorithm.topology': t, 'algorithm.sync_every': h, 'eval.per_worker': True,
                 'eval.every': scale.budget.steps},
                single, RETUNE)
          for t in plan.topologies for h in scale.h_table]
  return out


def _retune_of(method: str) -> study.Retune:
  """What a claim-7 method re-tunes on another graph: its own knob (the outer lr, the
  gossip step), or the inner lr for a method without one."""
  knob = {m.name: m.knob for m in methods(SCALES['full'])}[method]
  if knob is None:
    return study.Retune(study.LR)
  return study.Retune(knob.key, high=knob.high)


# ---- margins: relative loss, with their source and the conversion ----------------------

@dataclasses.dataclass(frozen=True)
class Margin:
  """A margin on the relative difference (L_a - L_b) / L_b of final eval losses: unit
  free, so the same per byte (here) and per token (the papers)."""
  relative: float
  source: str


def _ppl(percent: float, at: float, source: str) -> Margin:
  """`percent` perplexity at the paper's perplexity `at`, as relative loss:
  ln(1 + percent / 100) / ln(at)."""
  rel = math.log1p(percent / 100) / math.log(at)
  return Margin(rel, f'{percent:g}% perplexity at the paper\'s {at:g} = ln(1 + '
                f'{percent / 100:g}) / ln({at:g}) = {rel:.2%} of the loss; {source}')


NONE = Margin(0.0, 'no margin: the claim is a strict improvement')
WITHIN_2 = _ppl(2, 15.02, 'loco\'s non-inferiority margin at the DiLoCo paper\'s M = 8 '
                'perplexity (arXiv 2311.08105 Table 3; the paper gives no number for '
                '"matches"). It is about a seventh of the DiLoCo - DDP gap the scaling-law '
                'paper measures at M = 8, 35M: +3.9% of a 3.485-nat loss, 0.136 nats, 14.6% '
                'perplexity (arXiv 2503.09799 Table 4)')
DROPOUT_50 = _ppl(2.1, 15.02, 'the DiLoCo paper\'s measured cost of dropping 50% of outer '
                  'gradients (arXiv 2311.08105 Fig. 8)')


# ---- judging ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Test:
  """One comparison of a claim: (a - b) / b < margin per seed (finals, or any Group), or
  a - b < 0 in the compared values' own units where `relative` is False (claim 9's
  seconds, claim 11's gains)."""
  a: str
  b: str
  margin: Margin = NONE
  relative: bool = True


@dataclasses.dataclass(frozen=True)
class Verdict:
  word: str
  tests: list[tuple[Test, study.Comparison]]
  note: str = ''


def _refuted_p(c: study.Comparison) -> float:
  if c.diverged_a:   # the claimed method diverged where the other finished: refuted
    return 0.0
  t = c.paired or c.welch
  return 1.0 if t is None or math.isnan(t.p_greater) else t.p_greater


def judge(g: Mapping[str, Group], tests: Sequence[Test], budget: study.Budget) -> Verdict:
  """Every test must hold (its CI below the margin, at the look the two-look rule
  stops at: `study.sequential`); the claim fails if any test is refuted after Holm
  (one-sided p of the opposite at the looks' level)."""
  missing = [n for t in tests for n in (t.a, t.b) if n not in g]
  if missing:
    raise KeyError(', '.join(sorted(set(missing))))
  done = [(t, study.sequential(g[t.a], g[t.b], budget, t.margin.relative,
                               relative=t.relative)) for t in tests]
  words = [c.verdict() for _, c in done]
  if all(w == 'reproduced' for w in words):
    return Verdict('reproduced', done)
  if len(done) == 1:
    return Verdict(words[0], done)
  holm = stats.holm([_refuted_p(c) for _, c in done], alpha=study.LOOK_ALPHA)
  if any(holm.reject):
    return Verdict('not reproduced', done, f'{int(sum(holm.reject))} of {len(done)} '
                   'comparisons refuted after Holm')
  held, alone = words.count('reproduced'), words.count('not reproduced')
  return Verdict('inconclusive', done, f'{held} of {len(done)} comparisons hold and '
                 f'{alone} are refuted each on its own, none after Holm\'s correction for '
                 f'{len(done)} comparisons')


@dataclasses.dataclass(frozen=True)
class Regime:
  """A regime card: the paper's setting beside this page's, and what a test here means."""
  model: str
  tokens_per_weight: str
  rounds: str
  h: str
  workers: str
  batch: str                        # tokens per worker per step
  warm_start: str
  meaning: str                      # one sentence: does a small-scale test mean anything?

  FIELDS = (('model', 'model size'), ('tokens_per_weight', 'tokens per weight'),
            ('rounds', 'rounds'), ('h', 'H'), ('workers', 'workers M'),
            ('batch', 'tokens per worker per step'), ('warm_start', 'warm start'))


@dataclasses.dataclass(frozen=True)
class Claim:
  number: int
  statement: str
  source: str
  regime: Regime
  finals: tuple[str, ...]           # plotted and tabled; a family's name stands for
  # its best-tuned member (`shown`)
  tests: Callable[[Mapping[str, Any], Mapping[str, Group]], list[Test]]  # (picks, groups)
  x: str = 'tokens'                 # 'tokens' or 'sim_seconds'
  transfers: bool = False           # a mechanism check whose verdict transfers to scale;
  # else a data point at 0.43M weights of a claim that depends on scale

  @property
  def units(self) -> str:
    """What a compared value is: a final eval loss, or simulated seconds to the target."""
    return 'simulated seconds' if self.x == 'sim_seconds' else 'nats'

  def shown(self, picks: Mapping[str, Any]) -> tuple[str, ...]:
    """The finals, each family's name replaced by its best member's (kept where the
    family has no pick yet)."""
    return tuple(ref(picks, n) for n in self.finals)


def ref(picks: Mapping[str, Any], family: str = 'diloco') -> str:
  """The best-tuned member of a family (`FAMILIES`); the name itself if it is not a
  family or has no pick yet."""
  return picks.get(family, {}).get('member', family) if family in FAMILIES else family


def _form(picks, pair: tuple[str, str]) -> str:
  """The GASLoC form whose best setting scored lower on the tuning split."""
  return min(pair, key=lambda m: picks[m]['loss'])


def equal_bytes(g: Mapping[str, Group], graph: str, baseline: str) -> str:
  """Claim 7's GASLoC at the baseline's communication: of the two forms (every neighbour,
  one random neighbour per round) the one whose bytes sent per worker are nearest the
  baseline's (in ratio); the one-neighbour form until both have run."""
  forms = (f'gasloc_h1_peer_{graph}', f'gasloc_h1_{graph}')
  b = g.get(f'{baseline}_{graph}')
  if b is None or not all(f in g for f in forms) or not b.bytes_sent:
    return forms[0]
  return min(forms, key=lambda f: abs(math.log(max(g[f].bytes_sent, 1.0) / b.bytes_sent)))


def here(scale: Scale) -> dict[str, str]:
  """This page's regime, for the cards."""
  return dict(model='micro, 0.43M weights, byte vocabulary (Python stdlib text, iid)',
              tokens_per_weight=f'{scale.tokens_per_weight:.1f}',
              rounds=f'{scale.rounds}', h=f'{scale.sync_every}', workers='8',
              batch=f'{scale.batch} x {scale.seq_len} = {scale.batch * scale.seq_len}',
              warm_start='none (claim 1 also from a 25% DDP checkpoint)')


DILOCO_PAPER = dict(model='150M (60M, 400M too), C4 non-iid', tokens_per_weight='about 1,900',
                    rounds='128 (88k steps)', h='500', workers='8',
                    batch='512 x 1024 = 524k', warm_start='24k DDP steps')
SCALING_PAPER = dict(model='35M-2.4B, C4', tokens_per_weight='20 (Chinchilla)',
                     rounds='about 100-1,000', h='30 (1-300 swept)', workers='1, 2, 4, 8',
                     batch='tuned (grows with N and M)', warm_start='none')

def claims_of(plan: Plan) -> tuple[Claim, ...]:
  """The claims, their finals and tests over the plan's ladders."""
  return (
      Claim(1, 'DiLoCo reaches DDP\'s loss (within 2% perplexity) at equal tokens with H x '
            'fewer bytes.', '2311.08105',
            Regime(**DILOCO_PAPER, meaning=(
                'Not at the paper\'s regime: from scratch at 0.43M the scaling-law paper\'s '
                'fits (2503.09799 Table 7) predict DiLoCo M = 8 about +6.7% and M = 1 about '
                '+0.2% in loss, so the test here is whether loco follows those trends (M = 1 '
                'and the 25% DDP warm start are the controls), not the paper\'s headline.')),
            ('ddp', 'diloco', 'diloco_paper', 'diloco_m1', 'diloco_warm', 'diloco_m1_warm'),
            lambda p, _: [Test(ref(p), 'ddp', WITHIN_2)]),
      Claim(2, 'A Nesterov outer optimizer beats SGD / FedAvg outer.', '2311.08105, Fig. 6',
            Regime(**{**DILOCO_PAPER, 'workers': '8 (outer lr {.1,.3,.5,.7,1} x momentum '
                                                 '{.8,.9,.95})'},
                   meaning='Each momentum tuned over the same effective steps eta / (1 - mu); '
                   'the best-tuned Nesterov member against SGD tuned alike. {rounds} rounds let '
                   'momentum 0.9 build up (1 / (1 - 0.9) = 10 rounds), but whether momentum '
                   'helps depends on the pseudo-gradients\' noise, which depends on scale: a '
                   'data point.'),
            plan.reference + ('diloco_paper',),
            lambda p, _: [Test(ref(p, 'nesterov'), 'diloco_sgd')]),
      Claim(3, 'DiLoCo degrades gracefully when outer gradients are dropped: at most the '
            'paper\'s +2.1% perplexity at 50%.', '2311.08105, Fig. 8',
            Regime(**DILOCO_PAPER, meaning=(
                'The mechanism is the paper\'s (keep_local: the dropped worker\'s '
                'pseudo-gradient is not sent and it trains on from its own parameters); '
                'with {rounds} rounds a dropped round is a small share of the run, as in the '
                'paper. The 40-round page also measured offline and discard.')),
            ('diloco',) + tuple(f'diloco_keep{p}' for p in plan.dropouts),
            lambda p, _: [Test('diloco_keep50', ref(p), DROPOUT_50)], transfers=True),
      Claim(4, 'Streaming DiLoCo (P = 2 fragments, tau = 1, alpha = 0.5) matches DiLoCo\'s '
            'loss with a lower peak bandwidth.', '2501.18512',
            Regime(model='35M-4B, C4', tokens_per_weight='20 (and 1B overtrained)',
                   rounds='about 100-1,000', h='100 (30 swept)', workers='2',
                   batch='tuned', warm_start='none',
                   meaning='A mechanism test (fragment schedule and merge); P = 2 is every '
                   'block of micro in its own fragment, as P = layers / 3 is there.'),
            ('diloco', 'streaming', 'streaming_p1') + tuple(
                f'streaming_t{t}_a{_pct(a)}' for t, a in plan.streaming_grid),
            lambda p, _: [Test('streaming', ref(p), WITHIN_2)], transfers=True),
      Claim(5, '4-bit (E3M0) outer gradients cost no loss (within 2% perplexity).',
            '2501.18512',
            Regime(model='500M-4B, C4', tokens_per_weight='20', rounds='about 100-1,000',
                   h='100', workers='2', batch='tuned', warm_start='none',
                   meaning='A mechanism test: quantization error against the pseudo-gradient '
                   'does not depend on model size first-order.'),
            ('diloco', 'diloco_e3m0', 'streaming', 'streaming_e3m0'),
            lambda p, _: [Test('diloco_e3m0', ref(p), WITHIN_2),
                          Test('streaming_e3m0', 'streaming', WITHIN_2)], transfers=True),
      Claim(6, 'SparseLoCo at 1.6% density with 2-bit values matches or beats DiLoCo '
            '(within 2% perplexity).', '2508.15706',
            Regime(model='512M, DCLM', tokens_per_weight='20', rounds='163', h='15',
                   workers='8', batch='4M-token global batch / 8', warm_start='none',
                   meaning='H matches the paper, {rounds} rounds against its 163 and {tpw} '
                   'tokens per weight against its 20; the model is 1,200x smaller and the '
                   'inner lr is shared, not per method.'),
            ('diloco', 'sparseloco', 'diloco_e3m0', 'streaming_e3m0'),
            lambda p, _: [Test('sparseloco', ref(p), WITHIN_2)], transfers=True),
      Claim(7, 'GASLoC beats D-AdamW, AD-PSGD, A2CiD2 and NoLoCo at one step per '
            'communication on ring and exponential graphs.', '2606.11081',
            Regime(model='not public', tokens_per_weight='not public', rounds='—', h='1',
                   workers='not public', batch='not public', warm_start='not public',
                   meaning='The abstract names no baselines or sizes; they are loco\'s choice. '
                   'Tested with one random neighbour per round (the paper\'s "sparse '
                   'randomized peer communication"), every neighbour beside it.'),
            tuple(f'{m}_{g}' for g in GRAPHS for m in plan.h1_methods),
            lambda p, g: [Test(equal_bytes(g, graph, b), f'{b}_{graph}') for graph in GRAPHS
                          for b in plan.baselines_h1]),
      Claim(8, 'GASLoC with multiple local steps is competitive with DiLoCo (within 2% '
            'perplexity).', '2606.11081',
            Regime(model='not public', tokens_per_weight='not public', rounds='—', h='several',
                   workers='not public', batch='not public', warm_start='not public',
                   meaning='"Competitive" has no number; ring of 8 (the hardest graph for '
                   'gossip); the form is the one picked on the tuning split.'),
            ('diloco', 'gasloc', 'gasloc_pp'),
            lambda p, _: [Test(_form(p, ('gasloc', 'gasloc_pp')), ref(p), WITHIN_2)]),
      Claim(9, 'Under heterogeneous bandwidth, GASLoC reaches a target loss sooner in '
            'simulated time than DiLoCo.', '2606.11081',
            Regime(model='not public', tokens_per_weight='not public', rounds='—',
                   h='per worker', workers='not public', batch='not public',
                   warm_start='not public',
                   meaning='Slow links (2 of 8 workers 100x slower); asynchronous GASLoC as '
                   'the paper simulates it (exchanges overlap compute, H_i from each worker\'s '
                   'speed, peers in a rotation); synchronous runs re-timed on that network.'),
            ('diloco', 'gasloc', 'gasloc_pp', 'gasloc_async_overlap'),
            lambda p, _: [Test('gasloc_async_overlap', ref(p), relative=False)],
            x='sim_seconds'),
      Claim(10, 'Pruning half of each outer gradient (by magnitude, merged by sign) costs '
            'little: within 2% perplexity (the paper: 25 / 50 / 75% pruned cost -0.06 / '
            '+0.39 / +1.66%).', '2311.08105, Table 6',
            Regime(**DILOCO_PAPER, meaning='A mechanism test of TIES-style pruning (loco\'s '
                   'reading of the paper\'s sign pruning).'),
            ('diloco',) + tuple(f'diloco_prune{p}' for p in plan.pruned),
            lambda p, _: [Test('diloco_prune50', ref(p), WITHIN_2)], transfers=True),
      Claim(11, 'More replicas help with diminishing returns past 8 (the paper\'s Table 3: '
            '1 / 4 / 8 / 16 / 64 replicas give 16.23 / 15.18 / 15.02 / 14.91 / 14.96 '
            'perplexity).', '2311.08105, Table 3',
            Regime(**{**DILOCO_PAPER, 'workers': '1, 4, 8, 16, 64 (each with its own batch)'},
                   meaning='Each replica adds its own batch, so more replicas train more '
                   'tokens (as in the paper). Tested: the gain from 8 to 16 is below the '
                   'gain from 4 to 8.'),
            tuple('diloco' if m == 8 else f'diloco_r{m}' for m in sorted(plan.replicas + (8,))),
            lambda p, _: [Test('gain_8_to_16', 'gain_4_to_8', relative=False)]),
  )


CLAIMS = claims_of(Plan())     # the full page's


def derived_groups(g: Mapping[str, Group], picks: Mapping[str, Any]) -> dict[str, Group]:
  """Per-seed contrasts tested like finals: claim 11's gains (loss at M minus loss at 2M;
  M = 8 is the reference DiLoCo, the others re-tuned around it)."""
  out = {}
  m8 = ref(picks)
  for name, (a, b) in {'gain_4_to_8': ('diloco_r4', m8),
                       'gain_8_to_16': (m8, 'diloco_r16')}.items():
    if a in g and b in g:
      seeds = sorted(set(g[a].losses) & set(g[b].losses))
      out[name] = Group(name, {s: g[a].losses[s] - g[b].losses[s] for s in seeds}, {},
                        None, 0.0, 0.0, 0.0, [], {}, {**g[a].diverged, **g[b].diverged})
  return out


# ---- claim 9: simulated seconds to a target ------------------------------------------

def _asynchronous(name: str) -> bool:
  return name.startswith('gasloc_async')


def sim_curves(out: str, scale: Scale, name: str) -> dict[int, list[tuple[float, float]]]:
  """Per seed: (simulated seconds on SLOW_LINKS, eval loss) while training: the run's own
  clock where it is asynchronous, its re-timing on slow links otherwise."""
  curves = {}
  for s in scale.budget.seeds:
    d = os.path.join(out, 'final', name, f'seed{s}')
    if _asynchronous(name):
      found = (frontier.curve(runs_lib.read_metrics(d).rows)
               if os.path.isfile(os.path.join(d, runs_lib.METRICS)) else None)
    else:
      found = frontier.retimed_curve(d, 'slow_links')
    if found is not None:
      curves[s] = found
  return curves


def times_to_target(out: str, scale: Scale, g: Mapping[str, Group],
                    picks: Mapping[str, Any]) -> dict[str, Any]:
  """Simulated seconds per seed to the highest last eval loss of the synchronous finals
  of claim 9 (so each of them reaches it): {'target', 'groups': name -> Group of seconds,
  'never': name -> seeds that never reach it}."""
  names = [n for n in claims_of(scale.plan)[8].shown(picks) if n in g]   # claim 9
  curves = {n: sim_curves(out, scale, n) for n in names}
  sync = [c[-1][1] for n in names if not _asynchronous(n) for c in curves[n].values() if c]
  if not sync:
    return {}
  target = max(sync)
  result: dict[str, Any] = {'target': target, 'groups': {}, 'never': {}}
  for n, per_seed in curves.items():
    seconds = {s: study.seconds_to([c], target)[0] for s, c in per_seed.items()}
    result['never'][n] = sorted(s for s, x in seconds.items() if x is None)
    reached = {s: x for s, x in seconds.items() if x is not None}
    if reached:
      result['groups'][n] = Group(n, reached, {}, None, 0.0, 0.0, 0.0,
                                  [per_seed[s] for s in sorted(per_seed)])
  return result


# ---- the page --------------------------------------------------------------------------

def _table(claim: Claim, g: Mapping[str, Group], reference: str | None,
           traffic: Mapping[str, Group], picks: Mapping[str, Any],
           never: Collection[str] = ()) -> list[str]:
  """Per final: its per-seed values, the paired comparison with `reference` (relative
  loss, (a - ref) / ref per seed; seconds in seconds), and the bytes of its runs
  (`traffic`: the finals, also where `g` holds seconds to a target; `never`: the finals
  whose every seed ran and never reached it)."""
  seconds = claim.x == 'sim_seconds'
  what = 'seconds to the target' if seconds else 'final eval loss'
  diff_name = (f'paired difference to {reference} [95% CI]' if seconds else
               f'(a - {reference}) / {reference} per seed [95% CI]')
  rows = [f'| final | seeds: {what} | mean ± std | {diff_name}, test | eval SE of the '
          'difference (clustered, nats) | bytes sent / worker | bytes received / worker | '
          'peak bytes sent / step |',
          '|---|---|---|---|---|---|---|---|']
  for n in claim.shown(picks):
    if n not in g:
      ended = 'never reaches the target' if n in never else 'not run'
      rows.append(f'| {n} | {ended} | | | | | | |')
      continue
    x = g[n]
    diff, se = '—', '—'
    if reference in g and n != reference:
      c = study.compare(x, g[reference], relative=not seconds)
      diff = c.text().split('; eval SE')[0]
      se = '—' if c.eval_se is None else f'{c.eval_se:.4f}'
    b = traffic.get(n, x)
    rows.append(f'| {n} | {x.per_seed()} | {x.text()} | {diff} | {se} | '
                f'{report.human_bytes(b.bytes_sent)} | {report.human_bytes(b.bytes_received)} | '
                f'{report.human_bytes(b.peak_bytes)} |')
  return rows


def _tests_text(v: Verdict, units: str) -> list[str]:
  lines = []
  for t, c in v.tests:
    claim = (f'({t.a} - {t.b}) / {t.b} < {t.margin.relative:.2%} per seed' if t.relative
             else f'{t.a} - {t.b} < 0 {units}')
    look = (f' at the second look ({c.paired.n} seeds)' if c.look == 2 and c.paired
            else '')
    lines.append(f'- {claim} ({t.margin.source}): **{c.verdict()}**{look}; {c.text()}')
  if v.note:
    lines.append(f'- {v.note}.')
  return lines


def headline(v: Verdict | None, units: str) -> str:
  """A claim's effect in one cell: its first comparison's a - b (relative to b's loss, or
  in `units` where the test is not relative) with the CI of the look it stopped at, and
  how many more comparisons the claim has."""
  if v is None or not v.tests:
    return '—'
  t, c = v.tests[0]
  test = c.paired or c.welch
  if test is None:
    return f'{t.a} − {t.b}: {c.text()}'
  est, low, high = (x + c.margin for x in (test.estimate, *test.ci))
  fmt = ('{:+.2%}' if t.relative else '{:+,.0f} s' if units == 'simulated seconds'
         else '{:+.4f}')
  margin = f'; margin {t.margin.relative:+.2%}' if t.relative and t.margin.relative else ''
  more = len(v.tests) - 1
  seeds = test.n if isinstance(test.n, int) else ' and '.join(map(str, test.n))
  return (f'{t.a} − {t.b}{" (relative)" if t.relative else ""}: {fmt.format(est)} '
          f'[{fmt.format(low)}, {fmt.format(high)}] {test.level * 100:.3g}% CI, '
          f'{seeds} seeds{margin}' + (f'; {more} more comparison{"s" * (more > 1)}'
                                       if more else ''))


def _plot(claim: Claim, g, out, scale, t9, path, picks) -> None:
  if claim.number == 7:
    panels = [(graph, [n for n in claim.finals if n.endswith('_' + graph)])
              for graph in GRAPHS]
  else:
    panels = [(f'claim {claim.number}', list(claim.shown(picks)))]
  fig, axes = plots.figure(len(panels))
  for ax, (title, names) in zip(axes, panels):
    if claim.x == 'sim_seconds':
      series = {n: list(sim_curves(out, scale, n).values()) for n in names}
      plots.seed_curves(ax, series, 'simulated seconds (slow links)', title=title)
      if t9:
        ax.axhline(t9['target'], color='grey', linestyle=':', linewidth=1)
    else:
      series = {n: g[n].curves for n in names if n in g}
      warm = claims_figures.warm_names(_finals(scale))
      plots.seed_curves(ax, series, claims_figures.tokens_label(list(series), warm),
                        title=title)
  plots.save(fig, path)


# ---- the papers' figures, re-drawn with seed bands -----------------------------------

def _band(ax, xs, groups, color, label, marker='o'):
  """Mean over seeds (line) with the lowest-to-highest seed band, at the xs present."""
  pts = [(x, grp) for x, grp in zip(xs, groups) if grp is not None and grp.values]
  if not pts:
    return
  x = [p[0] for p in pts]
  ax.plot(x, [p[1].mean for p in pts], color=color, marker=marker, label=label)
  ax.fill_between(x, [min(p[1].values) for p in pts], [max(p[1].values) for p in pts],
                  color=color, alpha=0.2, linewidth=0)


def _hline(ax, grp, color, label):
  if grp is not None and grp.values:     # not where every seed diverged
    ax.axhline(grp.mean, color=color, linestyle='--', linewidth=1, label=label)
    ax.axhspan(min(grp.values), max(grp.values), color=color, alpha=0.1)


def figure_paths(figures: str) -> dict[str, str]:
  names = ('diloco_h', 'diloco_m', 'outer', 'streaming', 'sparse_bytes', 'gasloc_chi')
  return {n: os.path.join(figures, f'{n}.png') for n in names}


def draw_figures(g: Mapping[str, Group], scale: Scale, figures: str,
                 table: Mapping[tuple[str, int], Group], picks: Mapping[str, Any]
                 ) -> dict[str, str]:
  """The seed papers' key figures from the finals; returns name -> path."""
  paths = figure_paths(figures)
  get = g.get
  dn = ref(picks)          # the reference DiLoCo: H = 15, M = 8
  # DiLoCo against H, with DDP's line (2311.08105 Fig. 4; 2503.09799 Fig. 9).
  fig, (ax,) = plots.figure(1)
  hs = sorted(set(scale.h_series) | {scale.sync_every})
  _band(ax, hs, [get(dn) if h == scale.sync_every else get(f'diloco_h{h}') for h in hs],
        'C0', 'DiLoCo (M = 8)')
  _hline(ax, get('ddp'), 'C3', 'DDP')
  ax.set_xscale('log')
  ax.set_xlabel('H (inner steps per round)')
  ax.set_ylabel('final eval loss')
  ax.legend(fontsize=7)
  plots.save(fig, paths['diloco_h'])
  # DiLoCo against replicas (each with its own batch; 2311.08105 Table 3).
  fig, (ax,) = plots.figure(1)
  plan = scale.plan
  ms = sorted(plan.replicas + (8,))
  _band(ax, ms, [get(dn) if m == 8 else get(f'diloco_r{m}') for m in ms], 'C0',
        'DiLoCo, 4 x 64 tokens per replica')
  _hline(ax, get('ddp'), 'C3', 'DDP (8 x 4 x 64 tokens per step)')
  ax.set_xscale('log', base=2)
  ax.set_xlabel('replicas M')
  ax.set_ylabel('final eval loss')
  ax.legend(fontsize=7)
  plots.save(fig, paths['diloco_m'])
  # The outer optimizer: Nesterov momentum against SGD (2311.08105 Fig. 6).
  fig, (ax,) = plots.figure(1)
  _band(ax, plan.momenta, [get(reference_name(mu)) for mu in plan.momenta],
        'C0', 'DiLoCo, outer lr tuned per momentum (0: SGD)')
  _hline(ax, get('diloco_paper'), 'C1', 'the paper\'s configuration (0.9, outer lr 0.7)')
  _hline(ax, get('ddp'), 'C3', 'DDP')
  ax.set_xlabel('outer momentum')
  ax.set_ylabel('final eval loss')
  ax.legend(fontsize=7)
  plots.save(fig, paths['outer'])
  # Streaming: tau x alpha, and P (2501.18512).
  fig, (a1, a2) = plots.figure(2)
  for i, alpha in enumerate((0.5, 0.0)):
    taus = (1, 5)
    grps = [get('streaming') if (t, alpha) == (1, 0.5) else get(f'streaming_t{t}_a{_pct(alpha)}')
            for t in taus]
    _band(a1, taus, grps, f'C{i}', f'alpha = {alpha:g}')
  _hline(a1, get(dn), 'C3', 'DiLoCo')
  a1.set_xlabel('tau (steps the merge is late)')
  a1.set_ylabel('final eval loss')
  a1.legend(fontsize=7)
  _band(a2, (1, 2), [get('streaming_p1'), get('streaming')], 'C0', 'Streaming, tau 1, alpha .5')
  _hline(a2, get(dn), 'C3', 'DiLoCo')
  a2.set_xlabel('fragments P')
  a2.legend(fontsize=7)
  plots.save(fig, paths['streaming'])
  # SparseLoCo: loss against bytes sent and received (2508.15706 Fig. 1).
  fig, axes = plots.figure(2)
  for ax, key in zip(axes, ('bytes_sent', 'bytes_received')):
    for i, codec in enumerate(('2bit', 'f32')):
      names = ['sparseloco' if (k, codec) == (64, '2bit') else
               f'sparse_d{_pct(pct)}_{codec}' for k, pct in plan.densities]
      pts = [(getattr(g[n], key), g[n].mean, pct)
             for n, (_, pct) in zip(names, plan.densities) if n in g]
      if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', color=f'C{i}',
                label=f'SparseLoCo, {codec} values (100% .. 0.8%)')
    for j, n in enumerate((dn, 'diloco_e3m0', 'streaming_e3m0')):
      if n in g:
        ax.plot([getattr(g[n], key)], [g[n].mean], marker='s', linestyle='',
                color=f'C{j + 2}', label=n)
    ax.set_xscale('log')
    ax.set_xlabel(f'{key.replace("_", " ")} per worker')
    ax.set_ylabel('final eval loss')
    ax.legend(fontsize=6)
  plots.save(fig, paths['sparse_bytes'])
  # GASLoC: the topology gap against chi1 (the paper: momentum turns chi into sqrt(chi)).
  fig, (ax,) = plots.figure(1)
  chis = chi1_of()
  for i, h in enumerate(scale.h_table):
    base = table.get(('complete', h))
    pts = [(chis[t], table[(t, h)].mean - base.mean) for t in fixed_graphs()
           if (t, h) in table and base is not None]
    if pts:
      pts.sort()
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', color=f'C{i}',
              label=f'H = {h}')
  ax.set_xscale('log')
  ax.set_xlabel('chi1 of the fixed graph (1 / lambda_2 of its Laplacian)')
  ax.set_ylabel('loss - complete graph\'s (seed 1)')
  ax.axhline(0, color='grey', linewidth=0.8)
  ax.legend(fontsize=7)
  plots.save(fig, paths['gasloc_chi'])
  return paths


def figure_methods(scale: Scale, picks: Mapping[str, Any]) -> list[Method]:
  """The methods, and each family under its own name with its best member's keys (a
  final of the family is that member's algorithm in the figures)."""
  ms = methods(scale)
  by_name = {m.name: m for m in ms}
  return ms + [dataclasses.replace(by_name[ref(picks, f)], name=f)
               for f in scale.plan.families if ref(picks, f) in by_name]


# ---- drift: the per-round diagnostics of claims 1, 2 and 4 ------------------------------

DRIFT_PANELS = (('pg_cosine', 'mean cosine between workers\' pseudo-gradients'),
                ('consensus_distance', 'consensus distance before the sync'),
                ('pg_norm', 'pseudo-gradient norm (RMS over workers)'))


def drift_finals(picks: Mapping[str, Any], plan: Plan) -> dict[int, tuple[str, ...]]:
  """Per claim drawn: the finals whose drift shows its mechanism."""
  return {1: (ref(picks), 'diloco_warm', 'diloco_m1'),
          2: plan.reference,
          4: (ref(picks), 'streaming', 'streaming_p1')}


def drift_curves(out: str, name: str, seeds: Sequence[int], key: str
                 ) -> list[list[tuple[float, float]]]:
  """Per seed with the key in its rows: (tokens, the row's value) over training."""
  found = []
  for s in seeds:
    d = os.path.join(out, 'final', name, f'seed{s}')
    if os.path.isfile(os.path.join(d, runs_lib.METRICS)):
      rows = [(r['tokens'], r[key]) for r in runs_lib.read_metrics(d).rows if key in r]
      if rows:
        found.append(rows)
  return found


def drift_text(out: str, scale: Scale, g: Mapping[str, Group], picks: Mapping[str, Any],
               figures: str, rel: str) -> list[str]:
  """The drift figure (claims 1, 2 and 4: a row each, a panel per diagnostic, seed
  bands) and what it shows, from the finals' metrics rows: no training."""
  panels = drift_finals(picks, scale.plan)
  fig, axes = plots.figure(len(DRIFT_PANELS) * len(panels), rows=len(panels))
  drawn = False
  for i, (number, names) in enumerate(panels.items()):
    for j, (key, title) in enumerate(DRIFT_PANELS):
      ax = axes[i * len(DRIFT_PANELS) + j]
      series = {n: drift_curves(out, n, scale.budget.seeds, key) for n in names if n in g}
      series = {n: c for n, c in series.items() if c}
      drawn |= bool(series)
      plots.seed_curves(ax, series, 'tokens', ylabel=key, title=f'claim {number}: {title}')
  path = os.path.join(figures, 'drift.png')
  plots.save(fig, path)
  lines = ['## Drift at the syncs (claims 1, 2 and 4)', '',
           'Per round, from the engine\'s diagnostics (`loco.comm.drift`: the mean of each '
           'row\'s syncs): how far the workers drift apart within a round, and how much '
           'their pseudo-gradients agree. A cosine near 1 means the workers see data alike '
           'and a sync averages little away; the consensus distance is what a sync removes.',
           '']
  if not drawn:
    return lines + ['No final of these claims has the diagnostics in its rows yet (runs '
                    'made before them, or with `metrics.diagnostics` off).', '']
  rows = ['| final | pg cosine, last row (mean over seeds) | consensus distance | '
          'pg norm |', '|---|---|---|---|']
  for name in dict.fromkeys(n for names in panels.values() for n in names):
    last = [[c[-1][1] for c in drift_curves(out, name, scale.budget.seeds, k)]
            for k, _ in DRIFT_PANELS]
    if all(last):
      rows.append(f'| {name} | ' + ' | '.join(f'{np.mean(v):.4g}' for v in last) + ' |')
  return lines + rows + ['', f'![drift]({rel}/drift.png)', '']


def chi1_of() -> dict[str, float]:
  from loco.comm import topology   # imports numpy only; the topologies of 8 workers
  return {t: topology.make_topology(t, 8).chi1 for t in TOPOLOGIES if t != 'complete'} | {
      'complete': topology.make_topology('complete', 8).chi1}


def topology_table(g: Mapping[str, Group], scale: Scale) -> dict[tuple[str, int], Group]:
  return {(t, h): g[f'gasloc_{t}_h{h}'] for t in scale.plan.topologies for h in scale.h_table
          if f'gasloc_{t}_h{h}' in g}


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
  """The least-squares slope of log y against log x (positive ys only)."""
  pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
  if len(pts) < 2:
    return None
  x, y = np.array(pts).T
  return float(np.polyfit(x, y, 1)[0])


def topology_text(table: Mapping[tuple[str, int], Group], scale: Scale) -> list[str]:
  chis = chi1_of()
  rows = ['| graph | chi1 | ' + ' | '.join(f'H = {h}: averaged / own / consensus distance'
                                             for h in scale.h_table) + ' |',
          '|---|---|' + '---|' * len(scale.h_table)]
  for t in scale.plan.topologies:
    cells = []
    for h in scale.h_table:
      x = table.get((t, h))
      cells.append('not run' if x is None else
                   f'{x.mean:.4f} / {x.last.get("eval_loss_workers", math.nan):.4f} / '
                   f'{x.last.get("worker_spread", math.nan):.4f}')
    rows.append(f'| {t} | {chis[t]:.2f} | ' + ' | '.join(cells) + ' |')
  fixed = fixed_graphs(scale.plan.topologies)
  lines = []
  for h in scale.h_table:
    base = table.get(('complete', h))
    ts = [t for t in fixed if (t, h) in table]
    if base is None or not ts:
      continue
    gaps = {t: table[(t, h)].mean - base.mean for t in ts}
    spread = {t: table[(t, h)].last.get('worker_spread', math.nan) for t in ts}
    k = _slope([chis[t] for t in ts], list(gaps.values()))
    c = _slope([chis[t] for t in ts], list(spread.values()))
    lines.append(
        f'- H = {h}: gap to the complete graph '
        + ', '.join(f'{t} {gaps[t]:+.4f}' for t in ts) + '; slope of the gap: '
        + ('fewer than 2 graphs with a positive gap' if k is None else f'{k:.2f}')
        + '; slope of the consensus distance: '
        + ('fewer than 2 graphs' if c is None else f'{c:.2f}') + '.')
  random = [t for t in scale.plan.topologies if t != 'complete' and t not in fixed]
  rows += ['', 'Slopes of log(gap to the complete graph) and of log(consensus distance) '
           'against log(chi1), over the fixed graphs ('
           + ', '.join(fixed) + '; the gap\'s over those with a positive gap). A slope of 1: '
           'it grows like chi1; 0.5: like sqrt(chi1), the paper\'s claim with outer '
           'momentum. '
           + (f'{", ".join(random)} draws its graph per round: its chi1 is that of its '
              'expected communication rates, which equal the complete graph\'s, so it is '
              'left out of the slopes and the figure. ' if random else '')
           + 'The consensus distance is the workers\' RMS distance to their mean, relative '
           'to the mean\'s norm, at the last eval. One seed per cell: read the slopes as a '
           'shape, not a test.', '',
           *(lines or ['- not enough runs.'])]
  return rows


def fixed_graphs(topologies: Sequence[str] = TOPOLOGIES) -> list[str]:
  """The topologies (not complete) whose graph is the same every round."""
  from loco.comm import topology
  return [t for t in topologies
          if t != 'complete' and not topology.make_topology(t, 8).is_random]


# ---- the scaling overlay --------------------------------------------------------------

def scaling_text(dirs: Sequence[str], figures: str, rel: str) -> list[str]:
  from launch import scaling
  found = [d for d in dirs if os.path.isfile(scaling.points_path(d))]
  if not found:
    return ['Not run yet: `python -m launch.scaling --preset=micro --out=runs/scaling_micro` '
            '(this machine) and `python -m launch.scaling --out=runs/scaling_tiny` (an '
            'accelerator), then this page lists their points.']
  path = scaling.overlay(found, os.path.join(figures, 'scaling_overlay.png'))
  lines = [f'![scaling overlay]({rel}/{os.path.basename(path)})', '',
           '| study | N | tokens per weight | ' + ' | '.join(
               f'M = {m}: loco [95% CI] / fits' for m in scaling.WORKERS) + ' | ordering |',
           '|---|---|---|' + '---|' * len(scaling.WORKERS) + '---|']
  for d in found:
    p = scaling.read_points(d)
    cells = []
    for m in scaling.WORKERS:
      w = p['workers'].get(str(m))
      if not w:
        cells.append('not run')
        continue
      ci = w['gap_ci']
      cells.append(f'{w["gap_mean"]:+.1%}' + (f' [{ci[0]:+.1%}, {ci[1]:+.1%}]' if ci else '')
                   + f' / {w["predicted"]:+.1%}')
    name = scaling.study_name(d)
    lines.append(f'| {name} | {p["params"]:,} | {p["tokens_per_weight"]:.1f} | '
                 + ' | '.join(cells) + f' | {scaling.ordering(p)} |')
  return lines


# ---- what changed from the previous page ------------------------------------------------

# What changed from the previous page (PREVIOUS_PAGE), per claim. Every claim: batches of
# independent rows (was: each worker's rows consecutive windows of one document), the
# pick rule's check seed, relative margins, the two-look seed rule.
WHY = {
    1: 'Against the best-tuned DiLoCo of five momenta (was Nesterov 0.9, the weakest); '
       'margin 0.73% of the loss (was 2% per-byte perplexity, about 9% per token); the M = 1 '
       'control reads as many documents per step as M = 8.',
    2: 'Every momentum tuned over the same effective steps (was 0.9\'s outer lr reused at 0.8 '
       'and 0.95, SGD on a finer grid), SGD\'s inner lr tried again at its picked outer lr '
       '(tuning step 4); the best Nesterov member against SGD.',
    3: 'Against the best-tuned DiLoCo; margin 0.77% of the loss (the paper\'s +2.1% perplexity '
       'converted; was 2.1% per-byte perplexity); the cost of dropping half the outer '
       'gradients is also several times larger here (independent rows, and the best '
       'member\'s momentum 0.5), so the CI clears the old margin too.',
    4: 'On independent rows Streaming trails even the Nesterov 0.9 member it beat on stream '
       'batches, so against the best-tuned DiLoCo and a relative margin it is out; its grid '
       'has no alpha = 1.',
    5: 'Against the best-tuned DiLoCo with a relative margin (0.73% of the loss; was 2% '
       'per-byte perplexity): the CI still straddles it at 5 seeds (the two-look rule).',
    6: 'Against the best-tuned DiLoCo (it beat the weakest one before) with a relative '
       'margin: the CI still straddles it at 5 seeds; bytes beside.',
    7: 'At equal bytes: each baseline against the GASLoC form nearest its bytes sent (was: '
       'one random neighbour, a fifth to a half of the bytes); every method re-tuned on the '
       'exponential graph, the one-neighbour form re-tuned.',
    8: 'Against the best-tuned DiLoCo with a relative margin (0.73% of the loss; was 2% '
       'per-byte perplexity): the gap itself grew (independent rows, and the best member\'s '
       'momentum 0.5), and its CI lies above the tighter margin.',
    9: 'The asynchronous run on a matching re-tunes its outer lr; against the best-tuned '
       'DiLoCo it ends above the loss every synchronous final reaches, so it never reaches '
       'the target (synchronous GASLoC does, sooner than DiLoCo).',
    10: 'Against the best-tuned DiLoCo; relative margin; the cost of pruning half of each '
        'outer gradient is several times larger here (independent rows, and the best '
        'member\'s momentum 0.5), so the CI clears the old margin too.',
    11: 'Every M re-tunes its outer lr around M = 8\'s (was M = 8\'s reused: two finals '
        'diverged).',
}


KINDS = {True: 'mechanism check: a verdict about how the method works, which does not '
              'depend on model size first-order and transfers',
         False: 'data point: the claim depends on scale (model size, tokens, batch), so a '
                'verdict at 0.43M weights is a measurement there, not a test of the paper'}


def landscape_text(picks: Mapping[str, Any], g: Mapping[str, Group],
                   plan: Plan = Plan()) -> list[str]:
  """The reference family's tuning landscape: per momentum, the tuning loss (seed 0) at
  each outer lr tried at the member's inner lr, its pick, and its final's mean ± std
  over seeds (the seed spread); the DiLoCo paper's configuration beside it."""
  if not all(m in picks for m in plan.reference):
    return ['The reference family has not finished tuning.']
  best = ref(picks)
  lines = [f'Each momentum mu tunes the outer lr eta over the same effective steps eta / '
           f'(1 - mu) ({", ".join(f"{e:g}" for e in EFFECTIVE)}, extended once past an '
           f'edge) after the shared inner-lr grid; the cells are the tuning-split loss at '
           f'seed 0 of each eta at the member\'s picked inner lr. Best-tuned member, the '
           f'reference of every claim: **{best}**.', '',
           '| momentum | eta: tuning loss (eta / (1 - mu)) | pick | final: mean ± std '
           '(seeds) |', '|---|---|---|---|']
  for mu, name in zip(plan.momenta, plan.reference):
    p = picks[name]
    lr = p['setting'][study.LR]
    row = [(x['algorithm.outer_lr'], loss) for x, loss in p['tried']
           if x.get(study.LR, lr) == lr and 'algorithm.outer_lr' in x]
    row = [(eta, f'{eta:g}: {loss:.4f} ({eta / (1 - mu):.3g})') for eta, loss in row]
    cells = ', '.join(t for _, t in sorted(row))
    final = g[name].text() if name in g else 'not run'
    mark = ' **(best)**' if name == best else ''
    lines.append(f'| {mu:g}{mark} | {cells} | {p["label"]} | {final} |')
  paper = g['diloco_paper'].text() if 'diloco_paper' in g else 'not run'
  lines += ['', f'The DiLoCo paper\'s configuration (Nesterov, mu 0.9, eta 0.7: effective '
            f'step 7), at the 0.9 member\'s inner lr: {paper}.']
  return lines


def previous_verdicts(path: str) -> dict[int, str]:
  """The previous page's verdict per claim, read from its summary table."""
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    text = f.read()
  found = re.findall(r'^\| (\d+) \|.*\| \*\*([a-z ]+)\*\* \|', text, re.M)
  return {int(n): word for n, word in found}


def _progress(scale: Scale, g: Mapping[str, Group], more: Collection[str] = ()
              ) -> list[str]:
  """A line saying the page is partial, while some final runs have not ended (finished
  and scored, or diverged), one naming the finals with more seeds, and one naming the
  finals that diverged."""
  planned = {f.name: set(f.seeds_of(scale.budget)) for f in finals(scale, more)}
  diverged = [(n, g[n]) for n in planned if n in g and g[n].diverged]
  ended = sum(len(planned[n] & ({*g[n].losses} | {*g[n].diverged})) for n in planned if n in g)
  lines = []
  if more:
    seeds = ', '.join(map(str, study.extra_seeds(scale.budget)))
    lines += ['', f'**More seeds:** {", ".join(more)} also train seeds {seeds}: the first '
              f'look at a claim\'s test between them ({len(scale.budget.seeds)} seeds) left '
              'its CI straddling the margin, so the test looks again at every seed.']
  total = sum(len(x) for x in planned.values())
  if ended < total:
    lines += ['', f'**In progress:** {ended} of {total} final runs have '
              'ended; what is missing shows "not run", and the same command finishes it.']
  if diverged:
    lines += ['', f'**Diverged:** {sum(len(x.diverged) for _, x in diverged)} of '
              f'{total} final runs ('
              + '; '.join(f'{n}: {x.diverged_text()}' for n, x in diverged)
              + '). A diverged seed has no loss: its final\'s mean, std and tests are over '
              'the other seeds, and a comparison whose first final diverged where the '
              'other finished is not reproduced.']
  return lines


def _cost_text(out: str) -> str:
  """The runs' cost on this machine and the wall time they were in flight, both from
  their own statuses (`study.cost`), so across every invocation that trained them."""
  c = study.cost(out)
  units = c['tuning'] + c['finals']
  clock = (f'; they were in flight for {c["in_flight"] / 3600:.1f} h of wall time, pauses '
           'and other work on the machine included')
  away = ''.join(
      f' Another {e["tuning"] + e["finals"]:.0f} units ({e["tuning"]:.0f} tuning, '
      f'{e["finals"]:.0f} finals) trained on {host} (status.json\'s host), in flight for '
      f'{e["in_flight"] / 60:.0f} min there; the same command trains them here when they '
      'are missing.' for host, e in c['elsewhere'].items())
  return (f'Its runs: {units:.0f} units of one 1,050-step M = 8 run ({c["tuning"]:.0f} '
          f'tuning, {c["finals"]:.0f} finals) at a median {c["per_unit"]:.0f} s each on 2 '
          f'cores = {units * c["per_unit"] / 3600:.1f} h, scoring apart{clock}.{away}')


def _verdict(claim: Claim, groups: Mapping[str, Group], g: Mapping[str, Group],
             picks: Mapping[str, Any], scale: Scale, t9: Mapping[str, Any]):
  """(verdict or None, its word, the measured values' text) of one claim."""
  try:
    v = judge(groups, claim.tests(picks, g), scale.budget)
    measured = '; '.join(
        f'{n}: {groups[n].text(1, " s")}' if claim.x == 'sim_seconds'
        else f'{n}: {groups[n].text()}' for n in claim.shown(picks) if n in groups)
    word = v.word
  except KeyError as e:
    v, word, measured = None, 'not run', f'missing finals: {e.args[0]}'
    if claim.x == 'sim_seconds' and not t9:
      measured = 'the synchronous finals are not re-timed on slow links yet'
    elif claim.x == 'sim_seconds' and e.args[0] in g:
      # Finished, and no seed reached the target that every synchronous seed reaches.
      word = 'not reproduced'
      measured = '; '.join(f'{n}: {groups[n].text(1, " s")}'
                           for n in claim.shown(picks) if n in groups)
  if claim.x == 'sim_seconds' and t9:
    never = '; '.join(f'{n} never reaches it at seed{"s" * (len(s) > 1)} '
                      f'{", ".join(map(str, s))}' for n, s in t9['never'].items() if s)
    measured = (f'simulated seconds to eval loss {t9["target"]:.3f}: {measured}' +
                (f'; {never}' if never else ''))
  return v, word, measured


def _claims_sections(out: str, scale: Scale, figures: str, rel: str,
                     picks: Mapping[str, Any], g: Mapping[str, Group],
                     t9: Mapping[str, Any], warm: Collection[str], fill: Mapping[str, Any]
                     ) -> tuple[list[str], list[str], dict[int, str]]:
  """The summary table's rows, the per-claim sections (regime card, tests, table, plot)
  and each claim's verdict word."""
  rows, details, words = [], [], {}
  for claim in claims_of(scale.plan):
    # Claim 9 compares seconds to the target: only finals with a seed that reached it.
    groups = dict(t9.get('groups', {})) if claim.x == 'sim_seconds' else g
    v, word, measured = _verdict(claim, groups, g, picks, scale, t9)
    words[claim.number] = word
    figure = f'claim{claim.number}.png'
    _plot(claim, g, out, scale, t9, os.path.join(figures, figure), picks)
    kind = KINDS[claim.transfers]
    rows.append(f'| {claim.number} | {claim.statement} ({claim.source}) | {measured} | '
                f'{headline(v, claim.units)} | **{word}** | {kind.split(":")[0]} | '
                f'[plot]({rel}/{figure}) |')
    mine = here(scale)
    card = ['| | the paper | here |', '|---|---|---|'] + [
        f'| {label} | {getattr(claim.regime, key)} | {mine[key]} |'
        for key, label in Regime.FIELDS]
    tests = claim.tests(picks, g) if 'diloco' in picks else []
    never = [n for n, s in t9.get('never', {}).items() if s and n not in groups]
    table_rows = _table(claim, groups if claim.x == 'sim_seconds' else g,
                        tests[0].b if tests else None, g, picks,
                        never if claim.x == 'sim_seconds' else ())
    details.append('\n'.join([
        f'### Claim {claim.number}', '', f'{claim.statement} ({claim.source})', '',
        *card, '', f'What a test here means: {claim.regime.meaning.format(**fill)}', '',
        f'Kind: {kind}.', '',
        f'Verdict: **{word}**.', *(_tests_text(v, claim.units) if v else []), '',
        *(['Values are simulated seconds (slow links) to the target; bytes are the runs\'.',
           ''] if claim.x == 'sim_seconds' else []),
        *table_rows, '', f'![claim {claim.number}]({rel}/{figure})',
        *claims_figures.caption(claim.shown(picks), warm), '']))
  return rows, details, words


def _tuning_table(picks: Mapping[str, Any], scale: Scale) -> list[str]:
  """Every method's settings tried, its pick, the check seed's runs and its edges."""
  return study.tuning_table(picks, scale.budget.tune_seed, scale.budget.check_seed,
                            skip=scale.plan.families)


def _changed_text(page: str, words: Mapping[int, str], fill: Mapping[str, Any]
                  ) -> list[str]:
  """What changed from the previous page: its verdicts beside these, with the reasons."""
  before = previous_verdicts(PREVIOUS_PAGE)
  return [
      f'The previous page ([{os.path.basename(PREVIOUS_PAGE)}]'
      f'({os.path.relpath(PREVIOUS_PAGE, os.path.dirname(page) or ".")})) had the same '
      'regime (70 rounds of H = 15, 5 tokens per weight). Since, every claim: each row of a '
      'batch an independent window (it was consecutive windows of one document per worker), '
      'the reference DiLoCo tuned over (outer lr, momentum), variants re-tuned where their '
      'change moves the optimum, the inner lr tried again at a pick\'s knob where the knob '
      'moved, a second seed for the pick and its neighbour, margins as relative loss and '
      'the two-look seed rule. Per claim:',
      '',
      '| claim | before (stream batches, the old protocol) | here | what changed |',
      '|---|---|---|---|',
      *(f'| {c.number} | {before.get(c.number, "—")} | {words[c.number]} | '
        f'{WHY[c.number].format(**fill)} |' for c in CLAIMS)]


COMMANDS = {'full': COMMAND, 'long': 'python -m launch.claims --long --out=runs/claims140',
            'quick': 'python -m launch.claims --quick --out=runs/claims_quick'}


def _command(scale: Scale) -> str:
  """The command that regenerates a page of this scale: the scale is told by its length
  and plan (main's copy carries the batch layout), and a layout other than the default
  is passed on."""
  key = next((k for k, s in SCALES.items()
              if (s.budget.steps, s.plan) == (scale.budget.steps, scale.plan)), None)
  if key is None:
    raise ValueError(f'no scale in SCALES has {scale.budget.steps} steps and this plan')
  sampling = scale.budget.common.get('data.sampling', 'windows')
  return COMMANDS[key] + (f' --sampling={sampling}' if sampling != 'windows' else '')


def write_page(out: str, scale: Scale, page: str, figures: str,
               picks: Mapping[str, Any], g: Mapping[str, Group],
               scaling_dirs: Sequence[str] = ()) -> str:
  """Writes the page from the scored finals: the summary, what changed, the papers'
  figures, the practitioner's figures, the drift, the scaling overlay, the reference's
  landscape, the tuning table and a section per claim. Returns its path."""
  t9 = times_to_target(out, scale, g, picks)
  more = undecided(scale, g, picks)
  g = {**g, **derived_groups(g, picks)}
  g = claims_figures.offset_warm_starts(g, out, finals(scale, more), scale.budget)
  warm = claims_figures.warm_names(finals(scale, more))
  os.makedirs(figures, exist_ok=True)
  rel = os.path.relpath(figures, os.path.dirname(page) or '.')
  table = topology_table(g, scale)
  paths = draw_figures(g, scale, figures, table, picks)
  fill = dict(rounds=scale.rounds, tpw=f'{scale.tokens_per_weight:.1f}',
              steps_h1=scale.budget.steps_h1)
  rows, details, words = _claims_sections(out, scale, figures, rel, picks, g, t9, warm,
                                          fill)
  fig = lambda name, title: f'![{title}]({rel}/{os.path.basename(paths[name])})'  # noqa: E731
  text = '\n'.join([
      '# Claims of the seed papers, each tested in its regime',
      '',
      f'Regenerate: `{_command(scale)}` (re-running skips finished runs and rewrites this '
      f'page). {_cost_text(out)} The scaling overlay: `python -m launch.scaling '
      '--preset=micro --out=runs/scaling_micro`.',
      *_progress(scale, g, more),
      '',
      __doc__.split('\n\n', 2)[2].strip(),
      '',
      f'Budget of this page: {scale.budget}, H = {scale.sync_every}, {scale.rounds} rounds, '
      f'{scale.tokens_per_weight:.1f} tokens per weight.',
      '',
      '| # | claim (source) | measured (final eval loss, or claim 9\'s seconds, mean ± std '
      'over seeds) | effect: a − b [CI] (the first comparison, paired by seed) | verdict | '
      'kind | plot |',
      '|---|---|---|---|---|---|---|',
      *rows,
      '',
      '## What changed from the previous page, and why',
      '',
      *_changed_text(page, words, fill),
      '',
      '## The papers\' figures, re-drawn (bands: lowest to highest seed)',
      '',
      fig('diloco_h', 'DiLoCo against H'), fig('diloco_m', 'DiLoCo against replicas'),
      '',
      fig('outer', 'outer optimizer'), fig('streaming', 'Streaming tau x alpha and P'),
      '',
      fig('sparse_bytes', 'SparseLoCo loss against bytes'),
      '',
      '### GASLoC: topology x H (seed 1)',
      '',
      *topology_text(table, scale),
      '',
      fig('gasloc_chi', 'GASLoC gap against chi1'),
      '',
      *claims_figures.section(out, g, finals(scale, more), figure_methods(scale, picks),
                              scale.budget, NETWORKS, figures, rel),
      *drift_text(out, scale, g, picks, figures, rel),
      '## DiLoCo against DDP across model sizes (arXiv 2503.09799)',
      '',
      *scaling_text(scaling_dirs, figures, rel),
      '',
      '## The reference DiLoCo: its (outer lr, momentum) landscape',
      '',
      *landscape_text(picks, g, scale.plan),
      '',
      '## Tuning: equal budgets, every setting and the pick per method',
      '',
      *_tuning_table(picks, scale),
      '',
      '## Per claim',
      '',
      *details,
  ])
  os.makedirs(os.path.dirname(page) or '.', exist_ok=True)
  runs_lib.write_atomic(page, text + '\n')
  return page


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m launch.claims', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', default=os.path.join('runs', 'claims70'))
  scales = parser.add_mutually_exclusive_group()
  scales.add_argument('--quick', action='store_true',
                      help='36-step runs, one or two points per ladder: the pipeline '
                      'end to end, not evidence')
  scales.add_argument('--long', action='store_true',
                      help='140 rounds (2,100 steps, 10 tokens per weight), about 3.5 h')
  parser.add_argument('--page', help=f'default: {PAGE}, or OUT/claims.md with --quick; '
                      'its figures go to figures/claims beside it')
  parser.add_argument('--parallel', type=cli.positive_int, default=1)
  parser.add_argument('--batch_runs', type=cli.positive_int, default=3,
                      help='runs that differ only in seed or lr train up to N in one '
                      'program (loco.sweep --batch_runs; 1: each alone)')
  parser.add_argument('--scaling', nargs='*', default=list(SCALING),
                      help='launch.scaling studies (folders, or points files) whose points '
                      'the page overlays')
  parser.add_argument('--page_only', action='store_true',
                      help='write the page from the finished runs; train nothing')
  parser.add_argument('--sampling', choices=('windows', 'stream'), default='windows',
                      help='the batch layout of every run (data.sampling; stream '
                      'reproduces the pages made before independent-row batches)')
  args = parser.parse_args(argv)
  scale = SCALES['quick' if args.quick else 'long' if args.long else 'full']
  scale = dataclasses.replace(scale, budget=dataclasses.replace(
      scale.budget, common={**scale.budget.common, 'data.sampling': args.sampling}))
  page = args.page or (os.path.join(args.out, 'claims.md') if args.quick else PAGE)
  figures = os.path.join(os.path.dirname(page) or '.', FIGURES)

  def body() -> int:
    cli.check_output_dir(args.out)
    run = functools.partial(study.run_all, args.out, methods(scale),
                            budget=scale.budget, parallel=args.parallel,
                            retimes={'slow_links': SLOW_LINKS}, train=not args.page_only,
                            batch_runs=args.batch_runs, families=scale.plan.families,
                            retimed=scale.plan.reference + claims_of(scale.plan)[8].finals)
    picks, g = run(finals(scale))
    more = undecided(scale, g, picks)
    if more:      # a first look left a claim undecided: its finals train the extra seeds
      picks, g = run(finals(scale, more))
    claims_figures.retime_finals(args.out, finals(scale, more), scale.budget, NETWORKS)
    print(f'claims page: {write_page(args.out, scale, page, figures, picks, g, args.scaling)}')
    return 0

  return cli.run('launch.claims', body)


if __name__ == '__main__':
  cli.exit(main())
