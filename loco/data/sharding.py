"""Which documents each worker trains on: iid shares or non-iid parts.

- iid: a seeded global shuffle of all documents, then document i of that order
  goes to worker i % M: disjoint shares of (almost) equal size.
- noniid by 'file': worker w gets the contiguous range [w N / M, (w+1) N / M)
  of the documents in stored order (sorted paths for local corpora, so workers
  see different packages of the stdlib; the stored order for TFDS datasets).
- noniid by 'cluster': deterministic k-means (k = M, documents weighted by
  length) on each document's square-rooted byte-unigram distribution; worker
  w gets cluster w (DiLoCo's non-iid setting, arXiv 2311.08105). Sizes are
  unbalanced by design (on the stdlib with M = 8: 0.1 to 9 MB per worker).

Non-iid parts depend only on the data and M, never on the seed, so that a seed
sweep varies initialisation and order but not the heterogeneity.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import grain
import numpy as np

from loco import errors
from loco.data import sources

# k-means reads every document; beyond this, slice the split ('train[:1%]').
MAX_CLUSTER_DOCS = 200_000
_KMEANS_ITERS = 100


class Share(Protocol):
  """The documents of one worker: `share[j]` is a document index."""

  def __len__(self) -> int:
    ...

  def __getitem__(self, j: int) -> int:
    ...


def seed32(*parts: object) -> int:
  """A 32-bit seed from any values, stable across processes and machines."""
  digest = hashlib.sha256(repr(parts).encode()).digest()
  return int.from_bytes(digest[:4], 'little')


def shuffled_index(index: int, size: int, seed: int) -> int:
  """Position `index` of a seeded permutation of range(size), O(1) memory."""
  if size == 1:
    return 0
  return grain.experimental.index_shuffle(
      index, max_index=size - 1, seed=seed, rounds=4)


class IidShare:
  """Every M-th document of a seeded global permutation, from `worker` on."""

  def __init__(self, num_docs: int, num_workers: int, worker: int, seed: int):
    self._num_docs, self._num_workers, self._worker = (
        num_docs, num_workers, worker)
    self._seed = seed32('iid', seed)
    self._len = (num_docs - worker + num_workers - 1) // num_workers

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, j: int) -> int:
    return shuffled_index(self._worker + j * self._num_workers,
                          self._num_docs, self._seed)


class IndexShare:
  """An explicit, sorted list of document indices."""

  def __init__(self, indices: np.ndarray):
    self.indices = np.asarray(indices, dtype=np.int64)

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, j: int) -> int:
    return int(self.indices[j])


def byte_features(docs: sources.Documents) -> np.ndarray:
  """Square-rooted byte-unigram distribution per document, [N, 256] float64.

  The square root (Hellinger embedding) keeps rare bytes, such as the ones
  that mark docstrings or non-ASCII text, from being drowned by spaces.
  """
  feats = np.zeros((len(docs), 256), dtype=np.float64)
  for i in range(len(docs)):
    counts = np.bincount(np.frombuffer(docs[i], dtype=np.uint8), minlength=256)
    if counts.sum():
      feats[i] = np.sqrt(counts / counts.sum())
  return feats


def kmeans(x: np.ndarray, k: int, *, weights: np.ndarray | None = None,
           seed: int = 0) -> np.ndarray:
  """Deterministic weighted k-means (k-means++ init, Lloyd), no empty cluster.

  Labels are renumbered so that cluster c's first member precedes cluster
  c+1's first member.

  Args:
    x: [N, D] points, N >= k.
    k: number of clusters.
    weights: [N] positive point weights (default 1).
    seed: seed of the k-means++ initialisation.

  Returns:
    [N] int64 labels in [0, k).
  """
  n = len(x)
  w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
  rng = np.random.default_rng(seed)
  sq = (x * x).sum(1)
  first = int(rng.choice(n, p=w / w.sum()))
  centers = [x[first]]
  d2 = ((x - x[first]) ** 2).sum(1)
  for _ in range(1, k):
    mass = w * d2
    i = (int(rng.choice(n, p=mass / mass.sum())) if mass.sum() > 0
         else int(rng.integers(n)))
    centers.append(x[i])
    d2 = np.minimum(d2, ((x - x[i]) ** 2).sum(1))
  c = np.stack(centers)
  labels = np.full(n, -1, dtype=np.int64)
  for _ in range(_KMEANS_ITERS):
    dist = sq[:, None] - 2.0 * (x @ c.T) + (c * c).sum(1)[None, :]
    new = dist.argmin(1)
    counts = np.bincount(new, minlength=k)
    for empty in np.flatnonzero(counts == 0):
      # Refill an empty cluster with the worst-fitting point of a cluster that
      # can spare one (duplicate documents make this happen).
      cost = dist[np.arange(n), new] + 0.0
      cost[counts[new] <= 1] = -np.inf
      far = int(np.argmax(cost))
      counts[new[far]] -= 1
      new[far] = empty
      counts[empty] = 1
    if np.array_equal(new, labels):
      break
    labels = new
    c = np.stack([np.average(x[labels == j], axis=0, weights=w[labels == j])
                  for j in range(k)])
  order = np.argsort([np.flatnonzero(labels == j)[0] for j in range(k)],
                     kind='stable')
  return np.argsort(order)[labels]


def worker_shares(docs: sources.Documents, *, num_workers: int, sharding: str,
                  noniid_by: str, seed: int) -> list[Share]:
  """Disjoint document shares, one per worker, each non-empty."""
  n = len(docs)
  if n < num_workers:
    raise errors.DataError(
        f'{docs.name} has {n} documents, fewer than the {num_workers} workers; '
        'every worker needs at least one document.')
  if sharding == 'iid':
    return [IidShare(n, num_workers, w, seed) for w in range(num_workers)]
  if noniid_by == 'file':
    bounds = [w * n // num_workers for w in range(num_workers + 1)]
    return [range(bounds[w], bounds[w + 1]) for w in range(num_workers)]
  if n > MAX_CLUSTER_DOCS:
    raise errors.DataError(
        f"{docs.name} has {n} documents; noniid_by='cluster' reads them all "
        f'and allows at most {MAX_CLUSTER_DOCS}: slice the split (e.g. '
        "train_split='train[:100000]') or use noniid_by='file'.")
  # Weighted by length: clusters then split the text, not the file count
  # (unweighted, tiny files form clusters of a few KB on the stdlib).
  sizes = np.array([max(len(docs[i]), 1) for i in range(n)], dtype=np.float64)
  labels = kmeans(byte_features(docs), num_workers, weights=sizes)
  return [IndexShare(np.flatnonzero(labels == w)) for w in range(num_workers)]
