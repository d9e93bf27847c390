"""Training and eval batches: tokenize, pack, shard over workers, resume.

Each worker reads its share of the documents (`sharding.py`) in a seeded order that is
reshuffled every epoch, packed with EOS after each document and cut into windows of
`seq_len + 1` tokens (no padding); the trainer uses `w[:-1]` as inputs and `w[1:]` as
targets. How a worker's rows are drawn is `DataConfig.sampling` (`sampling.py`):
'windows' (the default) makes every row an independent window of the worker's share,
read without replacement within an epoch; 'stream' is loco's old layout, consecutive
windows of one token stream per worker.

A worker's position is two integers, and the document order and window permutations are
pure functions of (seed, worker, epoch, pool) through `grain.experimental.index_shuffle`,
so the state `{'format', 'signature', 'sampling', ..., 'workers': [[a, b], ...]}` is all
that a checkpoint needs, and restoring it replays exactly the same batches. A TFDS
source is read ahead by grain threads (`DataConfig.read_threads`); local corpora are in
memory already.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple, Sequence

import numpy as np

from loco import errors
from loco.data import config as config_lib
from loco.data import sampling as sampling_lib
from loco.data import sharding
from loco.data import sources
from loco.data import tokenizers

# Format 2 names its sampling; format 1 (no 'sampling' key) was the stream layout's.
STATE_FORMAT = 2
_SIGNATURE_VERSION = 1   # what the data-setup signature hashes; format 1 states share it
EVAL_SEED = 0  # The eval document order and window offsets never depend on the run's seed.
EVAL_MAX_TOKENS = 16_000_000  # Eval windows are drawn over at most this much of a split.
_ENTROPY_MAX_TOKENS = 4_000_000


class TrainIterator:
  """Endless int32 batches [len(workers), batch_per_worker, seq_len + 1].

  Each batch holds the workers this iterator reads (all `num_workers` by default;
  on several hosts a process reads only its own). `get_state()` returns a small
  JSON-serialisable dict with every worker's position (None for a worker not read
  here: `placement.every_position` gathers the processes'); `set_state(state)` on an
  iterator made with the same data config, workers, seed and seq_len continues with
  exactly the batches the original would have produced next (the batch size may
  differ: a position counts windows or tokens, not batches).
  """

  def __init__(self, readers: dict[int, Any], *, num_workers: int,
               batch_per_worker: int, seq_len: int, signature: str,
               layout: dict[str, Any]):
    self._readers = readers
    self._num_workers = num_workers
    self._shape = (len(readers), batch_per_worker, seq_len + 1)
    self._signature = signature
    self._layout = layout     # {'sampling': ..., and the windows' sizes}

  @property
  def workers(self) -> list[int]:
    """The workers whose rows this iterator's batches hold, in order."""
    return list(self._readers)

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> np.ndarray:
    batch = np.empty(self._shape, dtype=np.int32)
    for rows, reader in zip(batch, self._readers.values()):
      reader.read(rows)
    return batch

  def next_with_documents(self) -> tuple[np.ndarray, list[list[np.ndarray]]]:
    """The next batch and, per worker and row, the indices (into the training split) of
    the documents the row reads: for measuring a layout (scripts/batch_documents.py)."""
    batch = np.empty(self._shape, dtype=np.int32)
    docs = []
    for rows, reader in zip(batch, self._readers.values()):
      docs.append([])
      reader.read(rows, docs[-1])
    return batch, docs

  def get_state(self) -> dict[str, Any]:
    return {'format': STATE_FORMAT, 'signature': self._signature, **self._layout,
            'workers': [self._readers[w].position if w in self._readers else None
                        for w in range(self._num_workers)]}

  def set_state(self, state: dict[str, Any]) -> None:
    try:
      fmt, signature, workers = (
          state['format'], state['signature'], state['workers'])
      workers = [(int(a), int(b)) for a, b in workers]
    except (KeyError, TypeError, ValueError) as e:
      raise errors.DataError(
          'data iterator state is not a loco.data state (needs format, '
          f'signature and every worker\'s position); got {str(state)[:200]}.') from e
    if fmt not in (1, STATE_FORMAT):
      raise errors.DataError(
          f'data iterator state has format {fmt}; this loco reads formats 1 and '
          f'{STATE_FORMAT}.')
    if signature != self._signature or len(workers) != self._num_workers:
      raise errors.DataError(
          'data iterator state was saved for another data setup (source, '
          'split, tokenizer, sharding, number of workers or seed differ); '
          'resume with the config of the run that saved it.')
    saved = ({'sampling': 'stream'} if fmt == 1 else
             {k: state.get(k) for k in self._layout})
    if saved.get('sampling') != self._layout['sampling']:
      was = ('the stream layout (format 1, from before independent-row batches)'
             if fmt == 1 else f"data.sampling='{saved.get('sampling')}'")
      raise errors.DataError(
          f'data iterator state was saved with {was}; this run reads '
          f"data.sampling='{self._layout['sampling']}'. Resume it with "
          f"--config.data.sampling={saved.get('sampling')}, or start a new run.")
    if saved != self._layout:
      raise errors.DataError(
          f'data iterator state was saved for windows of {saved.get("window")} tokens '
          f'in pools of {saved.get("pool_tokens")}; this run reads windows of '
          f'{self._layout["window"]} in pools of {self._layout["pool_tokens"]} '
          '(seq_len + 1 and data.window_pool_tokens); resume with the run\'s own.')
    if any(a < 0 or b < 0 for a, b in workers):
      raise errors.DataError(f'data iterator state has negative positions: '
                             f'{workers}.')
    for w, reader in self._readers.items():
      reader.restore(*workers[w])

  def close(self) -> None:
    """Stops reader threads (TFDS sources); the iterator can still be used."""
    for reader in self._readers.values():
      reader.close()


def _signature(cfg: config_lib.DataConfig, docs: sources.Documents,
               tokenizer: tokenizers.Tokenizer, num_workers: int,
               seed: int) -> str:
  tok = {k: v for k, v in tokenizer.fingerprint().items() if k != 'model'}
  parts = [_SIGNATURE_VERSION, docs.identity, tok, cfg.sharding,
           cfg.noniid_by if cfg.sharding == 'noniid' else '', num_workers, seed]
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def make_train_iterator(cfg: config_lib.DataConfig, *, num_workers: int,
                        batch_per_worker: int, seq_len: int, seed: int,
                        workers: Sequence[int] | None = None) -> TrainIterator:
  """The training batches of all workers, from `cfg.train_split`.

  Args:
    cfg: the data config (`cfg.sampling`: how rows are drawn, see `sampling.py`).
    num_workers: M, the leading axis of every batch.
    batch_per_worker: sequences per worker per batch.
    seq_len: model sequence length; windows have seq_len + 1 tokens.
    seed: seeds the iid share, every worker's per-epoch document order and its
      window permutations.
    workers: the workers to read (this process's, on several hosts); all by default.
      Worker w's rows are the same whichever others are read.

  Returns:
    A TrainIterator of int32 [len(workers), batch_per_worker, seq_len + 1].
  """
  tokenizer = tokenizers.make_tokenizer(cfg)
  docs = sources.open_documents(cfg, cfg.train_split)
  shares = sharding.worker_shares(
      docs, num_workers=num_workers, sharding=cfg.sharding,
      noniid_by=cfg.noniid_by, seed=seed)
  tokens = sampling_lib.TokenizedDocs(docs, tokenizer)
  threads = 0 if docs.in_memory else cfg.read_threads
  window = seq_len + 1
  if cfg.sampling == 'windows':
    layout = {'sampling': 'windows', 'window': window,
              'pool_tokens': cfg.window_pool_tokens}
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32
    make = lambda *a: sampling_lib.WindowReader(
        *a, pool_tokens=cfg.window_pool_tokens, dtype=dtype, window=window)
  else:
    layout = {'sampling': 'stream'}
    make = lambda *a: sampling_lib.StreamReader(*a, window=window)
  readers = {
      w: make(tokens, shares[w], sharding.seed32('order', seed, w), tokenizer.eos_id,
              threads)
      for w in (range(num_workers) if workers is None else workers)
  }
  return TrainIterator(
      readers, num_workers=num_workers, batch_per_worker=batch_per_worker,
      seq_len=seq_len, signature=_signature(cfg, docs, tokenizer, num_workers, seed),
      layout=layout)


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

