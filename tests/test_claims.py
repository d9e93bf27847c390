"""The claims page (launch/claims.py): its runs, budgets, verdicts and the page, end to end."""

import dataclasses
import math
import os
import shutil

import numpy as np
import pytest

from launch import claims
from launch import claims_figures
from loco.lab import study
from loco.lab import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _settings(method, budget):
  """Every setting the protocol can ask of a method: its five, and both extensions."""
  scores = {}
  wanted, _ = study.settings(method, budget, scores)
  out = list(wanted)
  for s in wanted:
    scores[study.label(s)] = 2.0 + (0.0 if s[study.LR] == budget.inner_lrs[-1] else 0.1)
  wanted, _ = study.settings(method, budget, scores)
  for s in wanted:
    scores.setdefault(study.label(s), 2.0 if (method.knob and s.get(method.knob.key) ==
                                               method.knob.values[-1]) else 2.2)
  wanted, _ = study.settings(method, budget, scores)
  return wanted


# Finals that change what a run trains on purpose (named in their claims' cards).
WARM = ('diloco_warm', 'diloco_m1_warm')           # 3/4 of the steps after DDP's quarter
REPLICA_SERIES = ('diloco_r1', 'diloco_r2', 'diloco_r4', 'diloco_r16')   # own batch each


@pytest.mark.parametrize('scale', list(claims.SCALES))
def test_every_run_config_loads_and_each_claim_compares_at_equal_tokens(scale, in_repo):
  s = claims.SCALES[scale]
  b = s.budget
  ms = claims.methods(s)
  tuning = [study.tuning_run(m, b, setting) for m in ms for setting in _settings(m, b)]
  picks = _fake_picks(s)
  finals = claims.finals(s)
  final = study.final_runs(ms, finals, b, picks, 'OUT')
  # Every re-tuned variant's tuning runs load too.
  by_name = {m.name: m for m in ms}
  for f in finals:
    if f.retune is not None:
      parent = picks[f.method]
      problem = study.variant_problem(f, by_name[parent.get('member', f.method)],
                                      parent['setting'], b, 'OUT')
      tuning += [study.tuning_run(problem, b, x) for x in problem.plan({})[0]]
  sweep.check_runs(tuning)
  sweep.check_runs(final)
  load = lambda runs: {r.name: sweep.load_config(sweep.command(r, 'w')[3:]) for r in runs}
  tuning, final = load(tuning), load(final)
  assert {c.data.eval_split for c in tuning.values()} == {b.tuning_split}
  assert {c.data.eval_split for c in final.values()} == {b.final_split}
  assert {c.seed for c in tuning.values()} == {0}
  assert b.check_seed == (None if scale == 'quick' else claims.CHECK_SEED)
  assert claims.CHECK_SEED not in b.seeds + study.extra_seeds(b) + (b.tune_seed,)
  assert {c.seed for c in final.values()} == set(b.seeds)
  tokens = {name: c.steps * c.num_workers * c.batch_per_worker * c.seq_len
            for name, c in final.items()}
  seeds = {f.name: f.seeds_of(b) for f in finals}
  for claim in claims.claims_of(s.plan):
    within = {tokens[f'{f}/seed{seed}'] for f in claim.shown(picks)
              if f not in WARM + REPLICA_SERIES for seed in seeds[f]}
    assert len(within) == 1, (claim.number, within)
  # A warm start trains the steps DDP had left after its quarter-way checkpoint, from
  # the same seed's DDP run; DDP keeps that checkpoint.
  for name in WARM:
    c = final[f'{name}/seed2']
    assert c.steps == b.steps - s.warm_step and c.init_inner_state == 'carried'
    assert c.init_from == os.path.join('OUT', 'final', 'ddp', 'seed2', 'checkpoints',
                                       str(s.warm_step))
  ddp = final['ddp/seed1']
  assert s.warm_step % ddp.checkpoint.every == 0 and ddp.checkpoint.keep >= 4
  assert s.warm_step % s.sync_every == 0
  # Replicas keep 4 sequences each: tokens grow with M.
  assert [tokens[f'diloco_r{m}/seed1'] / tokens['diloco_nesterov/seed1']
          for m in s.plan.replicas] == [m / 8 for m in s.plan.replicas]
  # The reference family's variants train its best member (here the 0.5 one, or 0.9 in a
  # plan without it), the re-tuned ones at their own pick, the others at the member's.
  mu = 0.5 if 0.5 in s.plan.momenta else 0.9
  best = claims.reference_name(mu)
  assert picks['diloco']['member'] == best
  for name in ('diloco_keep50', 'diloco_prune50', 'diloco_e3m0', 'diloco_r4', 'diloco_warm'):
    c = final[f'{name}/seed1']
    assert (c.algorithm.outer_momentum, c.algorithm.outer_optimizer) == (mu, 'nesterov')
  assert final['diloco_prune50/seed1'].algorithm.outer_lr == picks[best][
      'setting']['algorithm.outer_lr']
  assert final['diloco_r4/seed1'].algorithm.outer_lr == 0.123
  paper = final['diloco_paper/seed1'].algorithm
  assert (paper.outer_lr, paper.outer_momentum, paper.outer_optimizer) == (0.7, 0.9, 'nesterov')
  assert {c.seed for n, c in tuning.items() if '_seed' in n} == set()
  configs = {**tuning, **final}
  assert {c.num_workers for n, c in configs.items()
          if not n.startswith(('diloco_r', 'diloco_m1'))} == {8}
  # Warm-up is a sixth of each run's own length (the H = 1 runs are shorter; tuning runs
  # train half the steps at the long scale); the warm starts have none.
  assert {c.optimizer.warmup_steps * 6 == c.steps for n, c in configs.items()
          if not n.startswith(WARM)} == {True}
  assert {c.steps for c in tuning.values()} == {
      round(b.steps * b.tune_fraction), round(b.steps_h1 * b.tune_fraction)}
  # The eval of every run ends on its last step and covers the split (32 x 16 windows).
  assert {c.steps % c.eval.every for n, c in configs.items()
          if not n.startswith(WARM)} == {0}
  assert {c.eval.batches for c in configs.values()} == {32}
  if scale != 'quick':     # 70 (long: 140) rounds of H = 15, 5 (10) tokens per weight
    rounds = {'full': 70, 'long': 140}[scale]
    runs = [c for n, c in final.items() if c.algorithm.sync_every == 15
            and not n.startswith(WARM)]
    assert {c.steps // c.algorithm.sync_every for c in runs} == {rounds}
    # 1,050 x 8 x 4 x 64 = 2.15M tokens / 426,752 weights
    assert s.tokens_per_weight == pytest.approx(rounds / 70 * 5.039, abs=0.01)
  streaming = [c for n, c in final.items() if n.startswith('streaming/')]
  assert {(c.algorithm.num_fragments, c.algorithm.non_block) for c in streaming} == {
      (2, 'first')}
  # Claim 7 tests GASLoC with one random neighbour per round.
  assert final['gasloc_h1_peer_ring/seed1'].algorithm.pairwise is True
  assert not final['gasloc_h1_ring/seed1'].algorithm.pairwise     # unset: every neighbour
  # Claim 1's M = 1 control holds the whole batch on one worker and is tuned on its own.
  for name in ('diloco_m1/seed1', 'diloco_m1_warm/seed1'):
    assert (final[name].num_workers, final[name].batch_per_worker) == (1, 8 * s.batch)
  assert {c.algorithm.outer_lr for n, c in tuning.items() if n.startswith('diloco_m1/')} == set(
      claims.NESTEROV_M1.values)


def _fake_picks(scale):
  """A pick per method (its second first-stage setting), the 0.5 member best of the
  reference family (0.9 in a plan without it), and every re-tuned variant at outer lr
  (or knob) 0.123."""
  ms = claims.methods(scale)
  best = claims.reference_name(0.5 if 0.5 in scale.plan.momenta else 0.9)
  picks = {m.name: dict(setting=study.settings(m, scale.budget, {})[0][1],
                        loss=1.9 if m.name == best else 2.0) for m in ms}
  study.add_families(picks, scale.plan.families)
  for f in claims.finals(scale):
    if f.retune is not None:
      picks[f.name] = dict(setting={f.retune.key: 0.123}, loss=2.0)
  return picks


def test_the_quick_plan_keeps_one_or_two_of_each_ladder_of_the_full_one():
  """The quick page trains a subset of each ladder (its end-to-end test stays short),
  with what the claims' tests read; a plan without it is refused."""
  full, quick = claims.SCALES['full'].plan, claims.SCALES['quick'].plan
  assert full == claims.Plan()
  for field in dataclasses.fields(claims.Plan):
    mine, every = getattr(quick, field.name), getattr(full, field.name)
    assert 0 < len(mine) < len(every) and set(mine) <= set(every), field.name
  assert {0.0, 0.9} <= set(quick.momenta)           # claim 2: SGD against momentum
  quick_methods = {m.name: m for m in claims.methods(claims.SCALES['quick'])}
  assert set(quick_methods) == {m.name for m in claims.methods(claims.SCALES['full'])} - {
      'diloco_mu0p5', 'diloco_mu0p8', 'diloco_mu0p95', 'a2cid2', 'noloco_h1'}
  names = {f.name for f in claims.finals(claims.SCALES['quick'])}
  assert {'diloco_keep50', 'diloco_prune50', 'diloco_r4', 'diloco_r16',
          'gasloc_complete_h6', 'dadamw_exponential', 'adpsgd_exponential'} <= names
  assert not {'diloco_keep10', 'diloco_r1', 'a2cid2_ring', 'gasloc_torus_h6'} & names
  for bad in ({'dropouts': (10, 30)}, {'replicas': (1, 2, 4)}, {'topologies': ('ring',)}):
    with pytest.raises(ValueError, match=f'Plan.{next(iter(bad))} must hold'):
      claims.Plan(**bad)


def test_variants_that_move_the_optimum_retune_it_and_the_reference_is_a_family():
  """M, H, topology and the communication form re-tune; variants that keep them (dropout,
  pruning, E3M0, warm starts, Streaming's merge) do not; every momentum of the reference
  is a member tuned over the same effective steps."""
  fs = {f.name: f for f in claims.finals()}
  retuned = {n for n, f in fs.items() if f.retune is not None}
  assert {f'diloco_r{m}' for m in claims.REPLICAS} <= retuned
  assert {f'diloco_h{h}' for h in claims.SCALES['full'].h_series} <= retuned
  assert {n for n in fs if n.startswith('gasloc_') and n.split('_')[-1].startswith('h')
          and n.split('_')[-1][1:].isdigit()} <= retuned
  assert {'gasloc_h1_peer_ring', 'gasloc_h1_peer_exponential', 'gasloc_async_overlap',
          'dadamw_exponential', 'adpsgd_exponential'} <= retuned
  assert not {'dadamw_ring', 'diloco_keep50', 'diloco_prune50', 'diloco_e3m0',
              'diloco_warm', 'streaming_t5_a0', 'diloco_paper'} & retuned
  assert fs['adpsgd_exponential'].retune.key == study.LR      # no knob: the inner lr
  assert fs['dadamw_exponential'].retune == study.Retune('algorithm.gossip_step', high=1.0)
  ms = {m.name: m for m in claims.methods(claims.SCALES['full'])}
  for mu in claims.REFERENCE_MOMENTA:
    m = ms[claims.reference_name(mu)]
    assert m.keys['algorithm.outer_momentum'] == mu
    assert [v / (1 - mu) for v in m.knob.values] == pytest.approx(claims.EFFECTIVE)
    assert m.knob.geometric
  assert claims.FAMILIES['nesterov'] == tuple(n for n in claims.REFERENCE if n != 'diloco_sgd')


def test_claim_7_compares_at_equal_bytes():
  g = {n: study.Group(n, {}, {}, None, b, b, b, []) for n, b in (
      ('gasloc_h1_peer_ring', 1e6), ('gasloc_h1_ring', 2e6), ('dadamw_ring', 2.1e6),
      ('adpsgd_ring', 0.9e6))}
  assert claims.equal_bytes(g, 'ring', 'dadamw') == 'gasloc_h1_ring'
  assert claims.equal_bytes(g, 'ring', 'adpsgd') == 'gasloc_h1_peer_ring'
  assert claims.equal_bytes(g, 'exponential', 'adpsgd') == 'gasloc_h1_peer_exponential'


def test_the_landscape_table_marks_the_best_member_and_the_papers_configuration():
  picks = _fake_picks(claims.SCALES['full'])
  for mu, name in zip(claims.REFERENCE_MOMENTA, claims.REFERENCE):
    lr = picks[name]['setting'][study.LR]
    etas = claims.reference_knob(mu).values
    picks[name]['tried'] = [({study.LR: lr, 'algorithm.outer_lr': e}, 2.0 + i / 100)
                            for i, e in enumerate(etas)] + [
        ({study.LR: lr / 2, 'algorithm.outer_lr': etas[1]}, 2.5)]
    picks[name]['label'] = study.label(picks[name]['setting'])
  study.add_families(picks, claims.FAMILIES)
  g = {'diloco_mu0p5': _group('diloco_mu0p5', [1.5, 1.51, 1.52]),
       'diloco_paper': _group('diloco_paper', [1.6, 1.61, 1.62])}
  text = '\n'.join(claims.landscape_text(picks, g))
  assert '| 0.5 **(best)** | 0.5: 2.0000 (1), 1: 2.0100 (2), 2: 2.0200 (4) |' in text
  assert '1.5100 ± 0.0100' in text and '2.5000' not in text     # another inner lr: not a cell
  assert "The DiLoCo paper's configuration (Nesterov, mu 0.9, eta 0.7" in text
  assert '1.6100 ± 0.0100' in text
  del picks['diloco_sgd']
  assert claims.landscape_text(picks, g) == ['The reference family has not finished tuning.']


def test_every_method_gets_five_settings_of_the_same_inner_lrs():
  s = claims.SCALES['full']
  for m in claims.methods(s):
    first, _ = study.settings(m, s.budget, {})
    assert [x[study.LR] for x in first] == list(s.budget.inner_lrs), m.name
    scores = {study.label(x): 2.0 + abs(math.log(x[study.LR] / 3e-3)) for x in first}
    five, _ = study.settings(m, s.budget, scores)
    assert len(five) == 5, m.name


def _group(name, losses):
  return study.Group(name, dict(zip((1, 2, 3), losses)), {}, None, 0.0, 0.0, 0.0, [])


def test_a_claim_of_several_comparisons_needs_every_one_and_fails_after_holm():
  g = {'a': _group('a', [1.00, 1.01, 0.99]), 'b': _group('b', [1.10, 1.11, 1.09]),
       'c': _group('c', [1.00, 1.06, 0.95]), 'd': _group('d', [0.90, 0.91, 0.89])}
  T = claims.Test
  b = BUDGET
  assert claims.judge(g, [T('a', 'b')], b).word == 'reproduced'
  assert claims.judge(g, [T('b', 'a')], b).word == 'not reproduced'
  assert claims.judge(g, [T('a', 'c')], b).word == 'inconclusive'
  assert claims.judge(g, [T('a', 'b'), T('d', 'b')], b).word == 'reproduced'
  both = claims.judge(g, [T('a', 'b'), T('a', 'c')], b)
  assert both.word == 'inconclusive' and '1 of 2 comparisons hold' in both.note
  refuted = claims.judge(g, [T('a', 'b'), T('a', 'd')], b)
  assert refuted.word == 'not reproduced' and 'refuted after Holm' in refuted.note
  with pytest.raises(KeyError, match='e'):
    claims.judge(g, [T('a', 'e')], b)


BUDGET = claims.SCALES['full'].budget


def test_margins_are_relative_loss_converted_from_the_papers_perplexity():
  assert claims.WITHIN_2.relative == pytest.approx(math.log(1.02) / math.log(15.02))
  assert claims.WITHIN_2.relative == pytest.approx(0.00731, abs=1e-5)
  assert claims.DROPOUT_50.relative == pytest.approx(0.0077, abs=1e-4)
  assert 'ln(1 + 0.02) / ln(15.02) = 0.73% of the loss' in claims.WITHIN_2.source
  assert 'about a seventh' in claims.WITHIN_2.source
  # 0.5% worse per seed: within 0.73%, not strictly better.
  g = {'a': _group('a', [1.005, 2.0 * 1.0052, 1.5 * 1.0048]), 'b': _group('b', [1.0, 2.0, 1.5])}
  assert claims.judge(g, [claims.Test('a', 'b')], BUDGET).word == 'not reproduced'
  assert claims.judge(g, [claims.Test('a', 'b', claims.WITHIN_2)], BUDGET).word == 'reproduced'


def test_the_summary_states_each_claims_effect_with_its_margin_added_back():
  """The summary's effect cell is the first comparison's mean (a - b) / b per seed and its
  CI, not the test's (a - b) / b - margin; a test in units shows them; a claim of several
  comparisons says how many more."""
  g = {'a': _group('a', [1.02, 2.04, 1.53]), 'b': _group('b', [1.0, 2.0, 1.5]),
       'c': _group('c', [1.0, 2.0, 1.5])}
  v = claims.judge(g, [claims.Test('a', 'b', claims.WITHIN_2)], BUDGET)
  cell = claims.headline(v, 'nats')
  assert cell.startswith('a − b (relative): +2.00% [+2.00%, +2.00%] ')
  assert '3 seeds; margin +0.73%' in cell and 'more comparison' not in cell
  g['a'], g['b'] = _group('a', [110.0, 232.0, 138.0]), _group('b', [10.0, 130.0, 40.0])
  v = claims.judge(g, [claims.Test('a', 'b', relative=False), claims.Test('a', 'c')], BUDGET)
  cell = claims.headline(v, 'simulated seconds')
  low, high = v.tests[0][1].ci
  assert cell.startswith(f'a − b: +100 s [{low:+,.0f} s, {high:+,.0f} s] ')
  assert cell.endswith('; 1 more comparison') and 'margin' not in cell
  assert claims.headline(None, 'nats') == '—'


@pytest.mark.parametrize('scale', list(claims.SCALES))
def test_each_claim_names_its_finals_and_regime(scale):
  """At every scale (the quick page's plan trains one or two of each ladder) a claim
  shows and tests only finals its page trains."""
  s = claims.SCALES[scale]
  names = {f.name for f in claims.finals(s)} | {'gain_4_to_8', 'gain_8_to_16'}
  picks = _fake_picks(s)
  for claim in claims.claims_of(s.plan):
    assert set(claim.shown(picks)) <= names, claim.number
    assert {n for t in claim.tests(picks, {}) for n in (t.a, t.b)} <= names, claim.number
    card = claim.regime
    assert all(getattr(card, key) for key, _ in claims.Regime.FIELDS), claim.number
    assert card.meaning.endswith('.'), claim.number
  assert [c.number for c in claims.CLAIMS] == list(range(1, 12))
  # The mechanism checks whose verdicts transfer; the others are data points at 0.43M.
  assert {c.number for c in claims.CLAIMS if c.transfers} == {3, 4, 5, 6, 10}
  assert set(claims.WHY) == set(range(1, 12))


def test_claim_11_tests_diminishing_returns_per_seed():
  picks = {'diloco': {'member': 'diloco_nesterov'}}
  g = {'diloco_r4': _group('diloco_r4', [2.10, 2.12, 2.11]),
       'diloco_nesterov': _group('diloco_nesterov', [2.00, 2.01, 2.02]),
       'diloco_r16': _group('diloco_r16', [1.97, 1.985, 1.99])}
  d = claims.derived_groups(g, picks)
  np.testing.assert_allclose([d['gain_4_to_8'].losses[s] for s in (1, 2, 3)],
                             [0.10, 0.11, 0.09])
  tests = claims.CLAIMS[10].tests(picks, g)
  assert claims.judge({**g, **d}, tests, BUDGET).word == 'reproduced'
  g['diloco_r16'] = _group('diloco_r16', [1.85, 1.86, 1.88])      # 8 -> 16 gains more
  d = claims.derived_groups(g, picks)
  assert claims.judge({**g, **d}, tests, BUDGET).word == 'not reproduced'


def test_a_diverged_final_ends_the_page_and_is_named_on_it():
  scale = claims.SCALES['quick']
  planned = {f.name: f.seeds_of(scale.budget) for f in claims.finals(scale)}
  total = sum(len(s) for s in planned.values())
  g = {n: study.Group(n, {s: 2.0 for s in seeds}, {}, None, 0.0, 0.0, 0.0, [])
       for n, seeds in planned.items()}
  assert claims._progress(scale, g) == []
  last = planned['diloco_r4'][-1]
  del g['diloco_r4'].losses[last]
  assert 'In progress:** ' + f'{total - 1} of {total}' in ''.join(claims._progress(scale, g))
  g['diloco_r4'].diverged[last] = 234
  lines = ''.join(claims._progress(scale, g))
  assert 'In progress' not in lines
  assert f'**Diverged:** 1 of {total} final runs (diloco_r4: seed {last} diverged at step 234)' \
      in lines
  # A claim whose method diverged where its baseline finished is refuted; claim 11's
  # gains lose the seed where either replica count diverged.
  g['diloco_r16'].diverged[last] = 50
  del g['diloco_r16'].losses[last]
  d = claims.derived_groups(g, {'diloco': {'member': 'diloco_nesterov'}})
  assert d['gain_8_to_16'].diverged == {last: 50} and last not in d['gain_8_to_16'].losses
  t = claims.Test('diloco_r16', 'diloco_nesterov')
  assert claims.judge(g, [t], scale.budget).word == 'not reproduced'
  assert claims._refuted_p(study.compare(g['diloco_r16'], g['diloco_nesterov'])) == 0.0


def test_a_test_whose_first_look_straddles_its_margin_gets_two_more_seeds():
  scale = claims.SCALES['full']
  first = scale.budget.seeds
  picks = _fake_picks(scale)      # the reference: diloco_mu0p5
  # Every final 3% from the next, per seed alike: every first look decides.
  g = {f.name: study.Group(f.name, {s: (2.0 + 0.06 * i) * (1 + 0.0001 * s) for s in first},
                           {}, None, 0.0, 0.0, 0.0, [])
       for i, f in enumerate(claims.finals(scale))}
  assert claims.undecided(scale, g, picks) == []
  # SparseLoCo 0.7% worse than the reference, give or take 0.3%: its CI straddles the
  # 0.73% margin. Pruning 1.1% worse, give or take 0.3%: it straddles too, away from
  # zero (the old rule, effects under 1% only, missed it).
  ref = g['diloco_mu0p5'].losses
  g['sparseloco'].losses.update({s: ref[s] * (1.007 + 0.003 * (s - 2)) for s in first})
  g['diloco_prune50'].losses.update({s: ref[s] * (1.011 + 0.003 * (s - 2)) for s in first})
  more = claims.undecided(scale, g, picks)
  assert more == ['diloco_mu0p5', 'diloco_prune50', 'sparseloco']
  extra = study.extra_seeds(scale.budget)
  assert extra == (max(first) + 1, max(first) + 2)
  seeds = {f.name: f.seeds_of(scale.budget) for f in claims.finals(scale, more)}
  assert seeds['sparseloco'] == seeds['diloco_mu0p5'] == first + extra
  assert seeds['streaming'] == first
  lines = ''.join(claims._progress(scale, g, more))
  assert '**More seeds:** diloco_mu0p5, diloco_prune50, sparseloco also train seeds' in lines
  assert '**In progress:**' in lines                      # the extra seeds are not run
  # The extra seeds move the means but not the choice, which reads the first seeds only;
  # the verdict is then the second look's.
  g['sparseloco'].losses.update({s: ref.get(s, 2.0) * 1.0 for s in extra})
  g['diloco_mu0p5'].losses.update({s: 2.0 for s in extra})
  g['sparseloco'].losses.update({s: 2.0 * 1.001 for s in extra})
  g['diloco_prune50'].losses.update({s: 2.0 * 1.011 for s in extra})
  assert claims.undecided(scale, g, picks) == more
  assert '**In progress:**' not in ''.join(claims._progress(scale, g, more))
  v = claims.judge(g, claims.CLAIMS[5].tests(picks, g), scale.budget)
  assert v.tests[0][1].look == 2


def test_the_topology_slopes_fit_the_fixed_graphs_against_chi1():
  """Gaps and consensus distances made to grow like chi1 ** k come back with slope k;
  the per-round random graph (matching, whose chi1 is the complete graph's) is left out."""
  scale = dataclasses.replace(claims.SCALES['quick'], plan=claims.Plan())   # every graph
  chis = claims.chi1_of()
  assert claims.fixed_graphs() == ['ring', 'torus', 'exponential']
  assert chis['matching'] == pytest.approx(chis['complete'])
  h = scale.h_table[0]

  def cell(t, loss, spread):
    return study.Group(t, {1: loss}, {}, None, 0.0, 0.0, 0.0, [],
                       {'worker_spread': spread, 'eval_loss_workers': loss})
  table = {(t, h): cell(t, 2.0 + 0.01 * chis[t] ** 0.5, 1e-3 * chis[t] ** 2)
           for t in ('ring', 'torus', 'exponential')}
  table[('complete', h)] = cell('complete', 2.0, 0.0)
  table[('matching', h)] = cell('matching', 9.0, 1.0)     # would wreck any fit it joined
  text = '\n'.join(claims.topology_text(table, scale))
  assert f'- H = {h}: gap to the complete graph ring +0.0185' in text
  assert 'slope of the gap: 0.50; slope of the consensus distance: 2.00.' in text
  assert 'matching draws its graph per round' in text
  table[('ring', h)] = cell('ring', 1.9, 1e-3 * chis['ring'] ** 2)      # one gap > 0 left
  table[('torus', h)] = cell('torus', 1.9, 1e-3 * chis['torus'] ** 2)
  assert 'fewer than 2 graphs with a positive gap' in '\n'.join(
      claims.topology_text(table, scale))


def _synthetic(scale):
  """Picks as the tuning would leave them and a scored Group per final, every seed, with
  losses, bytes and curves drawn per final's name: a page without training."""
  picks = _fake_picks(scale)
  for p in picks.values():
    p.setdefault('label', study.label(p['setting']))
    p.setdefault('tried', [(p['setting'], p['loss'])])
    p.setdefault('grid', [(p['label'], p['loss'])])
    p.setdefault('edge', [])
  g = {}
  for f in claims.finals(scale):
    r = np.random.default_rng(sum(map(ord, f.name)))
    seeds = f.seeds_of(scale.budget)
    curves = [[(1000.0 * i, 3.0 - 0.1 * i) for i in range(5)] for _ in seeds]
    g[f.name] = study.Group(
        f.name, {s: float(2.0 + 0.05 * r.standard_normal()) for s in seeds}, {}, None,
        float(r.integers(1e5, 1e8)), float(r.integers(1e5, 1e8)),
        float(r.integers(1e3, 1e6)), curves,
        {'worker_spread': 0.01, 'eval_loss_workers': 2.01})
  return picks, g


@pytest.mark.parametrize('scale', ['full', 'quick'])
def test_the_whole_page_is_written_from_scored_finals_without_runs(scale, tmp_path, in_repo):
  """write_page at each scale from synthetic picks and finals (no run folders): every
  claim gets a row and a section, the landscape a row per momentum of the plan, the
  topology table a row per graph, the tuning table a row per tuned method; claim 9 waits
  for its re-timing; the figures are drawn."""
  s = claims.SCALES[scale]
  picks, g = _synthetic(s)
  page = claims.write_page(str(tmp_path / 'runs'), s, str(tmp_path / 'claims.md'),
                           str(tmp_path / 'figures'), picks, g)
  text = open(page).read()
  rows = {int(line.split('|')[1]): line for line in text.splitlines()
          if line.startswith('| ') and line.split('|')[1].strip().isdigit() and
          '[plot](' in line}
  assert sorted(rows) == list(range(1, 12))
  assert '**not run**' in rows[9] and 'not re-timed on slow links yet' in rows[9]
  words = ('**reproduced**', '**not reproduced**', '**inconclusive**')
  assert all(any(w in rows[n] for w in words) for n in rows if n != 9), rows
  assert all(f'### Claim {n}\n' in text for n in range(1, 12))
  landscape = text.split('## The reference DiLoCo')[1].split('\n## ')[0]
  assert [line.split('|')[1].strip().split()[0] for line in landscape.splitlines()
          if line.startswith('| ') and line[2].isdigit()] == [f'{mu:g}' for mu in
                                                               s.plan.momenta]
  assert landscape.count('**(best)**') == 1
  topology = text.split('### GASLoC: topology x H')[1].split('\n## ')[0]
  assert [t for t in claims.TOPOLOGIES if f'| {t} | ' in topology] == list(s.plan.topologies)
  tuning = text.split('## Tuning: equal budgets')[1].split('\n## ')[0]
  assert all(f'| {m.name} | ' in tuning for m in claims.methods(s))
  for n in range(1, 12):
    assert os.path.getsize(tmp_path / 'figures' / f'claim{n}.png') > 1000
  for path in claims.figure_paths(str(tmp_path / 'figures')).values():
    assert os.path.getsize(path) > 1000, path


def test_the_previous_verdicts_are_read_from_that_page(in_repo):
  before = claims.previous_verdicts(claims.PREVIOUS_PAGE)
  assert sorted(before) == list(range(1, 12))
  assert before[1] == 'not reproduced' and before[4] == 'reproduced'


@pytest.mark.slow
def test_the_quick_claims_page_is_written_end_to_end(tmp_path, in_repo):
  """`python -m launch.claims --quick`: every tuning stage and final run, the re-timing,
  nine rows with a verdict and a plot each; a second call trains nothing."""
  out, page = str(tmp_path / 'claims'), str(tmp_path / 'claims.md')
  assert claims.main(['--quick', f'--out={out}', f'--page={page}']) == 0
  text = open(page).read()
  rows = [line for line in text.splitlines() if line.startswith('| ') and
          line.split('|')[1].strip().isdigit() and '[plot](' in line]
  assert [int(r.split('|')[1]) for r in rows] == list(range(1, 12))
  verdicts = ('**reproduced**', '**not reproduced**', '**inconclusive**')
  assert all(any(v in r for v in verdicts) for r in rows), rows
  assert '95% CI' in text and 'bytes received / worker' in text
  for n in range(1, 12):
    assert os.path.getsize(os.path.join(tmp_path, claims.FIGURES, f'claim{n}.png')) > 1000
  for path in claims.figure_paths(os.path.join(tmp_path, claims.FIGURES)).values():
    assert os.path.getsize(path) > 1000, path
  assert text.count('| model size |') == 11                 # a regime card per claim
  assert 'Regenerate: `python -m launch.claims --quick --out=' in text
  assert '## What changed from the previous page, and why' in text
  assert '## The reference DiLoCo: its (outer lr, momentum) landscape' in text
  assert '**(best)**' in text
  assert '| ring | ' in text and 'consensus distance' in text   # the topology x H table
  # The warm starts began from the same seed's DDP checkpoint a quarter of the way.
  with open(os.path.join(out, 'final', 'diloco_warm', 'seed1', 'log.txt')) as f:
    assert 'warm start from' in f.read()
  assert os.path.isdir(os.path.join(out, 'final', 'gasloc', 'seed1', 'retimed', 'slow_links'))
  # Every synchronous final re-timed on the page's networks, drawn against simulated
  # time and bytes; the asynchronous one is not re-timed.
  for name in ('ddp', 'diloco_warm', 'sparse_d100_f32', 'dadamw_ring'):
    for network in claims.NETWORKS:
      assert os.path.isdir(os.path.join(out, 'final', name, 'seed1', 'retimed', network))
  assert not os.path.isdir(os.path.join(out, 'final', 'gasloc_async_overlap', 'seed1',
                                        'retimed', 'gbit1_100ms'))
  for path in claims_figures.figure_paths(os.path.join(tmp_path, claims.FIGURES)).values():
    assert os.path.getsize(path) > 1000, path
  assert '## Choosing a method: loss against simulated time, and against bytes' in text
  assert '| gbit1_100ms | 1 Gbit/s | 100 ms | 0.1 s |' in text
  assert '| final | on the front of | bytes sent / worker |' in text
  mtime = os.path.getmtime(os.path.join(out, 'final', 'ddp', 'seed1', 'metrics.jsonl'))
  assert claims.main(['--quick', f'--out={out}', f'--page={page}']) == 0
  assert os.path.getmtime(os.path.join(out, 'final', 'ddp', 'seed1', 'metrics.jsonl')) == mtime
  # Writing the page without training scores a final that is finished but not scored.
  evals = os.path.join(out, 'final', 'ddp', 'seed1', 'evals')
  shutil.rmtree(evals)
  # ... and re-times a final on a network it lacks (no training: a replay), redrawing.
  retimed = os.path.join(out, 'final', 'ddp', 'seed1', 'retimed', 'gbit10_30ms')
  shutil.rmtree(retimed)
  assert claims.main(['--quick', f'--out={out}', f'--page={page}', '--page_only']) == 0
  assert os.listdir(evals) and os.path.isfile(os.path.join(retimed, 'metrics.jsonl'))


def test_a_damaged_clock_file_is_one_line(tmp_path, capsys):
  (tmp_path / 'seconds.txt').write_text('')
  with pytest.raises(claims.LocoError, match='seconds.txt is damaged'):
    study.read_seconds(str(tmp_path / 'seconds.txt'), 0.0)
  np.testing.assert_equal(study.read_seconds(str(tmp_path / 'none.txt'), math.nan), math.nan)


def test_each_page_names_the_command_that_regenerates_it():
  """main runs a copy of its scale that carries the batch layout: the page's command is
  still its own scale's, with a layout other than the default passed on."""
  def as_main(key, sampling):
    s = claims.SCALES[key]
    return dataclasses.replace(s, budget=dataclasses.replace(
        s.budget, common={**s.budget.common, 'data.sampling': sampling}))
  assert claims._command(as_main('full', 'windows')) == claims.COMMAND
  assert claims._command(as_main('long', 'windows')).startswith(
      'python -m launch.claims --long ')
  assert claims._command(as_main('quick', 'windows')).startswith(
      'python -m launch.claims --quick ')
  assert claims._command(as_main('full', 'stream')) == claims.COMMAND + ' --sampling=stream'
  other = dataclasses.replace(claims.SCALES['full'], budget=dataclasses.replace(
      claims.SCALES['full'].budget, steps=7))
  with pytest.raises(ValueError, match='no scale in SCALES has 7 steps'):
    claims._command(other)


def test_an_out_that_is_a_file_and_bad_flags_are_one_line(tmp_path, capsys):
  (tmp_path / 'f').write_text('x')
  assert claims.main([f'--out={tmp_path / "f"}']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'launch.claims: error: --out {tmp_path / "f"} is a file, not a directory.']
  with pytest.raises(SystemExit) as e:
    claims.main(['--parallel=0'])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('launch.claims: error: argument --parallel')


def test_the_drift_figure_reads_the_finals_diagnostics(tmp_path):
  """Claims 1, 2 and 4's drift from the rows' diagnostics, no training: the table holds
  the last row's value per final (mean over seeds); finals without them are left out."""
  import json
  scale = claims.SCALES['quick']
  picks = {'diloco': {'member': 'diloco_nesterov'}}
  out = str(tmp_path / 'out')
  for name, cos in (('diloco_nesterov', 0.5), ('streaming', 0.7)):
    for seed in scale.budget.seeds:
      d = os.path.join(out, 'final', name, f'seed{seed}')
      os.makedirs(d)
      with open(os.path.join(d, 'metrics.jsonl'), 'w') as f:
        for step in (6, 12):
          f.write(json.dumps({'step': step, 'tokens': 100 * step, 'train_loss': 3.0,
                              'pg_cosine': cos + 0.01 * seed, 'consensus_distance': 0.2,
                              'pg_norm': 1.5}) + '\n')
  g = {n: _group(n, [2.0, 2.0, 2.0]) for n in ('diloco_nesterov', 'streaming', 'ddp')}
  figures = str(tmp_path / 'figures')
  os.makedirs(figures)
  text = '\n'.join(claims.drift_text(out, scale, g, picks, figures, 'figures'))
  assert '| diloco_nesterov | 0.515 | 0.2 | 1.5 |' in text     # seeds 1 and 2: 0.51, 0.52
  assert '| streaming | 0.715 | 0.2 | 1.5 |' in text
  assert 'diloco_warm' not in text and '![drift](figures/drift.png)' in text
  assert os.path.getsize(os.path.join(figures, 'drift.png')) > 1000
  empty = '\n'.join(claims.drift_text(str(tmp_path / 'none'), scale, g, picks, figures, 'f'))
  assert 'No final of these claims has the diagnostics' in empty


def test_claim_9_reads_an_asynchronous_run_by_its_own_clock_and_a_synchronous_one_retimed(
    tmp_path):
  import json
  scale = claims.SCALES['quick']
  rows = [{'step': 6, 'tokens': 600, 'sim_seconds': 3.0, 'eval_loss': 2.5},
          {'step': 12, 'tokens': 1200, 'sim_seconds': 6.0, 'train_loss': 2.4},
          {'step': 18, 'tokens': 1800, 'sim_seconds': 6.5, 'eval_loss': float('nan')}]
  for d in (tmp_path / 'final' / 'gasloc_async_overlap' / 'seed1',
            tmp_path / 'final' / 'gasloc' / 'seed1' / 'retimed' / 'slow_links'):
    d.mkdir(parents=True)
    (d / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  (tmp_path / 'final' / 'gasloc' / 'seed2').mkdir(parents=True)     # not re-timed yet
  for name in ('gasloc_async_overlap', 'gasloc'):
    assert claims.sim_curves(str(tmp_path), scale, name) == {1: [(3.0, 2.5)]}, name


def test_an_asynchronous_run_that_never_reaches_claim_9s_target_is_named_not_hidden():
  """Claim 9's asynchronous GASLoC ended without reaching the target every synchronous
  final reaches: the verdict is 'not reproduced', the measured text keeps the finals that
  did reach it, and its table row says it never reached it (it ran: not 'not run')."""
  scale = claims.SCALES['full']
  claim = claims.claims_of(scale.plan)[8]
  picks = {'diloco': {'member': 'diloco_mu0p5'}}

  def group(name, values):
    return study.Group(name, dict(enumerate(values, 1)), {}, None, 2e8, 2e8, 3e6, [])

  g = {n: group(n, [1.54, 1.55, 1.56]) for n in
       ('diloco_mu0p5', 'gasloc', 'gasloc_pp', 'gasloc_async_overlap')}
  reached = {'diloco_mu0p5': group('diloco_mu0p5', [196.0, 194.0, 198.0]),
             'gasloc': group('gasloc', [163.0, 166.0, 166.0])}
  t9 = {'target': 1.643, 'groups': reached,
        'never': {'gasloc_pp': [], 'gasloc_async_overlap': [1, 2, 3]}}
  v, word, measured = claims._verdict(claim, reached, g, picks, scale, t9)
  assert v is None and word == 'not reproduced'
  assert 'diloco_mu0p5: 196' in measured and 'gasloc: 165' in measured
  assert 'gasloc_async_overlap never reaches it at seeds 1, 2, 3' in measured
  rows = claims._table(claim, reached, 'diloco_mu0p5', g, picks, ['gasloc_async_overlap'])
  assert '| gasloc_async_overlap | never reaches the target |' in '\n'.join(rows)
  assert not any(r.startswith('| gasloc_async_overlap | not run') for r in rows)
  # Finished but without a curve on slow links (no re-timing yet), or not run: not run,
  # not 'never reaches'.
  rows = claims._table(claim, reached, 'diloco_mu0p5', g, picks, [])
  assert '| gasloc_async_overlap | not run |' in '\n'.join(rows)
  assert '| gasloc_pp | not run |' in '\n'.join(rows)
