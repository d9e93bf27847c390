"""How a worker's rows are drawn (loco/data/sampling.py): independent windows by default.

The corpus here names itself: file `fNNN.txt` is tags `<fNNN.xxxx>` (xxxx random), so the
documents a row reads are decoded from its text, not taken from the iterator's word, and
no two windows are equal.
"""

import collections
import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from loco import errors
import loco.data as ld
from loco.data import sharding
from loco.data import sources

EOS = 256
_TAG = re.compile(rb'<(f\d{3})\.[a-z]{4}>')


@pytest.fixture(scope='module')
def named_cfg(tmp_path_factory, data_dir):
  """120 files of 2-6 KB, each tags of its own name."""
  root = tmp_path_factory.mktemp('named')
  rng = np.random.default_rng(0)
  letters = np.array(list('abcdefghijklmnopqrstuvwxyz'))
  for i in range(120):
    name = f'f{i:03d}'
    tags = [f'<{name}.{"".join(rng.choice(letters, 4))}>'
            for _ in range(int(rng.integers(180, 520)))]
    (root / f'{name}.txt').write_text(' '.join(tags))
  return ld.DataConfig(source='text', text_glob=str(root / '*.txt'), data_dir=data_dir)


def _names(row) -> set[bytes]:
  """The documents whose whole tags the row holds."""
  return set(_TAG.findall(row[row != EOS].astype(np.uint8).tobytes()))


def _first_name(row) -> bytes:
  return _TAG.search(row[row != EOS].astype(np.uint8).tobytes()).group(1)


def _layout_stats(cfg, sampling, workers, batch, steps=40, seq_len=63):
  """(mean distinct documents per worker-step, share of rows whose first document the
  same worker read at the step before), from the rows' own text."""
  it = ld.make_train_iterator(dataclasses.replace(cfg, sampling=sampling),
                              num_workers=workers, batch_per_worker=batch,
                              seq_len=seq_len, seed=0)
  distinct, continued, prev = [], [], [set()] * workers
  for step in range(steps):
    b = next(it)
    for w in range(workers):
      read = set().union(*(_names(r) for r in b[w]))
      distinct.append(len(read))
      if step:
        continued += [_first_name(r) in prev[w] for r in b[w]]
      prev[w] = read
  return np.mean(distinct), np.mean(continued)


@pytest.mark.parametrize('workers,batch', [(1, 16), (2, 8)])
def test_rows_of_a_step_read_different_documents(named_cfg, workers, batch):
  """Windows: a worker-step of B rows reads about B documents (a 60-120 document share
  whose documents are 2-6 KB) and few rows continue a document of the step before
  (expected about B x 4.3 KB / share, 6-15%); the stream layout reads one or two per
  worker-step and continues most rows (every row but the ones past a document's end, a
  step reading 1 KB of 2-6 KB documents). Fails on the stream layout."""
  distinct, continued = _layout_stats(named_cfg, 'windows', workers, batch)
  assert distinct >= 0.8 * batch, distinct
  assert continued < 0.3, continued
  distinct, continued = _layout_stats(named_cfg, 'stream', workers, batch)
  assert distinct <= 2.5 and continued > 0.7, (distinct, continued)


def _token_counts(cfg) -> tuple[collections.Counter, int, int]:
  """Byte counts (EOS as 256) of the training split, its tokens and documents."""
  docs = sources.open_documents(cfg, cfg.train_split)
  counts = collections.Counter()
  for i in range(len(docs)):
    counts.update(docs[i])
  counts[EOS] = len(docs)
  return counts, sum(counts.values()), len(docs)


@pytest.mark.parametrize('pool_tokens', [2**25, 9_000])
def test_an_epoch_reads_every_window_once(named_cfg, pool_tokens):
  """One worker, one epoch (its position reaches document n of its order with no window
  read): the rows' tokens are the split's, each pool's last partial window (fewer than
  seq_len + 1 tokens) left out, and no row repeats (a window is one place of one pool)."""
  seq_len = 100
  cfg = dataclasses.replace(named_cfg, window_pool_tokens=pool_tokens)
  counts, total, n = _token_counts(cfg)
  it = ld.make_train_iterator(cfg, num_workers=1, batch_per_worker=1, seq_len=seq_len,
                              seed=3)
  rows, pools = [], 0
  while it.get_state()['workers'][0] != [n, 0]:
    assert len(rows) < total // seq_len
    rows.append(next(it)[0, 0])
    first, read = it.get_state()['workers'][0]
    pools += read == 0
    assert first <= n
  got = collections.Counter()
  for r in rows:
    got.update(r.tolist())
  assert all(got[t] <= counts[t] for t in got)
  left_out = total - sum(got.values())
  assert 0 <= left_out < pools * (seq_len + 1), (left_out, pools)
  # A pool is whole documents (under 6 KB here) holding at least pool_tokens, or the
  # epoch's last documents.
  if pool_tokens > total:
    assert pools == 1
  else:
    assert total // (pool_tokens + 6000) <= pools <= total // pool_tokens + 1, pools
  assert len({r.tobytes() for r in rows}) == len(rows)
  # The next epoch reads another order: its first rows are not the first epoch's.
  nxt = [next(it)[0, 0] for _ in range(5)]
  assert not all(np.array_equal(a, b) for a, b in zip(nxt, rows))


def test_exact_resume_mid_epoch_and_across_an_epoch_boundary(named_cfg):
  """States saved mid-epoch and just before an epoch boundary (read from the state itself)
  replay the uninterrupted rows through the next epoch, in any batch size."""
  cfg = dataclasses.replace(named_cfg, window_pool_tokens=50_000)   # several pools too
  kwargs = dict(num_workers=3, seq_len=255, seed=11)   # an epoch: about 70 steps
  docs = sources.open_documents(cfg, cfg.train_split)
  share_len = [len(s) for s in sharding.worker_shares(
      docs, num_workers=3, sharding='iid', noniid_by='file', seed=11)]
  it = ld.make_train_iterator(cfg, batch_per_worker=8, **kwargs)
  states, batches = {}, []
  for step in range(200):
    states[step] = json.loads(json.dumps(it.get_state()))
    batches.append(next(it))
  epoch_of = [[p[0] // n for p, n in zip(s['workers'], share_len)]
              for s in states.values()]
  crossing = next(s for s in range(1, 200) if epoch_of[s] != epoch_of[s - 1])
  assert crossing < 120          # the run crossed a boundary with steps to spare
  for start in (37, crossing - 1):
    resumed = ld.make_train_iterator(cfg, batch_per_worker=8, **kwargs)
    next(resumed)
    resumed.set_state(states[start])
    for want in batches[start:start + 60]:
      np.testing.assert_array_equal(next(resumed), want)
  # Batches of 4 from the same state read the same rows, two per step.
  halves = ld.make_train_iterator(cfg, batch_per_worker=4, **kwargs)
  halves.set_state(states[crossing - 1])
  for want in batches[crossing - 1:crossing + 20]:
    np.testing.assert_array_equal(np.concatenate([next(halves), next(halves)], axis=1),
                                  want)


def test_states_of_another_layout_are_refused_in_one_line(named_cfg):
  kwargs = dict(num_workers=2, batch_per_worker=2, seq_len=31, seed=0)
  windows = ld.make_train_iterator(named_cfg, **kwargs)
  stream = ld.make_train_iterator(dataclasses.replace(named_cfg, sampling='stream'),
                                  **kwargs)
  for _ in range(3):
    next(windows), next(stream)
  old = {k: v for k, v in stream.get_state().items() if k != 'sampling'}
  old['format'] = 1   # what a checkpoint of the stream layout holds
  with pytest.raises(errors.DataError, match='stream layout .format 1.*sampling=stream'):
    windows.set_state(old)
  with pytest.raises(errors.DataError, match="sampling='windows'.*sampling=windows"):
    stream.set_state(windows.get_state())
  expected = next(stream)
  again = ld.make_train_iterator(dataclasses.replace(named_cfg, sampling='stream'),
                                 **kwargs)
  again.set_state(old)            # the old format resumes the stream layout as it was
  np.testing.assert_array_equal(next(again), expected)
  longer = ld.make_train_iterator(named_cfg, **{**kwargs, 'seq_len': 63})
  with pytest.raises(errors.DataError, match='windows of 32 tokens.*windows of 64'):
    longer.set_state(windows.get_state())
  other_pool = ld.make_train_iterator(
      dataclasses.replace(named_cfg, window_pool_tokens=1000), **kwargs)
  with pytest.raises(errors.DataError, match='pools of 33554432.*pools of 1000'):
    other_pool.set_state(windows.get_state())


def test_pool_tokens_is_checked():
  with pytest.raises(errors.ConfigError, match='window_pool_tokens'):
    ld.DataConfig(window_pool_tokens=0)
  with pytest.raises(errors.ConfigError, match="data.sampling is 'random'"):
    ld.DataConfig(sampling='random')


def _script(*args):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run([sys.executable, 'scripts/batch_documents.py', *args],
                        capture_output=True, text=True, cwd=repo)


def test_the_measuring_script_prints_both_layouts_and_answers_bad_input(named_cfg):
  """scripts/batch_documents.py on the self-naming corpus: a row per layout and shape,
  the windows rows reading more documents than the stream's; bad input is one line."""
  data = ['--data', 'source=text', '--data', f'text_glob={named_cfg.text_glob}',
          '--data', f'data_dir={named_cfg.data_dir}']
  done = _script('--shapes=1x8,2x4', '--steps=12', '--seq_len=63', *data)
  assert done.returncode == 0, done.stderr
  rows = [line.split('|')[1:-1] for line in done.stdout.splitlines()
          if line.startswith('| stream') or line.startswith('| windows')]
  table = {(r[0].strip(), r[1].strip()): float(r[2]) for r in rows}
  assert set(table) == {(s, m) for s in ('stream', 'windows') for m in ('1 x 8', '2 x 4')}
  for shape in ('1 x 8', '2 x 4'):
    assert table['windows', shape] >= 6 > 3 >= table['stream', shape], table
  for args, code, what in ((['--data', 'colour=blue'], 1, 'error: --data'),
                           (['--data', 'read_threads=two'], 1, 'of type int'),
                           (['--shapes=8by4'], 2, 'not a list like'),
                           (['--samplings=random'], 2, 'choose from')):
    done = _script(*args)
    assert done.returncode == code and what in done.stderr, (args, done.stderr)
    assert done.stderr.count('\n') == 1 and 'Traceback' not in done.stderr


def test_a_source_read_on_demand_packs_the_next_pool_ahead_with_the_same_rows(named_cfg):
  """The self-naming corpus as a TFDS ArrayRecord dataset (the on-demand path, grain
  reader threads and the next pool packed on a background thread): the same rows as the
  in-memory corpus, across several pools, and a restore while a pool is being packed
  ahead replays them."""
  from loco.data import corpus
  spec = corpus.text_spec(named_cfg.text_glob)
  corpus.prepare(spec, named_cfg.data_dir)
  tfds_cfg = dataclasses.replace(
      named_cfg, source='tfds', read_threads=2, window_pool_tokens=30_000,
      tfds_name=f'{corpus.BUILDER_NAME}/{spec.config_name}:{corpus.VERSION}')
  local_cfg = dataclasses.replace(named_cfg, window_pool_tokens=30_000)
  kwargs = dict(num_workers=2, batch_per_worker=8, seq_len=127, seed=4)
  local = ld.make_train_iterator(local_cfg, **kwargs)
  ahead = ld.make_train_iterator(tfds_cfg, **kwargs)
  states, batches = [], []
  for _ in range(120):                       # about 6 pools per worker
    states.append(ahead.get_state())
    batches.append(next(ahead))
    np.testing.assert_array_equal(batches[-1], next(local))
  assert states[-1]['workers'][0][0] > 0     # pools were crossed
  ahead.close()
  again = ld.make_train_iterator(tfds_cfg, **kwargs)
  for start in (70, 5):
    again.set_state(states[start])
    for want in batches[start:start + 30]:
      np.testing.assert_array_equal(next(again), want)
  again.close()
