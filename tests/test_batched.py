"""Batched runs write each run's workdir as its solo run would: metrics, comms log,
checkpoints; they resume, and a diverging run stops alone (loco/batched.py)."""

import json
import os

import numpy as np
import pytest

from loco import batched
from loco.run import checkpoint as checkpoint_lib
from loco.run import train
from loco.errors import ConfigError, Interrupted
from loco.files.metrics import read_metrics
from tests.nano import make_nano_config

RUNS = [dict(seed=1, lr=3e-3, outer_lr=0.7), dict(seed=2, lr=1e-3, outer_lr=0.5),
        dict(seed=4, lr=6e-3, outer_lr=1.0)]


def _config(glob, data_dir, run, name='diloco', network=None, **algorithm):
  c = make_nano_config(glob, data_dir)
  for key, value in (network or {}).items():
    c.network[key] = value
  c.num_workers = 2
  c.seed = run['seed']
  c.optimizer.lr = run['lr']
  c.algorithm.name = name
  c.algorithm.sync_every = 3
  c.algorithm.outer_lr = run['outer_lr']
  for key, value in algorithm.items():
    c.algorithm[key] = value
  return c


def _comms(workdir):
  with open(os.path.join(workdir, 'comms.jsonl')) as f:
    return [json.loads(line) for line in f]


def _same_rows(a, b, keys=('train_loss', 'eval_loss')):
  assert [r['step'] for r in a] == [r['step'] for r in b]
  for x, y in zip(a, b):
    for key in keys:
      assert (key in x) == (key in y), key
      if key in x:
        np.testing.assert_allclose(x[key], y[key], rtol=2e-5, atol=2e-6, err_msg=key)
    for key in ('tokens', 'bytes_sent', 'bytes_received', 'syncs', 'sim_seconds'):
      assert x.get(key) == y.get(key), key


ASYNC = dict(mode='async', profile='slow_links', slow_workers=1, slow_factor=20.0,
             step_seconds=0.1, overlap='compute', peer_choice='rotation')


@pytest.mark.slow
@pytest.mark.parametrize('name, extra, network', [
    ('diloco', {}, None),
    ('gasloc', dict(topology='ring'), None),                          # gossip
    ('sparseloco', dict(topk=8, chunk_size=64), None),                # compressed
    ('gasloc', dict(topology='matching'), ASYNC),                     # asynchronous replay
])
def test_each_batched_workdir_equals_its_solo_run(tmp_path, small_corpus_glob, data_dir,
                                                  name, extra, network):
  configs = [_config(small_corpus_glob, data_dir, run, name, network, **extra)
             for run in RUNS]
  if network:
    for c in configs:
      c.num_workers = 4
  dirs = [str(tmp_path / f'batched{i}') for i in range(len(RUNS))]
  results = batched.run_batched(configs, dirs)
  assert [r['state'] for r in results] == ['finished'] * 3
  for i, config in enumerate(configs):
    solo = str(tmp_path / f'solo{i}')
    train.run(config, solo)
    _same_rows(read_metrics(dirs[i]), read_metrics(solo))
    assert _comms(dirs[i]) == _comms(solo)
    assert sorted(os.listdir(os.path.join(dirs[i], 'checkpoints'))) == sorted(
        os.listdir(os.path.join(solo, 'checkpoints')))
    with open(os.path.join(dirs[i], 'config.json')) as f:
      assert json.load(f)['config']['seed'] == RUNS[i]['seed']
  assert read_metrics(dirs[0])[-1]['train_loss'] != read_metrics(dirs[1])[-1]['train_loss']


@pytest.mark.slow
def test_batched_runs_resume_alone_or_together(tmp_path, small_corpus_glob, data_dir,
                                               monkeypatch):
  configs = [_config(small_corpus_glob, data_dir, run) for run in RUNS[:2]]
  dirs = [str(tmp_path / 'a'), str(tmp_path / 'b')]
  # Stopped at step 15 (STOP, as SIGTERM sets it, once chunk 11-15 is read): each run
  # saves a checkpoint of that step, its row written first.
  real = train._chunks

  def stop_at_15(start, *args):
    for item in real(start, *args):
      if item[0] >= 15:
        train.STOP.set()
      yield item
  monkeypatch.setattr(train, "_chunks", stop_at_15)
  outcomes = {}
  with pytest.raises(Interrupted):
    batched.run_batched(configs, dirs, outcomes)
  train.STOP.clear()
  assert [o['state'] for o in outcomes.values()] == ['interrupted'] * 2
  for d in dirs:
    assert outcomes[d]['error'].startswith(
        "interrupted after step 15; saved each run's checkpoint (step 15) in "), outcomes[d]
    assert checkpoint_lib.committed_steps(os.path.join(d, 'checkpoints')) == [10, 15]
    assert read_metrics(d)[-1]['step'] == 15
  monkeypatch.setattr(train, "_chunks", real)
  # Run b resumes alone; then a (at step 15) and a new run c (at 0) go together.
  train.run(configs[1], dirs[1])
  third = _config(small_corpus_glob, data_dir, RUNS[2])
  results = batched.run_batched([configs[0], configs[1], third],
                                dirs + [str(tmp_path / 'c')])
  assert [r['state'] for r in results] == ['finished'] * 3
  for i, config in enumerate([configs[0], configs[1], third]):
    solo = str(tmp_path / f'solo{i}')
    train.run(config, solo)
    _same_rows(read_metrics((dirs + [str(tmp_path / 'c')])[i]), read_metrics(solo))


@pytest.mark.slow
def test_a_diverging_run_stops_alone(tmp_path, small_corpus_glob, data_dir):
  runs = [RUNS[0], dict(seed=2, lr=1e-3, outer_lr=1e6)]   # the outer step explodes
  configs = [_config(small_corpus_glob, data_dir, run) for run in runs]
  configs[1].algorithm.outer_lr = 1.0
  configs[1].optimizer.lr = 1e3
  dirs = [str(tmp_path / 'ok'), str(tmp_path / 'bad')]
  results = batched.run_batched(configs, dirs)
  assert results[0]['state'] == 'finished'
  assert results[1]['state'] == 'diverged', results[1]
  assert os.path.exists(os.path.join(dirs[1], 'diverged.json'))
  assert read_metrics(dirs[0])[-1]['step'] == 20
  assert len(read_metrics(dirs[1])) < len(read_metrics(dirs[0]))
  # The healthy run is its solo run.
  train.run(configs[0], str(tmp_path / 'solo'))
  _same_rows(read_metrics(dirs[0]), read_metrics(str(tmp_path / 'solo')))
  # Again: the diverged run is refused, the finished one skipped.
  again = batched.run_batched(configs, dirs)
  assert [r['state'] for r in again] == ['finished', 'diverged']


def test_runs_of_different_shapes_are_refused(tmp_path, small_corpus_glob, data_dir):
  configs = [_config(small_corpus_glob, data_dir, run) for run in RUNS[:2]]
  configs[1].algorithm.sync_every = 5
  outcomes = {}
  with pytest.raises(ConfigError, match='algorithm_kwargs.sync_every'):
    batched.run_batched(configs, [str(tmp_path / 'a'), str(tmp_path / 'b')], outcomes)
  assert all(o['state'] == 'failed' for o in outcomes.values())
  assert not os.path.exists(tmp_path / 'a')


def test_the_command_answers_bad_runs_files_in_one_line(tmp_path, capsys):
  bad = tmp_path / 'runs.json'
  bad.write_text('[{"workdir": 3}]')
  assert batched.main([f'--runs={bad}']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'must be a non-empty list' in err[0]
  bad.write_text('{not json')
  assert batched.main([f'--runs={bad}']) == 2
  assert 'is not JSON' in capsys.readouterr().err
  assert batched.main([f'--runs={tmp_path / "missing.json"}']) == 2
  assert 'does not exist' in capsys.readouterr().err
  # An empty workdir, and one directory reached twice (once through a link).
  argv = ['--config=experiments/tiny_ddp.py']
  bad.write_text(json.dumps([{'workdir': '', 'argv': argv}]))
  assert batched.main([f'--runs={bad}']) == 2
  assert capsys.readouterr().err.strip() == (
      f'loco.batched: error: the runs file {bad} gives run 0 an empty workdir; every run '
      'needs its own directory.')
  (tmp_path / 'a').mkdir()
  (tmp_path / 'b').symlink_to(tmp_path / 'a')
  bad.write_text(json.dumps([{'workdir': str(tmp_path / 'a'), 'argv': argv},
                             {'workdir': str(tmp_path / 'b'), 'argv': argv}]))
  assert batched.main([f'--runs={bad}']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'names one directory twice' in err[0], err


def test_links_inside_a_workdir_or_a_sweep_are_refused_and_the_rule_is_one_line(tmp_path):
  """The rule for links: a workdir may be a link (followed; its lock is on the target),
  nothing inside it may be (a `checkpoints/` into another run would be written and
  pruned under another run's lock); a sweep's run directories may not be links out of
  --out; a lock held by this very process says so instead of naming itself as another."""
  from loco.lab import sweep
  from loco.files import workdir as workdir_lib
  from loco.errors import WorkdirError
  other = tmp_path / 'other'
  (other / 'checkpoints').mkdir(parents=True)
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'checkpoints').symlink_to(other / 'checkpoints')
  with pytest.raises(WorkdirError, match=r'holds a link, checkpoints -> .*other/checkpoints'):
    with workdir_lib.Workdir(str(run)):
      pass
  (tmp_path / 'alias').symlink_to(other)        # the workdir itself a link: followed
  with workdir_lib.Workdir(str(tmp_path / 'alias')) as wd:
    assert wd.path == str(tmp_path / 'alias') and (other / '.lock').exists()
    with pytest.raises(WorkdirError, match='already a workdir of this process'):
      with workdir_lib.Workdir(str(other)):
        pass
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'x').symlink_to(other)
  with pytest.raises(sweep.SweepError, match=r'out/x is a link .*inside .*out only'):
    sweep.run_sweep([sweep.Run('x/y', 'experiments/tiny_ddp.py')], str(out))


@pytest.mark.slow
def test_sigterm_stops_every_run_at_its_checkpoint_in_one_line(tmp_path, small_corpus_glob,
                                                                 data_dir):
  """The command under SIGTERM (what loco.sweep sends): one `stopped:` line naming the
  step reached, exit 130, each run 'interrupted' in the results with a checkpoint of
  that step, and the same command finishes them."""
  import signal
  import subprocess
  import sys
  import time
  runs = []
  for i, run in enumerate(RUNS[:2]):
    argv = [f'--config={os.path.join(os.path.dirname(__file__), "nano_config.py")}',
            f'--config.seed={run["seed"]}', f'--config.optimizer.lr={run["lr"]}',
            '--config.steps=400', '--config.checkpoint.every=10']
    runs.append(dict(workdir=str(tmp_path / f'r{i}'), argv=argv))
  spec, results = tmp_path / 'runs.json', tmp_path / 'results.json'
  spec.write_text(json.dumps(runs))
  env = {**os.environ, 'NANO_GLOB': small_corpus_glob, 'NANO_DATA': data_dir,
         'JAX_PLATFORMS': 'cpu'}
  env.pop('XLA_FLAGS', None)
  cmd = [sys.executable, '-m', 'loco.batched', f'--runs={spec}', f'--results={results}']
  proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  deadline = time.time() + 240
  while not os.path.exists(tmp_path / 'r1' / 'checkpoints' / '20'):
    assert proc.poll() is None and time.time() < deadline, proc.communicate()
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  t = time.time()
  out, err = proc.communicate(timeout=120)
  # loco.sweep waits 15 s before it kills a stopping run: the chunk in flight and the
  # checkpoint commit fit in that on an idle machine (this allows a busy one).
  assert time.time() - t < 45
  assert proc.returncode == 130, err
  # Stopped at a chunk boundary, each run with its row and its checkpoint there.
  step = read_metrics(runs[0]['workdir'])[-1]['step']
  line = err.strip().splitlines()[-1]
  assert line.startswith(f'loco.batched: stopped: interrupted after step {step}; ') and (
      f' checkpoint (step {step}) ' in line), line
  assert 'Traceback' not in err
  outcome = json.loads(results.read_text())
  for r in runs:
    assert outcome[r['workdir']] == dict(state='interrupted',
                                         error=line[len('loco.batched: stopped: '):])
    assert read_metrics(r['workdir'])[-1]['step'] == step
    assert step in checkpoint_lib.committed_steps(os.path.join(r['workdir'], 'checkpoints'))
  again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
  assert again.returncode == 0, again.stderr
  for r in runs:
    assert read_metrics(r['workdir'])[-1]['step'] == 400
