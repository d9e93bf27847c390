"""Tests for loco.data: corpus, sources, tokenizers, sharding, packing."""

import dataclasses
import json
import os
import threading

import numpy as np
import pytest
import tensorflow_datasets as tfds

from loco import errors
from loco.data import corpus
from loco.data import pipeline
from loco.data import sharding
from loco.data import sources
from loco.data import tokenizers
import loco.data as ld

EOS = 256  # ByteTokenizer.eos_id


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(scope='session')
def stdlib_cfg(data_dir):
  """The full stdlib corpus, prepared once per session (about a second)."""
  return ld.DataConfig(data_dir=data_dir)


def _write_corpus(root, docs):
  for rel, text in docs.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)
  return os.path.join(root, '**', '*.txt')


def _package_docs():
  """24 documents in three 'packages' plus one empty file; all texts unique."""
  rng = np.random.default_rng(0)
  words = ['alpha', 'beta', 'gamma', 'delta', 'loss', 'token', 'worker']
  docs = {}
  for pkg in ('apkg', 'bpkg', 'cpkg'):
    for i in range(8):
      body = ' '.join(rng.choice(words, size=int(rng.integers(20, 400))))
      docs[f'{pkg}/doc{i:02d}.txt'] = f'id {pkg}/{i}\n{body}\n'
  docs['apkg/empty.txt'] = ''
  return docs


@pytest.fixture(scope='session')
def text_docs():
  return {rel: t for rel, t in _package_docs().items() if t}


@pytest.fixture(scope='session')
def text_cfg(tmp_path_factory, data_dir):
  glob = _write_corpus(str(tmp_path_factory.mktemp('corpus')), _package_docs())
  return ld.DataConfig(source='text', text_glob=glob, data_dir=data_dir)


def _segments(stream, eos=EOS):
  """Complete documents (bytes) between EOS tokens of a 1-D token stream."""
  cuts = np.flatnonzero(stream == eos)
  starts = np.concatenate([[0], cuts[:-1] + 1])
  return [stream[a:b].astype(np.uint8).tobytes() for a, b in zip(starts, cuts)]


def _pieces(row, eos=EOS):
  """The runs of text (bytes) between EOS tokens of one row, longer than 8 bytes."""
  cuts = np.concatenate([[-1], np.flatnonzero(row == eos), [len(row)]])
  return [row[a + 1:b].astype(np.uint8).tobytes() for a, b in zip(cuts, cuts[1:])
          if b - a - 1 > 8]


def _worker_stream(batches, w):
  return np.concatenate([b[w].reshape(-1) for b in batches])


# ------------------------------------------------------------------ config


@pytest.mark.parametrize('field,value', [
    ('source', 'wikipedia'), ('tokenizer', 'tiktoken'), ('sharding', 'random'),
    ('noniid_by', 'topic'),
])
def test_config_rejects_unknown_values(field, value):
  with pytest.raises(errors.ConfigError, match=f'data.{field}.*allowed'):
    ld.DataConfig(**{field: value})


@pytest.mark.parametrize('kwargs,key', [
    ({'source': 'tfds'}, 'tfds_name'),
    ({'source': 'text'}, 'text_glob'),
    ({'tokenizer': 'sentencepiece'}, 'sp_model'),
    ({'eval_split': 'train'}, 'eval_split'),
    ({'read_threads': -1}, 'read_threads'),
])
def test_config_rejects_incomplete_settings(kwargs, key):
  with pytest.raises(errors.ConfigError, match=key):
    ld.DataConfig(**kwargs)


def test_data_dir_default(monkeypatch):
  monkeypatch.setenv('LOCO_DATA_DIR', '/some/where')
  assert ld.DataConfig().resolved_data_dir == '/some/where'
  monkeypatch.delenv('LOCO_DATA_DIR')
  assert ld.DataConfig().resolved_data_dir.endswith('.cache/loco/tfds')
  gcs = ld.DataConfig(data_dir='gs://b/tfds')
  assert gcs.resolved_data_dir == 'gs://b/tfds'


# -------------------------------------------------------------- tokenizers


def test_byte_tokenizer_roundtrip():
  tok = ld.ByteTokenizer()
  text = 'def f(x):\n\treturn x  # héllo wörld 😀\n'
  ids = tok.encode(text)
  assert ids.dtype == np.int32 and ids.max() < 256 and ids.min() >= 0
  assert len(ids) == len(text.encode())
  assert tok.decode(ids) == text
  assert tok.decode(np.concatenate([ids, [tok.eos_id]])) == text
  assert (tok.vocab_size, tok.eos_id) == (257, 256)


def test_a_tokenizer_sample_without_text_or_with_little_is_said_in_one_line(tmp_path, capsys):
  with pytest.raises(errors.DataError, match=r'^the tokenizer sample holds no text'):
    tokenizers.train_sentencepiece(['', ''], vocab_size=320, output=str(tmp_path / 'e.model'))
  assert not (tmp_path / 'e.model').exists()
  few = tmp_path / 'few'
  few.mkdir()
  for name in ('a.txt', 'b.txt'):      # the text source splits by file: one for training
    (few / name).write_text('a small document, said again and again. ' * 20)
  assert tokenizers.main(['train', '--source=text', f'--text_glob={few}/*.txt',
                          f'--data_dir={tmp_path / "d"}', '--vocab_size=320',
                          f'--output={tmp_path / "o.model"}']) == 0
  captured = capsys.readouterr()
  assert captured.err.splitlines() == [
      'note: the tokenizer was trained on only 1 document(s), 800 bytes, for 320 pieces: '
      'its pieces fit that sample, not a corpus (at least 100 documents and 32,000 bytes '
      'are advised).']
  assert captured.out.startswith(f'wrote {tmp_path / "o.model"}: vocab 320')


def test_sentencepiece_train_load_roundtrip(tmp_path, text_cfg, text_docs):
  path = str(tmp_path / 'sp.model')
  assert tokenizers.main([
      'train', '--source=text', f'--text_glob={text_cfg.text_glob}',
      f'--data_dir={text_cfg.data_dir}', '--vocab_size=320',
      f'--output={path}']) == 0
  tok = ld.make_tokenizer(
      ld.DataConfig(tokenizer='sentencepiece', sp_model=path))
  assert tok.vocab_size == 320 and tok.eos_id == 2
  for text in [*list(text_docs.values())[:5], 'Unseen: \tx = {1: "ü"}\n\n']:
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == text  # identity normalisation + byte fallback
  # Through the pipeline: ids in range, EOS between documents.
  cfg = ld.DataConfig(source='text', text_glob=text_cfg.text_glob,
                      data_dir=text_cfg.data_dir, tokenizer='sentencepiece',
                      sp_model=path)
  it = ld.make_train_iterator(cfg, num_workers=2, batch_per_worker=2,
                              seq_len=64, seed=0)
  batch = np.stack([next(it) for _ in range(20)])
  assert batch.shape == (20, 2, 2, 65)
  assert batch.max() < 320 and batch.min() >= 0
  assert (batch == tok.eos_id).any()
  assert ld.dataset_fingerprint(cfg)['tokenizer']['sha256']


def test_sentencepiece_missing_model_is_data_error(tmp_path):
  cfg = ld.DataConfig(tokenizer='sentencepiece',
                      sp_model=str(tmp_path / 'x.model'))
  with pytest.raises(errors.DataError, match='x.model'):
    ld.make_tokenizer(cfg)


# ------------------------------------------------------------------ corpus


def test_stdlib_split_is_disjoint_by_file_and_deterministic(stdlib_cfg, full_stdlib):
  train = sources.open_documents(stdlib_cfg, 'train')
  valid = sources.open_documents(stdlib_cfg, 'validation')
  assert not set(train.paths) & set(valid.paths)
  assert list(train.paths) == sorted(train.paths)
  assert 0.03 < len(valid) / (len(train) + len(valid)) < 0.08
  spec = corpus.stdlib_spec()
  sizes = corpus.plan(spec).sizes
  split = corpus.split_files(sizes, 'stdlib')
  assert split == corpus.split_files(dict(reversed(sizes.items())), 'stdlib')
  assert set(valid.paths) <= set(split['validation'])
  assert sum(len(t) for t in train.texts) > 20e6  # the real corpus, ~30 MB


def test_stdlib_fingerprint_is_stable(stdlib_cfg, full_stdlib):
  fp = ld.dataset_fingerprint(stdlib_cfg)
  assert fp == ld.dataset_fingerprint(stdlib_cfg)
  assert fp['source'] == 'stdlib' and fp['files'] > 1000
  assert len(fp['sha256']) == 64 and fp['bytes'] > 20e6
  assert set(fp['splits']) == {'train', 'validation'}
  json.dumps(fp)  # goes into config.json


def test_text_fingerprint_follows_content(tmp_path, data_dir):
  docs = {f'd{i}.txt': f'document {i}\n' * 10 for i in range(6)}
  glob = _write_corpus(str(tmp_path), docs)
  cfg = ld.DataConfig(source='text', text_glob=glob, data_dir=data_dir)
  first = ld.dataset_fingerprint(cfg)
  assert first['files'] == 6 and first['glob'] == glob
  with open(tmp_path / 'd3.txt', 'a') as f:
    f.write('changed\n')
  second = ld.dataset_fingerprint(cfg)
  assert second['sha256'] != first['sha256'] and second['name'] != first['name']


def test_prepare_recovers_from_crash_and_runs_concurrently(
    tmp_path, monkeypatch):
  glob = _write_corpus(str(tmp_path / 'c'),
                       {f'f{i}.txt': f'x{i}\n' for i in range(5)})
  spec = corpus.text_spec(glob)
  data_dir = str(tmp_path / 'd')
  original = corpus.LocoCorpus._generate_examples

  def crash(self, rels):
    yield from original(self, rels[:1])
    raise RuntimeError('killed')

  monkeypatch.setattr(corpus.LocoCorpus, '_generate_examples', crash)
  with pytest.raises(RuntimeError, match='killed'):
    corpus.prepare(spec, data_dir)
  monkeypatch.setattr(corpus.LocoCorpus, '_generate_examples', original)
  config_dir = os.path.join(data_dir, corpus.BUILDER_NAME, spec.config_name)
  assert not os.path.exists(os.path.join(config_dir, corpus.VERSION))
  # A preparation killed -9 leaves an incomplete.* folder behind.
  os.makedirs(os.path.join(config_dir, f'incomplete.XYZ_{corpus.VERSION}'))
  results = []
  threads = [threading.Thread(target=lambda: results.append(
      corpus.prepare(spec, data_dir))) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(results) == 2
  assert corpus.fingerprint(results[0])['files'] == 5
  assert not [n for n in os.listdir(config_dir) if n.startswith('incomplete')]


def test_bad_globs_are_data_errors(tmp_path):
  with pytest.raises(errors.DataError, match='matches no files'):
    ld.make_train_iterator(
        ld.DataConfig(source='text', text_glob=str(tmp_path / '*.none'),
                      data_dir=str(tmp_path)),
        num_workers=1, batch_per_worker=1, seq_len=8, seed=0)
  _write_corpus(str(tmp_path), {'one.txt': 'only one\n'})
  with pytest.raises(errors.DataError, match='at least 2 files'):
    corpus.text_spec(str(tmp_path / '*.txt'))


def test_unknown_split_is_data_error(text_cfg):
  with pytest.raises(errors.DataError, match="split 'test'"):
    sources.open_documents(text_cfg, 'test')


# ---------------------------------------------------------------- pipeline


def test_same_seed_same_batches_other_seed_other_batches(stdlib_cfg):
  def read(seed):
    it = ld.make_train_iterator(stdlib_cfg, num_workers=2, batch_per_worker=2,
                                seq_len=64, seed=seed)
    return np.stack([next(it) for _ in range(3)])
  a = read(0)
  np.testing.assert_array_equal(a, read(0))
  assert not np.array_equal(a, read(1))


def test_stream_packing_is_exact_and_covers_every_document(text_cfg, text_docs):
  """The stream layout: one worker's rows, concatenated, are its documents in a
  per-epoch shuffled order (tests/test_sampling.py has the windows layout's)."""
  cfg = ld.DataConfig(source='text', text_glob=text_cfg.text_glob,
                      data_dir=text_cfg.data_dir, sampling='stream')
  it = ld.make_train_iterator(cfg, num_workers=1, batch_per_worker=16,
                              seq_len=63, seed=0)
  batches = [next(it) for _ in range(100)]
  assert all(b.shape == (1, 16, 64) and b.dtype == np.int32 for b in batches)
  stream = _worker_stream(batches, 0)
  assert stream.min() >= 0 and stream.max() <= EOS
  segments = _segments(stream)
  train = sources.open_documents(text_cfg, 'train')
  n = len(train)
  assert len(segments) > 2 * n  # more than two epochs: the stream repeats
  texts = sorted(train.texts)
  assert set(texts) < {t.encode() for t in text_docs.values()}
  for epoch in range(2):  # every epoch is a permutation of all documents
    assert sorted(segments[epoch * n:(epoch + 1) * n]) == texts
  assert segments[:n] != segments[n:2 * n]  # reshuffled per epoch
  assert b'' not in segments  # the empty file is not a document


@pytest.mark.parametrize('sampling', ['windows', 'stream'])
@pytest.mark.parametrize('sharding_,noniid_by', [
    ('iid', 'file'), ('noniid', 'file'), ('noniid', 'cluster')])
def test_worker_shares_are_disjoint(text_cfg, text_docs, sharding_, noniid_by, sampling):
  cfg = ld.DataConfig(source='text', text_glob=text_cfg.text_glob,
                      data_dir=text_cfg.data_dir, sharding=sharding_,
                      noniid_by=noniid_by, sampling=sampling)
  docs = sources.open_documents(cfg, 'train')
  shares = sharding.worker_shares(docs, num_workers=3, sharding=sharding_,
                                  noniid_by=noniid_by, seed=0)
  sets = [{s[j] for j in range(len(s))} for s in shares]
  assert all(sets)
  assert sum(map(len, sets)) == len(set().union(*sets)) == len(docs)
  # What the workers actually read stays inside their shares.
  it = ld.make_train_iterator(cfg, num_workers=3, batch_per_worker=2,
                              seq_len=63, seed=0)
  batches = [next(it) for _ in range(30)]
  for w, share in enumerate(sets):
    allowed = [docs[i] for i in share]
    others = [docs[i] for i in range(len(docs)) if i not in share]
    # Every piece of a row between EOS tokens is part of one of the worker's documents.
    pieces = {p for b in batches for row in b[w] for p in _pieces(row)}
    assert pieces and all(any(p in d for d in allowed) for p in pieces)
    assert any(not any(p in d for d in others) for p in pieces)


def test_noniid_file_gives_workers_different_packages(stdlib_cfg):
  cfg = ld.DataConfig(data_dir=stdlib_cfg.data_dir, sharding='noniid')
  docs = sources.open_documents(cfg, 'train')
  shares = sharding.worker_shares(docs, num_workers=4, sharding='noniid',
                                  noniid_by='file', seed=0)
  paths = [[docs.paths[s[j]] for j in range(len(s))] for s in shares]
  for a, b in zip(paths, paths[1:]):
    assert max(a) < min(b)  # contiguous ranges of the sorted tree
  top = [{p.split('/')[0] for p in ps} for ps in paths]
  assert 'asyncio' in top[0] and 'test' in top[3] and 'asyncio' not in top[3]


def test_cluster_sharding_separates_styles(tmp_path, data_dir):
  rng = np.random.default_rng(1)
  docs = {}
  for i in range(12):
    letters = ''.join(rng.choice(list('abcdefgh '), size=300))
    digits = ''.join(rng.choice(list('0123456789+-*'), size=300))
    docs[f'w{i:02d}.txt'] = f'{letters}\n'
    docs[f'n{i:02d}.txt'] = f'{digits}\n'
  glob = _write_corpus(str(tmp_path), docs)
  cfg = ld.DataConfig(source='text', text_glob=glob, data_dir=data_dir,
                      sharding='noniid', noniid_by='cluster')
  train = sources.open_documents(cfg, 'train')
  shares = sharding.worker_shares(train, num_workers=2, sharding='noniid',
                                  noniid_by='cluster', seed=0)
  kinds = [{train.paths[s[j]][0] for j in range(len(s))} for s in shares]
  assert sorted(map(sorted, kinds)) == [['n'], ['w']]
  again = sharding.worker_shares(train, num_workers=2, sharding='noniid',
                                 noniid_by='cluster', seed=5)
  assert [list(s.indices) for s in shares] == [list(s.indices) for s in again]


def test_too_few_documents_for_workers(text_cfg):
  with pytest.raises(errors.DataError, match='every worker needs'):
    ld.make_train_iterator(text_cfg, num_workers=50, batch_per_worker=1,
                           seq_len=8, seed=0)


@pytest.mark.parametrize('sampling', ['windows', 'stream'])
@pytest.mark.parametrize('which', ['stdlib', 'text'])
def test_exact_resume(which, sampling, stdlib_cfg, text_cfg):
  cfg = stdlib_cfg if which == 'stdlib' else text_cfg  # text wraps epochs
  cfg = dataclasses.replace(cfg, sampling=sampling)
  kwargs = dict(num_workers=3, batch_per_worker=2, seq_len=127, seed=7)
  it = ld.make_train_iterator(cfg, **kwargs)
  for _ in range(25):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it) for _ in range(10)]
  resumed = ld.make_train_iterator(cfg, **kwargs)
  next(resumed)  # a used iterator must restore as well as a fresh one
  resumed.set_state(state)
  for want in expected:
    np.testing.assert_array_equal(next(resumed), want)
  assert resumed.get_state() == it.get_state()
  other = ld.make_train_iterator(cfg, **{**kwargs, 'seed': 8})
  with pytest.raises(errors.DataError, match='another data setup'):
    other.set_state(state)
  with pytest.raises(errors.DataError, match='not a loco.data state'):
    other.set_state({'step': 3})


@pytest.mark.parametrize('sampling', ['windows', 'stream'])
def test_a_process_reads_only_its_workers_and_resumes_from_the_whole_state(
    text_cfg, sampling):
  """A multi-host process builds only its own workers' readers: the same rows as the
  full iterator's, its state has None for the others, and the gathered state of all
  workers restores it."""
  text_cfg = dataclasses.replace(text_cfg, sampling=sampling)
  kwargs = dict(num_workers=4, batch_per_worker=2, seq_len=31, seed=3)
  full = ld.make_train_iterator(text_cfg, **kwargs)
  part = ld.make_train_iterator(text_cfg, **kwargs, workers=[2, 3])
  assert part.workers == [2, 3]
  for _ in range(7):
    np.testing.assert_array_equal(next(part), next(full)[2:])
  state = part.get_state()
  assert state['workers'][:2] == [None, None]
  assert state['workers'][2:] == full.get_state()['workers'][2:]
  whole = json.loads(json.dumps(full.get_state()))
  expected = [next(full)[2:] for _ in range(3)]
  again = ld.make_train_iterator(text_cfg, **kwargs, workers=[2, 3])
  again.set_state(whole)
  for want in expected:
    np.testing.assert_array_equal(next(again), want)
  with pytest.raises(errors.DataError, match='not a loco.data state'):
    again.set_state(state)    # positions missing: not a whole state


def _window_segment(window, eos=EOS):
  """The bytes of the document run that holds the window's middle token (EOS excluded)."""
  m = len(window) // 2
  cuts = np.flatnonzero(window == eos)
  left = cuts[cuts < m]
  right = cuts[cuts >= m]
  lo = left[-1] + 1 if len(left) else 0
  hi = right[0] if len(right) else len(window)
  return window[lo:hi].astype(np.uint8).tobytes()


def test_eval_windows_are_fixed_and_read_their_documents(stdlib_cfg, text_cfg):
  w = ld.make_eval_windows(stdlib_cfg, batch_size=16, seq_len=256, num_batches=32)
  assert w.tokens.shape == (32, 16, 257) and w.tokens.dtype == np.int32
  assert w.docs.shape == (32, 16)
  again = ld.make_eval_windows(stdlib_cfg, batch_size=16, seq_len=256, num_batches=32)
  np.testing.assert_array_equal(w.tokens, again.tokens)
  np.testing.assert_array_equal(w.docs, again.docs)
  # Each window's middle token lies in the validation document it is labelled with,
  # and no window reads the training split.
  valid = sources.open_documents(stdlib_cfg, 'validation')
  assert w.split_documents == len(valid) == w.documents_read
  for window, doc in zip(w.tokens.reshape(-1, 257)[::7], w.docs.ravel()[::7]):
    assert _window_segment(window) in valid[int(doc)]
  with pytest.raises(errors.DataError, match='eval batches'):
    ld.make_eval_windows(text_cfg, batch_size=64, seq_len=1024, num_batches=8)


@pytest.mark.parametrize('num_batches', [4, 32])
def test_eval_windows_cover_the_split_in_proportion_to_its_tokens(stdlib_cfg, num_batches):
  """Windows sit one per equal stratum of the split's stream: every document that spans
  two strata is read, and each document gets windows in proportion to its tokens."""
  batch_size, seq_len = 16, 64
  w = ld.make_eval_windows(stdlib_cfg, batch_size=batch_size, seq_len=seq_len,
                           num_batches=num_batches, split='validation')
  valid = sources.open_documents(stdlib_cfg, 'validation')
  sizes = np.array([len(valid[i]) + 1 for i in range(len(valid))])   # bytes + EOS
  n = num_batches * batch_size
  stratum = sizes.sum() / n
  touched = set(w.docs.ravel().tolist())
  assert {i for i in range(len(valid)) if sizes[i] >= 2 * stratum} <= touched
  counts = np.bincount(w.docs.ravel(), minlength=len(valid))
  # A document of s tokens holds between s / stratum - 2 and s / stratum + 2 windows.
  assert np.all(np.abs(counts - sizes / stratum) <= 2), (counts, sizes / stratum)
  # Every batch spans the split: its windows come from strata spread over the stream.
  assert min(len(set(b.tolist())) for b in w.docs) >= min(batch_size, len(touched)) // 2


def test_unigram_entropy_of_stdlib_bytes(stdlib_cfg):
  h = ld.unigram_entropy_nats(stdlib_cfg)
  assert 3.0 < h < 3.5, h  # ~3.25 nats/byte over the whole stdlib


# -------------------------------------------------------------------- tfds


@pytest.mark.parametrize('sampling', ['windows', 'stream'])
def test_tfds_source_with_mock_c4(tmp_path, sampling):
  # Registers c4's builder code, which the mock needs (no data, no TF).
  import tensorflow_datasets.text.c4  # pylint: disable=g-import-not-at-top,unused-import
  cfg = ld.DataConfig(source='tfds', tfds_name='c4/en:3.1.0',
                      data_dir=str(tmp_path), read_threads=2, sampling=sampling)
  with tfds.testing.mock_data(num_examples=40,
                              policy=tfds.testing.MockPolicy.USE_CODE):
    kwargs = dict(num_workers=2, batch_per_worker=2, seq_len=16, seed=0)
    it = ld.make_train_iterator(cfg, **kwargs)
    for _ in range(3):
      next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    it.close()
    resumed = ld.make_train_iterator(cfg, **kwargs)
    resumed.set_state(state)
    for want in expected:
      np.testing.assert_array_equal(next(resumed), want)
    resumed.close()
    assert expected[0].shape == (2, 2, 17) and expected[0].max() <= EOS
    evals = ld.make_eval_windows(cfg, batch_size=2, seq_len=16, num_batches=2)
    assert evals.tokens.shape == (2, 2, 17) and evals.docs.shape == (2, 2)
    fp = ld.dataset_fingerprint(cfg)
    assert fp['source'] == 'tfds' and fp['splits']['train']['docs'] == 40
    with pytest.raises(errors.DataError, match="no feature 'body'"):
      sources.open_documents(
          ld.DataConfig(source='tfds', tfds_name='c4/en:3.1.0',
                        data_dir=str(tmp_path), text_key='body'), 'train')


def test_tfds_missing_data_dir_is_data_error(tmp_path):
  missing = str(tmp_path / 'nowhere')
  cfg = ld.DataConfig(source='tfds', tfds_name='c4/en:3.1.0', data_dir=missing)
  with pytest.raises(errors.DataError,
                     match=f'{missing}.*does not exist.*c4/en'):
    ld.make_train_iterator(cfg, num_workers=1, batch_per_worker=1, seq_len=8,
                           seed=0)


@pytest.mark.parametrize('name', ['c4/en:3.1.0', 'no_such_dataset'])
def test_tfds_unprepared_dataset_is_data_error(tmp_path, name):
  cfg = ld.DataConfig(source='tfds', tfds_name=name, data_dir=str(tmp_path))
  with pytest.raises(errors.DataError,
                     match=f"'{name}' is not prepared in {tmp_path}.*build"):
    ld.make_eval_windows(cfg, batch_size=1, seq_len=8, num_batches=1)


def test_tfds_reads_a_prepared_loco_corpus_by_name(text_cfg):
  # Any ArrayRecord TFDS dataset works; a prepared loco corpus is one.
  spec = corpus.text_spec(text_cfg.text_glob)
  corpus.prepare(spec, text_cfg.data_dir)
  cfg = ld.DataConfig(
      source='tfds', data_dir=text_cfg.data_dir,
      tfds_name=f'{corpus.BUILDER_NAME}/{spec.config_name}:{corpus.VERSION}')
  tfds_docs = sources.open_documents(cfg, 'train')
  local = sources.open_documents(text_cfg, 'train')
  texts = [tfds_docs[i] for i in range(len(tfds_docs))]
  # Lazy TFDS sources keep empty documents (each just yields an EOS).
  assert sorted(t for t in texts if t) == sorted(local.texts)


def test_large_local_corpus_is_read_lazily(monkeypatch, text_cfg):
  monkeypatch.setattr(sources, 'IN_MEMORY_MAX_BYTES', 0)
  docs = sources.open_documents(text_cfg, 'train')
  assert not docs.in_memory and len(docs) == len(
      corpus.plan(corpus.text_spec(text_cfg.text_glob)).splits['train'])
  cfg = ld.DataConfig(source='text', text_glob=text_cfg.text_glob,
                      data_dir=text_cfg.data_dir, sharding='noniid')
  batch = next(ld.make_train_iterator(cfg, num_workers=2, batch_per_worker=2,
                                      seq_len=32, seed=0))
  assert batch.shape == (2, 2, 33) and batch.max() <= EOS


def test_loco_stdlib_reads_another_standard_library(tmp_path, monkeypatch):
  lib = tmp_path / 'python3.11'
  (lib / 'json').mkdir(parents=True)
  (lib / 'site-packages' / 'pkg').mkdir(parents=True)
  (lib / 'abc.py').write_text('x = 1\n')
  (lib / 'json' / 'decoder.py').write_text('y = 2\n')
  (lib / 'site-packages' / 'pkg' / 'mod.py').write_text('z = 3\n')
  monkeypatch.setenv(corpus.STDLIB_ENV, str(lib))
  spec = corpus.stdlib_spec()
  assert spec.root == os.path.realpath(lib)
  assert spec.files == ('abc.py', 'json/decoder.py')   # site-packages left out
  assert spec.key != corpus.text_spec(str(lib / '**' / '*.py')).key
  monkeypatch.setenv(corpus.STDLIB_ENV, str(tmp_path / 'absent'))
  with pytest.raises(errors.DataError, match='LOCO_STDLIB=.*is not a folder'):
    corpus.stdlib_spec()
