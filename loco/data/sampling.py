"""How one worker's batch rows are drawn from its share: independent windows or a stream.

Both layouts read the worker's share (`sharding.py`) in a seeded document order that is
reshuffled every epoch (document k of the worker's endless order is share entry
`permutation_e(k % n)` of epoch e = k // n), each document followed by EOS, packed and
cut into windows of `seq_len + 1` tokens with no padding.

- **'windows'** (the default; what the data loaders of the papers loco simulates do):
  the order is read in *pools* of whole documents holding at least `pool_tokens` tokens
  (a pool ends early at the end of an epoch, so a share smaller than `pool_tokens` is one
  pool per epoch and its permutation is global). A pool is packed and cut into windows,
  and its windows are read in a seeded permutation (`grain.experimental.index_shuffle`):
  every row of a batch is an independent window, the rows of one step come from
  different places of the pool, consecutive steps do not continue each other's
  documents, and every window of a pool is read once (the pool's last partial window,
  fewer than `seq_len + 1` tokens, is left out). Held in memory: the current pool
  (`pool_tokens` tokens as uint16 for vocabularies up to 65,536, else int32) and its
  documents' starts; documents are read on demand when a pool is filled (a TFDS source
  through grain reader threads, and the next pool is packed on a background thread while
  the current one is read, so the tokenizing of a pool overlaps training: two pools in
  memory then), so C4 at hundreds of GB is never materialised.
  Position: `[k, j]`, the pool's first document in the worker's order and how many of
  the pool's windows were read.
- **'stream'** (loco's layout before independent rows): consecutive windows of one
  endless token stream, so a row continues the row before it and a worker reads one
  document for as many steps as the document lasts. Kept so that results made with it
  can be reproduced; it makes every worker fine-tune on one file for many rounds and
  confounds comparisons across worker counts. Position: `[k, offset]`, the current
  document in the worker's order and the tokens of it (EOS included) consumed.

Either position is two integers per worker and a pure function of the rows read, so a
checkpoint holds it and a restored reader replays exactly the rows the uninterrupted one
would have read. A pool's windows do not depend on the batch size, so a windows position
is valid for any batch size (not for another `seq_len`).
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Iterator

import grain
import numpy as np

from loco import errors
from loco.data import sharding

SAMPLINGS = ('windows', 'stream')
_ENDLESS = 2**62


class TokenizedDocs:
  """`tokens(i)`: document i's tokens, without EOS."""

  def __init__(self, docs, tokenizer):
    self._docs, self._tokenizer = docs, tokenizer
    # Bytes cost nothing to "tokenize" (a uint8 view); other tokenizers on an in-memory
    # corpus are worth caching, since every epoch reads every document again.
    cache = tokenizer.name != 'bytes'
    self._cache: dict[int, np.ndarray] | None = (
        {} if cache and docs.in_memory else None)

  def __call__(self, i: int) -> np.ndarray:
    if self._cache is None:
      return self._tokenizer.encode_document(self._docs[i])
    if i not in self._cache:
      self._cache[i] = self._tokenizer.encode_document(self._docs[i])
    return self._cache[i]


class _ShareReader:
  """The worker's documents in its endless, per-epoch reshuffled order."""

  def __init__(self, tokens: TokenizedDocs, share: sharding.Share, seed: int,
               eos_id: int, read_threads: int, window: int):
    self._tokens, self._share = tokens, share
    self._seed, self._eos, self._threads = seed, eos_id, read_threads
    self._window = window
    self._reader: Iterator[np.ndarray] | None = None
    self._reader_at = 0   # the order index of the document the reader yields next

  def doc_index(self, k: int) -> int:
    """The document read k-th by this worker (epoch k // len(share))."""
    # Pure in k: grain's reader threads call it concurrently.
    epoch, t = divmod(k, len(self._share))
    return self._share[sharding.shuffled_index(
        t, len(self._share), sharding.seed32(self._seed, epoch))]

  def _load(self, k: int) -> np.ndarray:
    return self._tokens(self.doc_index(k))

  def _document(self, k: int) -> np.ndarray:
    """Document k of the order; sequential calls share one read-ahead reader."""
    if self._reader is None or self._reader_at != k:
      self.close()
      if not self._threads:
        self._reader = map(self._load, itertools.count(k))
      else:
        dataset = grain.MapDataset.range(k, _ENDLESS).map(self._load)
        self._reader = iter(dataset.to_iter_dataset(grain.ReadOptions(
            num_threads=self._threads, prefetch_buffer_size=8 * self._threads)))
      self._reader_at = k
    self._reader_at += 1
    return next(self._reader)

  def close(self) -> None:
    close = getattr(self._reader, 'close', None)
    if close is not None:
      close()
    self._reader = None


class _Stopped(Exception):
  """A background pool was cancelled."""


class _Background:
  """`fn(first, stop)` on a daemon thread: the next pool, packed ahead."""

  def __init__(self, fn: Callable, first: int):
    self.first = first
    self._stop, self._done = threading.Event(), threading.Event()
    self._result, self._error = None, None
    threading.Thread(target=self._run, args=(fn,), daemon=True).start()

  def _run(self, fn: Callable) -> None:
    try:
      self._result = fn(self.first, self._stop)
    except BaseException as e:  # pylint: disable=broad-except  (re-raised by result())
      self._error = e
    finally:
      self._done.set()

  def result(self):
    self._done.wait()
    if self._error is not None:
      raise self._error
    return self._result

  def cancel(self) -> None:
    self._stop.set()
    self._done.wait()


class WindowReader(_ShareReader):
  """Independent windows: a seeded permutation of each pool's windows (the default)."""

  def __init__(self, *args, pool_tokens: int, dtype: np.dtype, **kwargs):
    super().__init__(*args, **kwargs)
    self._pool_tokens, self._dtype = pool_tokens, dtype
    self._first, self._read = 0, 0    # the position [k, j]
    self._pool: tuple[np.ndarray, np.ndarray, np.ndarray, int, int] | None = None
    self._next: _Background | None = None   # a source read on demand packs ahead

  @property
  def position(self) -> list[int]:
    return [self._first, self._read]

  def restore(self, first: int, read: int) -> None:
    self.close()
    self._pool = None
    self._first, self._read = first, read

  def close(self) -> None:
    if self._next is not None:
      self._next.cancel()
      self._next = None
    super().close()

  def _pack(self, first: int, stop: threading.Event | None = None):
    """The pool of documents first, first + 1, ... (see the module docstring)."""
    n, w = len(self._share), self._window
    eos = np.array([self._eos], self._dtype)
    pieces, starts, ids, total, k = [], [], [], 0, first
    while True:
      if stop is not None and stop.is_set():
        raise _Stopped
      toks = self._document(k)
      pieces += [toks, eos]
      starts.append(total)
      ids.append(self.doc_index(k))
      total += len(toks) + 1
      k += 1
      if total >= w and (total >= self._pool_tokens or k % n == 0):
        break
    windows = total // w
    pool = np.concatenate(pieces, dtype=self._dtype, casting='unsafe')[:windows * w]
    return (pool.reshape(windows, w), np.asarray(starts, np.int64),
            np.asarray(ids, np.int64), k, sharding.seed32(self._seed, 'pool', first))

  def _fill_pool(self) -> None:
    if self._next is not None and self._next.first == self._first:
      self._pool = self._next.result()
    else:
      self.close()
      self._pool = self._pack(self._first)
    self._next = (_Background(self._pack, self._pool[3]) if self._threads else None)
    windows = len(self._pool[0])
    if self._read >= windows:
      raise errors.DataError(
          f'data iterator state points at window {self._read} of a pool of {windows} '
          'windows; the state does not belong to this data.')

  def read(self, out: np.ndarray, docs: list | None = None) -> None:
    """Writes the next len(out) windows into `out` [rows, window]; with `docs`, appends
    each row's documents (indices into the split) to it."""
    for r in range(len(out)):
      if self._pool is None:
        self._fill_pool()
      windows, starts, ids, end, seed = self._pool
      i = sharding.shuffled_index(self._read, len(windows), seed)
      out[r] = windows[i]
      if docs is not None:
        lo = np.searchsorted(starts, i * self._window, side='right') - 1
        hi = np.searchsorted(starts, (i + 1) * self._window - 1, side='right')
        docs.append(ids[lo:hi])
      self._read += 1
      if self._read == len(windows):
        self._first, self._read, self._pool = end, 0, None


class StreamReader(_ShareReader):
  """Consecutive windows of one endless token stream ('stream': loco's old layout)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._doc, self._offset = 0, 0
    self._current: np.ndarray | None = None

  @property
  def position(self) -> list[int]:
    return [self._doc, self._offset]

  def restore(self, doc: int, offset: int) -> None:
    self.close()
    self._current = None
    self._doc, self._offset = doc, offset

  def read(self, out: np.ndarray, docs: list | None = None) -> None:
    """Writes the next out.size tokens of the stream into `out` [rows, window]; with
    `docs`, appends each row's documents (indices into the split) to it."""
    flat = out.reshape(-1)
    pos, need = 0, len(flat)
    pieces = []     # (first token, document) of each piece written
    while pos < need:
      if self._current is None:
        self._current = self._document(self._doc)
        if self._offset > len(self._current):
          raise errors.DataError(
              f'data iterator state points at token {self._offset} of a '
              f'document with {len(self._current)} tokens; the state does not '
              'belong to this data.')
        if docs is not None:
          pieces.append((pos, self.doc_index(self._doc)))
      elif docs is not None and not pieces:
        pieces.append((pos, self.doc_index(self._doc)))
      n = len(self._current)
      if self._offset < n:
        take = min(n - self._offset, need - pos)
        flat[pos:pos + take] = self._current[self._offset:self._offset + take]
        pos += take
        self._offset += take
      if pos < need and self._offset == n:
        flat[pos] = self._eos
        pos += 1
        self._offset += 1
      if self._offset == n + 1:
        self._doc += 1
        self._offset = 0
        self._current = None
    if docs is not None:
      first = np.array([p for p, _ in pieces])
      owner = np.array([d for _, d in pieces], np.int64)
      for r in range(len(out)):
        lo = np.searchsorted(first, r * self._window, side='right') - 1
        hi = np.searchsorted(first, (r + 1) * self._window - 1, side='right')
        docs.append(owner[lo:hi])
