"""scripts/device/runs_pack.py: a study's ended runs travel without their models."""

import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'scripts', 'device'))
import runs_pack  # noqa: E402  pylint: disable=g-import-not-at-top


def _run(root, rel, state='finished', steps=(15, 30), scored_step=None, diverged=False,
         checkpoint=True):
  d = os.path.join(root, rel)
  os.makedirs(d)
  with open(os.path.join(d, 'status.json'), 'w') as f:
    json.dump({'state': state, 'host': 'here'}, f)
  with open(os.path.join(d, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps({'step': s, 'train_loss': 2.0}) + '\n' for s in steps)
  if checkpoint:
    os.makedirs(os.path.join(d, 'checkpoints', str(steps[-1])))
    open(os.path.join(d, 'checkpoints', str(steps[-1]), 'state'), 'w').write('model')
    os.makedirs(os.path.join(d, 'tensorboard'))
    open(os.path.join(d, 'tensorboard', 'events'), 'w').write('e')
  if scored_step is not None:
    os.makedirs(os.path.join(d, 'evals'))
    with open(os.path.join(d, 'evals', 'validation_512x16.json'), 'w') as f:
      json.dump({'step': scored_step, 'loss': 2.0}, f)
  if diverged:
    with open(os.path.join(d, 'diverged.json'), 'w') as f:
      json.dump({'step': 7, 'message': 'exploded'}, f)
  return d


def _names(path):
  with tarfile.open(path) as tar:
    return set(tar.getnames())


def test_only_ended_runs_travel_and_never_their_models(tmp_path):
  root = str(tmp_path / 'study')
  _run(root, 'tune/ddp/lr0.003')
  _run(root, 'tune/ddp/lr0.006', state='failed', diverged=True)
  _run(root, 'tune/ddp/lr0.012', state='running')
  _run(root, 'tune/ddp/lr0.024', state='failed')            # not diverged: trains again
  _run(root, 'final/ddp/seed1', scored_step=30)
  _run(root, 'final/ddp/seed2', scored_step=15)              # scored before its last step
  _run(root, 'final/ddp/seed3')                              # finished, not scored
  dest = str(tmp_path / 'out' / 'runs.tgz')
  assert runs_pack.pack(root, dest) == (3, [dest])
  names = _names(dest)
  runs = {n.rsplit('/', 1)[0] for n in names if n.endswith('status.json')}
  assert runs == {'tune/ddp/lr0.003', 'tune/ddp/lr0.006', 'final/ddp/seed1'}
  assert 'final/ddp/seed1/evals/validation_512x16.json' in names
  assert 'tune/ddp/lr0.006/diverged.json' in names
  assert not any('checkpoints' in n or 'tensorboard' in n for n in names), names
  # --newer: only what ended after the stamp (what a lease trained).
  stamp = tmp_path / 'stamp'
  stamp.write_text('')
  later = time.time() + 5
  os.utime(os.path.join(root, 'tune/ddp/lr0.003', 'status.json'), (later, later))
  assert runs_pack.pack(root, dest, str(stamp))[0] == 1
  assert {n for n in _names(dest) if n.endswith('status.json')} == {
      'tune/ddp/lr0.003/status.json'}


def test_a_merge_adds_and_replaces_what_has_not_ended_and_keeps_what_has(tmp_path):
  there, here = str(tmp_path / 'there'), str(tmp_path / 'here')
  for rel in ('tune/a/x', 'tune/a/y', 'tune/a/z'):
    _run(there, rel, steps=(15, 30, 45))
  _run(there, 'final/ddp/seed1', scored_step=30)
  packed = str(tmp_path / 'runs.tgz')
  assert runs_pack.pack(there, packed)[0] == 4
  _run(here, 'tune/a/y', state='running', steps=(15,))        # half-trained here
  _run(here, 'tune/a/z', steps=(15, 30))                      # ended here: kept
  assert runs_pack.merge(here, packed) == (2, 1, 1)
  for rel in ('tune/a/x', 'tune/a/y', 'final/ddp/seed1'):
    assert json.load(open(os.path.join(here, rel, 'status.json')))['state'] == 'finished'
  assert runs_pack._last_step(os.path.join(here, 'tune/a/y')) == 45
  assert not os.path.exists(os.path.join(here, 'tune/a/y', 'checkpoints'))   # the old one's
  assert runs_pack._last_step(os.path.join(here, 'tune/a/z')) == 30
  assert os.path.isdir(os.path.join(here, 'tune/a/z', 'checkpoints'))
  assert runs_pack.merge(here, packed) == (0, 0, 4)           # a second merge: nothing


def test_a_folder_keeps_the_ended_runs_and_a_fresh_checkout_goes_on_from_it(tmp_path):
  """results/claims70: the ended runs in the repository, added to run by run."""
  there, kept, here = (str(tmp_path / d) for d in ('there', 'kept', 'here'))
  _run(there, 'tune/a/x', steps=(15, 30, 45))
  _run(there, 'tune/a/y', state='running', steps=(15,))       # not ended: stays behind
  _run(there, 'final/ddp/seed1', scored_step=30)
  assert runs_pack.pack(there, kept) == (2, [kept])
  assert sorted(runs_pack.workdirs(kept)) == ['final/ddp/seed1', 'tune/a/x']
  assert not os.path.exists(os.path.join(kept, 'tune/a/x', 'checkpoints'))
  assert not os.path.exists(os.path.join(kept, 'tune/a/x', 'tensorboard'))
  # The next pack copies only what is new there; what is kept is not rewritten.
  stamp = os.path.getmtime(os.path.join(kept, 'tune/a/x', 'metrics.jsonl'))
  with open(os.path.join(there, 'tune/a/y', 'status.json'), 'w') as f:
    json.dump({'state': 'finished'}, f)
  assert runs_pack.pack(there, kept) == (3, [kept])
  assert os.path.getmtime(os.path.join(kept, 'tune/a/x', 'metrics.jsonl')) == stamp
  assert runs_pack._last_step(os.path.join(kept, 'tune/a/y')) == 15
  # A fresh checkout: the kept runs come back, an unfinished copy is replaced, an
  # ended one kept, a leftover half copy ignored.
  _run(here, 'tune/a/x', state='running', steps=(15,))
  _run(here, 'final/ddp/seed1', scored_step=30, steps=(15, 30))
  _run(kept, 'tune/a/z.part')
  out = subprocess.run([sys.executable, 'scripts/device/runs_pack.py', 'merge',
                        f'--runs={here}', '--src', kept], cwd=ROOT, capture_output=True,
                       text=True)
  assert out.returncode == 0, out.stderr
  assert '1 runs added to' in out.stdout and '1 unfinished ones replaced, 1 kept' in out.stdout
  assert runs_pack._last_step(os.path.join(here, 'tune/a/x')) == 45
  assert not os.path.exists(os.path.join(here, 'tune/a/x', 'checkpoints'))
  assert os.path.isdir(os.path.join(here, 'final/ddp/seed1', 'checkpoints'))
  assert not os.path.exists(os.path.join(here, 'tune/a/z.part'))
  assert runs_pack.merge(here, kept) == (0, 0, 3)


def test_a_large_pack_goes_on_in_parts_that_merge_as_one(tmp_path):
  there, here = str(tmp_path / 'there'), str(tmp_path / 'here')
  for i in range(3):
    _run(there, f'tune/a/r{i}')
  dest = str(tmp_path / 'out' / 'runs.tgz')
  n, parts = runs_pack.pack(there, dest, part_mb=1e-6)       # a run per archive
  assert n == 3 and parts == [dest, str(tmp_path / 'out' / 'runs-2.tgz'),
                              str(tmp_path / 'out' / 'runs-3.tgz')]
  assert [len({x for x in _names(p) if x.endswith('status.json')}) for p in parts] == [1] * 3
  assert runs_pack.pack(there, dest) == (3, [dest])          # the old parts are gone
  assert sorted(os.listdir(tmp_path / 'out')) == ['runs.tgz']
  runs_pack.pack(there, dest, part_mb=1e-6)
  out = subprocess.run([sys.executable, 'scripts/device/runs_pack.py', 'merge',
                        f'--runs={here}', '--src', *parts], cwd=ROOT, capture_output=True,
                       text=True)
  assert out.returncode == 0, out.stderr
  assert sorted(os.listdir(os.path.join(here, 'tune', 'a'))) == ['r0', 'r1', 'r2']
  assert out.stdout.count('1 runs added') == 3


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
  bad = tmp_path / 'bad.tgz'
  with tarfile.open(bad, 'w:gz') as tar:
    data = b'{}'
    info = tarfile.TarInfo('../escape/status.json')
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
  (tmp_path / 'runs').mkdir()
  (tmp_path / 'junk.tgz').write_text('not a tar file')
  damaged = tmp_path / 'damaged'
  _run(str(damaged), 'tune/a/x')
  (damaged / 'tune' / 'a' / 'x' / 'status.json').write_text('{"state": ')
  cases = [
      (['merge', f'--runs={tmp_path / "runs"}', f'--src={bad}'], 'not a plain path'),
      (['merge', f'--runs={tmp_path / "runs"}', f'--src={tmp_path / "junk.tgz"}'], 'error'),
      (['merge', f'--runs={tmp_path / "runs"}', f'--src={tmp_path / "none.tgz"}'],
       'is not a file'),
      (['merge', f'--runs={tmp_path / "runs"}', f'--src={tmp_path / "none"}'],
       'neither a .tgz archive nor a directory'),
      (['pack', f'--runs={tmp_path / "runs"}', f'--dest={tmp_path / "runs" / "kept"}'],
       'overlap'),
      (['pack', f'--runs={tmp_path / "none"}', f'--dest={tmp_path / "x.tgz"}'],
       'is not a directory'),
      (['pack', f'--runs={tmp_path / "runs"}', f'--dest={tmp_path / "x.tgz"}',
        f'--newer={tmp_path / "none"}'], 'does not exist'),
      (['pack', f'--runs={tmp_path / "runs"}', f'--dest={tmp_path / "x.tgz"}',
        '--part_mb=0'], 'must be positive'),
      (['pack', f'--runs={damaged}', f'--dest={tmp_path / "x.tgz"}'], 'status.json'),
  ]
  for args, says in cases:
    out = subprocess.run([sys.executable, 'scripts/device/runs_pack.py', *args], cwd=ROOT,
                         capture_output=True, text=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1, (args, out.stderr)
    assert lines[0].startswith('runs_pack.py: error: ') and says in lines[0], lines
  assert not os.path.exists(tmp_path / 'escape')


@pytest.mark.parametrize('what', ['pack', 'merge'])
def test_the_usage_names_both_commands(what):
  out = subprocess.run([sys.executable, 'scripts/device/runs_pack.py', what, '--help'],
                       cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0 and '--runs' in out.stdout
