"""Resume where every worker sits at a different position of its data.

A hand-made corpus of three 'packages' of equal-length documents (30, 100 and 250
bytes: 31, 101 and 251 tokens with EOS), sharded non-iid by file over 3 workers, so
worker w reads only package w. After k steps a worker has read k * batch_per_worker
windows of seq_len + 1 tokens, which puts the three workers at different positions that
follow from the lengths alone, in either batch layout:

- windows: [the pool's first document, windows of the pool read]; a worker's 16
  documents are one pool per epoch of 16 x 31 // 33 = 15, 16 x 101 // 33 = 48 and
  16 x 251 // 33 = 121 windows, so 20 windows put worker 0 5 windows into its second
  pool (which starts at document 16) and workers 1 and 2 at window 20 of their first;
- stream: [document, tokens of it consumed]; 20 x 33 = 660 tokens per worker, and
  660 = 21 x 31 + 9 = 6 x 101 + 54 = 2 x 251 + 158.
"""

import json
import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

import loco.data as ld
from loco.run import train
from loco.data import sources
from loco.files.metrics import TIMING_KEYS, read_metrics

# Package -> (documents, bytes per document); b02 and c02 go to validation (the
# family split's hash order), leaving 16 training documents in each package, so the
# non-iid file ranges of 3 workers are exactly the packages.
PACKAGES = {'a': (16, 30), 'b': (17, 100), 'c': (17, 250)}
VALIDATION = {'b02.txt', 'c02.txt'}
M, B, L = 3, 2, 32
CKPT = 10


def _text(name: str, length: int) -> str:
  return (f'{name} says hello. ' * length)[:length]


@pytest.fixture
def corpus_glob(tmp_path):
  root = tmp_path / 'corpus'
  root.mkdir()
  for pkg, (count, length) in PACKAGES.items():
    for i in range(count):
      (root / f'{pkg}{i:02d}.txt').write_text(_text(f'{pkg}{i:02d}', length))
  return str(root / '*.txt')


POSITIONS = {'windows': [[16, 5], [0, 20], [0, 20]],
             'stream': [[21, 9], [6, 54], [2, 158]]}


def _config(nano_config, corpus_glob, steps, sampling):
  c = nano_config
  c.data.text_glob = corpus_glob
  c.data.sampling = sampling
  c.data.sharding = 'noniid'
  c.data.noniid_by = 'file'
  c.num_workers, c.batch_per_worker, c.seq_len = M, B, L
  c.steps = steps
  c.optimizer.decay_steps = 18    # the same schedule for the 10- and the 20-step run
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = 4      # the checkpoint at step 10 falls inside a round
  c.eval.batches, c.eval.batch_size = 1, 2
  return c


def _comparable(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _comms(workdir):
  with open(os.path.join(workdir, 'comms.jsonl')) as f:
    return f.read()


@pytest.mark.slow
@pytest.mark.parametrize('sampling', ['windows', 'stream'])
def test_resume_restores_each_workers_own_position(nano_config, corpus_glob, tmp_path,
                                                   sampling):
  c = _config(nano_config, corpus_glob, 20, sampling)
  train_docs = sources.open_documents(ld.DataConfig(**c.data), 'train')
  every = {f'{p}{i:02d}.txt' for p, (n, _) in PACKAGES.items() for i in range(n)}
  assert sorted(train_docs.paths) == sorted(every - VALIDATION)   # the premise above

  full = str(tmp_path / 'full')
  train.run(c, full)
  part = str(tmp_path / 'part')
  train.run(_config(nano_config, corpus_glob, CKPT, sampling), part)
  assert [r['step'] for r in read_metrics(part)] == [5, 10]
  train.run(_config(nano_config, corpus_glob, 20, sampling), part)

  expected = read_metrics(full)
  assert [r['step'] for r in expected] == [5, 10, 15, 20]
  assert _comparable(read_metrics(part)) == _comparable(expected)
  assert _comms(part) == _comms(full)

  # The checkpointed data state: each worker at its own position, by hand (above).
  manager = ocp.CheckpointManager(os.path.join(part, 'checkpoints'),
                                  item_names=('state', 'data', 'host'))
  data = manager.restore(CKPT, args=ocp.args.Composite(data=ocp.args.JsonRestore()))['data']
  manager.close()
  assert [list(p) for p in data['workers']] == POSITIONS[sampling]

  # And that state is the one a fresh iterator reaches after 10 batches, and from
  # which it continues with the batches of steps 11, 12, ...
  kwargs = dict(num_workers=M, batch_per_worker=B, seq_len=L, seed=c.seed)
  it = ld.make_train_iterator(ld.DataConfig(**c.data), **kwargs)
  for _ in range(CKPT):
    next(it)
  assert it.get_state()['workers'] == POSITIONS[sampling]
  resumed = ld.make_train_iterator(ld.DataConfig(**c.data), **kwargs)
  resumed.set_state(json.loads(json.dumps(data)))
  for _ in range(3):
    np.testing.assert_array_equal(next(resumed), next(it))
