"""End-to-end runs: outputs, exact resume, divergence, and user errors from the CLI."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from loco import algorithms
from loco.run import checkpoint as checkpoint_lib
from loco.run import experiment
from loco.run import step as step_lib
from loco.run import train
from loco.errors import CheckpointError, ConfigError, DataError
from loco.comm.drift import KEYS as DRIFT_KEYS
from loco.files.metrics import TIMING_KEYS, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _comparable(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


@pytest.mark.slow
def test_run_writes_outputs_and_resumes_exactly(nano_config, tmp_path, capsys):
  nano_config.algorithm.name = 'diloco'
  nano_config.algorithm.sync_every = 3
  full = str(tmp_path / 'full')
  last = train.run(nano_config, full)
  records = read_metrics(full)
  assert [r['step'] for r in records] == [5, 10, 15, 20]
  for key in ('step', 'tokens', 'train_loss', 'bytes_sent', 'bytes_received', 'peak_bytes',
              'syncs', 'sim_seconds', 'tokens_per_second'):
    assert key in records[-1], key
  for key in ('eval_loss', 'eval_loss_se', 'eval_loss_workers', 'worker_spread'):
    assert key in records[1] and key in records[3], key
  for key in DRIFT_KEYS:    # every chunk of 5 steps holds a sync (H = 3)
    assert all(key in r for r in records), key
  assert records[-1]['tokens'] == 20 * 2 * 2 * 32
  assert records[-1]['syncs'] == 6                  # steps 3, 6, ..., 18
  assert last == records[-1]
  config_json = json.load(open(os.path.join(full, 'config.json')))
  assert config_json['data_fingerprint']['files'] > 0
  assert config_json['model']['param_count'] > 0
  assert any(f.startswith('events') for f in os.listdir(os.path.join(full, 'tensorboard')))

  # Interrupt: keep only the step-10 checkpoint, as if the run died after it.
  resumed = str(tmp_path / 'resumed')
  shutil.copytree(full, resumed)
  shutil.rmtree(os.path.join(resumed, 'checkpoints', '20'))
  capsys.readouterr()
  train.run(nano_config, resumed)
  assert _comparable(read_metrics(resumed)) == _comparable(records)
  assert (f'  workdir    {resumed} (resuming from step 10 of 20; checkpoint every 10 steps)'
          in capsys.readouterr().out.splitlines())


# What a run prints before its first step: a header, then each slow phase as it ends.

def test_a_run_says_what_it_will_do_then_times_each_slow_phase(nano_config, tmp_path,
                                                              capsys):
  workdir = str(tmp_path / 'run')
  train.run(nano_config, workdir)
  out = capsys.readouterr().out.splitlines()
  weights = json.load(open(os.path.join(workdir, 'config.json')))['model']['param_count']
  assert out[0] == (f'loco: ddp, 2 workers on 1 cpu device; model nano: {weights:,} weights '
                    '(2 layers, d_model 32)')
  assert out[1] == '  algorithm  transport_dtype=float32'
  assert '  tokens     2,560 planned: 20 steps x 2 workers x 2 sequences x 32' in out
  assert '  network    none (no simulated clock: set network.profile to time the run)' in out
  assert f'  workdir    {workdir} (a new run; checkpoint every 10 steps)' in out
  phases = [re.match(r'  (\S.*?) +\d+\.\d s  ', line) for line in out]
  assert [m.group(1) for m in phases if m] == ['set up', 'read data', 'compiled',
                                               'first eval'], out
  assert len(out) <= 16       # compact (loco.main then prints the end-of-run summary)


def test_the_header_names_the_settings_mesh_network_and_resume_step():
  from loco import configs
  exp = experiment.parse_config(configs.load(
      os.path.join(REPO, 'experiments', 'tiny_gasloc.py'),
      {'mesh.workers': '2', 'network.profile': 'multi_region', 'network.step_seconds': '0.1'}))
  lines = experiment.header(exp, 'runs/x', start=100, total=300)
  text = '\n'.join(lines)
  assert lines[0].startswith('loco: gasloc, 8 workers on 2 cpu devices (mesh 2 workers x 1 '
                             'fsdp); model tiny: ')
  for setting in ('sync_every=50', 'topology=ring', 'weights=metropolis',
                  'outer_optimizer=nesterov', 'outer_lr=0.7', 'outer_momentum=0.5'):
    assert setting in text, setting
  assert all(len(line) <= experiment.HEADER_WIDTH for line in lines[1:]), lines
  assert 'adamw lr=0.003 warmup_steps=50 decay_steps=250 final_lr_frac=0.1' in text
  assert '  data       stdlib, bytes tokenizer, iid over workers' in lines
  assert '  eval       8 x 16 sequences of validation every 50 steps' in lines
  assert '  tokens     1,228,800 planned: 300 steps x 8 workers x 4 sequences x 128' in lines
  assert '  network    multi_region (sync) step_seconds=0.1' in lines
  assert lines[-1] == ('  workdir    runs/x (resuming from step 100 of 300; checkpoint every '
                       '100 steps)')
  assert len(lines) <= 12


# One of each engine path in the default run (local updates + all-reduce, gossip, sparse
# all-gather, fragments, pairwise per-step gossip); every algorithm with pytest -m slow.
_LOOP_DEFAULT = {'diloco', 'gasloc', 'sparseloco', 'streaming_diloco', 'adpsgd'}


@pytest.mark.parametrize('name', [n if n in _LOOP_DEFAULT else
                                  pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(algorithms.REGISTRY)])
def test_every_algorithm_trains_through_the_loop(nano_config, tmp_path, name):
  """Donation, checkpointing and metrics work for every registered algorithm."""
  nano_config.algorithm.name = name
  for key, value in algorithms.REGISTRY[name].example.items():   # syncs within 4 steps
    nano_config.algorithm[key] = value
  nano_config.num_workers = 4
  nano_config.steps = 4
  nano_config.log_every = 2
  nano_config.eval.every = 4
  nano_config.checkpoint.every = 4
  record = train.run(nano_config, str(tmp_path / name))
  assert record['step'] == 4 and np.isfinite(record['eval_loss'])
  assert record['syncs'] > 0 and record['bytes_sent'] > 0
  # The drift diagnostics: on every row (each chunk of 2 steps syncs) of an algorithm
  # with rounds (an outer chain: its StepInfo has them), on none of one without.
  exp = experiment.parse_config(nano_config)
  alg = experiment.build_algorithm(exp)
  abstract = step_lib.init_state(exp, alg, jax.random.key(0))[2]
  rounds = jax.eval_shape(alg.step, abstract, abstract.params)[1].drift is not None
  for row in read_metrics(str(tmp_path / name)):
    present = {k for k in DRIFT_KEYS if k in row}
    assert present == (set(DRIFT_KEYS) if rounds else set()), (row['step'], present)
    if rounds:
      assert -1 <= row['pg_cosine'] <= 1 and row['pg_norm'] >= row['pg_mean_norm'] > 0
      assert np.isfinite(row['consensus_distance']) and row['consensus_distance'] >= 0


@pytest.mark.slow
def test_corrupt_checkpoint_is_a_clear_error(nano_config, tmp_path):
  workdir = str(tmp_path / 'run')
  train.run(nano_config, workdir)
  ckpt = os.path.join(workdir, 'checkpoints', '20', 'state')
  for root, _, files in os.walk(ckpt):
    for name in files:
      with open(os.path.join(root, name), 'wb') as f:
        f.write(b'garbage')
  nano_config.steps = 30          # resuming needs the corrupt step-20 checkpoint
  with pytest.raises(CheckpointError, match='cannot be read'):
    train.run(nano_config, workdir)
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '10'))


@pytest.mark.parametrize('key,value,match', [
    ('optimizer.lr', -1.0, 'optimizer.lr must be positive'),
    ('seq_len', 4096, "above the model's max_seq_len"),
    ('num_workers', 0, 'num_workers must be >= 1'),
    ('eval.every', 7, 'multiple of log_every'),
    ('algorithm.name', 'nope', 'algorithm.name must be one of'),
    ('algorithm.sync_every', 0, 'sync_every'),
    ('data.sharding', 'random', 'sharding'),
    ('mesh.workers', 3, 'mesh.workers'),
])
def test_bad_config_values(nano_config, tmp_path, key, value, match):
  section, _, leaf = key.rpartition('.')
  (nano_config[section] if section else nano_config)[leaf] = value
  with pytest.raises(ConfigError, match=match):
    train.run(nano_config, str(tmp_path / 'run'))


@pytest.mark.slow
def test_missing_data_dir_is_a_clear_error(nano_config, tmp_path):
  nano_config.data.source = 'tfds'
  nano_config.data.tfds_name = 'c4/en:3.1.0'
  nano_config.data.data_dir = str(tmp_path / 'nowhere')
  with pytest.raises(DataError, match='c4'):
    train.run(nano_config, str(tmp_path / 'run'))


def _cli(*args, cwd=REPO):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, '-m', 'loco.main', *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_unknown_key_and_bad_value_fail_in_one_line(tmp_path):
  out = _cli('--config=experiments/tiny_ddp.py', f'--workdir={tmp_path}',
             '--config.optimizr.lr=1')
  assert out.returncode != 0
  assert 'optimizr' in out.stderr and 'Traceback' not in out.stderr
  out = _cli('--config=experiments/tiny_ddp.py', f'--workdir={tmp_path}',
             '--config.optimizer.lr=-1')
  assert out.returncode == 1
  assert out.stderr.strip().splitlines()[-1] == (
      'loco: error: optimizer.lr must be positive, got -1.0.')
  assert 'Traceback' not in out.stderr


def _diloco_run(nano_config, path, mesh_workers=1, fsdp=1):
  import copy
  c = copy.deepcopy(nano_config)
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = 3
  c.num_workers = 4
  c.batch_per_worker = 4
  c.mesh.workers, c.mesh.fsdp = mesh_workers, fsdp
  return train.run(c, str(path))


@pytest.fixture(scope='module')
def one_device_diloco(small_corpus_glob, data_dir, tmp_path_factory):
  from tests.nano import make_nano_config
  return _diloco_run(make_nano_config(small_corpus_glob, data_dir),
                     tmp_path_factory.mktemp('one'))


@pytest.mark.parametrize('mesh_workers,fsdp', [
    (2, 4), pytest.param(4, 2, marks=pytest.mark.slow), pytest.param(4, 1, marks=pytest.mark.slow)])
def test_mesh_run_matches_the_vmap_run(nano_config, one_device_diloco, tmp_path,
                                       mesh_workers, fsdp):
  """The worker axis over `mesh_workers` of the 8 in-process CPU devices, each worker's
  state and batch over `fsdp` (workers x fsdp), gives the one-device numbers."""
  import jax
  assert len(jax.devices()) >= 8, 'tests/conftest.py gives JAX 8 CPU devices'
  one = one_device_diloco
  mesh = _diloco_run(nano_config, tmp_path, mesh_workers, fsdp)
  assert one['bytes_sent'] == mesh['bytes_sent'] and one['syncs'] == mesh['syncs']
  np.testing.assert_allclose(mesh['train_loss'], one['train_loss'], rtol=1e-4)
  np.testing.assert_allclose(mesh['eval_loss'], one['eval_loss'], rtol=1e-4)


# Warm starts (init_from): another run's checkpoint as the starting point.

def _source_run(nano_config, path):
  nano_config.algorithm.name, nano_config.algorithm.sync_every = 'diloco', 2
  nano_config.steps, nano_config.checkpoint.every, nano_config.eval.every = 5, 5, 5
  train.run(nano_config, path)
  from loco.run import checkpoint
  return checkpoint.read_named_state(path)[1]


@pytest.mark.slow
def test_a_warm_start_begins_every_worker_at_the_sources_mean_model(nano_config, tmp_path):
  source = str(tmp_path / 'source')
  saved = _source_run(nano_config.copy_and_resolve_references(), source)
  mean = lambda x: np.asarray(x, np.float64).mean(0)
  nano_config.num_workers, nano_config.algorithm.name = 4, 'diloco'   # another M
  nano_config.steps, nano_config.eval.every, nano_config.checkpoint.every = 10, 5, 5
  nano_config.init_from = source
  for inner_state in ('fresh', 'carried'):
    nano_config.init_inner_state = inner_state
    exp = experiment.parse_config(nano_config)
    alg = experiment.build_algorithm(exp)
    key = jax.random.key(exp.run.seed)
    _, init, like = step_lib.init_state(exp, alg, key)
    notes = []
    state = checkpoint_lib.warm_start(init, key, like, source, inner_state, notes.append)
    assert notes and 'warm start from' in notes[0] and inner_state in notes[0]
    for got, anchor, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.anchor),
                                 jax.tree.leaves(saved['params'])):
      assert got.shape[0] == 4
      np.testing.assert_allclose(np.asarray(got), np.broadcast_to(mean(want), got.shape),
                                 rtol=1e-6, atol=1e-7)
      np.testing.assert_array_equal(np.asarray(anchor), np.asarray(got))
    adam = state.inner_state[1][0]                     # chain(clip, chain(adam, ...))
    mu = np.asarray(adam.mu['embed'])
    if inner_state == 'fresh':
      assert not mu.any() and int(np.asarray(adam.count)[0]) == 0
    else:
      np.testing.assert_allclose(mu[2], mean(saved['inner_state']['1']['0']['mu']['embed']),
                                 rtol=1e-6, atol=1e-9)
      assert mu.any() and int(np.asarray(adam.count)[3]) == 5
  # Trained from there, the first losses are those of a trained model.
  warm, cold = str(tmp_path / 'warm'), str(tmp_path / 'cold')
  train.run(nano_config, warm)
  resumed = str(tmp_path / 'resumed')          # resumes from its own checkpoint, exactly
  shutil.copytree(warm, resumed)
  shutil.rmtree(os.path.join(resumed, 'checkpoints', '10'))
  train.run(nano_config, resumed)
  assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(warm))
  nano_config.init_from, nano_config.init_inner_state = '', 'fresh'
  train.run(nano_config, cold)
  assert read_metrics(warm)[0]['train_loss'] < read_metrics(cold)[0]['train_loss'] - 0.05


@pytest.mark.slow
def test_a_warm_start_from_ddp_carries_its_inner_optimizer_into_diloco(nano_config, tmp_path):
  """DDP's inner state is (its gradient all-reduce's, AdamW's): DiLoCo carries AdamW's."""
  source = str(tmp_path / 'ddp')
  ddp = nano_config.copy_and_resolve_references()
  ddp.algorithm.name, ddp.steps, ddp.checkpoint.every, ddp.eval.every = 'ddp', 5, 5, 5
  train.run(ddp, source)
  saved = checkpoint_lib.read_named_state(source)[1]
  nano_config.algorithm.name, nano_config.algorithm.sync_every = 'diloco', 2
  nano_config.init_from, nano_config.init_inner_state = source, 'carried'
  exp = experiment.parse_config(nano_config)
  key = jax.random.key(exp.run.seed)
  _, init, like = step_lib.init_state(exp, experiment.build_algorithm(exp), key)
  state = checkpoint_lib.warm_start(init, key, like, source, 'carried', lambda m: None)
  adam = state.inner_state[1][0]
  want = np.asarray(saved['inner_state']['1']['1']['0']['nu']['embed'], np.float64).mean(0)
  np.testing.assert_allclose(np.asarray(adam.nu['embed'])[1], want, rtol=1e-6, atol=1e-12)
  assert int(np.asarray(adam.count)[0]) == 5


@pytest.mark.slow
def test_warm_start_errors_are_one_line_and_leave_no_workdir(nano_config, tmp_path):
  source = str(tmp_path / 'source')
  _source_run(nano_config.copy_and_resolve_references(), source)
  nano_config.init_from = str(tmp_path / 'missing')
  with pytest.raises(CheckpointError, match='init_from: .*missing does not exist'):
    train.run(nano_config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')
  (tmp_path / 'a_file').write_text('x')
  nano_config.init_from = str(tmp_path / 'a_file')
  with pytest.raises(CheckpointError, match='init_from: .*a_file is a file, not a run'):
    train.run(nano_config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')
  nano_config.init_from, nano_config.model.d_model = source, 64
  with pytest.raises(ConfigError, match=r'init_from: params.* the models differ'):
    train.run(nano_config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')
  nano_config.model.d_model, nano_config.init_inner_state = None, 'kept'
  with pytest.raises(ConfigError, match="init_inner_state must be one of"):
    train.run(nano_config, str(tmp_path / 'run'))
  # Carrying an inner state without a warm start once did nothing and said nothing.
  nano_config.init_from, nano_config.init_inner_state = '', 'carried'
  with pytest.raises(ConfigError, match=r'^init_inner_state=carried .* needs init_from'):
    train.run(nano_config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')


