"""The run directory's reader (loco.files.runs) and every command that reads runs, on damaged
hand-written run directories: one line, a non-zero exit, nothing misleading written.

Each class of bad input found by the hostile-input pass has a test here; the runs are
written by hand (config.json, metrics.jsonl, comms.jsonl, status.json, checkpoints/),
so nothing trains.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from loco import cli
from loco.lab import report
from loco.lab import retime
from loco.files import runs
from loco.lab import sweep
from loco.errors import RunFileError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M = 2
NET = ['--network.profile=homogeneous', '--network.step_seconds=1',
       '--network.bandwidth=1000']


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def _jsonl(rows):
  return ''.join(json.dumps(r) + '\n' for r in rows)


def _make_run(path, steps=20, every=5, status=None, metrics=True, evals=(3.0, 2.5)):
  """A finished synchronous run of 2 workers: an all-reduce of 100 bytes every 5 steps,
  a metrics row every 5 steps (evals at 10 and 20) whose cumulative bytes match."""
  path = str(path)
  config = {'steps': steps, 'num_workers': M, 'batch_per_worker': 2, 'seq_len': 8,
            'seed': 0, 'algorithm': {'name': 'diloco'},
            'network': {'profile': 'homogeneous', 'step_seconds': 1.0}}
  _write(os.path.join(path, 'config.json'),
         json.dumps({'config': config, 'model': {'flops_per_token': 1e6}}))
  comms = [{'workers': M}] + [
      dict(step=s, kind=[1] * M, sent=[100.0] * M, payload=[100.0] * M,
           peers=[[j for j in range(M) if j != i] for i in range(M)])
      for s in range(every, steps + 1, every)]
  _write(os.path.join(path, 'comms.jsonl'), _jsonl(comms))
  if metrics:
    rows = []
    for s in range(5, steps + 1, 5):
      row = dict(step=s, tokens=32 * s, train_loss=3.0 - s / 100,
                 bytes_sent=100.0 * (s // every), bytes_received=100.0 * (s // every),
                 peak_bytes=100.0, syncs=s // every, sim_seconds=float(s))
      if s % 10 == 0:
        row['eval_loss'] = evals[s // 10 - 1]
      rows.append(row)
    _write(os.path.join(path, 'metrics.jsonl'), _jsonl(rows))
  if status:
    _write(os.path.join(path, 'status.json'), json.dumps(status))
  return path


def _lines(path):
  with open(path) as f:
    return f.read().splitlines(keepends=True)


def _rewrite(path, lines):
  with open(path, 'w') as f:
    f.writelines(lines)


def _one_error(capsys, prog, code, expected_code=1):
  """The command's stderr: exactly one `prog: error:` line, no traceback."""
  err = capsys.readouterr().err
  assert code == expected_code, err
  assert 'Traceback' not in err
  assert len(err.splitlines()) == 1, err
  assert err.startswith(f'{prog}: error: '), err
  return err.strip().removeprefix(f'{prog}: error: ')


def _tree(path):
  return sorted(os.path.relpath(os.path.join(root, f), path)
                for root, _, files in os.walk(path) for f in files)


# ---- loco.files.runs: the readers on hand-written files ----------------------------------------

def test_read_run_of_a_good_run(tmp_path):
  path = _make_run(tmp_path / 'r', status=dict(state='finished', seconds=3.5))
  run = runs.read_run(path)
  assert run.status == 'finished' and run.error is None
  assert [r['step'] for r in run.metrics] == [5, 10, 15, 20]
  assert run.config['steps'] == 20 and run.stored['model'] == {'flops_per_token': 1e6}
  assert run.metrics_note is None and run.last['step'] == 20
  log = runs.read_comms(path, run.metrics)
  assert log.num_workers == M and sorted(log.records) == [5, 10, 15, 20]
  with pytest.raises(dataclasses_frozen()):
    run.status = 'failed'


def dataclasses_frozen():
  import dataclasses
  return dataclasses.FrozenInstanceError


def test_a_torn_last_metrics_line_is_dropped_with_a_note(tmp_path):
  path = _make_run(tmp_path / 'r')
  with open(os.path.join(path, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 25, "tokens": 8')
  rows, note = runs.read_metrics(path)
  assert [r['step'] for r in rows] == [5, 10, 15, 20]
  assert note == 'metrics.jsonl line 5 (the last) is torn and was left out'
  assert runs.read_run(path).metrics_note == note


@pytest.mark.parametrize('line,message', [
    ('{"step": 7, "tokens": \n', 'line 2 is not valid JSON (a damaged line in the middle'),
    ('[1, 2]\n', 'line 2 is a JSON list, not a metrics row.'),
    ('{"tokens": 3}\n', 'line 2 has no whole-number step (step: None).'),
    ('{"step": "7"}\n', "line 2 has no whole-number step (step: '7')."),
    ('{"step": 7.0}\n', 'line 2 has no whole-number step (step: 7.0).'),
    ('{"step": 5}\n', 'line 2: step 5 does not follow step 5 of the line before'),
    ('{"step": 3}\n', 'line 2: step 3 does not follow step 5 of the line before'),
    ('{"step": 7, "bytes_sent": "lots"}\n', "line 2: bytes_sent is 'lots', not a number."),
])
def test_a_damaged_metrics_row_is_one_sentence_naming_file_and_line(tmp_path, line, message):
  path = _make_run(tmp_path / 'r')
  lines = _lines(os.path.join(path, 'metrics.jsonl'))
  _rewrite(os.path.join(path, 'metrics.jsonl'), lines[:1] + [line] + lines[1:])
  with pytest.raises(RunFileError) as e:
    runs.read_metrics(path)
  assert str(e.value).startswith(os.path.join(path, 'metrics.jsonl'))
  assert message in str(e.value)


@pytest.mark.parametrize('text,message', [
    ('{"config": {"steps": 20', 'config.json is not valid JSON (line 1: '),
    ('', 'config.json is not valid JSON (it is empty).'),
    ('[]', 'config.json holds a JSON list, not an object.'),
    ('{"model": {}}', "config.json: it has no 'config' object"),
    ('{"config": {"steps": "20"}}', "config.json: config.steps is '20', not a whole number"),
    ('{"config": {"algorithm": "ddp"}}', 'config.json: config.algorithm is str, not an object'),
])
def test_a_damaged_config_is_one_sentence(tmp_path, text, message):
  path = _make_run(tmp_path / 'r')
  _write(os.path.join(path, 'config.json'), text)
  with pytest.raises(RunFileError, match='^' + os.path.join(path, '') + '.*') as e:
    runs.read_config(path)
  assert message in str(e.value)
  assert runs.read_config(str(tmp_path)) is None          # no config.json: not an error


@pytest.mark.parametrize('reader,name,text,message', [
    (runs.read_status, 'status.json', '{"state": "done"}', "state is 'done', not one of"),
    (runs.read_status, 'status.json', '{"state": "failed", "error": 3}', 'error is not text'),
    (runs.read_status, 'status.json', '{"state": "fin', 'not valid JSON'),
    (runs.read_diverged, 'diverged.json', '{"message": "x"}', 'step is None, not a whole'),
    (runs.read_diverged, 'diverged.json', '"diverged"', 'holds a JSON str, not an object'),
])
def test_damaged_status_and_diverged_files(tmp_path, reader, name, text, message):
  path = _make_run(tmp_path / 'r')
  _write(os.path.join(path, name), text)
  with pytest.raises(RunFileError) as e:
    reader(path)
  assert str(e.value).startswith(os.path.join(path, name)) and message in str(e.value)


def test_committed_steps_are_the_folders_orbax_committed(tmp_path):
  path = _make_run(tmp_path / 'r')
  ckpt = os.path.join(path, 'checkpoints')
  _write(os.path.join(ckpt, '10', 'commit_success.txt'), '')
  _write(os.path.join(ckpt, '20', '_CHECKPOINT_METADATA'), '{}')     # older orbax
  os.makedirs(os.path.join(ckpt, '45'))                                # empty: not committed
  _write(os.path.join(ckpt, '50.orbax-checkpoint-tmp-17', 'commit_success.txt'), '')
  _write(os.path.join(ckpt, '30', 'state', 'commit_success.txt'), '')  # only an item
  assert runs.committed_steps(path) == [10, 20]
  assert runs.committed_steps(str(tmp_path)) == []


@pytest.mark.parametrize('files,metrics,status', [
    # diverged.json (loco.run.train) wins over everything.
    ({'diverged.json': {'step': 14, 'message': 'the loss became nan'},
      'status.json': {'state': 'failed'}}, None, 'diverged'),
    # A non-finite loss in metrics.jsonl is divergence too.
    ({}, [{'step': 5, 'train_loss': float('nan')}], 'diverged'),
    ({'status.json': {'state': 'finished'}}, None, 'finished'),
    ({'status.json': {'state': 'failed', 'error': 'loco: error: x'}}, None, 'failed'),
    ({'status.json': {'state': 'interrupted'}}, None, 'interrupted'),
    ({'status.json': {'state': 'running'}}, None, 'running'),
    # By hand: the last step against config.steps.
    ({}, None, 'finished'),
    ({}, [{'step': 5}, {'step': 10}], 'incomplete'),
    # The wording of an error never decides: a log that mentions nan, no diverged.json.
    ({'log.txt': 'loco: error: the training loss became nan at step 14\n'},
     [{'step': 5}], 'incomplete'),
    ({'status.json': {'state': 'failed',
                      'error': 'loco: error: the training loss became nan at step 14'}},
     None, 'failed'),
])
def test_status_comes_from_structured_files(tmp_path, files, metrics, status):
  path = _make_run(tmp_path / 'r')
  if metrics is not None:
    _write(os.path.join(path, 'metrics.jsonl'), _jsonl(metrics))
  for name, content in files.items():
    _write(os.path.join(path, name), content if isinstance(content, str)
           else json.dumps(content))
  run = runs.read_run(path)
  assert run.status == status
  assert run.status in runs.STATUSES


def test_read_comms_accepts_only_a_whole_log(tmp_path):
  path = _make_run(tmp_path / 'r')
  log = os.path.join(path, 'comms.jsonl')
  rows = runs.read_metrics(path).rows
  good = _lines(log)

  def error(lines, steps=rows):
    _rewrite(log, lines)
    with pytest.raises(RunFileError) as e:
      runs.read_comms(path, steps)
    return str(e.value).removeprefix(log + ' ').removeprefix(log + ': ')

  assert error(good[:2] + ['{"step": 10, "kind": [1,\n'] + good[3:]) == (
      'line 3 is not valid JSON (a damaged line in the middle of the file).')
  assert error(good[:-1] + [good[-1][:20]]) == (
      'line 5 (the last) is cut short: the log is incomplete.')
  assert error(good[:-2]).startswith(
      'does not cover the run: up to step 15 it records 200 bytes sent per worker and '
      'metrics.jsonl 300 (its last record before that is step 10)')
  assert error(good[:2] + good[3:]).startswith(        # a line deleted in the middle
      'does not cover the run: up to step 10 it records 100 bytes sent per worker')
  assert error(good[1:]) == 'line 1 is not the header {"workers": M} of a loco communication log.'
  assert error(good[:1] + good[2:3] + good[1:2] + good[3:]) == (
      'line 3: step 5 does not follow step 10 of the record before (steps must increase).')
  bad = json.loads(good[2])
  bad['sent'] = [100.0]
  assert error(good[:2] + [json.dumps(bad) + '\n'] + good[3:]).startswith(
      'line 3 is not a communication record: sent must be a list of 2 (one per worker)')
  bad = dict(json.loads(good[2]), kind=[7, 7])
  assert error(good[:2] + [json.dumps(bad) + '\n'] + good[3:]).startswith(
      'line 3 is not a communication record: kind must be a list of 2')
  bad = {k: v for k, v in json.loads(good[2]).items() if k != 'peers'}
  assert error(good[:2] + [json.dumps(bad) + '\n'] + good[3:]).startswith(
      'line 3 is not a communication record: peers must be a list of 2')
  _rewrite(log, good)
  assert sorted(runs.read_comms(path, rows).records) == [5, 10, 15, 20]


# ---- loco.retime ---------------------------------------------------------------------------

def _retime(capsys, workdir, *extra):
  return retime.main([workdir, *NET, *extra])


def test_retime_of_a_good_hand_written_run(tmp_path, capsys):
  path = _make_run(tmp_path / 'r')
  assert _retime(capsys, path) == 0
  out = os.path.join(path, 'retimed', 'homogeneous')
  assert capsys.readouterr().out.strip().endswith(f': {out}')
  rows = runs.read_metrics(out).rows
  # 5 one-second steps, then a 2-worker ring all-reduce of 100 bytes at 1000 B/s:
  # 2 phases of 50 bytes (no latency).
  assert [r['sim_seconds'] for r in rows] == pytest.approx([5.1, 10.2, 15.3, 20.4], abs=0.01)


@pytest.mark.parametrize('damage,message', [
    ('corrupt_middle', 'comms.jsonl line 3 is not valid JSON (a damaged line in the middle '
                       'of the file).'),
    ('cut_short', 'comms.jsonl does not cover the run: up to step 15 it records 200 bytes '
                  'sent per worker and metrics.jsonl 300'),
    ('torn_last', 'comms.jsonl line 5 (the last) is cut short: the log is incomplete.'),
    ('malformed', 'comms.jsonl line 3 is not a communication record: sent must be a list '
                  'of 2'),
    ('missing_line', 'comms.jsonl does not cover the run: up to step 10 it records 100 '
                     'bytes'),
    ('config', 'config.json is not valid JSON'),
    ('config_type', "config.json: config.batch_per_worker is 'two', not a whole number"),
    ('metrics', 'metrics.jsonl line 2 is not valid JSON'),
])
def test_retime_refuses_a_damaged_run_and_writes_nothing(tmp_path, capsys, damage, message):
  """Before: a corrupt middle line or a cut-short log exited 0 with simulated times 2-4x
  too small (the replay silently stopped at the damage); config damage was a traceback."""
  path = _make_run(tmp_path / 'r')
  log, metrics = os.path.join(path, 'comms.jsonl'), os.path.join(path, 'metrics.jsonl')
  good = _lines(log)
  if damage == 'corrupt_middle':
    _rewrite(log, good[:2] + ['{"step": 10, "ki\n'] + good[3:])
  elif damage == 'cut_short':
    _rewrite(log, good[:-2])
  elif damage == 'torn_last':
    _rewrite(log, good[:-1] + [good[-1][:30]])
  elif damage == 'malformed':
    _rewrite(log, good[:2] + [json.dumps(dict(json.loads(good[2]), sent=[1.0])) + '\n']
             + good[3:])
  elif damage == 'missing_line':
    _rewrite(log, good[:2] + good[3:])
  elif damage == 'config':
    _write(os.path.join(path, 'config.json'), '{"config": {"steps": 2')
  elif damage == 'config_type':
    stored = json.load(open(os.path.join(path, 'config.json')))
    stored['config']['batch_per_worker'] = 'two'
    _write(os.path.join(path, 'config.json'), json.dumps(stored))
  elif damage == 'metrics':
    lines = _lines(metrics)
    _rewrite(metrics, lines[:1] + ['{"step": 7, \n'] + lines[1:])
  before = _tree(path)
  error = _one_error(capsys, 'loco.retime', _retime(capsys, path))
  assert message in error and error.startswith(path)
  assert _tree(path) == before and not os.path.exists(os.path.join(path, 'retimed'))


def test_retime_name_and_output_problems_are_one_line(tmp_path, capsys):
  path = _make_run(tmp_path / 'r')
  for name in ('a/b', '..', '', '../../x'):
    assert _one_error(capsys, 'loco.retime', _retime(capsys, path, f'--name={name}')) == (
        f"the re-timing name {name!r} must be letters, digits and _.,=+-.")
  _write(os.path.join(path, 'retimed', 'taken'), 'a file')
  assert _one_error(capsys, 'loco.retime', _retime(capsys, path, '--name=taken')) == (
      f'{os.path.join(path, "retimed", "taken")} is a file, not a directory: the re-timing '
      'cannot be written there.')
  other = _make_run(tmp_path / 'other')
  _write(os.path.join(other, 'retimed'), 'a file')
  assert _one_error(capsys, 'loco.retime', _retime(capsys, other)).endswith(
      'retimed is a file, not a directory: the re-timing cannot be written there.')
  code = retime.main([path, path, *NET])
  assert _one_error(capsys, 'loco.retime', code, 2).startswith('takes one WORKDIR')
  code = retime.main([path, '--network.step_seconds=1'])
  assert _one_error(capsys, 'loco.retime', code, 2).startswith(
      '--config.network.profile=PROFILE is required')
  assert not os.path.exists(os.path.join(path, 'retimed', 'homogeneous'))


def test_retime_refuses_a_log_of_another_worker_count(tmp_path, capsys):
  path = _make_run(tmp_path / 'r')
  stored = json.load(open(os.path.join(path, 'config.json')))
  stored['config']['num_workers'] = 4
  _write(os.path.join(path, 'config.json'), json.dumps(stored))
  assert _one_error(capsys, 'loco.retime', _retime(capsys, path)) == (
      f'{os.path.join(path, "comms.jsonl")} is the log of 2 workers, but the run has '
      'num_workers=4.')


# ---- loco.report -----------------------------------------------------------------------

def _sweep_of_two(tmp_path):
  root = str(tmp_path / 'sweep')
  finished = dict(state='finished', returncode=0, error=None, seconds=2.0)
  _make_run(os.path.join(root, 'good'), status=finished)
  _make_run(os.path.join(root, 'hurt'), status=finished, evals=(3.0, 2.0))
  return root


@pytest.mark.parametrize('name,text,message', [
    ('config.json', '{"config": ', 'config.json is not valid JSON (line 1: '),
    ('metrics.jsonl', None, 'metrics.jsonl line 2 is not valid JSON (a damaged line'),
    ('status.json', '{"state": "finished", "seconds": "2"}', "seconds is '2', not a number"),
    ('diverged.json', '{"step": "x"}', "step is 'x', not a whole number"),
])
def test_report_lists_a_run_with_a_damaged_file_as_unreadable(tmp_path, capsys, name, text,
                                                              message):
  """Before: a traceback (config.json, metrics row) or a silently wrong status."""
  root = _sweep_of_two(tmp_path)
  file = os.path.join(root, 'hurt', name)
  if text is None:
    lines = _lines(file)
    _rewrite(file, lines[:1] + ['{"step": 7, "tok\n'] + lines[1:])
  else:
    _write(file, text)
  assert report.main([root]) == 0
  captured = capsys.readouterr()
  assert 'Traceback' not in captured.err
  assert captured.err.splitlines() == [
      f'loco.report: warning: {file}{captured.err.split(file, 1)[1].rstrip()}']
  assert message in captured.err and captured.err.rstrip().endswith(
      'The run is listed as unreadable.')
  text = open(os.path.join(root, 'report.md')).read()
  assert '2 runs: 1 finished, 1 unreadable.' in text
  assert '| hurt | — | unreadable | — |' in text
  assert f'- `hurt` (unreadable): {file}' in text
  # The good run's numbers stand, and the damaged run's numbers set no target.
  assert 'Target: eval loss <= 2.5000' in text


def test_report_drops_a_torn_last_metrics_line_with_a_note(tmp_path, capsys):
  root = _sweep_of_two(tmp_path)
  with open(os.path.join(root, 'hurt', 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 25, "tok')
  assert report.main([root]) == 0
  captured = capsys.readouterr()
  assert captured.err == ''
  assert 'hurt (finished): metrics.jsonl line 5 (the last) is torn and was left out' in (
      captured.out)
  assert '| hurt | diloco | finished | 2.0000 |' in open(os.path.join(root, 'report.md')).read()


def test_report_refuses_an_out_that_is_a_file_before_any_work(tmp_path, capsys):
  root = _sweep_of_two(tmp_path)
  out = tmp_path / 'out.txt'
  out.write_text('keep me')
  before = _tree(root)
  code = report.main([root, f'--out={out}'])
  assert _one_error(capsys, 'loco.report', code) == f'--out {out} is a file, not a directory.'
  assert out.read_text() == 'keep me' and _tree(root) == before


def test_report_refuses_a_read_only_out(tmp_path, capsys):
  root = _sweep_of_two(tmp_path)
  before = _tree(root)
  if os.geteuid() != 0:
    out = tmp_path / 'ro'
    out.mkdir()
    out.chmod(0o500)
    expected = f'--out {out} is not writable (read-only?).'
  else:
    # Root ignores permission bits; /sys is read-only even for root in a container.
    if os.access('/sys', os.W_OK) and not _sys_is_read_only():
      pytest.skip('running as root with a writable /sys: no read-only place to test')
    out = '/sys/loco-report-test'
    expected = f'--out {out} cannot be created: {out}: '
  code = report.main([root, f'--out={out}'])
  error = _one_error(capsys, 'loco.report', code)
  assert error.startswith(expected)
  assert _tree(root) == before


def _sys_is_read_only():
  try:
    os.mkdir('/sys/loco-report-probe')
  except OSError:
    return True
  os.rmdir('/sys/loco-report-probe')
  return False


def test_report_refuses_a_damaged_sweep_json(tmp_path, capsys):
  root = _sweep_of_two(tmp_path)
  _write(os.path.join(root, 'sweep.json'), '{"runs": [{"name": 3}]}')
  code = report.main([root])
  assert _one_error(capsys, 'loco.report', code) == (
      f"{os.path.join(root, 'sweep.json')}: runs is not a list of {{'name': ...}} objects.")
  assert not os.path.exists(os.path.join(root, 'report.md'))


def test_report_shows_bytes_sent_and_received(tmp_path):
  root = _sweep_of_two(tmp_path)
  metrics = os.path.join(root, 'good', 'metrics.jsonl')
  rows = [dict(r, bytes_received=r['bytes_sent'] * 3) for r in runs.read_metrics(
      os.path.join(root, 'good')).rows]
  _rewrite(metrics, [_jsonl(rows)])
  stream = io.StringIO()
  text = open(report.write_report([root], stream=stream)).read()
  assert ('| good | diloco | finished | 2.5000 | 2.5000 | 640 | 400 B | 1.20 KB | 100 B |'
          in text)
  printed = stream.getvalue().splitlines()
  assert printed[0].split()[6:8] == ['sent', 'received']
  assert printed[1].split()[3:7] == ['400', 'B', '1.20', 'KB']
  assert any(line.startswith('sent, received: bytes per worker;') for line in printed)


def test_ratios_say_what_they_compare():
  assert report.fewer(1200.0, 100.0) == '12.0x fewer bytes sent'
  assert report.fewer(100.0, 400.0, 'bytes_received') == '4.0x more bytes received'
  assert report.fewer(8.0, 4.0, 'peak_bytes') == '2.0x fewer peak bytes sent per step'
  assert report.fewer(None, 4.0) == report.fewer(4.0, 0.0) == '—'


# ---- loco.sweep: bad specs ---------------------------------------------------------------

def _spec_file(tmp_path, body):
  path = tmp_path / 'spec.py'
  path.write_text(f'from loco.sweep import Run\n\n\ndef get_sweep():\n  return {body}\n')
  return str(path)


@pytest.mark.parametrize('body,message', [
    ('None', 'returned None; it must return a list (or another iterable) of '
             'loco.lab.sweep.Run.'),
    ("Run('a', 'x.py')", "returned Run(name='a', config='x.py', overrides={}); it must "
                          'return a list (or another iterable) of loco.lab.sweep.Run.'),
    ("[Run(3, 'x.py')]", 'run name 3 must be a string (its workdir under --out), not int.'),
    ("[Run('/abs', 'x.py')]", "run name '/abs' must be letters, digits and _.,=+-"),
    ("[Run('a/./b', 'x.py')]", "run name 'a/./b' must be letters, digits and _.,=+-"),
    ("[Run('.', 'x.py')]", "run name '.' must be letters, digits and _.,=+-"),
    ("[Run('sweep.json', 'x.py')]", "run name 'sweep.json' uses 'sweep.json', the name of "
                                    "a file loco keeps in a sweep or a run's directory"),
    ("[Run('a/checkpoints', 'x.py')]", "run name 'a/checkpoints' uses 'checkpoints'"),
    ("[Run('report.md', 'x.py')]", "run name 'report.md' uses 'report.md'"),
    ("[Run('a', 'x.py', [('steps', 3)])]", "run 'a': overrides must be a mapping "
                                           "{'KEY': value}, got a list."),
    ("[Run('a', 'x.py', {3: 1})]", "run 'a': override key 3 must be a string"),
    ("[Run('a', None)]", "run 'a': config None must be a config file path"),
])
def test_a_bad_spec_is_one_line_and_starts_nothing(tmp_path, capsys, body, message):
  """Before: tracebacks (None, a non-string name, a list of overrides) or a run whose
  workdir overwrote the sweep's own sweep.json."""
  spec = _spec_file(tmp_path, body)
  code = sweep.main([spec, f'--out={tmp_path / "out"}'])
  assert message in _one_error(capsys, 'loco.sweep', code, 2)
  assert not os.path.exists(tmp_path / 'out')


def test_a_sweep_out_that_is_a_file_is_one_line(tmp_path, capsys):
  spec = _spec_file(tmp_path, "[Run('a', 'experiments/tiny_ddp.py')]")
  out = tmp_path / 'out'
  out.write_text('keep me')
  code = sweep.main([spec, f'--out={out}', '--no_report'])
  assert _one_error(capsys, 'loco.sweep', code) == f'--out {out} is a file, not a directory.'
  assert out.read_text() == 'keep me'


def test_a_bad_spec_on_the_real_command_line(tmp_path):
  spec = _spec_file(tmp_path, '[Run(None, "x.py")]')
  proc = subprocess.run([sys.executable, '-m', 'loco.sweep', spec, f'--out={tmp_path / "o"}'],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr
  assert proc.stderr.splitlines() == [
      'loco.sweep: error: run name None must be a string (its workdir under --out), not '
      'NoneType.']
  bad = subprocess.run([sys.executable, '-m', 'loco.sweep', spec, '--parallel=0'],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and bad.stderr.splitlines() == [
      "loco.sweep: error: argument --parallel: '0' must be at least 1 (see --help)"]
  assert not os.path.exists(tmp_path / 'o')


# ---- Ctrl-C -------------------------------------------------------------------------------

def _interrupt(*_, **__):
  raise KeyboardInterrupt


@pytest.mark.parametrize('module,attribute,argv', [
    (report, 'write_report', ['somewhere']),
    (retime, 'retime', ['somewhere', '--network.profile=homogeneous']),
    (sweep, 'load_spec', ['spec.py']),
])
def test_ctrl_c_in_any_command_is_exit_130_and_one_stopped_line(monkeypatch, capsys, module,
                                                                 attribute, argv):
  monkeypatch.setattr(module, attribute, _interrupt)
  assert module.main(argv) == 130
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and 'Traceback' not in err
  assert err.startswith(f'loco.{module.__name__.rsplit(".", 1)[1]}: stopped: interrupted; ')   # the command's name


def test_sigint_to_a_report_blocked_on_its_input(tmp_path):
  """A real Ctrl-C: the report waits on a metrics.jsonl that is a FIFO with a writer that
  never writes (a slow input), and gets SIGINT there."""
  root = _sweep_of_two(tmp_path)
  fifo = os.path.join(root, 'hurt', 'metrics.jsonl')
  os.remove(fifo)
  os.mkfifo(fifo)
  proc = subprocess.Popen([sys.executable, '-m', 'loco.report', root],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  writer = None
  try:
    deadline = time.time() + 120
    while writer is None and time.time() < deadline:   # opens once the report reads it
      assert proc.poll() is None, proc.communicate()
      try:
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
      except OSError:     # ENXIO: no reader yet
        time.sleep(0.05)
    assert writer is not None, 'the report never opened its input'
    time.sleep(0.2)       # into the blocking read
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
  finally:
    if writer is not None:
      os.close(writer)
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 130, err
  assert err.splitlines() == [
      'loco.report: stopped: interrupted; what was finished before is kept, and the same '
      'command starts again from there.']
  assert not os.path.exists(os.path.join(root, 'report.md'))


def test_the_boundary_itself():
  assert cli.run('loco.x', _interrupt) == 130
  assert cli.run('loco.x', lambda: (_ for _ in ()).throw(RunFileError('x: broken.'))) == 1


def test_every_command_ends_through_the_one_exit_path():
  """Every `python -m` command of loco and launch ends its `__main__` block through
  `cli.exit` (flush, then leave without interpreter shutdown), as loco.main and
  loco.batched end through `os._exit`: JAX's and orbax's threads torn down after an
  interrupt once crashed loco.evaluate's exit (139 after the right line)."""
  import ast
  import glob
  found = []
  # loco/colab.py runs on a notebook runtime before loco is installed: it imports only
  # the standard library (its own tests/test_colab.py), so it ends through sys.exit.
  standalone = {os.path.join(REPO, 'loco', 'colab.py')}
  for path in sorted(glob.glob(os.path.join(REPO, 'loco', '**', '*.py'), recursive=True)
                     + glob.glob(os.path.join(REPO, 'launch', '*.py'))):
    tree = ast.parse(open(path).read())
    functions = {node.name: ast.unparse(node) for node in tree.body
                 if isinstance(node, ast.FunctionDef)}
    for node in tree.body:
      if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and getattr(node.test.left, 'id', None) == '__name__'):
        block = ast.unparse(node)
        # `run()`: a module function the block calls (loco.main's console-script entry).
        block += ''.join(functions.get(call.func.id, '') for call in ast.walk(node)
                         if isinstance(call, ast.Call) and isinstance(call.func, ast.Name))
        found.append(os.path.relpath(path, REPO))
        assert ('cli.exit(' in block or 'os._exit(' in block or 'app.run(' in block
                or path in standalone and 'sys.exit(main())' in block), f'{path}: {block}'
  assert {'loco/run/evaluate.py', 'loco/lab/report.py', 'loco/lab/sweep.py', 'loco/lab/retime.py',
          'launch/claims.py', 'launch/scaling.py', 'loco/data/prepare.py',
          'loco/lab/calibrate.py', 'loco/batched.py'} <= set(found)


def test_atomic_writes_never_follow_a_planted_link(tmp_path):
  """Every JSON and page loco writes goes through `runs.write_atomic`: a link planted at
  the old fixed temporary name (PATH.tmp) or at any other name is never written through;
  the file gets the usual permissions; a failed write leaves the old file and no part."""
  from loco.files import metrics
  from loco.files import workdir as workdir_lib
  outside = tmp_path / 'outside.txt'
  outside.write_text('keep me')
  run = tmp_path / 'run'
  run.mkdir()
  target = run / 'status.json'
  (run / 'status.json.tmp').symlink_to(outside)
  workdir_lib.write_json(str(target), {'state': 'finished'})
  metrics.write_jsonl(str(run / 'rows.jsonl'), [{'step': 1}])
  (run / 'rows.jsonl.tmp').symlink_to(outside)
  metrics.write_jsonl(str(run / 'rows.jsonl'), [{'step': 2}])
  assert outside.read_text() == 'keep me'
  assert json.loads(target.read_text()) == {'state': 'finished'}
  assert (run / 'rows.jsonl').read_text() == '{"step": 2}\n'
  mask = os.umask(0)
  os.umask(mask)
  assert os.stat(target).st_mode & 0o777 == 0o666 & ~mask
  # A link at the destination itself is replaced by the file, not written through.
  (run / 'page.md').symlink_to(outside)
  runs.write_atomic(str(run / 'page.md'), 'page')
  assert not os.path.islink(run / 'page.md') and outside.read_text() == 'keep me'
  # A failure names the destination and leaves no temporary file behind.
  with pytest.raises(OSError) as failed:
    runs.write_atomic(str(run / 'missing' / 'x.json'), '{}')
  assert failed.value.filename == str(run / 'missing' / 'x.json')
  assert sorted(p.name for p in run.iterdir()) == [
      'page.md', 'rows.jsonl', 'rows.jsonl.tmp', 'status.json', 'status.json.tmp']
