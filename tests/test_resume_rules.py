"""What may change when a run resumes (loco/files/workdir.py `check_resume`, WORKSPACE.md):
only `steps` may grow (fewer are refused), a key that changes the run's meaning is
refused by name, keys that only change how it runs or logs may change, and an unset
`optimizer.decay_steps` makes the schedule span the new length (checked on the learning
rate the resumed run actually applied, recovered from its checkpoints).
"""

import copy
import json
import math
import os
import shutil

import numpy as np
import orbax.checkpoint as ocp
import pytest

from loco.run import train
from loco.errors import WorkdirError
from loco.files.metrics import read_metrics
from tests.nano import make_nano_config

BASE_STEPS = 10
LR, WARMUP, FINAL = 3e-3, 2, 0.1        # nano: optimizer.lr default, warmup_steps = 2
B1, B2, EPS, WD = 0.9, 0.95, 1e-8, 0.1  # the base config's AdamW


@pytest.fixture(scope='module')
def base_run(tmp_path_factory, small_corpus_glob, data_dir):
  """A finished 10-step DDP run (checkpoint at step 10), trained once for the module."""
  c = make_nano_config(small_corpus_glob, data_dir)
  c.steps = BASE_STEPS
  workdir = str(tmp_path_factory.mktemp('base') / 'run')
  train.run(c, workdir)
  return workdir


@pytest.fixture(scope='module')
def interrupted_run(tmp_path_factory, small_corpus_glob, data_dir):
  """A 20-step run stopped after its step-10 checkpoint (the step-20 one removed)."""
  c = make_nano_config(small_corpus_glob, data_dir)
  c.steps = 20
  workdir = str(tmp_path_factory.mktemp('interrupted') / 'run')
  train.run(c, workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '20'))
  return workdir


@pytest.fixture
def config(small_corpus_glob, data_dir):
  c = make_nano_config(small_corpus_glob, data_dir)
  c.steps = BASE_STEPS
  return c


def _copy(base_run, tmp_path) -> str:
  workdir = str(tmp_path / 'run')
  shutil.copytree(base_run, workdir)
  os.remove(os.path.join(workdir, '.lock'))
  return workdir


def _set(config, key, value):
  section, _, leaf = key.rpartition('.')
  (config[section] if section else config)[leaf] = value


def _hand_lr(count: int, steps: int) -> float:
  """Linear warm-up over WARMUP, then cosine from LR to LR * FINAL over steps - WARMUP."""
  if count < WARMUP:
    return LR * count / WARMUP
  decay = steps - WARMUP
  t = min(count - WARMUP, decay) / decay
  return LR * FINAL + (LR - LR * FINAL) * 0.5 * (1 + math.cos(math.pi * t))


def _flat(tree, prefix=''):
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f'{prefix}{k}/'))
    return out
  return {prefix[:-1]: np.asarray(tree)}


def _applied_lr(workdir: str, step: int) -> float:
  """The learning rate of the update that took worker 0 from step - 1 to step.

  AdamW: p_s = p_{s-1} - lr (mu_s / (1 - b1^s) / (sqrt(nu_s / (1 - b2^s)) + eps)
  + wd p_{s-1} [matrices]); solved for lr by least squares over all parameters.
  """
  manager = ocp.CheckpointManager(os.path.join(workdir, 'checkpoints'),
                                  item_names=('state', 'data', 'host'))
  read = lambda s: manager.restore(
      s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))['state']
  before, after = read(step - 1), read(step)
  manager.close()
  adam = after['inner_state']['1']['1']['0']      # ddp: (all-reduce, (clip, adamw))
  assert int(adam['count'][0]) == step
  p0, p1 = _flat(before['params']), _flat(after['params'])
  mu, nu = _flat(adam['mu']), _flat(adam['nu'])
  num = den = 0.0
  for name in p0:
    x0 = p0[name][0].astype(np.float64)
    direction = ((mu[name][0] / (1 - B1 ** step))
                 / (np.sqrt(nu[name][0] / (1 - B2 ** step)) + EPS))
    u = direction + (WD * x0 if x0.ndim >= 2 else 0.0)
    delta = p1[name][0].astype(np.float64) - x0
    num += float(-(delta * u).sum())
    den += float((u * u).sum())
  return num / den


@pytest.mark.slow
def test_growing_steps_is_allowed_with_a_note_and_the_schedule_spans_the_new_length(
    base_run, config, tmp_path, capsys):
  workdir = _copy(base_run, tmp_path)
  config.steps = 20
  # Execution-only keys change too: one metrics row and one checkpoint per step, no
  # per-worker eval, a progress bar.
  config.log_every, config.checkpoint.every, config.checkpoint.keep = 1, 1, 20
  config.eval.per_worker = False
  config.progress = True
  capsys.readouterr()
  record = train.run(config, workdir)
  err = capsys.readouterr().err
  notes = [line for line in err.splitlines() if 'steps grows' in line]
  assert notes == ['loco: note: steps grows from 10 to 20 (optimizer.decay_steps is unset, '
                   'so the learning-rate schedule now spans 20 steps from step 10 on).']
  assert record['step'] == 20
  records = read_metrics(workdir)
  assert [r['step'] for r in records] == [5, 10, *range(11, 21)]
  assert 'eval_loss_workers' in records[1] and 'eval_loss_workers' not in records[-1]
  assert 'eval_loss' in records[-1]
  stored = json.load(open(os.path.join(workdir, 'config.json')))['config']
  assert stored['steps'] == 20 and stored['optimizer']['decay_steps'] is None

  # The update to step s used the schedule at count s - 1: warm-up 2 steps, then a
  # cosine over 20 - 2 = 18 steps (the 10-step run's would have ended at step 10).
  for step in (11, 15):
    want = _hand_lr(step - 1, steps=20)
    assert want != pytest.approx(_hand_lr(step - 1, steps=BASE_STEPS), rel=0.05)
    assert _applied_lr(workdir, step) == pytest.approx(want, rel=2e-3), step
  assert _hand_lr(14, steps=20) == pytest.approx(9.75e-4, rel=1e-12)   # 3e-4 + 2.7e-3 / 4


def test_fewer_steps_are_refused_in_one_line(base_run, config, tmp_path):
  workdir = _copy(base_run, tmp_path)
  before = read_metrics(workdir)
  stored = open(os.path.join(workdir, 'config.json')).read()
  config.steps = 5
  with pytest.raises(WorkdirError) as e:
    train.run(config, workdir)
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith('steps=5 is below the 10 steps of the run in ')
  assert 'steps may only grow on resume' in message
  assert read_metrics(workdir) == before
  assert open(os.path.join(workdir, 'config.json')).read() == stored


@pytest.mark.slow
def test_steps_between_the_checkpoint_and_the_stored_run_are_refused(interrupted_run, config,
                                                                   tmp_path):
  """Steps are compared with the stored run's, not the checkpoint's: resuming the
  20-step run from step 10 with steps=15 would change its schedule (decay over 13)."""
  workdir = _copy(interrupted_run, tmp_path)
  config.steps = 15
  with pytest.raises(WorkdirError) as e:
    train.run(config, workdir)
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith('steps=15 is below the 20 steps of the run in ')
  assert '(checkpoint at step 10)' in message
  assert [r['step'] for r in read_metrics(workdir)] == [5, 10, 15, 20]   # untouched


@pytest.mark.parametrize('key,value,shown', [
    ('optimizer.b2', 0.99, 'optimizer.b2 (0.95 -> 0.99)'),
    ('eval.batches', 3, 'eval.batches (2 -> 3)'),
    ('algorithm.transport_dtype', 'bfloat16', "algorithm.transport_dtype (None -> 'bfloat16')"),
    ('optimizer.decay_steps', 30, 'optimizer.decay_steps (None -> 30)'),
])
def test_a_change_of_meaning_is_refused_naming_the_key(base_run, config, tmp_path, key,
                                                       value, shown):
  workdir = _copy(base_run, tmp_path)
  before = read_metrics(workdir)
  config.steps = 20            # even with steps growing
  _set(config, key, value)
  with pytest.raises(WorkdirError) as e:
    train.run(config, workdir)
  message = str(e.value)
  assert '\n' not in message
  assert f'holds a run with another config: {shown};' in message
  assert read_metrics(workdir) == before


@pytest.mark.parametrize('key,value', [
    ('progress', True), ('log_every', 1), ('eval.every', 5), ('eval.per_worker', False),
    ('checkpoint.keep', 5), ('grad_mode', 'vmap'), ('data.read_threads', 0)])
def test_an_execution_only_change_is_allowed(base_run, config, tmp_path, capsys, key, value):
  workdir = _copy(base_run, tmp_path)
  before = read_metrics(workdir)
  _set(config, key, value)
  capsys.readouterr()
  record = train.run(config, workdir)        # the same steps: nothing left to do
  assert 'finished before (step 10 of 10); nothing to do' in capsys.readouterr().err
  assert record == before[-1]
  assert read_metrics(workdir) == before


@pytest.mark.slow
def test_growing_steps_of_an_async_run_is_refused(config, tmp_path):
  """Growing steps once replayed the longer run's event schedule from the shorter one's
  last tick (workers lost steps, sim_seconds ran backwards): it is refused in one line,
  and the longer run trained whole takes every step on a clock that only moves on."""
  def async_config(steps):
    c = copy.deepcopy(config)
    c.num_workers, c.steps = 4, steps
    c.optimizer.decay_steps = 18
    c.algorithm.name, c.algorithm.sync_every, c.algorithm.topology = 'gasloc', 3, 'ring'
    c.network.profile, c.network.mode, c.network.local_work = 'homogeneous', 'async', 'time'
    c.network.step_seconds, c.network.speeds = 1.0, [1.0, 1.0, 1.0, 0.4]
    return c

  workdir = str(tmp_path / 'run')
  train.run(async_config(10), workdir)
  with pytest.raises(WorkdirError, match="steps cannot grow on resume in network.mode='async'"):
    train.run(async_config(20), workdir)
  train.run(async_config(20), str(tmp_path / 'new'))   # a new workdir trains it whole
  records = read_metrics(str(tmp_path / 'new'))
  assert records[-1]['tokens'] == 20 * 4 * 2 * 32     # steps x M x batch x seq_len
  seconds = [r['sim_seconds'] for r in records]
  assert seconds == sorted(seconds)


@pytest.mark.slow
def test_a_run_from_before_data_sampling_resumes_only_on_the_stream(config, tmp_path):
  """A stored config without data.sampling was trained on the stream layout: the default
  ('windows') reads other batches, so the resume is refused in one line that names the
  fix, and --config.data.sampling=stream resumes it exactly (its checkpoint's data state
  in format 1, as such a run wrote it)."""
  whole = str(tmp_path / 'run')
  config.steps = 20
  config.data.sampling = 'stream'
  train.run(config, whole)                   # the uninterrupted stream run
  old = str(tmp_path / 'old')                # the same, stopped at step 10 by an old loco
  shutil.copytree(whole, old)
  os.remove(os.path.join(old, '.lock'))
  shutil.rmtree(os.path.join(old, 'checkpoints', '20'))
  path = os.path.join(old, 'config.json')
  with open(path) as f:
    stored = json.load(f)
  for key in ('sampling', 'window_pool_tokens'):
    del stored['config']['data'][key]
  with open(path, 'w') as f:
    json.dump(stored, f)
  state_file = os.path.join(old, 'checkpoints', '10', 'data', 'metadata')
  with open(state_file) as f:
    state = json.load(f)
  assert state['format'] == 2 and state['sampling'] == 'stream'
  with open(state_file, 'w') as f:
    json.dump({'format': 1, 'signature': state['signature'], 'workers': state['workers']},
              f)

  config.data.sampling = 'windows'
  with pytest.raises(WorkdirError, match='resume it with --config.data.sampling=stream') as e:
    train.run(config, old)
  assert '\n' not in str(e.value)
  config.data.sampling = 'stream'
  train.run(config, old)
  strip = lambda rs: [{k: v for k, v in r.items()                          # noqa: E731
                       if k not in ('tokens_per_second', 'wall_seconds')} for r in rs]
  assert strip(read_metrics(old)) == strip(read_metrics(whole))


def test_a_key_added_to_loco_after_the_run_began_resumes_at_its_default(tmp_path):
  """A stored config without a key that loco added later (here the Hugging Face source's
  data.hf_eval_fraction, default 0.05, and data.hf_streaming, default False): at its
  default the resume is the same run; at another value it is refused, naming the key."""
  from loco.files import workdir as workdir_lib
  from loco.configs import default
  base = default.get_config().to_dict()
  stored = json.loads(json.dumps(base))
  for key in ('hf_eval_fraction', 'hf_streaming'):
    del stored['data'][key]
  os.makedirs(tmp_path / 'run')
  workdir_lib.write_json(str(tmp_path / 'run' / 'config.json'), {'config': stored})
  wd = workdir_lib.Workdir(str(tmp_path / 'run'), lock=False)
  assert wd.check_resume(json.loads(json.dumps(base)), 10, base) == []
  changed = json.loads(json.dumps(base))
  changed['data']['hf_eval_fraction'] = 0.1
  with pytest.raises(WorkdirError, match=r'data.hf_eval_fraction \(None -> 0.1\)'):
    wd.check_resume(changed, 10, base)
  with pytest.raises(WorkdirError, match='data.hf_eval_fraction'):   # no defaults: strict
    wd.check_resume(json.loads(json.dumps(base)), 10)
