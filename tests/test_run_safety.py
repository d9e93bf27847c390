"""Runs under hostile conditions: busy, changed, full or read-only workdirs, crashes,
Ctrl-C, divergence. Each ends in one clear line and never loses a committed checkpoint.
"""

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from loco import algorithms
from loco.run import checkpoint as checkpoint_lib
from loco.run import ledger
from loco.files import metrics
from loco.lab import report
from loco.run import train
from loco.files import workdir as workdir_lib
from loco.run.checkpoint import Checkpointer
from loco.core.engine import Algorithm
from loco.errors import (CheckpointError, ConfigError, DivergenceError, Interrupted, LocoError,
                         WorkdirError)
from loco.files.metrics import TIMING_KEYS, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_NANO_FILE = '''
import sys
sys.path.insert(0, {repo!r})
from tests.nano import make_nano_config

def get_config():
  c = make_nano_config({glob!r}, {data_dir!r})
  c.steps = {steps}
  return c
'''


def _comparable(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _nano_file(tmp_path, small_corpus_glob, data_dir, steps=20) -> str:
  path = tmp_path / f'nano{steps}.py'
  path.write_text(_NANO_FILE.format(repo=REPO, glob=small_corpus_glob, data_dir=data_dir,
                                    steps=steps))
  return str(path)


def _cli(*args, **kwargs):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, '-m', 'loco.main', *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300, **kwargs)


def _error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith('loco: error:')]


# One run per workdir.

@pytest.mark.slow
def test_a_busy_workdir_is_refused_in_one_line(nano_config, tmp_path, small_corpus_glob,
                                               data_dir):
  workdir = str(tmp_path / 'run')
  with workdir_lib.Workdir(workdir):          # this process holds the lock ...
    with pytest.raises(WorkdirError, match='already a workdir of this process'):
      train.run(nano_config, workdir)
    # ... and to another process (the command) it is another loco run's.
    config = _nano_file(tmp_path, small_corpus_glob, data_dir)
    out = _cli(f'--config={config}', f'--workdir={workdir}')
    assert out.returncode == 1
    assert _error_lines(out.stderr) == [
        f'loco: error: the workdir {workdir} is in use by another loco run (process '
        f'{os.getpid()}); wait for it to end or pick another --workdir.']
    assert not os.path.exists(os.path.join(workdir, 'metrics.jsonl'))
  train.run(nano_config, workdir)             # free again once the holder is gone


# Metrics rows and checkpoints.

@pytest.mark.slow
def test_each_row_is_on_disk_before_its_checkpoint_is_saved(nano_config, tmp_path,
                                                            monkeypatch):
  workdir = str(tmp_path / 'run')
  saved = []
  original = Checkpointer.save

  def save(self, step, *args):
    steps = [r['step'] for r in read_metrics(workdir)]   # what a kill -9 would leave
    assert steps and steps[-1] == step, (step, steps)
    saved.append(step)
    return original(self, step, *args)

  monkeypatch.setattr(Checkpointer, 'save', save)
  train.run(nano_config, workdir)
  assert saved == [10, 20]


@pytest.mark.slow
def test_a_torn_last_line_is_dropped_on_resume_with_a_note(nano_config, tmp_path, capsys):
  full = str(tmp_path / 'full')
  train.run(nano_config, full)
  records = read_metrics(full)
  # A crash after the step-10 checkpoint, in the middle of writing a later row.
  crashed = str(tmp_path / 'crashed')
  train.run(nano_config, crashed)
  _drop_checkpoint(crashed, 20)
  with open(os.path.join(crashed, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 25, "tokens": 12')
  capsys.readouterr()
  train.run(nano_config, crashed)
  assert 'line 5 (the last) is torn' in capsys.readouterr().err
  assert _comparable(read_metrics(crashed)) == _comparable(records)


@pytest.mark.slow
def test_trimming_metrics_on_resume_is_atomic(nano_config, tmp_path, monkeypatch):
  workdir = str(tmp_path / 'run')
  train.run(nano_config, workdir)
  before = open(os.path.join(workdir, 'metrics.jsonl')).read()
  written = []

  def dying_dumps(obj, *args, **kwargs):   # the process dies while rewriting the file
    if written:
      raise KeyboardInterrupt
    written.append(obj)
    return json.dumps(obj, *args, **kwargs)

  monkeypatch.setattr(metrics, 'json', types.SimpleNamespace(loads=json.loads,
                                                             dumps=dying_dumps))
  with pytest.raises(KeyboardInterrupt):
    metrics.MetricsWriter(workdir, resume_step=10)
  assert written and open(os.path.join(workdir, 'metrics.jsonl')).read() == before


@pytest.mark.slow
def test_kill_between_row_and_checkpoint_commit_loses_nothing(nano_config, tmp_path):
  full = str(tmp_path / 'full')
  train.run(nano_config, full)
  # The step-20 row was written but its checkpoint never committed.
  killed = str(tmp_path / 'killed')
  train.run(nano_config, killed)
  _drop_checkpoint(killed, 20)
  assert read_metrics(killed)[-1]['step'] == 20
  train.run(nano_config, killed)
  assert _comparable(read_metrics(killed)) == _comparable(read_metrics(full))


def _drop_checkpoint(workdir: str, step: int) -> None:
  import shutil
  shutil.rmtree(os.path.join(workdir, 'checkpoints', str(step)))


# Resuming with another config.

@pytest.mark.parametrize('key,value', [
    ('optimizer.lr', 1e-2), ('num_workers', 4),   # the rest: pytest -m slow
    *(pytest.param(k, v, marks=pytest.mark.slow) for k, v in (
        ('algorithm.name', 'diloco'), ('model.d_model', 64), ('data.sharding', 'noniid'),
        ('seed', 1)))])
def test_resume_with_a_changed_meaning_is_refused(nano_config, tmp_path, key, value):
  workdir = str(tmp_path / 'run')
  nano_config.steps = 10
  train.run(nano_config, workdir)
  stored = open(os.path.join(workdir, 'config.json')).read()
  section, _, leaf = key.rpartition('.')
  (nano_config[section] if section else nano_config)[leaf] = value
  nano_config.steps = 20
  with pytest.raises(WorkdirError, match=rf'holds a run with another config: {key} \('):
    train.run(nano_config, workdir)
  assert open(os.path.join(workdir, 'config.json')).read() == stored
  assert [r['step'] for r in read_metrics(workdir)] == [5, 10]


@pytest.mark.slow
def test_steps_may_grow_and_say_so(nano_config, tmp_path, capsys):
  workdir = str(tmp_path / 'run')
  nano_config.steps = 10
  train.run(nano_config, workdir)
  nano_config.steps = 20
  nano_config.progress = True                 # not a change of meaning
  nano_config.checkpoint.keep = 3
  capsys.readouterr()
  record = train.run(nano_config, workdir)
  assert 'steps grows from 10 to 20' in capsys.readouterr().err
  assert record['step'] == 20
  assert json.load(open(os.path.join(workdir, 'config.json')))['config']['steps'] == 20


@pytest.mark.slow
def test_steps_below_the_checkpoint_are_refused(nano_config, tmp_path):
  workdir = str(tmp_path / 'run')
  train.run(nano_config, workdir)
  nano_config.steps = 10
  with pytest.raises(WorkdirError, match='steps=10 is below the 20 steps'):
    train.run(nano_config, workdir)


@pytest.mark.slow
def test_rerunning_a_finished_workdir_prints_its_summary(tmp_path, small_corpus_glob,
                                                         data_dir):
  config = _nano_file(tmp_path, small_corpus_glob, data_dir, steps=10)
  workdir = str(tmp_path / 'run')
  first = _cli(f'--config={config}', f'--workdir={workdir}')
  assert first.returncode == 0, first.stderr[-2000:]
  again = _cli(f'--config={config}', f'--workdir={workdir}')
  assert again.returncode == 0, again.stderr[-2000:]
  assert 'finished before (step 10 of 10); nothing to do' in again.stderr
  summary = again.stdout.splitlines()    # the first run's header and phases are not repeated
  assert summary[0] == f'workdir: {workdir}' and 'steps: 10' in summary[1]
  assert first.stdout.splitlines()[-len(summary):] == summary


@pytest.mark.slow
def test_an_incomplete_step_folder_is_not_a_finished_run(nano_config, tmp_path, capsys):
  """An empty checkpoints/20/ (an interrupted copy) once made a run trained to step 10
  read as finished at 20; now it is set aside with a note and the run trains on."""
  workdir = str(tmp_path / 'run')
  nano_config.steps = 10
  train.run(nano_config, workdir)
  os.makedirs(os.path.join(workdir, 'checkpoints', '20'))
  nano_config.steps = 20
  record = train.run(nano_config, workdir)
  assert record['step'] == 20 and read_metrics(workdir)[-1]['step'] == 20
  assert checkpoint_lib.committed_steps(os.path.join(workdir, 'checkpoints')) == [10, 20]
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '20.incomplete'))
  err = capsys.readouterr().err
  assert 'checkpoints/20 is not a complete checkpoint' in err and 'finished before' not in err


def test_a_vocab_below_the_tokenizers_is_a_config_error_not_a_divergence(nano_config,
                                                                          tmp_path):
  nano_config.model.vocab_size = 10
  with pytest.raises(ConfigError, match=r'model.vocab_size=10 is below the tokenizer'):
    train.run(nano_config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')


@pytest.mark.parametrize('args,line', [
    (['--workdir='], 'loco: error: --workdir is empty'),
    (['--distributed'], 'loco: error: --distributed: jax.distributed.initialize() failed'),
    (['--config.seed=9223372036854775808'], 'loco: error: seed must be in [0, 2**32)'),
])
def test_bad_flags_are_one_line(tmp_path, small_corpus_glob, data_dir, args, line):
  config = _nano_file(tmp_path, small_corpus_glob, data_dir, steps=10)
  out = _cli(f'--config={config}', *args)
  assert out.returncode in (1, 2), out.stderr[-2000:]
  lines = [x for x in out.stderr.splitlines() if x.strip()]
  assert len(lines) == 1 and lines[0].startswith(line), lines
  assert not os.path.exists(os.path.join(REPO, 'runs', 'nano10'))


# OS errors.

def test_a_workdir_that_is_a_file_is_one_error(nano_config, tmp_path):
  path = tmp_path / 'file'
  path.write_text('x')
  with pytest.raises(WorkdirError, match='is a file, not a directory'):
    train.run(nano_config, str(path))


@contextlib.contextmanager
def _tmpfs(path, size: str, read_only: bool = False):
  os.makedirs(path)
  options = f'size={size}' + (',ro' if read_only else '')
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', str(path)],
                    capture_output=True).returncode:
    pytest.skip('mounting a tmpfs needs root (a real full / read-only disk)')
  try:
    yield str(path)
  finally:
    subprocess.run(['umount', '-l', str(path)], capture_output=True)


def test_a_read_only_file_system_is_one_error(nano_config, tmp_path):
  with _tmpfs(tmp_path / 'ro', '1M', read_only=True) as ro:
    with pytest.raises(WorkdirError, match=r'cannot use the workdir .*Read-only file system'):
      train.run(nano_config, os.path.join(ro, 'run'))


@pytest.mark.slow
@pytest.mark.parametrize('size,keep', [('3M', 1000), ('600k', 1)])
def test_a_full_disk_stops_with_one_line_and_keeps_the_checkpoint(tmp_path,
                                                                  small_corpus_glob,
                                                                  data_dir, size, keep):
  """Room for a few checkpoints (every 5 steps), not for all of them. With keep=1 the
  message once said no checkpoint was written while one was committed on disk."""
  config = _nano_file(tmp_path, small_corpus_glob, data_dir, steps=2000)
  with _tmpfs(tmp_path / 'small', size) as small:
    workdir = os.path.join(small, 'run')
    out = _cli(f'--config={config}', f'--workdir={workdir}', '--config.checkpoint.every=5',
               f'--config.checkpoint.keep={keep}', '--config.eval.every=0')
    assert out.returncode == 1, out.stderr[-3000:]
    step = max(checkpoint_lib.committed_steps(os.path.join(workdir, 'checkpoints')),
               default=None)
    assert step and step < 2000
    assert 'Traceback' not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert re.fullmatch(
        rf'loco: error: No space left on device \({re.escape(workdir)}/\S+\); the last '
        rf'good checkpoint \(step {step}\) is kept in {re.escape(workdir)}: fix it and the '
        'same command resumes.', lines[0]), lines[0]


def _run_catching(config, workdir):
  try:
    train.run(config, workdir)
  except LocoError as e:
    return e
  return None


def test_a_failing_tensorboard_write_stops_the_run_instead_of_hanging(nano_config, tmp_path,
                                                                      monkeypatch):
  from tensorboardX import record_writer

  def full(self, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), 'events.out.tfevents')

  monkeypatch.setattr(record_writer.RecordWriter, 'write', full)
  done = []
  thread = threading.Thread(
      target=lambda: done.append(_run_catching(nano_config, str(tmp_path / 'run'))),
      daemon=True)
  thread.start()
  thread.join(timeout=120)
  assert done, 'the run hung when TensorBoard could not write'
  assert isinstance(done[0], WorkdirError)
  assert str(done[0]).startswith('No space left on device (events.out.tfevents); no '
                                 'checkpoint was written')


# Ctrl-C.

@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(nano_config, tmp_path,
                                                           monkeypatch):
  full = str(tmp_path / 'full')
  train.run(nano_config, full)
  workdir = str(tmp_path / 'run')
  write = metrics.MetricsWriter.write

  def interrupt_at_15(self, record):
    write(self, record)
    if record['step'] == 15:
      raise KeyboardInterrupt

  monkeypatch.setattr(metrics.MetricsWriter, 'write', interrupt_at_15)
  with pytest.raises(Interrupted) as stopped:
    train.run(nano_config, workdir)
  assert str(stopped.value) == (
      f'interrupted after step 15; the last good checkpoint (step 10) is kept in {workdir}: '
      'the same command resumes from it.')
  monkeypatch.setattr(metrics.MetricsWriter, 'write', write)
  train.run(nano_config, workdir)
  assert _comparable(read_metrics(workdir)) == _comparable(read_metrics(full))


@pytest.mark.slow
def test_a_swallowed_interrupt_still_stops_the_loop(nano_config, tmp_path):
  """The signal handler also sets train.STOP: a KeyboardInterrupt that a library caught
  (a CI run once trained on for 20 minutes after Ctrl-C) still stops the next chunk."""
  train.STOP.set()
  try:
    with pytest.raises(Interrupted, match='the same command resumes'):
      train.run(nano_config, str(tmp_path / 'run'))
  finally:
    train.STOP.clear()


# SIGTERM and Ctrl-C while training: a checkpoint at the step reached (preemption).

@contextlib.contextmanager
def _loco_signal_handler():
  """loco.main's SIGTERM handler, installed in this process."""
  old = signal.signal(signal.SIGTERM, lambda signum, frame: train.on_signal())
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, old)
    train.STOP.clear()


def _signal_after_row(monkeypatch, step: int) -> None:
  """SIGTERM to this process once the row of `step` is written."""
  write = metrics.MetricsWriter.write

  def write_then_signal(self, record):
    write(self, record)
    if record['step'] == step:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(metrics.MetricsWriter, 'write', write_then_signal)


def _text(workdir: str, name: str) -> str:
  with open(os.path.join(workdir, name)) as f:
    return f.read()


def _final_state(workdir: str) -> dict:
  _, state = checkpoint_lib.read_named_state(workdir)
  return dict(jax.tree_util.tree_flatten_with_path(state)[0])


@pytest.mark.slow
def test_sigterm_between_checkpoints_saves_the_step_reached_and_resumes_exactly(
    nano_config, tmp_path, monkeypatch):
  """No periodic checkpoint before the end (checkpoint.every 100 > 30 steps): SIGTERM
  while step 20 is in flight stops the loop at step 20 with that step's row and a
  checkpoint; the same command then gives the uninterrupted run's rows, comms and
  final state bit for bit."""
  nano_config.steps = 30
  nano_config.checkpoint.every = 100
  full = str(tmp_path / 'full')
  train.run(nano_config, full)
  workdir = str(tmp_path / 'run')
  _signal_after_row(monkeypatch, 15)    # written once chunk 16-20 is dispatched
  with _loco_signal_handler(), pytest.raises(Interrupted) as stopped:
    train.run(nano_config, workdir)
  assert re.fullmatch(rf'interrupted after step 20; saved its checkpoint \(step 20\) in '
                      rf'\d+\.\d s in {re.escape(workdir)}: the same command resumes from '
                      r'it\.', str(stopped.value)), str(stopped.value)
  assert checkpoint_lib.committed_steps(os.path.join(workdir, 'checkpoints')) == [20]
  assert [r['step'] for r in read_metrics(workdir)] == [5, 10, 15, 20]
  monkeypatch.undo()
  train.run(nano_config, workdir)
  assert _comparable(read_metrics(workdir)) == _comparable(read_metrics(full))
  assert _text(workdir, 'comms.jsonl') == _text(full, 'comms.jsonl')
  ours, theirs = _final_state(workdir), _final_state(full)
  assert ours.keys() == theirs.keys()
  for path in ours:
    np.testing.assert_array_equal(ours[path], theirs[path], err_msg=str(path))


_SLOW_SAVE_FILE = '''
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from tests.nano import make_nano_config
from loco.files import metrics
from orbax.checkpoint._src.checkpointers import async_checkpointer

# The test's first signal and its slow save: SIGTERM to this process once row 25 is
# written (the loop stops at step 30 and saves it); every save after the first (step
# 20's) waits 10 minutes in orbax's background thread before it commits.
_write = metrics.MetricsWriter.write
def _write_then_signal(self, record):
  _write(self, record)
  if record['step'] == 25:
    os.kill(os.getpid(), signal.SIGTERM)
metrics.MetricsWriter.write = _write_then_signal
_commit = async_checkpointer._background_wait_for_commit_futures
_saves = []
def _slow_commit(*args, **kwargs):
  _saves.append(1)
  if len(_saves) > 1:
    time.sleep(600)
  return _commit(*args, **kwargs)
async_checkpointer._background_wait_for_commit_futures = _slow_commit

def get_config():
  c = make_nano_config({glob!r}, {data_dir!r})
  c.steps, c.checkpoint.every = 40, 20
  return c
'''


def _start_main(config, workdir: str) -> subprocess.Popen:
  """`python -m loco.main` on `config` into `workdir`, started on the CPU, its output
  captured as text."""
  return subprocess.Popen([sys.executable, '-m', 'loco.main', f'--config={config}',
                           f'--workdir={workdir}'], cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS='cpu'),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_second_sigterm_during_the_save_keeps_the_last_committed_checkpoint(
    nano_config, tmp_path, small_corpus_glob, data_dir):
  """The first SIGTERM stops the run at step 30, whose save is held in orbax's
  background thread; a second SIGTERM abandons it: one line naming step 30 and the
  step-20 checkpoint kept, exit 130, at once; the resume from step 20 equals the
  uninterrupted run."""
  config = tmp_path / 'slow_save.py'
  config.write_text(_SLOW_SAVE_FILE.format(repo=REPO, glob=small_corpus_glob,
                                           data_dir=data_dir))
  workdir = str(tmp_path / 'run')
  proc = _start_main(config, workdir)
  checkpoints = os.path.join(workdir, 'checkpoints')
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None and not any(
      name.startswith('30.') for name in (os.listdir(checkpoints)
                                          if os.path.isdir(checkpoints) else ())):
    time.sleep(0.1)
  time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130, err[-2000:]
  lines = [line for line in err.splitlines() if line.startswith('loco:')
           and not line.startswith('loco: note:')]
  assert lines == [
      'loco: stopped: interrupted again while saving step 30; that save was abandoned; the '
      f'last good checkpoint (step 20) is kept in {workdir}: the same command resumes from '
      'it.'], err[-2000:]
  assert 'Traceback' not in err
  assert checkpoint_lib.committed_steps(checkpoints) == [20]
  assert read_metrics(workdir)[-1]['step'] == 30     # the row came before the save
  nano_config.steps, nano_config.checkpoint.every = 40, 20
  train.run(nano_config, workdir)                    # the same config, without the delay
  full = str(tmp_path / 'full')
  train.run(nano_config, full)
  assert _comparable(read_metrics(workdir)) == _comparable(read_metrics(full))


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_stops_both_at_one_step(tmp_path, small_corpus_glob,
                                                                data_dir):
  """Two CPU processes over Gloo on a 2 x 4 mesh; SIGTERM reaches process 1 only: both
  stop at the same chunk boundary (they gather the stop flag at each one) and save
  that step's checkpoint together. Only process 0 prints the header and phases."""
  import socket
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  config = _nano_file(tmp_path, small_corpus_glob, data_dir, steps=100000)
  workdir = str(tmp_path / 'run')
  env = {**{k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}, 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=4'}
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'loco.main', f'--config={config}', f'--workdir={workdir}',
       '--distributed', f'--coordinator_address=localhost:{port}', '--num_processes=2',
       f'--process_id={i}', '--config.num_workers=4', '--config.batch_per_worker=4',
       '--config.mesh.workers=2', '--config.mesh.fsdp=4', '--config.checkpoint.every=1000',
       '--config.eval.every=1000'], cwd=REPO, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  deadline = time.time() + 300
  while time.time() < deadline and all(p.poll() is None for p in procs) and not (
      os.path.exists(metrics_path) and len(read_metrics(workdir)) >= 3):
    time.sleep(0.2)
  procs[1].send_signal(signal.SIGTERM)
  outs, errs = zip(*[p.communicate(timeout=120) for p in procs])
  header = ('loco: ddp, 4 workers on 8 cpu devices (mesh 2 workers x 4 fsdp) in 2 '
            'processes; model nano: ')
  assert any(line.startswith(header) for line in outs[0].splitlines()), outs[0]
  assert 'loco: ddp' not in outs[1] and 'compiled' not in outs[1], outs[1]   # process 0's
  assert [p.returncode for p in procs] == [130, 130], errs[0][-2000:] + errs[1][-2000:]
  step = read_metrics(workdir)[-1]['step']
  for err in errs:
    lines = [line for line in err.splitlines() if line.startswith('loco: stopped:')]
    assert len(lines) == 1 and lines[0].startswith(
        f'loco: stopped: interrupted after step {step}; saved its checkpoint (step {step})'
    ), err[-2000:]
  assert checkpoint_lib.committed_steps(os.path.join(workdir, 'checkpoints')) == [step]


@pytest.mark.slow
@pytest.mark.parametrize('when', ['training', 'starting'])
def test_sigint_to_the_cli_prints_one_line(tmp_path, small_corpus_glob, data_dir, when):
  """Ctrl-C after 3 rows, or half a second after the start (imports, config, init):
  one line, exit 130, and the process ends at once (its exit once crashed or hung);
  while training, the line names the step reached, whose checkpoint it saved."""
  config = _nano_file(tmp_path, small_corpus_glob, data_dir, steps=100000)
  workdir = str(tmp_path / 'run')
  proc = _start_main(config, workdir)
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  deadline = time.time() + (120 if when == 'training' else 0.5)
  while time.time() < deadline and not (os.path.exists(metrics_path)
                                         and len(read_metrics(workdir)) >= 3):
    time.sleep(0.1)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130, err[-2000:]
  lines = [line for line in err.splitlines()
           if line.startswith('loco:') and not line.startswith('loco: note:')]
  assert len(lines) == 1 and lines[0].startswith(
      'loco: stopped: interrupted after step ' if when == 'training' else
      'loco: stopped: interrupted while starting'), err[-2000:]
  assert 'Traceback' not in err
  if when == 'training':   # stopped at a chunk boundary with its row and its checkpoint
    step = read_metrics(workdir)[-1]['step']
    assert lines[0].startswith(f'loco: stopped: interrupted after step {step}; ')
    assert f'(step {step})' in lines[0] and lines[0].endswith('the same command resumes '
                                                              'from it.'), lines[0]
    assert step in checkpoint_lib.committed_steps(os.path.join(workdir, 'checkpoints'))


# Divergence.

def _sabotaged(value: float, from_step: int):
  """DDP whose params become `value` from `from_step` on (a NaN, or an exploded model)."""
  def factory(inner, *, mesh=None):
    base = algorithms.make('ddp', inner, mesh=mesh)

    def step(state, grads, ctx=None):
      state, info = base.step(state, grads, ctx)
      params = jax.tree.map(
          lambda p: jnp.where(state.step >= from_step, jnp.full_like(p, value), p),
          state.params)
      return state._replace(params=params), info
    return Algorithm(base.init, step)
  return factory


@pytest.mark.slow
@pytest.mark.parametrize('value,why', [
    (float('nan'), 'the training loss became nan at step 14'),
    (0.0, 'the training loss rose to 5.549 at step 14, no better than uniform guessing'),
])
def test_divergence_is_recorded_and_keeps_the_good_checkpoint(nano_config, tmp_path,
                                                              monkeypatch, value, why):
  monkeypatch.setitem(algorithms.REGISTRY, 'sabotaged',
                      algorithms.AlgorithmSpec(_sabotaged(value, 13)))
  nano_config.algorithm.name = 'sabotaged'
  workdir = str(tmp_path / 'run')
  with pytest.raises(DivergenceError) as diverged:
    train.run(nano_config, workdir)
  assert str(diverged.value).startswith(why)
  assert str(diverged.value).endswith(f'the last good checkpoint (step 10) is kept in '
                                      f'{workdir}.')
  assert workdir_lib.Workdir(workdir).diverged()['step'] == 14
  committed = [d for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit()]
  assert committed == ['10']
  assert [r['step'] for r in read_metrics(workdir)] == [5, 10]
  row, = report.summarize([workdir])
  assert row['status'] == 'diverged' and row['error'].startswith(why)
  with pytest.raises(DivergenceError, match='diverged at step 14 .*would diverge again'):
    train.run(nano_config, workdir)


@pytest.mark.slow
def test_a_checkpoint_with_a_non_finite_model_is_never_written_nor_resumed(
    nano_config, tmp_path, monkeypatch):
  """The params turn NaN at step 10, a checkpoint step: the save is refused (the run is
  diverged at 10, checkpoint 5 kept). A checkpoint holding NaN written anyway (here with
  the save check switched off, as by an earlier loco) is refused on resume by name,
  instead of being resumed and called the last good one when the run diverges again."""
  monkeypatch.setitem(algorithms.REGISTRY, 'sabotaged',
                      algorithms.AlgorithmSpec(_sabotaged(float('nan'), 10)))
  nano_config.algorithm.name = 'sabotaged'
  nano_config.checkpoint.every = 5
  workdir = str(tmp_path / 'run')
  with pytest.raises(DivergenceError, match=r'^the parameters became non-finite by step '
                                            r'10; the last good checkpoint \(step 5\)'):
    train.run(nano_config, workdir)
  assert sorted(d for d in os.listdir(os.path.join(workdir, 'checkpoints'))
                if d.isdigit()) == ['5']
  from loco.run import step as step_lib
  monkeypatch.setattr(step_lib, 'all_finite', lambda tree: jnp.bool_(True))
  poisoned = str(tmp_path / 'poisoned')
  with pytest.raises(DivergenceError):
    train.run(nano_config, poisoned)
  assert '10' in os.listdir(os.path.join(poisoned, 'checkpoints'))
  os.remove(os.path.join(poisoned, 'diverged.json'))
  monkeypatch.undo()
  monkeypatch.setitem(algorithms.REGISTRY, 'sabotaged',
                      algorithms.AlgorithmSpec(_sabotaged(float('nan'), 10)))
  with pytest.raises(CheckpointError, match=r'checkpoints/(10|15|20) holds non-finite values '
                                            r"\(\.params\['.*it was saved from a diverging"):
    train.run(nano_config, poisoned)


def test_the_loss_rule_waits_until_the_model_has_learned():
  uniform = np.log(257)
  start = np.full((3, 2), uniform + 0.01)          # an untrained model sits at ln V
  best, step, why = ledger.check_losses(start, 1, np.inf, 257)
  assert why is None and step is None and best == pytest.approx(uniform + 0.01)
  best, step, why = ledger.check_losses(np.array([[3.0, 3.2], [uniform, uniform]]), 4,
                                       best, 257)
  assert step == 5 and why.startswith('the training loss rose to 5.549 at step 5')
  assert best == pytest.approx(3.1)


# Failures before training.

def test_a_bad_algorithm_leaves_no_workdir(nano_config, tmp_path):
  nano_config.algorithm.name = 'gasloc'
  nano_config.algorithm.topology = 'torus'
  nano_config.num_workers = 3
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError):
    train.run(nano_config, str(workdir))
  assert not workdir.exists()


@pytest.mark.slow
def test_a_data_error_leaves_no_workdir(nano_config, tmp_path):
  nano_config.data.text_glob = str(tmp_path / 'nothing' / '*.txt')
  workdir = tmp_path / 'run'
  with pytest.raises(LocoError):
    train.run(nano_config, str(workdir))
  assert not workdir.exists()


# Checkpoint layout.

@pytest.mark.slow
def test_checkpoints_are_named_and_readable_with_orbax_alone(nano_config, tmp_path):
  nano_config.algorithm.name = 'diloco'
  nano_config.algorithm.sync_every = 3
  workdir = str(tmp_path / 'run')
  train.run(nano_config, workdir)
  manager = ocp.CheckpointManager(os.path.join(workdir, 'checkpoints'),
                                  item_names=('state', 'data', 'host'))
  restored = manager.restore(20, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(), data=ocp.args.JsonRestore(),
      host=ocp.args.JsonRestore()))
  manager.close()
  state = restored['state']
  assert set(state) == {'step', 'params', 'inner_state', 'anchor', 'outer_state', 'key'}
  assert int(state['step']) == 20
  qkv = state['params']['blocks']['0']['attn']['qkv']
  assert qkv.shape[0] == nano_config.num_workers
  np.testing.assert_array_equal(state['anchor']['embed'][0], state['anchor']['embed'][1])
  assert restored['data']['workers'] and restored['host']['tokens'] == 20 * 2 * 2 * 32


@pytest.mark.slow
def test_chunks_are_padded_not_recompiled(nano_config, tmp_path):
  # 23 steps in chunks of 5: the last chunk (3 steps) is padded and masked.
  nano_config.steps = 23
  nano_config.eval.every = 0
  nano_config.checkpoint.every = 0
  padded = train.run(nano_config, str(tmp_path / 'padded'))
  nano_config.log_every = 1
  single = train.run(nano_config, str(tmp_path / 'single'))
  assert [r['step'] for r in read_metrics(str(tmp_path / 'padded'))] == [5, 10, 15, 20, 23]
  assert padded['tokens'] == single['tokens'] == 23 * 2 * 2 * 32
  assert padded['bytes_sent'] == single['bytes_sent']
  np.testing.assert_allclose(padded['train_loss'], single['train_loss'], rtol=1e-6)
