"""loco.lab.study: equal budgets by construction, picks on fake results whose best setting is
known, and the paired comparison of finals."""

import dataclasses
import json
import math
import os
import time

import numpy as np
import pytest

from loco.run import evaluate
from loco import stats as stats_lib
from loco.lab import study
from loco.errors import LocoError

BUDGET = study.Budget(base='experiments/micro.py:ddp', steps=60, steps_h1=30,
                      common={'seq_len': 64}, inner_lrs=(1.5e-3, 3e-3, 6e-3), seeds=(1, 2, 3))
OUTER = study.Knob('algorithm.outer_lr', (0.5, 0.7, 1.0))
STEP = study.Knob('algorithm.gossip_step', (0.25, 0.5, 1.0), high=1.0)


def _bowl(best_lr, best_knob=None, key=OUTER.key):
  """A loss whose minimum over (log lr, knob) is at (best_lr, best_knob)."""
  def loss(s):
    x = (math.log2(s[study.LR] / best_lr)) ** 2
    return 2.0 + 0.01 * x + (0.0 if best_knob is None else 0.05 * (s[key] - best_knob) ** 2)
  return loss


def _tune_by_hand(method, loss):
  """Feeds `settings` the scores of `loss` until its budget is spent."""
  scores = {}
  while True:
    wanted, complete = study.settings(method, BUDGET, scores)
    if complete:
      return wanted, scores
    for s in wanted:
      scores.setdefault(study.label(s), loss(s))


def _pick(wanted, scores):
  return min(wanted, key=lambda s: scores[study.label(s)])


def test_an_interior_optimum_costs_five_settings_and_is_picked():
  m = study.Method('diloco', {}, OUTER)
  wanted, scores = _tune_by_hand(m, _bowl(3e-3, 0.7))
  assert len(wanted) == 5
  assert [s[study.LR] for s in wanted[:3]] == [1.5e-3, 3e-3, 6e-3]        # at knob 0.7
  assert all(s[OUTER.key] == 0.7 for s in wanted[:3])
  assert {s[OUTER.key] for s in wanted[3:]} == {0.5, 1.0}                 # at the best lr
  assert all(s[study.LR] == 3e-3 for s in wanted[3:])
  assert _pick(wanted, scores) == {study.LR: 3e-3, OUTER.key: 0.7}


def test_an_edge_pick_is_extended_once_on_each_knob_at_its_edge():
  m = study.Method('diloco', {}, OUTER)
  wanted, scores = _tune_by_hand(m, _bowl(20e-3, 2.0))     # both optima past the grid
  extra = wanted[5:7]
  assert {study.LR: 12e-3, OUTER.key: 1.0} in extra                     # lr x 2
  assert {study.LR: 6e-3, OUTER.key: pytest.approx(1.3)} in extra       # knob + its step
  # Once: the knob's extension is not extended again. It moved the knob from step 1's
  # 0.7, so the inner lr's neighbours train at 1.3, and one more step past the better.
  assert wanted[7:] == [{study.LR: lr, OUTER.key: 1.3} for lr in (3e-3, 12e-3, 24e-3)]
  assert _pick(wanted, scores) == {study.LR: 24e-3, OUTER.key: 1.3}


def test_a_pick_whose_knob_moved_tries_the_inner_lr_again_at_that_knob():
  """Coordinate-wise tuning picks the inner lr at step 1's knob; where the best inner lr
  depends on the knob (a smaller outer step wants a larger inner lr), the pick's knob
  retries the inner lr's neighbours, once, and steps once past the better one."""
  m = study.Method('diloco', {}, OUTER)

  def loss(s):
    best_lr = 12e-3 if s[OUTER.key] <= 0.5 else 1.5e-3
    return (2.0 + 0.01 * math.log2(s[study.LR] / best_lr) ** 2 +
            5.0 * (s[OUTER.key] - 0.5) ** 2)
  wanted, scores = _tune_by_hand(m, loss)
  assert wanted[:7] == [
      {study.LR: 1.5e-3, OUTER.key: 0.7}, {study.LR: 3e-3, OUTER.key: 0.7},
      {study.LR: 6e-3, OUTER.key: 0.7},                   # step 1: 1.5e-3 wins at 0.7
      {study.LR: 1.5e-3, OUTER.key: 0.5}, {study.LR: 1.5e-3, OUTER.key: 1.0},  # 0.5 wins
      {study.LR: 0.75e-3, OUTER.key: 0.5}, {study.LR: 1.5e-3, OUTER.key: 0.3}]  # edges
  assert wanted[7:] == [{study.LR: 3e-3, OUTER.key: 0.5}, {study.LR: 6e-3, OUTER.key: 0.5}]
  assert _pick(wanted, scores) == {study.LR: 6e-3, OUTER.key: 0.5}
  # Where neither neighbour beats the pick, two runs and no step past.
  flat = lambda s: loss(s) + (0.0 if s[study.LR] == 1.5e-3 else 1.0)  # noqa: E731
  wanted, scores = _tune_by_hand(m, flat)
  assert wanted[7:] == [{study.LR: 3e-3, OUTER.key: 0.5}]     # 0.75e-3 ran at step 3
  assert _pick(wanted, scores) == {study.LR: 1.5e-3, OUTER.key: 0.5}


def test_an_extension_outside_the_knobs_range_is_not_run():
  m = study.Method('dadamw', {}, STEP)
  wanted, _ = _tune_by_hand(m, _bowl(3e-3, 1.0, STEP.key))
  assert max(s[STEP.key] for s in wanted) == 1.0                        # 1.5 > high
  # The pick moved the step from 0.5 to 1.0: the inner lr's neighbours train there.
  assert wanted[5:] == [{study.LR: lr, STEP.key: 1.0} for lr in (1.5e-3, 6e-3)]


def test_a_method_without_a_knob_gets_five_inner_lrs():
  m = study.Method('ddp', {})
  wanted, scores = _tune_by_hand(m, _bowl(0.5e-3))
  lrs = [s[study.LR] for s in wanted]
  assert lrs[:5] == [1.5e-3, 3e-3, 6e-3, 0.75e-3, 12e-3]
  assert lrs[5:] == [0.375e-3]                # the pick 0.75e-3 is at the low edge
  assert _pick(wanted, scores)[study.LR] == 0.375e-3


def test_every_method_has_the_same_budget_before_extensions():
  """Five settings each when the optimum is interior, whatever the method's knob."""
  cases = [(study.Method('a', {}), _bowl(3e-3)),
           (study.Method('b', {}, OUTER), _bowl(3e-3, 0.7)),
           (study.Method('c', {}, STEP), _bowl(3e-3, 0.5, STEP.key))]
  assert [len(_tune_by_hand(m, loss)[0]) for m, loss in cases] == [5, 5, 5]


def test_warm_up_scales_with_each_runs_length():
  h15 = study.run_keys(study.Method('a', {}), BUDGET)
  h1 = study.run_keys(study.Method('b', {}, h1=True), BUDGET)
  assert h15['steps'] == 60 and h15['optimizer.warmup_steps'] == 10
  assert h1['steps'] == 30 and h1['optimizer.warmup_steps'] == 5


def test_tuning_runs_train_a_fraction_and_finals_their_own_seeds():
  half = dataclasses.replace(BUDGET, tune_fraction=0.5)
  m = study.Method('a', {})
  run = study.tuning_run(m, half, {study.LR: 3e-3})
  assert run.overrides['steps'] == 30 and run.overrides['optimizer.warmup_steps'] == 5
  assert run.overrides['seed'] == 0
  finals = [study.Final('a', 'a'),
            study.Final('warm', 'a', {'init_from': '{out}/final/a/seed{seed}/checkpoints/15',
                                      'steps': 45}, seeds=(2,))]
  picks = {'a': dict(setting={study.LR: 3e-3})}
  runs = {r.name: r for r in study.final_runs([m], finals, half, picks, 'OUT')}
  assert sorted(runs) == ['a/seed1', 'a/seed2', 'a/seed3', 'warm/seed2']
  assert runs['a/seed1'].overrides['steps'] == 60          # finals train the whole length
  warm = runs['warm/seed2'].overrides
  assert warm['init_from'] == 'OUT/final/a/seed2/checkpoints/15' and warm['steps'] == 45


def _fake_run(path, steps, loss, status='finished', diverged=False):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump({'config': {'steps': steps}}, f)
  with open(os.path.join(path, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps({'step': steps, 'tokens': 10 * steps, 'train_loss': 3.0,
                        'eval_loss': loss}) + '\n')
  with open(os.path.join(path, 'status.json'), 'w') as f:
    json.dump({'state': status}, f)
  if diverged:
    with open(os.path.join(path, 'diverged.json'), 'w') as f:
      json.dump({'step': steps, 'message': 'diverged'}, f)


def test_tune_reads_the_runs_and_picks_the_known_best(tmp_path):
  """Runs written by hand (no training): the pick is the known best, a diverged setting
  scores +inf, and unfinished runs are refused without training."""
  m = study.Method('diloco', {}, OUTER)
  loss = _bowl(6e-3, 0.5)
  out = str(tmp_path)
  with pytest.raises(LocoError, match='3 tuning runs are not finished'):
    study.tune(out, [m], BUDGET, train=False)
  for _ in range(4):   # the stages appear as earlier ones finish
    wanted, _, known = study._known(os.path.join(out, 'tune'), m, BUDGET)
    for s in wanted:
      if study.label(s) not in known:
        diverged = s == {study.LR: 1.5e-3, OUTER.key: 0.7}
        _fake_run(os.path.join(out, 'tune', 'diloco', study.label(s)), BUDGET.steps,
                  float('nan') if diverged else loss(s),
                  'failed' if diverged else 'finished', diverged)
  picks = study.tune(out, [m], BUDGET, train=False)['diloco']
  grid = dict(picks['grid'])
  assert grid[study.label({study.LR: 1.5e-3, OUTER.key: 0.7})] == math.inf
  # The best lr (6e-3) and knob (0.5) are both at their grid's edge: one step further on
  # each was tried (12e-3; 0.3) and lost, so the pick is interior after extension; the
  # knob moved from 0.7, so the inner lr's lower neighbour at 0.5 (3e-3) ran and lost.
  assert picks['setting'] == {study.LR: 6e-3, OUTER.key: 0.5}
  assert len(picks['grid']) == 8 and picks['edge'] == []
  assert grid[study.label({study.LR: 3e-3, OUTER.key: 0.5})] > loss(picks['setting'])


def test_tuning_drops_the_checkpoints_of_its_finished_runs_only(tmp_path, monkeypatch):
  """A sweep stand-in trains each tuning run (one setting diverges and fails): after each
  sweep the finished runs have lost their checkpoints (a pick reads metrics only), the
  failed one keeps its own, and the pick is the one made from runs written by hand."""
  m = study.Method('diloco', {}, OUTER)
  loss = _bowl(6e-3, 0.5)
  out = str(tmp_path)
  broken = {study.LR: 1.5e-3, OUTER.key: 0.7}

  def sweep(runs, folder, parallel, report, batch_runs):
    del parallel, report, batch_runs
    for r in runs:
      workdir = os.path.join(folder, r.name)
      if os.path.isfile(os.path.join(workdir, 'status.json')):
        continue                                       # a sweep skips what has ended
      s = {k: r.overrides[k] for k in (study.LR, OUTER.key)}
      _fake_run(workdir, BUDGET.steps, float('nan') if s == broken else loss(s),
                'failed' if s == broken else 'finished', s == broken)
      os.makedirs(os.path.join(workdir, 'checkpoints', str(BUDGET.steps)))
      with open(os.path.join(workdir, 'checkpoints', str(BUDGET.steps), 'x'), 'wb') as f:
        f.write(b'0' * 1000)
    return 0

  monkeypatch.setattr(study, 'run_sweep', sweep)
  freed = []
  drop = study.drop_checkpoints
  monkeypatch.setattr(study, 'drop_checkpoints',
                      lambda folder, names: freed.append(drop(folder, names)))
  picks = study.tune(out, [m], BUDGET)['diloco']
  assert picks['setting'] == {study.LR: 6e-3, OUTER.key: 0.5}
  tune = os.path.join(out, 'tune', 'diloco')
  runs = sorted(os.listdir(tune))
  have = [d for d in runs if os.path.isdir(os.path.join(tune, d, 'checkpoints'))]
  assert have == [study.label(broken)] and len(runs) == len(picks['grid']) == 8
  assert len(freed) > 1 and sum(freed) == 1000 * (len(runs) - 1)
  assert all(os.path.isfile(os.path.join(tune, d, 'metrics.jsonl')) for d in runs)
  assert drop(os.path.join(out, 'tune'), ['diloco/none']) == 0


def _group(name, losses, windows=None, docs=None):
  return study.Group(name, dict(zip((1, 2, 3), losses)),
                     {} if windows is None else dict(zip((1, 2, 3), windows)),
                     docs, 0.0, 0.0, 0.0, [])


def test_compare_pairs_by_seed_and_reports_welch_and_the_eval_se():
  """Seed 1 is hard for both methods: pairing removes it, Welch cannot."""
  a = _group('a', [2.10, 2.00, 2.02])
  b = _group('b', [2.05, 1.96, 1.97])
  c = study.compare(a, b)
  d = np.array([0.05, 0.04, 0.05])
  se = d.std(ddof=1) / math.sqrt(3)
  assert c.paired.estimate == pytest.approx(d.mean())
  assert c.paired.se == pytest.approx(se)
  assert c.paired.df == 2 and c.welch.df < 4
  assert c.paired.p < 0.01 < c.welch.p           # the pairing is what makes it decisive
  assert c.verdict() == 'not reproduced'         # a - b < 0 is refuted
  # A margin in nats moves the bound: a within 0.07 nats of b holds.
  assert study.compare(a, b, margin=0.07).verdict() == 'reproduced'
  assert study.compare(a, b, margin=0.045).verdict() == 'inconclusive'


def test_compare_clusters_the_eval_se_by_document():
  docs = np.array([0, 0, 1, 1, 2, 2])
  wa = [np.array([2.0, 2.2, 1.0, 1.1, 3.0, 3.1])] * 3
  wb = [np.array([1.9, 2.0, 1.0, 1.0, 3.1, 3.1])] * 3
  a = _group('a', [2.0, 2.1, 2.2], wa, docs)
  b = _group('b', [1.9, 2.0, 2.1], wb, docs)
  diff = wa[0] - wb[0]
  r = diff - diff.mean()
  sums = [r[0] + r[1], r[2] + r[3], r[4] + r[5]]
  expected = math.sqrt(3 / 2 * sum(x * x for x in sums) / 36)
  assert study.compare(a, b).eval_se == pytest.approx(expected)


def test_a_diverged_seed_is_named_and_counts_against_the_method_that_diverged():
  a = study.Group('a', {1: 2.00, 2: 2.01}, {}, None, 0.0, 0.0, 0.0, [], {}, {3: 234})
  b = _group('b', [2.10, 2.11, 2.12])
  assert a.mean == pytest.approx(2.005)                 # over the seeds that finished
  assert a.per_seed() == '2.0000, 2.0100, diverged at step 234'
  assert a.text().endswith('over 2 of 3 seeds (seed 3 diverged at step 234)')
  # a beats b at both seeds it finished, but diverged where b did not: not a win.
  c = study.compare(a, b)
  assert c.paired.df == 1 and c.diverged_a == (3,) and c.diverged_b == ()
  assert c.verdict() == 'not reproduced'
  assert 'a diverged at seed 3, b did not' in c.text()
  # The other way round the finished seeds decide, and the text says b diverged.
  c = study.compare(b, a, margin=-0.05)
  assert c.diverged_b == (3,) and c.verdict() == 'not reproduced'    # b - a > -0.05
  assert study.compare(b, a, margin=0.2).verdict() == 'reproduced'
  assert 'a diverged at seed 3, b did not' in c.text()
  # Where both diverged, that seed is simply absent from the test.
  both = study.Group('b', {1: 2.1, 2: 2.11}, {}, None, 0.0, 0.0, 0.0, [], {}, {3: 9})
  assert study.compare(a, both).diverged_a == () and study.compare(a, both).verdict() \
      == 'reproduced'
  one = study.Group('x', {2: 2.5}, {}, None, 0.0, 0.0, 0.0, [], {}, {1: 5})
  assert one.text() == '2.5000 over 1 of 2 seeds (seed 1 diverged at step 5)'
  assert _group('b', [2.5]).text() == '2.5000 (1 seed)'
  every = study.Group('x', {}, {}, None, 0.0, 0.0, 0.0, [], {}, {1: 5, 2: 6})
  assert math.isnan(every.mean) and every.text().startswith('every seed diverged')


def test_groups_read_a_diverged_final_as_a_result(tmp_path):
  out = str(tmp_path)
  f = study.Final('a', 'a')
  for seed in (1, 2):
    d = os.path.join(out, 'final', 'a', f'seed{seed}')
    _fake_run(d, BUDGET.steps, 2.0 + seed / 100)
    path = evaluate.result_path(d, BUDGET.final_split, BUDGET.score_batches, 16)
    os.makedirs(os.path.dirname(path))
    with open(path, 'w') as fh:
      json.dump({'step': BUDGET.steps, 'loss': 2.0 + seed / 100,
                 'window_losses': [2.0, 2.1], 'window_docs': [0, 1]}, fh)
  _fake_run(os.path.join(out, 'final', 'a', 'seed3'), 17, float('nan'), 'failed',
            diverged=True)
  g = study.groups(out, [f], BUDGET)['a']
  assert g.losses == {1: pytest.approx(2.01), 2: pytest.approx(2.02)}
  assert g.diverged == {3: 17}
  # Every seed diverged: the final is still there, as diverged, not "not run".
  _fake_run(os.path.join(out, 'final', 'b', 'seed1'), 9, float('nan'), 'failed', True)
  g = study.groups(out, [study.Final('b', 'b', seeds=(1,))], BUDGET)
  assert g['b'].losses == {} and g['b'].diverged == {1: 9}


def test_time_to_target_per_seed():
  curves = [[(0.0, 3.0), (10.0, 2.0)], [(0.0, 3.0), (10.0, 2.6)]]
  assert study.seconds_to(curves, 2.5) == [pytest.approx(5.0), None]


def test_the_clock_counts_an_interrupted_invocation(tmp_path):
  clock = str(tmp_path / 'seconds.txt')
  with pytest.raises(KeyboardInterrupt):
    with study.clocked(clock):
      time.sleep(0.05)
      raise KeyboardInterrupt
  first = study.read_seconds(clock, 0.0)
  assert 0.05 <= first < 5
  with study.clocked(clock):
    time.sleep(0.02)
  assert study.read_seconds(clock, 0.0) >= first + 0.02
  total = study.read_seconds(clock, 0.0)
  with study.clocked(clock, on=False):        # --page_only: the clock does not move
    time.sleep(0.02)
  assert study.read_seconds(clock, 0.0) == total


def test_in_flight_is_the_union_of_the_finished_runs_spans(tmp_path):
  def status(name, start, end, state='finished'):
    d = tmp_path / 'final' / name
    d.mkdir(parents=True)
    (d / 'status.json').write_text(json.dumps(dict(
        name=name, state=state, start=f'2026-11-25T10:{start}', end=f'2026-11-25T10:{end}')))
  status('a', '00:00', '00:40')       # a and b overlap: 10:00-10:50 counts once
  status('b', '00:30', '00:50')
  status('c', '01:10', '01:20')       # a gap of 20 s (a later invocation): not counted
  status('d', '00:00', '01:20', 'failed')           # not finished: not counted
  (tmp_path / 'final' / 'e').mkdir()
  (tmp_path / 'final' / 'e' / 'status.json').write_text('{"state": "finished"}')
  assert study.in_flight(str(tmp_path)) == pytest.approx(60.0)
  assert study.cost(str(tmp_path))['in_flight'] == pytest.approx(60.0)


def test_cost_counts_each_batch_once_and_takes_the_median_per_unit(tmp_path):
  def status(folder, name, seconds, batch=None, **overrides):
    d = tmp_path / folder / name
    d.mkdir(parents=True)
    (d / 'status.json').write_text(json.dumps(dict(
        name=name, state='finished', seconds=seconds, batch=batch,
        overrides={'steps': 1050, **overrides})))
  pair = ['a/1', 'a/2']
  status('tune', 'a/1', 80.0, pair)                 # a batch of 2 units in 80 s: 40 s/unit
  status('tune', 'a/2', 80.0, pair)
  status('final', 'b', 45.0, num_workers=1, batch_per_worker=32)   # 1 unit in 45 s
  status('final', 'c', 900.0, steps=525)            # half a unit, slowed by a pause
  d = tmp_path / 'final' / 'd'                      # unfinished: not counted
  d.mkdir(parents=True)
  (d / 'status.json').write_text(json.dumps(dict(name='d', state='running',
                                                 overrides={'steps': 1050})))
  c = study.cost(str(tmp_path))
  assert c['programs'] == 3 and c['tuning'] == 2.0 and c['finals'] == 1.5
  assert c['per_unit'] == 45.0                      # median of 40, 45 and 1800


def test_cost_counts_runs_another_machine_trained_apart(tmp_path, monkeypatch):
  monkeypatch.delenv('LOCO_HOST', raising=False)
  monkeypatch.setattr(study.sweep_lib.socket, 'gethostname', lambda: 'here')

  def status(folder, name, seconds, host=None, start='00:00', end='01:00'):
    d = tmp_path / folder / name
    d.mkdir(parents=True)
    s = dict(name=name, state='finished', seconds=seconds, overrides={'steps': 1050},
             start=f'2026-11-27T10:{start}', end=f'2026-11-27T10:{end}')
    if host:
      s['host'] = host
    (d / 'status.json').write_text(json.dumps(s))
  status('tune', 'a', 40.0)                          # before hosts were recorded: here
  status('tune', 'b', 50.0, host='here')
  status('tune', 'c', 5.0, host='gpu', end='00:05')  # fast elsewhere: not in the median
  status('tune', 'd', 6.0, host='gpu', start='00:03', end='00:06')
  status('final', 'e', 7.0, host='gpu', start='00:10', end='00:20')
  c = study.cost(str(tmp_path))
  assert c['programs'] == 2 and c['tuning'] == 2.0 and c['finals'] == 0.0
  assert c['per_unit'] == 45.0 and c['in_flight'] == pytest.approx(60.0)
  assert c['elsewhere'] == {'gpu': dict(tuning=2.0, finals=1.0,
                                        in_flight=pytest.approx(16.0))}
  monkeypatch.setenv('LOCO_HOST', 'gpu')               # the page written on the other host
  c = study.cost(str(tmp_path))
  assert c['tuning'] == 3.0 and c['finals'] == 1.0      # a (no host) counts as this one's
  assert c['elsewhere'] == {'here': dict(tuning=1.0, finals=0.0,
                                         in_flight=pytest.approx(60.0))}


def _study_cost(*args):
  import subprocess
  import sys
  return subprocess.run([sys.executable, 'scripts/study_cost.py', *args], capture_output=True,
                        text=True, timeout=120, cwd=__file__.rsplit('/tests/', 1)[0])


@pytest.mark.slow
def test_the_cost_script_prints_units_and_answers_bad_input_in_one_line(tmp_path):
  d = tmp_path / 'final' / 'a'
  d.mkdir(parents=True)
  (d / 'status.json').write_text(json.dumps(dict(name='a', state='finished', seconds=86.0,
                                                 overrides={'steps': 2100})))
  out = _study_cost(str(tmp_path), '--planned')
  assert out.returncode == 0, out.stderr
  assert 'median 43.0 s per unit' in out.stdout and 'finals so far: 2.0 units' in out.stdout
  assert 'finals planned (launch.claims, full scale)' in out.stdout
  assert 'tuning planned: ' in out.stdout
  (d / 'status.json').write_text('{"state": "fini')
  for args, says in (((str(tmp_path),), 'is not valid JSON'),
                     ((str(tmp_path / 'none'),), 'no finished runs under'),
                     ((), 'usage:'), ((str(tmp_path), '--bad'), 'usage:')):
    out = _study_cost(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode in (1, 2) and len(lines) == 1 and says in lines[0], (args, lines)


# ---- variants re-tuned where their change moves the optimum ---------------------------

def test_a_retuned_variant_tries_three_points_around_its_parents_pick():
  m = study.Method('diloco', {'algorithm.outer_momentum': 0.9}, OUTER)
  pick = {study.LR: 3e-3, OUTER.key: 0.4}
  m4 = study.Final('diloco_r4', 'diloco', {'num_workers': 4}, retune=study.Retune())
  assert study.retune_values(m4, m, pick) == (0.2, 0.4, 0.8)
  # Another momentum: the same effective steps eta / (1 - mu) as the parent's.
  mu5 = study.Final('diloco_mu0p5', 'diloco', {'algorithm.outer_momentum': 0.5},
                    retune=study.Retune())
  assert study.retune_values(mu5, m, pick) == pytest.approx((1.0, 2.0, 4.0))
  with pytest.raises(LocoError, match='gossip_step, which its method diloco'):
    study.retune_values(dataclasses.replace(m4, retune=study.Retune('algorithm.gossip_step')),
                        m, pick)
  # A knob picked at the top of its range keeps the ratios below it.
  gossip = study.Method('dsgd', {}, STEP)
  top = study.Final('dsgd_exp', 'dsgd', {'algorithm.topology': 'exponential'},
                    retune=study.Retune(STEP.key, high=1.0))
  assert study.retune_values(top, gossip, {STEP.key: 1.0}) == (0.25, 0.5, 1.0)
  assert study.retune_values(top, gossip, {STEP.key: 0.25}) == (0.125, 0.25, 0.5)
  bare = study.Method('diloco', {}, OUTER)
  with pytest.raises(LocoError, match='cannot be moved to the same effective step'):
    study.retune_values(mu5, bare, pick)


def test_a_retune_extends_once_past_an_edge_within_its_range():
  key = 'algorithm.gossip_step'
  scores = {study.label({key: v}): loss for v, loss in ((0.25, 2.2), (0.5, 2.1), (1.0, 2.0))}
  wanted, complete = study.retune_settings((0.25, 0.5, 1.0), key, math.inf, scores)
  assert [s[key] for s in wanted] == [0.25, 0.5, 1.0, 2.0] and not complete
  wanted, complete = study.retune_settings((0.25, 0.5, 1.0), key, 1.0, scores)
  assert len(wanted) == 3 and complete          # 2.0 is past the knob's range
  scores[study.label({key: 0.5})] = 1.9          # interior: no extension
  assert study.retune_settings((0.25, 0.5, 1.0), key, math.inf, scores) == (
      [{key: 0.25}, {key: 0.5}, {key: 1.0}], True)


def _finish(out, problem_dir, settings, loss, seed_suffix=''):
  for s in settings:
    _fake_run(os.path.join(out, 'tune', problem_dir, study.label(s) + seed_suffix),
              BUDGET.steps, loss(s))


def test_tune_retunes_a_variant_after_its_parent_and_its_final_trains_the_variants_pick(
    tmp_path):
  m = study.Method('diloco', {'algorithm.outer_momentum': 0.9}, OUTER)
  variant = study.Final('diloco_r2', 'diloco', {'num_workers': 2}, retune=study.Retune())
  plain = study.Final('diloco_prune', 'diloco', {'algorithm.prune': 0.5})
  out, tune_dir = str(tmp_path), os.path.join(str(tmp_path), 'tune')
  loss = _bowl(3e-3, 0.7)
  for _ in range(3):
    wanted, _, known = study._known(tune_dir, m, BUDGET)
    _finish(out, 'diloco', [s for s in wanted if study.label(s) not in known], loss)
  # The parent is done; the variant's three points are what is left.
  with pytest.raises(LocoError, match='^3 tuning runs are not finished'):
    study.tune(out, [m], BUDGET, train=False, finals=[variant, plain])
  parent = study.tune(out, [m], BUDGET, train=False)['diloco']['setting']
  assert parent == {study.LR: 3e-3, OUTER.key: 0.7}
  points = [{OUTER.key: v} for v in (0.35, 0.7, 1.4)]
  # At M = 2 the best outer lr is lower: 0.35 is at the edge, so 0.175 is tried too.
  by_outer = {0.175: 2.3, 0.35: 2.0, 0.7: 2.1, 1.4: math.nan}
  _finish(out, 'diloco_r2', points, lambda s: by_outer[s[OUTER.key]])
  with pytest.raises(LocoError, match='^1 tuning runs are not finished'):
    study.tune(out, [m], BUDGET, train=False, finals=[variant, plain])
  _finish(out, 'diloco_r2', [{OUTER.key: 0.175}], lambda s: by_outer[s[OUTER.key]])
  picks = study.tune(out, [m], BUDGET, train=False, finals=[variant, plain])
  assert picks['diloco_r2']['setting'] == {OUTER.key: 0.35}
  runs = {r.name: r.overrides for r in
          study.final_runs([m], [variant, plain], BUDGET, picks, out)}
  r2 = runs['diloco_r2/seed1']
  assert (r2[OUTER.key], r2[study.LR], r2['num_workers']) == (0.35, 3e-3, 2)
  assert runs['diloco_prune/seed1'][OUTER.key] == 0.7   # not re-tuned: the parent's
  # The variant's tuning runs carry the parent's inner lr and the variant's keys.
  run = study.tuning_run(study.variant_problem(variant, m, parent, BUDGET), BUDGET,
                         {OUTER.key: 0.35})
  assert run.name == 'diloco_r2/outer_lr0.35'
  assert (run.overrides['num_workers'], run.overrides[study.LR], run.overrides['seed']) == (
      2, 3e-3, BUDGET.tune_seed)


def test_a_retuned_final_may_not_take_a_methods_name(tmp_path):
  m = study.Method('diloco', {'algorithm.outer_momentum': 0.9}, OUTER)
  with pytest.raises(LocoError, match="has a method's name"):
    study.tune(str(tmp_path), [m], BUDGET, train=False,
               finals=[study.Final('diloco', 'diloco', retune=study.Retune())])
  with pytest.raises(LocoError, match='names the method gasloc, which is not tuned'):
    study.tune(str(tmp_path), [m], BUDGET, train=False, finals=[study.Final('g', 'gasloc')])


# ---- the pick rule that sees divergence risk ----------------------------------------

def _grid(values, key=OUTER.key):
  return [{study.LR: 3e-3, key: v} for v in values]


def test_the_pick_and_its_larger_neighbour_train_at_the_check_seed():
  wanted = _grid((0.4, 0.7, 1.0))
  known = {study.label(s): x for s, x in zip(wanted, (2.1, 2.0, 2.05))}
  missing, pick = study.pick_checked(wanted, known, {}, OUTER.key)
  assert pick is None and missing == [wanted[1], wanted[2]]
  checked = {study.label(wanted[1]): 2.01, study.label(wanted[2]): 2.06}
  _, pick = study.pick_checked(wanted, known, checked, OUTER.key)
  assert pick == dict(setting=wanted[1], passed=[], flag='')
  # The neighbour diverges at the check seed: the pick stands, flagged.
  checked[study.label(wanted[2])] = math.inf
  _, pick = study.pick_checked(wanted, known, checked, OUTER.key)
  assert pick['setting'] == wanted[1]
  assert pick['flag'] == 'its neighbour lr0.003_outer_lr1 diverged'
  # The pick itself diverges there: passed over; the next best needs its own check.
  checked[study.label(wanted[1])] = math.inf
  missing, pick = study.pick_checked(wanted, known, checked, OUTER.key)
  assert pick is None and missing == [wanted[0]]
  checked[study.label(wanted[0])] = 2.12
  _, pick = study.pick_checked(wanted, known, checked, OUTER.key)
  # 1.0, second best, diverged at the check seed already: passed over too.
  assert pick['setting'] == wanted[0]
  assert pick['passed'] == ['lr0.003_outer_lr0.7', 'lr0.003_outer_lr1']
  assert pick['flag'] == 'its neighbour lr0.003_outer_lr0.7 diverged'
  checked[study.label(wanted[0])] = math.inf
  with pytest.raises(LocoError, match='every setting diverged at the tuning seed or the check'):
    study.pick_checked(wanted, known, checked, OUTER.key)


def test_the_largest_setting_checks_its_smaller_neighbour():
  wanted = _grid((0.4, 0.7, 1.0))
  assert study.neighbour(wanted[2], wanted, OUTER.key) == wanted[1]
  assert study.neighbour(wanted[0], wanted, OUTER.key) == wanted[1]
  other_lr = {study.LR: 6e-3, OUTER.key: 1.0}
  assert study.neighbour(other_lr, wanted + [other_lr], OUTER.key) is None


def test_tune_with_a_check_seed_passes_over_a_pick_that_diverges_there(tmp_path):
  budget = dataclasses.replace(BUDGET, check_seed=7)
  m = study.Method('dsgd', {}, STEP)
  out, tune_dir = str(tmp_path), os.path.join(str(tmp_path), 'tune')
  # The inner lr matters more than the step: the pick's neighbour on the step, not on
  # the lr (step 4's runs at step 1.0), is the runner-up.
  bowl = _bowl(3e-3, 1.0, key=STEP.key)
  loss = lambda s: bowl(s) + 0.04 * math.log2(s[study.LR] / 3e-3) ** 2  # noqa: E731
  for _ in range(4):
    wanted, _, known = study._known(tune_dir, m, budget)
    _finish(out, 'dsgd', [s for s in wanted if study.label(s) not in known], loss)
  best = {study.LR: 3e-3, STEP.key: 1.0}
  # The pick (gossip step 1.0, the range's top) and its smaller neighbour, at seed 7.
  with pytest.raises(LocoError, match='^2 tuning runs are not finished'):
    study.tune(out, [m], budget, train=False)
  _fake_run(os.path.join(tune_dir, 'dsgd', study.label(best) + '_seed7'), budget.steps,
            math.nan, 'failed', True)
  _finish(out, 'dsgd', [{study.LR: 3e-3, STEP.key: 0.5}], loss, '_seed7')
  picks = study.tune(out, [m], budget, train=False)
  assert picks['dsgd']['passed'] == [study.label(best)]
  assert picks['dsgd']['setting'] == {study.LR: 3e-3, STEP.key: 0.5}
  assert picks['dsgd']['flag'] == f'its neighbour {study.label(best)} diverged'


def test_the_pick_rules_false_positive_rate_by_simulation():
  """Landscapes of five outer lrs whose loss falls towards the largest (seed noise far
  below the steps between them), where only the largest carries a divergence risk q per
  seed. Without any risk (q = 0) the check passes over and flags nothing: no false
  positives. With risk, a pick at risk q survives as often as two seeds both miss it,
  (1 - q)^2, against (1 - q) for one tuning seed; the setting next to it is then the pick,
  flagged, and nothing further from the risk is ever flagged."""
  rng = np.random.default_rng(0)
  wanted = _grid((0.25, 0.5, 1.0, 2.0, 4.0))
  for q in (0.0, 0.2, 0.5):
    trials, kept_risky, false_alarms, flagged = 4000, 0, 0, 0
    for _ in range(trials):
      losses = [2.0 + 0.05 * (4 - i) + rng.normal(0, 0.005) for i in range(5)]
      div0, div1 = rng.random() < q, rng.random() < q
      known = {study.label(s): (math.inf if i == 4 and div0 else x)
               for i, (s, x) in enumerate(zip(wanted, losses))}
      checked = {study.label(s): (math.inf if i == 4 and div1 else x + 0.01)
                 for i, (s, x) in enumerate(zip(wanted, losses))}
      _, pick = study.pick_checked(wanted, known, checked, OUTER.key)
      at = pick['setting'][OUTER.key]
      kept_risky += at == 4.0
      flagged += bool(pick['flag'])
      false_alarms += (bool(pick['flag']) or bool(pick['passed'])) and not (div0 or div1)
      assert at >= 2.0 and (not pick['flag'] or at == 2.0)
    assert false_alarms == 0
    assert kept_risky / trials == pytest.approx((1 - q) ** 2, abs=0.025)
    assert flagged / trials == pytest.approx(1 - (1 - q) ** 2, abs=0.025)


# ---- the sequential seed rule --------------------------------------------------------

def _looks(d, alpha):
  """The two-look rule, vectorised (`study.two_look_rates`), checked against
  `study.sequential` on Groups below."""
  return study.two_look_rates(d, alpha)


def test_the_two_look_rule_keeps_its_level_at_the_margin_and_a_naive_one_does_not():
  """At a true difference equal to the margin (the boundary of both hypotheses) the rule
  says 'reproduced' at most 2.5% of the time, and 'not reproduced' too; a t test's level
  does not depend on the spread, so one spread stands for all. Looking twice at 95% CIs
  would say it 4.3% of the time."""
  rng = np.random.default_rng(0)
  d = rng.standard_normal((200_000, 5))
  accept, reject = _looks(d, study.LOOK_ALPHA)
  se = math.sqrt(0.025 * 0.975 / len(d))
  assert accept.mean() < 0.025 + 2 * se and reject.mean() < 0.025 + 2 * se
  assert accept.mean() > 0.022                  # not needlessly conservative
  naive, _ = _looks(d, 0.025)
  assert naive.mean() > 0.04
  # Where the effect is clear, the first look decides (no extra seeds wasted).
  clear = rng.standard_normal((20_000, 5)) * 0.2 - 1.0
  lo, hi = (x for x in _looks(clear, study.LOOK_ALPHA))
  assert lo.mean() > 0.99


def test_sequential_is_the_vectorised_rule_on_groups():
  """`study.sequential` on Groups decides as `_looks` does, seed by seed."""
  rng = np.random.default_rng(1)
  budget = dataclasses.replace(BUDGET, seeds=(1, 2, 3))
  extra = study.extra_seeds(budget)
  assert extra == (4, 5)
  seeds = (1, 2, 3) + extra
  for _ in range(300):
    d = rng.normal(rng.normal(0, 0.02), 0.02, 5)
    b = study.Group('b', {s: 2.0 for s in seeds}, {}, None, 0, 0, 0, [])
    a = study.Group('a', {s: 2.0 + x for s, x in zip(seeds, d)}, {}, None, 0, 0, 0, [])
    accept, reject = _looks(d[None, :], study.LOOK_ALPHA)
    c = study.sequential(a, b, budget)
    want = 'reproduced' if accept[0] else 'not reproduced' if reject[0] else 'inconclusive'
    assert c.verdict() == want
    assert c.look == (1 if c.verdict() != 'inconclusive' and not study.straddles(
        a, b, budget) else 2)
    assert study.straddles(a, b, budget) == (c.look == 2)
  # Before the extra seeds exist, an undecided first look stays the answer.
  first = study.Group('a', {1: 2.01, 2: 1.99, 3: 2.0}, {}, None, 0, 0, 0, [])
  base = study.Group('b', {1: 2.0, 2: 2.0, 3: 2.0}, {}, None, 0, 0, 0, [])
  c = study.sequential(first, base, budget)
  assert c.look == 1 and c.verdict() == 'inconclusive' and study.straddles(first, base, budget)


def test_a_relative_margin_is_tested_on_per_seed_relative_differences():
  b = _group('b', [2.0, 1.5, 1.8])
  a = _group('a', [2.0 * 1.005, 1.5 * 1.006, 1.8 * 1.0055])   # 0.5%, 0.6%, 0.55% worse
  c = study.compare(a, b, 0.01, relative=True)
  assert c.paired.differences == pytest.approx((0.005 - 0.01, 0.006 - 0.01, 0.0055 - 0.01))
  assert c.verdict() == 'reproduced'
  assert study.compare(a, b, 0.003, relative=True).verdict() == 'not reproduced'
  assert study.compare(a, b, 0.0055, relative=True).verdict() == 'inconclusive'
  assert '% CI of (a - b) / b - 1.00%' in c.text()


def test_a_family_stands_for_its_best_tuned_member(tmp_path):
  """The reference family: its finals train the member with the lowest tuning loss, and a
  re-tuned variant of the family re-tunes around that member's pick."""
  sgd = study.Method('d_sgd', {'algorithm.outer_momentum': 0.0},
                     study.Knob(OUTER.key, (0.5, 1.0, 2.0), geometric=True))
  nest = study.Method('d_nest', {'algorithm.outer_momentum': 0.9}, OUTER)
  out, tune_dir = str(tmp_path), os.path.join(str(tmp_path), 'tune')
  for m, loss in ((sgd, _bowl(3e-3, 1.0)), (nest, lambda s: _bowl(3e-3, 0.7)(s) + 0.1)):
    for _ in range(3):
      wanted, _, known = study._known(tune_dir, m, BUDGET)
      _finish(out, m.name, [s for s in wanted if study.label(s) not in known], loss)
  fams = {'diloco': ('d_sgd', 'd_nest')}
  prune = study.Final('prune', 'diloco', {'algorithm.prune': 0.5})
  r2 = study.Final('r2', 'diloco', {'num_workers': 2}, retune=study.Retune())
  with pytest.raises(LocoError, match='^3 tuning runs'):
    study.tune(out, [sgd, nest], BUDGET, train=False, finals=[prune, r2], families=fams)
  _finish(out, 'r2', [{OUTER.key: v} for v in (0.5, 1.0, 2.0)],
          lambda s: 2.0 + abs(s[OUTER.key] - 1.0))
  picks = study.tune(out, [sgd, nest], BUDGET, train=False, finals=[prune, r2],
                     families=fams)
  assert picks['diloco']['member'] == 'd_sgd'
  runs = {r.name: r.overrides for r in
          study.final_runs([sgd, nest], [prune, r2], BUDGET, picks, out)}
  assert runs['prune/seed1']['algorithm.outer_momentum'] == 0.0
  assert runs['prune/seed1'][OUTER.key] == 1.0 and runs['r2/seed1'][OUTER.key] == 1.0
  with pytest.raises(LocoError, match='family d_sgd must be a new name'):
    study.tune(out, [sgd, nest], BUDGET, train=False, families={'d_sgd': ('d_nest',)})


def test_a_geometric_knob_extends_by_its_ratio():
  m = study.Method('d', {}, study.Knob(OUTER.key, (0.5, 1.0, 2.0), geometric=True))
  wanted, _ = _tune_by_hand(m, _bowl(3e-3, 8.0))
  assert max(s[OUTER.key] for s in wanted) == 4.0
  wanted, _ = _tune_by_hand(m, _bowl(3e-3, 0.1))
  assert min(s[OUTER.key] for s in wanted) == 0.25


def test_the_planned_tuning_counts_every_method_and_retuned_variant():
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      'study_cost', __file__.rsplit('/tests/', 1)[0] + '/scripts/study_cost.py')
  cost = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(cost)
  from launch import claims
  s = claims.SCALES['full']
  low, high = cost.planned_tuning_units()
  ms = claims.methods(s)
  retuned = [f for f in claims.finals(s) if f.retune is not None]
  # Units: a 1,050-step M = 8 run is 1; a one-step-per-communication method 300 / 1,050.
  h1 = sum(m.h1 for m in ms) * 300 / 1050
  assert low >= 7 * (len(ms) - sum(m.h1 for m in ms)) + 7 * h1 - 1e-9
  assert high - low == pytest.approx(
      2 * sum(study.run_units(study.run_keys(m, s.budget, tuning=True)) for m in ms) +
      3 * sum(study.run_units(study.run_keys(m, s.budget, tuning=True))
              for m in ms if m.knob is not None) +
      sum(study.run_units({**study.run_keys(ms[1], s.budget, tuning=True), **f.keys})
          if not f.method.startswith(('gasloc_h1', 'dadamw', 'adpsgd', 'a2cid2', 'noloco'))
          else 300 / 1050 for f in retuned))


def test_a_final_trained_at_an_old_pick_is_refused_not_reported(tmp_path):
  """A finished final whose status records other keys than the plan's (a pick moved,
  e.g. after a check seed passed it over) is named; the study stops instead of scoring
  it as the new pick's."""
  m = study.Method('diloco', {'algorithm.outer_momentum': 0.9}, OUTER)
  out, tune_dir = str(tmp_path), os.path.join(str(tmp_path), 'tune')
  loss = _bowl(3e-3, 0.7)
  for _ in range(3):
    wanted, _, known = study._known(tune_dir, m, BUDGET)
    _finish(out, 'diloco', [s for s in wanted if study.label(s) not in known], loss)
  picks = study.tune(out, [m], BUDGET, train=False)
  runs = study.final_runs([m], [study.Final('diloco', 'diloco')], BUDGET, picks, out)
  final = os.path.join(out, 'final')
  for r in runs:
    os.makedirs(os.path.join(final, r.name))
    with open(os.path.join(final, r.name, 'status.json'), 'w') as f:
      json.dump({'state': 'finished', 'overrides': r.overrides}, f)
  assert study.stale(runs, final) == []
  moved = {**runs[1].overrides, OUTER.key: 1.0}
  with open(os.path.join(final, runs[1].name, 'status.json'), 'w') as f:
    json.dump({'state': 'finished', 'overrides': moved}, f)
  assert study.stale(runs, final) == ['diloco/seed2']
  with pytest.raises(LocoError, match='1 finished finals .* were trained with other keys'):
    study.run_all(out, [m], [study.Final('diloco', 'diloco')], BUDGET, train=False)


@pytest.mark.slow
def test_the_protocol_rates_script_prints_both_rules_and_refuses_bad_input():
  out = _study_cost_like('scripts/protocol_rates.py', '--trials=2000')
  assert out.returncode == 0, out.stderr
  assert 'Pocock, each look at 97.2%: passed' in out.stdout
  assert 'q = 0.2: risky setting kept' in out.stdout and 'false alarms 0' in out.stdout
  bad = _study_cost_like('scripts/protocol_rates.py', '--trials=ten')
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def _study_cost_like(script, *args):
  import subprocess
  import sys
  return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                        timeout=300, cwd=__file__.rsplit('/tests/', 1)[0])


def test_the_tuning_table_shows_the_check_seed_and_what_it_passed_over():
  picks = {
      'a': dict(grid=[('lr1', 1.5), ('lr2', 1.25)], label='lr1', edge=[],
                check={'lr1': 1.375, 'lr2': 9.5}, flag='lr2 diverged at seed 10'),
      'b': dict(grid=[('lr1', 2.0)], label='lr1', edge=['optimizer.lr'], passed=['lr4']),
      'fam': dict(grid=[], label='a', edge=[]),
  }
  rows = study.tuning_table(picks, 0, 10, skip=('fam',))
  assert rows[0].startswith('| method | settings tried (final eval loss, seed 0,')
  assert 'at seed 10: the pick and its neighbour' in rows[0]
  assert rows[2:] == [
      '| a | lr1: 1.5000, lr2: 1.2500 | lr1 | lr1: 1.3750, lr2: 9.5000 | '
      'lr2 diverged at seed 10 | — |',
      '| b | lr1: 2.0000 | lr1 | — | lr4 | optimizer.lr |']
  assert study.tuning_table(picks, 0, None)[2].split(' | ')[3] == 'no check seed'
