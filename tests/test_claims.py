"""The claims page (launch/claims.py): its runs, budgets, verdicts and the page, end to end."""

import math
import os
import shutil

import numpy as np
import pytest

from launch import claims
from launch import claims_figures
from loco import study
from loco import sweep

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
  picks = {m.name: dict(setting=study.settings(m, b, {})[0][1], loss=2.0) for m in ms}
  finals = claims.finals(s)
  final = study.final_runs(ms, finals, b, picks, 'OUT')
  sweep.check_runs(tuning)
  sweep.check_runs(final)
  load = lambda runs: {r.name: sweep.load_config(sweep.command(r, 'w')[3:]) for r in runs}
  tuning, final = load(tuning), load(final)
  assert {c.data.eval_split for c in tuning.values()} == {b.tuning_split}
  assert {c.data.eval_split for c in final.values()} == {b.final_split}
  assert {c.seed for c in tuning.values()} == {0}
  assert {c.seed for c in final.values()} == set(b.seeds)
  tokens = {name: c.steps * c.num_workers * c.batch_per_worker * c.seq_len
            for name, c in final.items()}
  seeds = {f.name: f.seeds_of(b) for f in finals}
  for claim in claims.CLAIMS:
    within = {tokens[f'{f}/seed{seed}'] for f in claim.finals
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
          for m in claims.REPLICAS] == [m / 8 for m in claims.REPLICAS]
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
  assert claims.judge(g, [T('a', 'b')]).word == 'reproduced'
  assert claims.judge(g, [T('b', 'a')]).word == 'not reproduced'
  assert claims.judge(g, [T('a', 'c')]).word == 'inconclusive'
  assert claims.judge(g, [T('a', 'b'), T('d', 'b')]).word == 'reproduced'
  both = claims.judge(g, [T('a', 'b'), T('a', 'c')])
  assert both.word == 'inconclusive' and '1 of 2 comparisons hold' in both.note
  refuted = claims.judge(g, [T('a', 'b'), T('a', 'd')])
  assert refuted.word == 'not reproduced' and 'refuted after Holm' in refuted.note
  with pytest.raises(KeyError, match='e'):
    claims.judge(g, [T('a', 'e')])


def test_margins_are_in_nats_from_perplexity():
  assert claims.WITHIN_2.nats == pytest.approx(math.log(1.02))
  assert claims.DROPOUT_50.nats == pytest.approx(math.log(1.021))
  assert '2% perplexity' in claims.WITHIN_2.source
  g = {'a': _group('a', [1.015, 1.016, 1.014]), 'b': _group('b', [1.0, 1.0, 1.0])}
  assert claims.judge(g, [claims.Test('a', 'b')]).word == 'not reproduced'
  assert claims.judge(g, [claims.Test('a', 'b', claims.WITHIN_2)]).word == 'reproduced'


def test_each_claim_names_its_finals_and_regime():
  names = {f.name for f in claims.finals()} | {'gain_4_to_8', 'gain_8_to_16'}
  picks = {m: dict(loss=2.0) for m in ('gasloc', 'gasloc_pp', 'gasloc_h1')}
  for claim in claims.CLAIMS:
    assert set(claim.finals) <= names, claim.number
    assert {n for t in claim.tests(picks) for n in (t.a, t.b)} <= names, claim.number
    card = claim.regime
    assert all(getattr(card, key) for key, _ in claims.Regime.FIELDS), claim.number
    assert card.meaning.endswith('.'), claim.number
  assert [c.number for c in claims.CLAIMS] == list(range(1, 12))
  assert set(claims.WHY) == set(range(1, 12))


def test_claim_11_tests_diminishing_returns_per_seed():
  g = {'diloco_r4': _group('diloco_r4', [2.10, 2.12, 2.11]),
       'diloco_nesterov': _group('diloco_nesterov', [2.00, 2.01, 2.02]),
       'diloco_r16': _group('diloco_r16', [1.97, 1.985, 1.99])}
  d = claims.derived_groups(g)
  np.testing.assert_allclose([d['gain_4_to_8'].losses[s] for s in (1, 2, 3)],
                             [0.10, 0.11, 0.09])
  assert claims.judge({**g, **d}, claims.CLAIMS[10].tests({})).word == 'reproduced'
  g['diloco_r16'] = _group('diloco_r16', [1.85, 1.86, 1.88])      # 8 -> 16 gains more
  d = claims.derived_groups(g)
  assert claims.judge({**g, **d}, claims.CLAIMS[10].tests({})).word == 'not reproduced'


def test_a_diverged_final_ends_the_page_and_is_named_on_it():
  scale = claims.SCALES['quick']
  planned = {f.name: f.seeds_of(scale.budget) for f in claims.finals(scale)}
  total = sum(len(s) for s in planned.values())
  g = {n: study.Group(n, {s: 2.0 for s in seeds}, {}, None, 0.0, 0.0, 0.0, [])
       for n, seeds in planned.items()}
  assert claims._progress(scale, g) == []
  last = planned['diloco_r1'][-1]
  del g['diloco_r1'].losses[last]
  assert 'In progress:** ' + f'{total - 1} of {total}' in ''.join(claims._progress(scale, g))
  g['diloco_r1'].diverged[last] = 234
  lines = ''.join(claims._progress(scale, g))
  assert 'In progress' not in lines
  assert f'**Diverged:** 1 of {total} final runs (diloco_r1: seed {last} diverged at step 234)' \
      in lines
  # A claim whose method diverged where its baseline finished is refuted; claim 11's
  # gains lose the seed where either replica count diverged.
  g['diloco_r16'].diverged[last] = 50
  del g['diloco_r16'].losses[last]
  d = claims.derived_groups(g)
  assert d['gain_8_to_16'].diverged == {last: 50} and last not in d['gain_8_to_16'].losses
  t = claims.Test('diloco_r16', 'diloco_nesterov')
  assert claims.judge(g, [t]).word == 'not reproduced'
  assert claims._refuted_p(study.compare(g['diloco_r16'], g['diloco_nesterov'])) == 0.0


def test_an_effect_under_1_percent_gets_two_more_seeds():
  scale = claims.SCALES['quick']
  first = scale.budget.seeds
  picks = {m: dict(loss=2.0) for m in ('gasloc', 'gasloc_pp', 'gasloc_h1')}
  # Every final 0.05 nats from the next; E3M0 DiLoCo 0.5% from DiLoCo.
  g = {f.name: study.Group(f.name, {s: 2.0 + 0.05 * i + 0.001 * s for s in first}, {},
                           None, 0.0, 0.0, 0.0, [])
       for i, f in enumerate(claims.finals(scale))}
  g['diloco_e3m0'].losses.update({s: g['diloco_nesterov'].losses[s] + 0.005 for s in first})
  more = claims.small_effects(scale, g, picks)
  assert more == ['diloco_e3m0', 'diloco_nesterov']
  extra = claims.extra_seeds(scale)
  assert extra == (max(first) + 1, max(first) + 2)
  seeds = {f.name: f.seeds_of(scale.budget) for f in claims.finals(scale, more)}
  assert seeds['diloco_e3m0'] == seeds['diloco_nesterov'] == first + extra
  assert seeds['streaming'] == first
  lines = ''.join(claims._progress(scale, g, more))
  assert '**More seeds:** diloco_e3m0, diloco_nesterov also train seeds' in lines
  assert '**In progress:**' in lines                      # the extra seeds are not run
  # The extra seeds move the means but not the choice, which reads the first seeds only.
  g['diloco_e3m0'].losses.update({s: 9.0 for s in extra})
  g['diloco_nesterov'].losses.update({s: 2.0 for s in extra})
  assert claims.small_effects(scale, g, picks) == more
  assert '**In progress:**' not in ''.join(claims._progress(scale, g, more))


def test_the_topology_slopes_fit_the_fixed_graphs_against_chi1():
  """Gaps and consensus distances made to grow like chi1 ** k come back with slope k;
  the per-round random graph (matching, whose chi1 is the complete graph's) is left out."""
  scale = claims.SCALES['quick']
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


def test_the_40_round_verdicts_are_read_from_that_page(in_repo):
  before = claims.previous_verdicts(claims.PREVIOUS_PAGE)
  assert sorted(before) == list(range(1, 10))
  assert before[1] == 'not reproduced' and before[2] == 'reproduced'


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
  assert '## What changed from the 40-round page, and why' in text
  assert '| ring | ' in text and 'consensus distance' in text   # the topology x H table
  # The warm starts began from the same seed's DDP checkpoint a quarter of the way.
  with open(os.path.join(out, 'final', 'diloco_warm', 'seed1', 'log.txt')) as f:
    assert 'warm start from' in f.read()
  assert os.path.isdir(os.path.join(out, 'final', 'gasloc', 'seed1', 'retimed', 'slow_links'))
  # Every synchronous final re-timed on the page's networks, drawn against simulated
  # time and bytes; the asynchronous one is not re-timed.
  for name in ('ddp', 'diloco_warm', 'sparse_d25_f32', 'dadamw_ring'):
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
