"""Training and eval batches: tokenize, pack, shard over workers, resume.

Each worker reads an endless stream: the documents of its share (see
`sharding.py`) in a seeded order that is reshuffled every epoch, each followed
by EOS, concatenated and cut into windows of `seq_len + 1` tokens (no padding;
a document continues in the next window and the next epoch continues the
stream). The trainer uses `w[:-1]` as inputs and `w[1:]` as targets.

A worker's position is two integers: `doc`, how many documents of its stream
came before the current one, and `offset`, how many tokens (EOS included) of
the current one were consumed. The document order is a pure function of
(seed, worker, epoch) through `grain.experimental.index_shuffle`, so the state
`{'format', 'signature', 'workers': [[doc, offset], ...]}` is all that a
checkpoint needs, and restoring it replays exactly the same batches. A TFDS
source is read ahead by grain threads (`DataConfig.read_threads`); local
corpora are in memory already.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any, Iterator, NamedTuple, Sequence

import grain
import numpy as np

from loco import errors
from loco.data import config as config_lib
from loco.data import sharding
from loco.data import sources
from loco.data import tokenizers

STATE_FORMAT = 1
EVAL_SEED = 0  # The eval document order and window offsets never depend on the run's seed.
EVAL_MAX_TOKENS = 16_000_000  # Eval windows are drawn over at most this much of a split.
_ENTROPY_MAX_TOKENS = 4_000_000
_ENDLESS = 2**62


class _TokenizedDocs:
  """`tokens(i)`: document i's tokens, without EOS."""

  def __init__(self, docs: sources.Documents, tokenizer: tokenizers.Tokenizer):
    self._docs, self._tokenizer = docs, tokenizer
    # Bytes cost nothing to "tokenize"; other tokenizers on an in-memory corpus
    # are worth caching, since every epoch reads every document again.
    cache = not isinstance(tokenizer, tokenizers.ByteTokenizer)
    self._cache: dict[int, np.ndarray] | None = (
        {} if cache and docs.in_memory else None)

  def __call__(self, i: int) -> np.ndarray:
    if self._cache is None:
      return self._tokenizer.encode_document(self._docs[i])
    if i not in self._cache:
      self._cache[i] = self._tokenizer.encode_document(self._docs[i])
    return self._cache[i]


class _WorkerStream:
  """One worker's endless token stream over its share of the documents."""

  def __init__(self, tokens: _TokenizedDocs, share: sharding.Share, seed: int,
               eos_id: int, read_threads: int):
    self._tokens, self._share = tokens, share
    self._seed, self._eos, self._threads = seed, eos_id, read_threads
    self._doc, self._offset = 0, 0
    self._current: np.ndarray | None = None
    self._reader: Iterator[np.ndarray] | None = None

  def doc_index(self, k: int) -> int:
    """The document read k-th by this worker (epoch k // len(share))."""
    # Pure in k: grain's reader threads call it concurrently.
    epoch, t = divmod(k, len(self._share))
    return self._share[sharding.shuffled_index(
        t, len(self._share), sharding.seed32(self._seed, epoch))]

  def _load(self, k: int) -> np.ndarray:
    return self._tokens(self.doc_index(k))

  def _open_reader(self, start: int) -> Iterator[np.ndarray]:
    if not self._threads:
      return map(self._load, itertools.count(start))
    dataset = grain.MapDataset.range(start, _ENDLESS).map(self._load)
    return iter(dataset.to_iter_dataset(grain.ReadOptions(
        num_threads=self._threads, prefetch_buffer_size=8 * self._threads)))

  def close(self) -> None:
    close = getattr(self._reader, 'close', None)
    if close is not None:
      close()
    self._reader, self._current = None, None

  @property
  def position(self) -> list[int]:
    return [self._doc, self._offset]

  def restore(self, doc: int, offset: int) -> None:
    self.close()
    self._doc, self._offset = doc, offset

  def fill(self, out: np.ndarray) -> None:
    """Writes the next len(out) tokens of the stream into the 1-D `out`."""
    pos, need = 0, len(out)
    while pos < need:
      if self._current is None:
        if self._reader is None:
          self._reader = self._open_reader(self._doc)
        self._current = next(self._reader)
        if self._offset > len(self._current):
          raise errors.DataError(
              f'data iterator state points at token {self._offset} of a '
              f'document with {len(self._current)} tokens; the state does not '
              'belong to this data.')
      n = len(self._current)
      if self._offset < n:
        take = min(n - self._offset, need - pos)
        out[pos:pos + take] = self._current[self._offset:self._offset + take]
        pos += take
        self._offset += take
      if pos < need and self._offset == n:
        out[pos] = self._eos
        pos += 1
        self._offset += 1
      if self._offset == n + 1:
        self._doc += 1
        self._offset = 0
        self._current = None


class TrainIterator:
  """Endless int32 batches [len(workers), batch_per_worker, seq_len + 1].

  Each batch holds the workers this iterator reads (all `num_workers` by default;
  on several hosts a process reads only its own). `get_state()` returns a small
  JSON-serialisable dict with every worker's position (None for a worker not read
  here: `placement.every_position` gathers the processes'); `set_state(state)` on an
  iterator made with the same data config, workers and seed continues with exactly the
  batches the original would have produced next (batch size and sequence length may
  differ: the state counts documents and tokens).
  """

  def __init__(self, streams: dict[int, _WorkerStream], *, num_workers: int,
               batch_per_worker: int, seq_len: int, signature: str):
    self._streams = streams
    self._num_workers = num_workers
    self._shape = (len(streams), batch_per_worker, seq_len + 1)
    self._signature = signature

  @property
  def workers(self) -> list[int]:
    """The workers whose rows this iterator's batches hold, in order."""
    return list(self._streams)

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> np.ndarray:
    batch = np.empty(self._shape, dtype=np.int32)
    for row, stream in zip(batch, self._streams.values()):
      stream.fill(row.reshape(-1))
    return batch

  def get_state(self) -> dict[str, Any]:
    return {'format': STATE_FORMAT, 'signature': self._signature,
            'workers': [self._streams[w].position if w in self._streams else None
                        for w in range(self._num_workers)]}

  def set_state(self, state: dict[str, Any]) -> None:
    try:
      fmt, signature, workers = (
          state['format'], state['signature'], state['workers'])
      workers = [(int(d), int(o)) for d, o in workers]
    except (KeyError, TypeError, ValueError) as e:
      raise errors.DataError(
          'data iterator state is not a loco.data state (needs format, '
          f'signature and every worker\'s position); got {str(state)[:200]}.') from e
    if fmt != STATE_FORMAT:
      raise errors.DataError(
          f'data iterator state has format {fmt}; this loco reads format '
          f'{STATE_FORMAT}.')
    if signature != self._signature or len(workers) != self._num_workers:
      raise errors.DataError(
          'data iterator state was saved for another data setup (source, '
          'split, tokenizer, sharding, number of workers or seed differ); '
          'resume with the config of the run that saved it.')
    if any(d < 0 or o < 0 for d, o in workers):
      raise errors.DataError(f'data iterator state has negative positions: '
                             f'{workers}.')
    for w, stream in self._streams.items():
      stream.restore(*workers[w])

  def close(self) -> None:
    """Stops reader threads (TFDS sources); the iterator can still be used."""
    for stream in self._streams.values():
      stream.close()


def _signature(cfg: config_lib.DataConfig, docs: sources.Documents,
               tokenizer: tokenizers.Tokenizer, num_workers: int,
               seed: int) -> str:
  tok = {k: v for k, v in tokenizer.fingerprint().items() if k != 'model'}
  parts = [STATE_FORMAT, docs.identity, tok, cfg.sharding,
           cfg.noniid_by if cfg.sharding == 'noniid' else '', num_workers, seed]
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def make_train_iterator(cfg: config_lib.DataConfig, *, num_workers: int,
                        batch_per_worker: int, seq_len: int, seed: int,
                        workers: Sequence[int] | None = None) -> TrainIterator:
  """The training stream of all workers, from `cfg.train_split`.

  Args:
    cfg: the data config.
    num_workers: M, the leading axis of every batch.
    batch_per_worker: sequences per worker per batch.
    seq_len: model sequence length; windows have seq_len + 1 tokens.
    seed: seeds the iid share and every worker's per-epoch document order.
    workers: the workers to read (this process's, on several hosts); all by default.
      Worker w's stream is the same whichever others are read.

  Returns:
    A TrainIterator of int32 [len(workers), batch_per_worker, seq_len + 1].
  """
  tokenizer = tokenizers.make_tokenizer(cfg)
  docs = sources.open_documents(cfg, cfg.train_split)
  shares = sharding.worker_shares(
      docs, num_workers=num_workers, sharding=cfg.sharding,
      noniid_by=cfg.noniid_by, seed=seed)
  tokens = _TokenizedDocs(docs, tokenizer)
  threads = 0 if docs.in_memory else cfg.read_threads
  streams = {
      w: _WorkerStream(tokens, shares[w], sharding.seed32('order', seed, w),
                       tokenizer.eos_id, threads)
      for w in (range(num_workers) if workers is None else workers)
  }
  return TrainIterator(
      streams, num_workers=num_workers, batch_per_worker=batch_per_worker, seq_len=seq_len,
      signature=_signature(cfg, docs, tokenizer, num_workers, seed))


class EvalWindows(NamedTuple):
  """Fixed eval windows and the document each one reads (see `make_eval_windows`)."""

  tokens: np.ndarray     # int32 [batches, batch_size, seq_len + 1]
  docs: np.ndarray       # int32 [batches, batch_size]: the split's index of the document
                         # holding each window's middle token
  documents_read: int    # documents of the split the windows were drawn over
  split_documents: int   # documents in the split


def _eval_stream(cfg: config_lib.DataConfig, split: str, max_tokens: int):
  """The split's documents (EOS after each) in a fixed shuffled order, up to `max_tokens`.

  Returns (stream, starts, ids, docs, tokenizer): document k of the order begins at
  stream[starts[k]] and is document ids[k] of the split.
  """
  tokenizer = tokenizers.make_tokenizer(cfg)
  docs = sources.open_documents(cfg, split)
  eos = np.array([tokenizer.eos_id], dtype=np.int32)
  pieces, starts, ids, total = [], [], [], 0
  for j in range(len(docs)):
    index = sharding.shuffled_index(j, len(docs), EVAL_SEED)
    toks = tokenizer.encode_document(docs[index])
    pieces += [toks, eos]
    starts.append(total)
    ids.append(index)
    total += len(toks) + 1
    if total >= max_tokens:
      break
  return (np.concatenate(pieces).astype(np.int32), np.asarray(starts, np.int64),
          np.asarray(ids, np.int32), docs, tokenizer)


def make_eval_windows(cfg: config_lib.DataConfig, *, batch_size: int, seq_len: int,
                      num_batches: int, split: str | None = None) -> EvalWindows:
  """Fixed eval windows drawn across the whole split, with each window's document.

  The split's documents are concatenated (EOS after each) in a fixed shuffled order
  (`EVAL_SEED`, independent of the run's seed): the whole split, or its first
  `EVAL_MAX_TOKENS` tokens in that order for a very large split (C4's validation). That
  stream is cut into `num_batches * batch_size` equal strata and one window of
  `seq_len + 1` tokens is taken at a seeded offset inside each: the windows never
  overlap, every part of the split is read in proportion to its tokens, and every
  document that spans two strata is touched. Window k goes to batch k % num_batches, so
  every batch spans the split too. Runs of the same data, split and shapes get the same
  windows; `docs` lets a standard error be clustered by document.

  Raises:
    DataError: the split has fewer tokens than the windows need.
  """
  split = split or cfg.eval_split
  n, width = num_batches * batch_size, seq_len + 1
  stream, starts, ids, docs, _ = _eval_stream(cfg, split, EVAL_MAX_TOKENS)
  if len(stream) < n * width:
    raise errors.DataError(
        f'{docs.name} has {len(stream)} tokens, fewer than the {n * width} '
        f'needed for {num_batches} eval batches of {batch_size} x {width}; '
        'ask for fewer eval batches or use a larger eval split.')
  # Stratum k is [floor(k s), floor((k + 1) s)) with s = len / n >= width, so each holds
  # a window and the windows stay inside the stream.
  stride = len(stream) / n
  lo = np.floor(np.arange(n) * stride).astype(np.int64)
  hi = np.floor(np.arange(1, n + 1) * stride).astype(np.int64)
  offset = np.random.default_rng(EVAL_SEED).random(n)
  begin = lo + np.floor(offset * (hi - lo - width + 1)).astype(np.int64)
  windows = stream[begin[:, None] + np.arange(width)]
  owner = ids[np.searchsorted(starts, begin + width // 2, side='right') - 1]
  # Window k = j * num_batches + b sits in batch b, slot j.
  tokens = windows.reshape(batch_size, num_batches, width).transpose(1, 0, 2)
  owner = owner.reshape(batch_size, num_batches).T
  return EvalWindows(np.ascontiguousarray(tokens), np.ascontiguousarray(owner, np.int32),
                     documents_read=len(starts), split_documents=len(docs))


def unigram_entropy_nats(cfg: config_lib.DataConfig) -> float:
  """Unigram entropy of the eval split's tokens (EOS included), nats/token.

  The loss of a model that learned token frequencies and nothing else: about
  3.3 nats for the stdlib in bytes. Reads at most 4M tokens of the split.
  """
  stream, _, _, _, tokenizer = _eval_stream(cfg, cfg.eval_split, _ENTROPY_MAX_TOKENS)
  counts = np.bincount(stream, minlength=tokenizer.vocab_size)
  p = counts[counts > 0] / len(stream)
  return float(-(p * np.log(p)).sum())


def dataset_fingerprint(cfg: config_lib.DataConfig) -> dict[str, Any]:
  """What the run trained on, for config.json: source, counts, bytes, hashes."""
  info = sources.fingerprint(cfg)
  info['tokenizer'] = tokenizers.make_tokenizer(cfg).fingerprint()
  return info

