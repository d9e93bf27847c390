"""launch.scaling: the published fits, the plan, the points and the overlay; the quick
study end to end (slow)."""

import json
import os

import numpy as np
import pytest

from launch import scaling
from loco.lab import study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_published_fits_give_the_gaps_quoted_in_references():
  # REFERENCES.md (2503.09799 Table 7 extrapolated): at 3.2M about +0.1/+1.1/+2.8/+5.3%,
  # at 0.43M about +0.2/+1.4/+3.6/+6.7%; at 35M the fits are near Table 4's measurements.
  for n, quoted in ((3.2e6, (0.1, 1.1, 2.8, 5.3)), (0.43e6, (0.2, 1.4, 3.6, 6.7))):
    got = [100 * scaling.predicted_gap(n, m) for m in scaling.WORKERS]
    np.testing.assert_allclose(got, quoted, atol=0.06)
  at35 = [100 * scaling.predicted_gap(35e6, m) for m in scaling.WORKERS]
  measured = [scaling.MEASURED[35e6][m] for m in scaling.WORKERS]
  np.testing.assert_allclose(at35, measured, atol=0.35)


def test_steps_are_multiples_of_four_rounds():
  assert scaling.steps_for(20, 3_213_824, 128 * 128, 30) == 3960
  assert scaling.steps_for(20, 3_213_824, 128 * 128, 30) % 120 == 0
  assert scaling.steps_for(1e-6, 1000, 2048, 30) == 120       # at least 4 H


@pytest.mark.parametrize('preset', ['micro', 'tiny'])
def test_every_run_of_the_probe_and_the_study_loads(preset):
  # The probe and every run of a sized plan are loco.main configs that load (the probe of
  # 200 steps once clashed with log_every = H = 30 and failed before training).
  from loco.run import experiment
  from loco.lab import study
  from loco.lab import sweep
  batch, seq_len = scaling.SHAPES[preset]
  plan = dict(preset=preset, params=426_752, batch=batch, seq_len=seq_len, h=scaling.H,
              inner_lrs=[1.5e-3, 3e-3, 6e-3], seeds=[1, 2, 3], eval_batches=32,
              score_batches=512, steps=scaling.steps_for(3.0, 426_752, batch * seq_len,
                                                         scaling.H))
  runs = scaling.probe_runs(plan, 3)
  assert len(runs) == 3
  b = scaling.budget(plan)
  ms = scaling.methods(batch)
  picks = {m.name: dict(setting=study.settings(m, b, {})[0][1]) for m in ms}
  runs += [study.tuning_run(m, b, s) for m in ms for s in study.settings(m, b, {})[0]]
  runs += study.final_runs(ms, scaling.finals(), b, picks, 'OUT')
  sweep.check_runs(runs)
  configs = [sweep.load_config(sweep.command(r, 'w')[3:]) for r in runs]
  for c in configs:          # the checks loco.main makes before it trains
    experiment.parse_config(c)
  assert configs[0].steps == scaling.PROBE_STEPS and configs[-1].steps == plan['steps']
  # Every run sees the same global batch: M workers x batch / M sequences.
  assert {c.num_workers * c.batch_per_worker for c in configs} == {batch}


def _Group(losses, diverged=None):
  return study.Group('g', losses, {}, None, 0.0, 0.0, 0.0, [], {}, diverged or {})


def test_a_new_plan_checks_its_picks_at_a_second_seed_and_an_old_plan_keeps_its_own():
  plan = dict(preset='micro', seq_len=64, steps=720, eval_batches=32, h=30,
              inner_lrs=[1.5e-3, 3e-3, 6e-3], seeds=[1, 2, 3], score_batches=512)
  assert scaling.budget(plan).check_seed is None          # made before the check seed
  assert scaling.budget({**plan, 'check_seed': 10}).check_seed == scaling.CHECK_SEED == 10


def test_points_are_paired_relative_gaps_with_cis(tmp_path):
  plan = dict(preset='micro', params=426_752, tokens_per_weight=9.6, steps=2000, h=30,
              batch=32, seq_len=64)
  groups = {'ddp': _Group({1: 2.0, 2: 2.1, 3: 1.9}),
            'diloco_m8': _Group({1: 2.1, 2: 2.2, 3: 2.0}),
            'diloco_m1': _Group({1: 2.0, 2: 2.1}, {3: 77})}
  p = scaling.points(str(tmp_path), plan, groups)
  m8 = p['workers']['8']
  np.testing.assert_allclose(list(m8['gaps'].values()), [0.05, 0.1 / 2.1, 0.1 / 1.9])
  assert m8['gap_ci'][0] < m8['gap_mean'] < m8['gap_ci'][1]
  assert p['workers']['1']['gap_mean'] == 0.0 and '2' not in p['workers']
  assert p['workers']['1']['diverged'] == {'3': 77} and m8['diverged'] == {}
  plan.update(seeds=(1, 2, 3))
  page = scaling.write_page(str(tmp_path), plan, json.loads(json.dumps(p)), {}, 60.0)
  with open(page) as f:
    assert '+0.00%, +0.00%, seed 3 diverged at step 77 |' in f.read()
  assert 'not all of M = 1, 2, 4, 8' in scaling.ordering(p)
  groups.update(diloco_m2=_Group({1: 2.02, 2: 2.12, 3: 1.92}),
                diloco_m4=_Group({1: 2.01, 2: 2.11, 3: 1.91}))
  p = scaling.points(str(tmp_path), plan, groups)
  assert scaling.ordering(p).startswith('does not follow')      # M = 4 below M = 2
  (tmp_path / 'points.json').write_text(json.dumps(p))
  path = scaling.overlay([str(tmp_path)], str(tmp_path / 'fig' / 'overlay.png'))
  assert os.path.getsize(path) > 10_000
  # A points file kept with the docs draws the same as its study's folder.
  kept = tmp_path / 'kept' / 'micro_points.json'
  kept.parent.mkdir()
  kept.write_text(json.dumps(p))
  assert scaling.read_points(str(kept)) == scaling.read_points(str(tmp_path))
  assert scaling.study_name(str(kept)) == 'micro'
  assert scaling.study_name(str(tmp_path / 'scaling_micro')) == 'scaling_micro'
  assert os.path.getsize(scaling.overlay([str(kept)], str(tmp_path / 'fig' / 'o2.png'))) > 10_000


def test_the_committed_micro_points_are_a_readable_points_file():
  """The claims page overlays docs/scaling/micro_points.json (claims.SCALING)."""
  from launch import claims
  kept = [w for w in claims.SCALING if w.endswith('.json')]
  assert kept and all(os.path.isfile(os.path.join(ROOT, w)) for w in kept)
  for w in kept:
    p = scaling.read_points(os.path.join(ROOT, w))
    assert p['preset'] == 'micro' and set(p['workers']) <= {str(m) for m in scaling.WORKERS}


def test_overlay_and_plan_files_missing_damaged_or_foreign_are_one_line(tmp_path, capsys):
  assert scaling.main(['--overlay', str(tmp_path), f'--out={tmp_path / "o"}']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'launch.scaling: error: {tmp_path} has no points.json (run '
                 'launch.scaling there first).']
  assert scaling.main(['--overlay', str(tmp_path / 'none.json'), f'--out={tmp_path / "o"}']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'launch.scaling: error: {tmp_path / "none.json"} is missing or not a JSON '
                 'object.']
  for text, match in (('{"workers": ', 'is not valid JSON'),
                      ('{"runs": []}', 'is not a launch.scaling points file')):
    (tmp_path / 'points.json').write_text(text)
    assert scaling.main(['--overlay', str(tmp_path), f'--out={tmp_path / "o"}']) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
  (tmp_path / 'study').mkdir()
  (tmp_path / 'study' / 'plan.json').write_text('[1, 2]')
  assert scaling.main(['--quick', f'--out={tmp_path / "study"}']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'plan.json holds a JSON list, not an object' in err[0], err
  (tmp_path / 'study' / 'plan.json').write_text('{"preset": "tiny"}')
  assert scaling.main(['--quick', f'--out={tmp_path / "study"}']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'is not a launch.scaling plan (no batch,' in err[0], err
  # Every key launch.scaling reads back is checked for its type, in plan.json ...
  good = dict(preset='nano', quick=True, params=1000, batch=8, seq_len=32, h=3, steps=12,
              inner_lrs=[1e-3], seeds=[1, 2], eval_batches=4, score_batches=16,
              batch_runs=3, sampling='windows', tokens_per_weight=3.1,
              probe_seconds_per_step=None)
  for key, value, says in (('steps', '12', 'steps is a str, not a whole number'),
                           ('seeds', [1, 'two'], 'seeds is a list, not a list of whole'),
                           ('tokens_per_weight', None, 'tokens_per_weight is null'),
                           ('batch', True, 'batch is a bool, not a whole number'),
                           ('preset', 'huge', "preset 'huge' is not one of"),
                           ('check_seed', 'ten', 'check_seed is a str, not a whole number')):
    (tmp_path / 'study' / 'plan.json').write_text(json.dumps({**good, key: value}))
    assert scaling.main(['--quick', f'--out={tmp_path / "study"}']) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('launch.scaling: error: ') and says in err[0], err
  # ... and in points.json, down to each worker count's point.
  point = dict(gaps={'1': 0.1}, gap_mean=0.1, gap_ci=[0.0, 0.2], predicted=0.05)
  points = dict(params=1000, tokens_per_weight=3.0, ddp={'mean': 2.0}, workers={'8': point})
  for bad, says in (({**points, 'params': 1.5}, 'params is 1.5, not a whole number'),
                    ({**points, 'workers': []}, 'workers is a list, not an object'),
                    ({**points, 'workers': {'8': 3}}, '(workers.8) is damaged'),
                    ({**points, 'workers': {'8': {**point, 'gap_ci': [0.1]}}},
                     'gap_ci is a list, not a pair of finite numbers or null'),
                    ({**points, 'ddp': {'mean': 'x'}}, '(ddp) is damaged: mean is a str')):
    (tmp_path / 'points.json').write_text(json.dumps(bad))
    assert scaling.main(['--overlay', str(tmp_path), f'--out={tmp_path / "o"}']) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
  (tmp_path / 'points.json').write_text(json.dumps(points))
  assert scaling.main(['--overlay', str(tmp_path), f'--out={tmp_path / "o"}']) == 0
  capsys.readouterr()
  # Numbers that are not finite are refused as arguments, in one line.
  for flag in ('--minutes=nan', '--minutes=-1', '--tokens_per_weight=inf'):
    with pytest.raises(SystemExit) as stop:
      scaling.main(['--quick', f'--out={tmp_path / "study"}', flag])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'must be' in err[0] and flag.split('=')[0] in err[0], err


def test_an_interrupted_probe_is_an_interrupt_not_a_failure(tmp_path, capsys, monkeypatch):
  """SIGTERM or Ctrl-C during the sizing probe (its sweep returns 130) stops the study
  with the stopped line and exit 130; a probe that fails is still an error."""
  from loco.lab import sweep
  monkeypatch.setattr(scaling, '_params', lambda preset: 426_752)
  for code, exit_code, says in ((130, 130, 'launch.scaling: stopped: interrupted'),
                                (1, 1, 'launch.scaling: error: the sizing probe failed')):
    monkeypatch.setattr(sweep, 'run_sweep', lambda *a, code=code, **k: code)
    assert scaling.main(['--preset=micro', f'--out={tmp_path / "s"}']) == exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(says), err
    assert not (tmp_path / 's' / 'plan.json').exists()


@pytest.mark.slow
def test_the_quick_study_runs_end_to_end(tmp_path, in_repo):
  out = str(tmp_path / 'quick')
  assert scaling.main(['--quick', f'--out={out}']) == 0
  with open(os.path.join(out, 'points.json')) as f:
    p = json.load(f)
  assert p['preset'] == 'nano' and sorted(p['workers']) == ['1', '2', '4', '8']
  for w in p['workers'].values():
    assert len(w['gaps']) == 2 and w['gap_ci'] is not None
  page = open(os.path.join(out, 'scaling.md')).read()
  assert '| M = 8 |' in page and 'Ordering:' in page
  plan = json.load(open(os.path.join(out, 'plan.json')))
  assert plan['steps'] == 12
  # Batched: the finals' seeds trained in one program.
  status = json.load(open(os.path.join(out, 'final', 'diloco_m8', 'seed1', 'status.json')))
  assert status['batch'] == ['diloco_m8/seed1', 'diloco_m8/seed2']
  # Again: nothing trains, the same points.
  assert scaling.main(['--quick', f'--out={out}']) == 0
  assert json.load(open(os.path.join(out, 'points.json'))) == p
