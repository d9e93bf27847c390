"""The packing pipeline at exact fill boundaries, against hand-written windows.

Both layouts (loco/data/sampling.py): 'stream' reads each worker's packed documents as
consecutive windows; 'windows' packs each pool of whole documents (here one epoch, or
more when the epoch holds less than a window) and reads its windows in a seeded
permutation, leaving out the pool's last partial window.

seq_len = 7, so windows hold 8 tokens; '$' below is EOS. Non-iid 'file' sharding over
5 workers gives worker w the sorted train documents [w N / 5, (w + 1) N / 5) of the
N = 6 training files: one document each for workers 0-3 (so each stream is that
document and its EOS, repeated) and two for worker 4 (in a per-epoch shuffled order).

  worker 0  'a' x 7    7 + 1 = 8 tokens: exactly one window
  worker 1  'b' x 15  15 + 1 = 16: exactly two windows
  worker 2  'c' x 8    8 + 1 = 9: one over (the text fills a window, EOS opens the next)
  worker 3  'd' x 6    6 + 1 = 7: one short
  worker 4  'e' x 7 and 'f' x 15: both exact, so every window is one piece of one document
"""

import dataclasses
import json

import numpy as np
import pytest

import loco.data as ld
from loco.data import sources

EOS = 256
SEQ = 7
TRAIN = {'w0.txt': 'a' * 7, 'w1.txt': 'b' * 15, 'w2.txt': 'c' * 8, 'w3.txt': 'd' * 6,
         'w4a.txt': 'e' * 7, 'w4b.txt': 'f' * 15}
# The family split's hash order puts val0.txt (alone) in validation.
VALIDATION = {'val0.txt': 'v' * 100}

WINDOWS = {   # the first 12 windows of workers 0-3, by hand
    0: ['aaaaaaa$'] * 12,
    1: ['bbbbbbbb', 'bbbbbbb$'] * 6,
    2: ['cccccccc', '$ccccccc', 'c$cccccc', 'cc$ccccc', 'ccc$cccc', 'cccc$ccc',
        'ccccc$cc', 'cccccc$c', 'ccccccc$', 'cccccccc', '$ccccccc', 'c$cccccc'],
    3: ['dddddd$d', 'ddddd$dd', 'dddd$ddd', 'ddd$dddd', 'dd$ddddd', 'd$dddddd',
        '$dddddd$', 'dddddd$d', 'ddddd$dd', 'dddd$ddd', 'ddd$dddd', 'dd$ddddd'],
}
E_EPOCH, F_EPOCH = ['eeeeeee$'], ['ffffffff', 'fffffff$']


def _text(window) -> str:
  return ''.join('$' if t == EOS else chr(t) for t in window)


@pytest.fixture(scope='module')
def cfg(tmp_path_factory, data_dir):
  root = tmp_path_factory.mktemp('packing')
  for name, text in {**TRAIN, **VALIDATION}.items():
    (root / name).write_text(text)
  return ld.DataConfig(source='text', text_glob=str(root / '*.txt'), data_dir=data_dir,
                       sharding='noniid', noniid_by='file', sampling='stream')


def _iterator(cfg, batch=1):
  return ld.make_train_iterator(cfg, num_workers=5, batch_per_worker=batch, seq_len=SEQ,
                                seed=0)


def _windows(batches, w):
  return [_text(b[w, 0]) for b in batches]


def test_the_split_is_the_premise(cfg):
  assert sources.open_documents(cfg, 'train').paths == sorted(TRAIN)


def test_windows_at_exact_and_off_by_one_fills(cfg):
  it = _iterator(cfg)
  batches = [next(it) for _ in range(12)]
  assert all(b.shape == (5, 1, SEQ + 1) and b.dtype == np.int32 for b in batches)
  for w, want in WINDOWS.items():
    assert _windows(batches, w) == want, w
  # Worker 4: each epoch is e then f or f then e; 'eeeeeee$' ends a window exactly, and
  # the next window starts with the next document's first token.
  got = _windows(batches, 4)
  epochs = [got[i:i + 3] for i in range(0, 12, 3)]
  assert all(e in (E_EPOCH + F_EPOCH, F_EPOCH + E_EPOCH) for e in epochs), got
  assert len({tuple(e) for e in epochs}) == 2     # both orders occur: the boundary e -> f is read
  # No empty window and no doubled EOS anywhere.
  for w in range(5):
    stream = ''.join(_windows(batches, w))
    assert '$$' not in stream and not stream.startswith('$')


def test_state_at_a_boundary_resumes_the_identical_next_window(cfg):
  it = _iterator(cfg)
  next(it)
  state = json.loads(json.dumps(it.get_state()))
  # (doc, offset) by hand after one window of 8 tokens: worker 0 finished its document
  # with its EOS (the next begins); worker 1 and 2 consumed 8 tokens of text, EOS not yet
  # (worker 2's text is all read); worker 3 read 'dddddd$' and one 'd' of the next.
  assert state['workers'][:4] == [[1, 0], [0, 8], [0, 8], [1, 1]]
  assert state['workers'][4] in ([1, 0], [0, 8])  # e first, or f first
  resumed = _iterator(cfg)
  resumed.set_state(state)
  expected = [next(it) for _ in range(11)]
  got = [next(resumed) for _ in range(11)]
  for w, want in WINDOWS.items():
    assert _windows(got, w) == want[1:], w
  for a, b in zip(got, expected):
    np.testing.assert_array_equal(a, b)

  # Worker 2 after 9 windows: 72 tokens = 8 x 'cccccccc$', it sits at [8, 0].
  it = _iterator(cfg)
  for _ in range(9):
    next(it)
  state = it.get_state()
  assert state['workers'][:4] == [[9, 0], [4, 8], [8, 0], [10, 2]]
  resumed = _iterator(cfg)
  resumed.set_state(state)
  nxt = next(resumed)
  np.testing.assert_array_equal(nxt, next(it))
  assert [_text(nxt[w, 0]) for w in range(4)] == [WINDOWS[w][9] for w in range(4)]


# The windows layout on the same shares. A pool is whole documents up to the end of an
# epoch (or past it while it holds less than one window); its windows are permuted.
POOLS = {   # worker: the windows of one pool, and how many documents a pool reads
    0: (['aaaaaaa$'], 1),                       # 8 tokens: one window
    1: (['bbbbbbbb', 'bbbbbbb$'], 1),           # 16: two, in a per-pool order
    2: (['cccccccc'], 1),                       # 9: one window, the EOS left out
    3: (['dddddd$d'], 2),                       # 7 < 8: two epochs, 'dddddd$' left out
}


def test_windows_layout_reads_each_pool_window_once_in_a_seeded_order(cfg):
  cfg = dataclasses.replace(cfg, sampling='windows')
  it = _iterator(cfg)
  batches = [next(it) for _ in range(12)]
  for w, (pool, _) in POOLS.items():
    got = _windows(batches, w)
    per_pool = [sorted(got[i:i + len(pool)]) for i in range(0, 12, len(pool))]
    assert all(p == sorted(pool) for p in per_pool), (w, got)
  assert len({tuple(_windows(batches, 1)[i:i + 2]) for i in range(0, 12, 2)}) == 2
  # Worker 4: 'eeeeeee$' and 'ffffffff' 'fffffff$' (both orders of e and f pack the same
  # three windows), each pool's three in its own order.
  got = _windows(batches, 4)
  pools = [got[i:i + 3] for i in range(0, 12, 3)]
  assert all(sorted(p) == sorted(E_EPOCH + F_EPOCH) for p in pools), got
  assert len({tuple(p) for p in pools}) > 1
  # Positions by hand after 3 rows: [first document of the pool, windows read of it].
  it = _iterator(cfg)
  for _ in range(3):
    next(it)
  assert it.get_state()['workers'] == [[3, 0], [1, 1], [3, 0], [6, 0], [2, 0]]
  # The same rows in batches of 3: a position counts windows, not batches.
  wide = _iterator(cfg, batch=3)
  rows = [next(wide) for _ in range(4)]
  for b in range(4):
    np.testing.assert_array_equal(rows[b], np.stack(batches[3 * b:3 * b + 3], axis=2)[:, 0])
  # ... so a state saved after 6 rows of batches of 1 resumes batches of 3 at row 7.
  it = _iterator(cfg)
  for _ in range(6):
    next(it)
  again = _iterator(cfg, batch=3)
  again.set_state(json.loads(json.dumps(it.get_state())))
  np.testing.assert_array_equal(next(again), rows[2])
