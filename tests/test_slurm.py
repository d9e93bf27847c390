"""`loco.sweep --launcher=slurm` through submitit, run with its LocalExecutor
(`--launcher=submitit_local`): the same statuses, logs, resume and batching as local
processes."""

import json
import os
import shutil

import pytest

from loco.lab import slurm
from loco.lab import sweep
from loco.errors import UsageError

pytest.importorskip('submitit')

_NANO = """
import sys
sys.path.insert(0, {repo!r})
from tests.nano import make_nano_config

def get_config():
  c = make_nano_config({glob!r}, {data_dir!r})
  c.steps = 20
  return c
"""
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_slurm_options_are_key_value_pairs_with_numbers():
  assert slurm.parse_options(['partition=gpu', 'timeout_min=600', 'nodes=2']) == dict(
      partition='gpu', timeout_min=600, nodes=2)
  with pytest.raises(UsageError, match=r'--slurm=partition: expected KEY=VALUE'):
    slurm.parse_options(['partition'])


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_sweep_of_two_runs_as_jobs_finishes_and_resumes(tmp_path, small_corpus_glob,
                                                          data_dir, monkeypatch):
  monkeypatch.chdir(REPO)
  nano = tmp_path / 'nano.py'
  nano.write_text(_NANO.format(repo=REPO, glob=small_corpus_glob, data_dir=data_dir))
  runs = [sweep.Run('a', str(nano)), sweep.Run('b', str(nano), {'seed': 1})]
  out = str(tmp_path / 'sweep')
  assert sweep.run_sweep(runs, out, launcher='submitit_local', report=False,
                         progress_every=0) == 0
  for name in ('a', 'b'):
    status = sweep.read_status(os.path.join(out, name))
    assert status['state'] == 'finished' and status['returncode'] == 0, status
    assert status['pid'].startswith('job ') and status['attempts'] == 1
    log = open(os.path.join(out, name, 'log.txt')).read()
    assert log.count('==> loco.sweep attempt 1') == 1 and 'loco: ddp, 2 workers' in log
  assert os.listdir(os.path.join(out, slurm.SUBMITIT))      # submitit's job files
  # b's job killed after its step-10 checkpoint: the step-20 one and its rows lost.
  b = os.path.join(out, 'b')
  full = _lines(os.path.join(b, 'metrics.jsonl'))
  shutil.rmtree(os.path.join(b, 'checkpoints', '20'))
  with open(os.path.join(b, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in full if r['step'] <= 10)
  status = sweep.read_status(b)
  status.update(state='interrupted', returncode=-9, error='killed by signal 9')
  sweep.write_json(os.path.join(b, 'status.json'), status)
  a_before = os.stat(os.path.join(out, 'a', 'status.json')).st_mtime_ns

  assert sweep.run_sweep(runs, out, launcher='submitit_local', report=False,
                         progress_every=0) == 0
  assert os.stat(os.path.join(out, 'a', 'status.json')).st_mtime_ns == a_before  # skipped
  status = sweep.read_status(b)
  assert status['state'] == 'finished' and status['attempts'] == 2
  log = open(os.path.join(b, 'log.txt')).read()
  assert '==> loco.sweep attempt 2' in log and 'resuming from step 10' in log
  from loco.files.metrics import TIMING_KEYS
  strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]  # noqa: E731
  assert strip(_lines(os.path.join(b, 'metrics.jsonl'))) == strip(full)
