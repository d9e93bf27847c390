"""Workdirs on object storage (`loco.files.storage`): the lease that replaces the lock, the
mirror of run files, and a run killed and resumed exactly through a URL workdir.

Two stand-ins, no network: `file://` URLs run the whole URL-workdir code (lease, mirror,
checkpoints at the URL, no rename, no lock) on a local disk; `gs://` URLs reach a local
GCS emulator (the `cluster` extra's gcp-storage-emulator) through gcsfs and epath for
the lease and the run files, and through orbax and tensorstore for one checkpoint.
"""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from loco.run import checkpoint as checkpoint_lib
from loco.files import runs
from loco.files import storage
from loco.run import train
from loco.files import workdir as workdir_lib
from loco.errors import WorkdirError
from loco.files.metrics import TIMING_KEYS, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _staging(tmp_path, monkeypatch):
  monkeypatch.setenv(storage.STAGING_ENV, str(tmp_path / 'staging'))


@pytest.fixture(scope='module')
def gcs():
  """A GCS emulator in this process with bucket `loco-test`; gcsfs and tensorstore
  pointed at it."""
  pytest.importorskip('gcsfs')
  server_lib = pytest.importorskip('gcp_storage_emulator.server')
  logging.getLogger('gcsfs').setLevel(logging.ERROR)
  logging.getLogger('gcp_storage_emulator').setLevel(logging.CRITICAL)
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  server = server_lib.create_server('127.0.0.1', port, in_memory=True,
                                    default_bucket='loco-test')
  server.start()
  url = f'http://127.0.0.1:{port}'
  saved = {k: os.environ.get(k) for k in ('STORAGE_EMULATOR_HOST', 'TENSORSTORE_GCS_HTTP_URL',
                                          'GOOGLE_AUTH_TOKEN_FOR_TESTING')}
  os.environ.update(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
                    GOOGLE_AUTH_TOKEN_FOR_TESTING='test')
  yield 'gs://loco-test'
  server.stop()
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


def _url_of(tmp_path, name: str) -> str:
  return f'file://{tmp_path / name}'


# The lease: one run per URL workdir.

def test_a_second_run_on_a_url_workdir_is_refused_while_the_first_holds_it(tmp_path):
  url = _url_of(tmp_path, 'run')
  with workdir_lib.Workdir(url) as wd:
    assert wd.url == url and wd.path.startswith(str(tmp_path / 'staging'))
    lease = json.loads((tmp_path / 'run' / storage.LEASE).read_text())
    assert lease['pid'] == os.getpid()
    with pytest.raises(WorkdirError, match=r'in use by another loco run .*lease \.lease '
                                           r'renewed \d+ s ago'):
      with workdir_lib.Workdir(url):
        pass
  assert not (tmp_path / 'run' / storage.LEASE).exists()    # released at the end
  with workdir_lib.Workdir(url):                            # and free again
    pass


@pytest.mark.parametrize('holder,free', [
    (dict(host='elsewhere', pid=1, age=10.0), False),       # fresh, on another host
    (dict(host='elsewhere', pid=1, age=storage.LEASE_SECONDS + 5), True),   # expired
    (dict(host=socket.gethostname(), pid=None, age=1.0), True),  # a dead process here
    (dict(host=socket.gethostname(), pid=os.getppid(), age=1.0), False),   # alive here
])
def test_a_lease_is_free_once_expired_or_its_process_is_gone(tmp_path, holder, free):
  url = _url_of(tmp_path, 'run')
  os.makedirs(tmp_path / 'run')
  pid = holder['pid']
  if pid is None:     # a process that has ended
    done = subprocess.Popen([sys.executable, '-c', 'pass'])
    done.wait()
    pid = done.pid
  (tmp_path / 'run' / storage.LEASE).write_text(json.dumps(dict(
      run='other', host=holder['host'], pid=pid, renewed=time.time() - holder['age'])))
  lease = storage.Lease(url)
  assert (lease.holder() is None) == free


def test_the_mirror_sends_only_changed_files_and_pull_replaces_the_local_copy(tmp_path):
  url = _url_of(tmp_path, 'remote')
  local = tmp_path / 'local'
  os.makedirs(local / 'tensorboard')
  (local / 'metrics.jsonl').write_text('{"step": 5}\n')
  (local / 'tensorboard' / 'events').write_bytes(b'\x00\x01')
  mirror = storage.Mirror(str(local), url)
  assert mirror.push() == ['metrics.jsonl', 'tensorboard/events']
  assert mirror.push() == []
  with open(local / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 10}\n')
  assert mirror.push() == ['metrics.jsonl']
  other = tmp_path / 'other'
  os.makedirs(other)
  (other / 'stale.json').write_text('{}')
  assert storage.pull(url, str(other)) == ['metrics.jsonl', 'tensorboard/events']
  assert not (other / 'stale.json').exists()
  assert (other / 'metrics.jsonl').read_text() == '{"step": 5}\n{"step": 10}\n'


def test_an_unreachable_url_workdir_is_one_sentence(tmp_path):
  (tmp_path / 'file').write_text('')
  with pytest.raises(WorkdirError, match=r'^cannot use the workdir file://.*file/run: '):
    with workdir_lib.Workdir(f'file://{tmp_path}/file/run'):
      pass


# The same code against a GCS emulator.

def test_lease_and_mirror_on_an_emulated_gcs_bucket(gcs, tmp_path):
  url = f'{gcs}/runs/lease'
  with workdir_lib.Workdir(url) as wd:
    assert storage.isfile(f'{url}/{storage.LEASE}')
    with pytest.raises(WorkdirError, match='in use by another loco run'):
      with workdir_lib.Workdir(url):
        pass
    with open(wd.file('metrics.jsonl'), 'w') as f:
      f.write('{"step": 1}\n')
    assert wd.file('checkpoints') == f'{url}/checkpoints'
  assert storage.listdir(url) == ['metrics.jsonl']        # lease gone, the row sent
  with workdir_lib.Workdir(url) as wd:                     # a fresh mirror pulls it
    assert open(wd.file('metrics.jsonl')).read() == '{"step": 1}\n'


def test_a_checkpoint_saved_to_and_restored_from_an_emulated_gcs_bucket(gcs):
  directory = f'{gcs}/runs/ckpt/checkpoints'
  state = {'w': jax.numpy.arange(6.0).reshape(2, 3), 'step': jax.numpy.int32(7)}
  saver = checkpoint_lib.Checkpointer(directory, note=lambda message: None)
  saver.save(10, state, {'workers': [[0, 1]]}, {'tokens': 40})
  saver.close()
  assert runs.committed_in(directory) == [10]
  loader = checkpoint_lib.Checkpointer(directory)
  restored, data, host = loader.restore(loader.latest_step(), state)
  loader.close()
  np.testing.assert_array_equal(restored['w'], state['w'])
  assert (data, host) == ({'workers': [[0, 1]]}, {'tokens': 40})


# A run killed (SIGKILL) and resumed exactly through a URL workdir.

def _comparable(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


@pytest.mark.slow
def test_a_url_workdir_run_killed_and_resumed_is_the_uninterrupted_run(
    nano_config, small_corpus_glob, data_dir, tmp_path):
  nano_config.steps = 30
  full = str(tmp_path / 'full')
  train.run(nano_config, full)
  url = _url_of(tmp_path, 'remote')
  env = {**os.environ, 'NANO_GLOB': small_corpus_glob, 'NANO_DATA': data_dir,
         'JAX_PLATFORMS': 'cpu'}
  env.pop('XLA_FLAGS', None)
  cmd = [sys.executable, '-m', 'loco.main',
         f'--config={os.path.join(REPO, "tests", "nano_config.py")}',
         '--config.steps=30', f'--workdir={url}']
  proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while runs.committed_in(f'{url}/checkpoints') != [10]:
    assert proc.poll() is None and time.time() < deadline, proc.communicate()
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  remote = tmp_path / 'remote'
  assert (remote / storage.LEASE).exists()              # left behind by the killed run
  # What the URL holds: the rows up to its checkpoint (sent before the save started).
  assert [json.loads(line)['step'] for line in
          (remote / 'metrics.jsonl').read_text().splitlines()][:2] == [5, 10]
  staging = storage.staging(url)
  # The resume starts from what the URL holds, not from this host's mirror.
  with open(os.path.join(staging, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 999}\n')
  train.run(nano_config, url)
  assert _comparable(read_metrics(str(remote))) == _comparable(read_metrics(full))
  assert (remote / 'comms.jsonl').read_text() == open(os.path.join(full, 'comms.jsonl')).read()
  assert not (remote / storage.LEASE).exists()
  _, ours = checkpoint_lib.read_named_state(str(remote))
  _, theirs = checkpoint_lib.read_named_state(full)
  ours, theirs = (dict(jax.tree_util.tree_flatten_with_path(s)[0]) for s in (ours, theirs))
  assert ours.keys() == theirs.keys()
  for path in ours:
    np.testing.assert_array_equal(ours[path], theirs[path], err_msg=str(path))
