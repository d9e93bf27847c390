"""The claims page (launch/claims.py): equal budgets, configs, picks, verdicts, end to end."""

import json
import os

import pytest

from launch import claims
from loco import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def in_repo():
  cwd = os.getcwd()
  os.chdir(REPO)
  yield
  os.chdir(cwd)


@pytest.mark.parametrize('scale', list(claims.SCALES))
def test_every_method_of_a_comparison_has_the_same_tuning_budget(scale):
  ms = claims.methods(claims.SCALES[scale])
  sizes = {name: len(claims._grid(m, claims.SCALES[scale])) for name, m in ms.items()}
  assert sizes.pop('ddp') == 1                 # no outer setting: one run
  assert len(set(sizes.values())) == 1, sizes
  assert set(sizes.values()) == {3 if scale == 'full' else 2}
  finals = {f.name: f for f in claims.finals()}
  for claim in claims.CLAIMS:
    assert set(claim.finals) <= set(finals), claim.number


def _fake_picks(scale):
  return {name: dict(setting=claims._grid(m, scale)[-1], label='x', loss=2.0, grid=[])
          for name, m in claims.methods(scale).items()}


@pytest.mark.parametrize('scale', list(claims.SCALES))
def test_every_run_config_loads_and_each_claim_compares_at_equal_tokens(scale, in_repo):
  s = claims.SCALES[scale]
  tuning, finals = claims.tuning_runs(s), claims.final_runs(s, _fake_picks(s))
  sweep.check_runs(tuning)
  sweep.check_runs(finals)
  load = lambda runs: {r.name: sweep.load_config(sweep.command(r, 'w')[3:]) for r in runs}
  tuning, finals = load(tuning), load(finals)
  assert {c.data.eval_split for c in tuning.values()} == {claims.TUNING_SPLIT}
  assert {c.data.eval_split for c in finals.values()} == {claims.FINAL_SPLIT}
  assert {c.seed for c in tuning.values()} == {0}
  assert {c.seed for c in finals.values()} == set(s.seeds)
  tokens = {name: c.steps * c.num_workers * c.batch_per_worker * c.seq_len
            for name, c in finals.items()}
  for claim in claims.CLAIMS:
    within = {tokens[f'{f}/seed{seed}'] for f in claim.finals for seed in s.seeds}
    assert len(within) == 1, (claim.number, within)
  configs = {**tuning, **finals}
  assert {c.num_workers for c in configs.values()} == {8}
  full = [c for n, c in configs.items() if c.algorithm.sync_every not in (None, 1)]
  if scale == 'full':      # 40 rounds of H at the full scale
    assert {c.steps // c.algorithm.sync_every for c in full} == {40}


def _write_run(workdir, loss, seed=0, steps=10):
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump({'config': {'steps': steps, 'seed': seed}}, f)
  with open(os.path.join(workdir, 'status.json'), 'w') as f:
    json.dump({'state': 'finished'}, f)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write(json.dumps({'step': steps, 'tokens': 100, 'bytes_sent': 8.0, 'peak_bytes': 4.0,
                        'eval_loss': loss, 'eval_loss_se': 0.01}) + '\n')


def test_the_finals_take_each_methods_best_tuning_setting(tmp_path):
  """Hand-written tuning results: the lowest final eval loss per method is picked; an
  unfinished tuning run is one line; a failed one is left out."""
  s = claims.SCALES['full']
  runs = claims.tuning_runs(s)
  best = {'diloco_nesterov/outer_lr0.7_outer_momentum0.5': 1.6, 'diloco_sgd/outer_lr1.3': 1.7}
  for i, run in enumerate(runs):
    _write_run(str(tmp_path / 'tune' / run.name), best.get(run.name, 2.0 + i / 100))
  picked = claims.picks(str(tmp_path), s)
  assert picked['diloco_nesterov']['setting'] == {'algorithm.outer_lr': 0.7,
                                                  'algorithm.outer_momentum': 0.5}
  assert picked['diloco_sgd']['label'] == 'outer_lr1.3'
  assert picked['diloco_sgd']['loss'] == 1.7
  assert len(picked['dadamw']['grid']) == 3
  assert claims.final_runs(s, picked)[0].overrides['seed'] == 1
  with open(tmp_path / 'tune' / 'diloco_sgd' / 'outer_lr0.7' / 'status.json', 'w') as f:
    json.dump({'state': 'failed'}, f)
  assert claims.picks(str(tmp_path), s)['diloco_sgd']['label'] == 'outer_lr1.3'
  with open(tmp_path / 'tune' / 'diloco_sgd' / 'outer_lr1.0' / 'status.json', 'w') as f:
    json.dump({'state': 'running'}, f)
  with pytest.raises(sweep.SweepError, match='tuning runs of diloco_sgd .* not finished'):
    claims.picks(str(tmp_path), s)


def _group(name, losses):
  return claims.Group(name, losses, 0.01, 1.0, 1.0, [])


@pytest.mark.parametrize('a,b,margin,verdict', [
    ([1.00, 1.01, 0.99], [1.10, 1.11, 1.09], 0.0, 'reproduced'),
    ([1.10, 1.11, 1.09], [1.00, 1.01, 0.99], 0.0, 'not reproduced'),
    ([1.00, 1.05, 0.95], [1.01, 1.06, 0.96], 0.0, 'inconclusive'),     # within noise
    ([1.01, 1.02, 1.00], [1.00, 1.01, 0.99], 0.05, 'reproduced'),     # within 5%
    ([1.10, 1.11, 1.09], [1.00, 1.01, 0.99], 0.02, 'not reproduced'),  # 10% > 2%
])
def test_verdicts_compare_means_with_two_standard_errors(a, b, margin, verdict):
  assert claims.verdict_at_most(_group('a', a), _group('b', b), margin)[0] == verdict


def test_a_claim_whose_finals_are_missing_says_not_run(tmp_path):
  g = {'ddp': _group('ddp', [1.0, 1.1])}
  with pytest.raises(KeyError, match='diloco_nesterov'):
    claims.CLAIMS[0].judge(g, {})


@pytest.mark.slow
def test_the_quick_claims_page_is_written_end_to_end(tmp_path, in_repo):
  """`python -m launch.claims --quick`: every tuning and final run, the re-timing, nine
  rows with a verdict and a plot each; a second call trains nothing."""
  out, page = str(tmp_path / 'claims'), str(tmp_path / 'claims.md')
  assert claims.main(['--quick', f'--out={out}', f'--page={page}']) == 0
  text = open(page).read()
  rows = [line for line in text.splitlines() if line.startswith('| ') and
          line.split('|')[1].strip().isdigit()]
  assert [int(r.split('|')[1]) for r in rows] == list(range(1, 10))
  verdicts = ('**reproduced**', '**not reproduced**', '**inconclusive**')
  assert all(any(v in r for v in verdicts) for r in rows), rows
  for n in range(1, 10):
    assert os.path.getsize(os.path.join(out, 'figures', f'claim{n}.png')) > 1000
  assert os.path.isdir(os.path.join(out, 'final', 'gasloc', 'seed1', 'retimed', 'slow_links'))
  mtime = os.path.getmtime(os.path.join(out, 'final', 'ddp', 'seed1', 'metrics.jsonl'))
  assert claims.main(['--quick', f'--out={out}', f'--page={page}']) == 0
  assert os.path.getmtime(os.path.join(out, 'final', 'ddp', 'seed1', 'metrics.jsonl')) == mtime


def test_time_to_target_is_linear_between_evals_and_inf_if_never_reached():
  curve = [(10.0, 3.0), (20.0, 2.0), (30.0, 1.5)]
  assert claims.seconds_to(curve, 2.5) == pytest.approx(15.0)
  assert claims.seconds_to(curve, 2.0) == pytest.approx(20.0)
  assert claims.seconds_to(curve, 3.5) == pytest.approx(10.0)    # at the first eval
  assert claims.seconds_to(curve, 1.0) == float('inf')
