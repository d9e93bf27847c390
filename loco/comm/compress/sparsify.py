"""Sparsifiers: `select` keeps values (compact) and says how to scatter them back;
alone, a sparsifier sends them at their dtype (`then` codes them instead)."""

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from loco.comm.compress import chunking
from loco.comm.compress.base import (Compressor, Message, PyTree, index_width, size, stateless_init,
                                 value_width)
from loco.errors import ConfigError


class Selection(NamedTuple):
  """What a sparsifier keeps, before its values are coded.

  Attributes:
    values: list of compact arrays of kept values, one per tensor (`[chunks, k']`
      for chunked top-k), or one for the whole tree (`topk_global(scope='tree')`).
    index_bits: bits of the indices that locate them.
    scatter: maps coded `values` (same shapes) to the dense `(decoded, mask)` trees.
    capacity: kept values per tensor (`Message.capacity`); None for a whole-tree
      selection.
  """
  values: list[jax.Array]
  index_bits: int
  scatter: Callable[[list[jax.Array]], tuple[PyTree, PyTree]]
  capacity: tuple[int, ...] | None = None


class RandomKState(NamedTuple):
  """State of `random_k`: the payload of its last update and its own PRNG key."""
  bits: jax.Array
  key: jax.Array


def sparsifier(init: Callable, select: Callable) -> Compressor:
  """A sparsifier Compressor from its `select`: values sent at their own dtype."""

  def encode(updates, state, *, context=None):
    selection, state = select(updates, state, context=context)
    decoded, mask = selection.scatter(selection.values)
    value_bits = sum(size(v) * value_width(v) for v in selection.values)
    message = Message(decoded, mask, selection.index_bits, value_bits, 0, selection.capacity)
    return message, state._replace(bits=jnp.float32(message.bits))

  return Compressor(init, encode, 'sparsifier', select)


def _leafwise(treedef, outs) -> Selection:
  """A Selection from one (values, index bits, scatter) triple per tensor."""
  def scatter(values):
    pairs = [out[2](v) for out, v in zip(outs, values)]
    return (jax.tree.unflatten(treedef, [d for d, _ in pairs]),
            jax.tree.unflatten(treedef, [m for _, m in pairs]))

  return Selection([o[0] for o in outs], sum(o[1] for o in outs), scatter,
                   tuple(size(o[0]) for o in outs))


def _scatter_rows(shape, idx_CxK: jax.Array, vals_CxK: jax.Array, fill) -> jax.Array:
  rows = jnp.arange(shape[0])[:, None]
  return jnp.full(shape, fill, vals_CxK.dtype).at[rows, idx_CxK].set(vals_CxK)


def _chunked_select(k: int, chunk_size: int, dense_below: int, scores_fn, index_bits: bool):
  """select(updates, key) for a per-chunk sparsifier ranking `scores_fn(x, leaf_key)`."""
  side = chunking.check_chunk_size(chunk_size)
  if not isinstance(k, int) or not 1 <= k <= chunk_size:
    raise ConfigError(f'topk must be an integer in [1, chunk_size={chunk_size}] (values '
                      f'kept per chunk), got {k!r}.')
  if not isinstance(dense_below, int) or dense_below < 0:
    raise ConfigError(f'dense_below must be an integer >= 0, got {dense_below!r}.')

  def select_leaf(x, key):
    if size(x) < dense_below:
      # Sent whole: every value, no indices (the value codec still applies).
      return x, 0, lambda v: (v, jnp.ones(x.shape, bool))
    ch = chunking.layout(x.shape, side)
    kk = chunking.chunk_k(ch.chunk_len, k, chunk_size)
    x_CxL = chunking.to_chunks(x, ch)
    _, idx = jax.lax.top_k(scores_fn(x_CxL, key), kk)
    vals = jnp.take_along_axis(x_CxL, idx, axis=1)
    bits = ch.num_chunks * kk * index_width(ch.chunk_len) if index_bits else 0

    def scatter(v):
      dense = _scatter_rows(x_CxL.shape, idx, v, 0)
      mask = _scatter_rows(x_CxL.shape, idx, jnp.ones(idx.shape, bool), False)
      return chunking.from_chunks(dense, ch), chunking.from_chunks(mask, ch)

    return vals, bits, scatter

  def select_tree(updates, key=None):
    leaves, treedef = jax.tree.flatten(updates)
    keys = [None if key is None else jax.random.fold_in(key, i) for i in range(len(leaves))]
    return _leafwise(treedef, [select_leaf(x, k) for x, k in zip(leaves, keys)])

  return select_tree


def topk_chunks(k: int = 64, chunk_size: int = 4096, dense_below: int = 0) -> Compressor:
  """Keeps the k largest-magnitude values of every chunk (SparseLoCo / DeMo tiles).

  Matrices are cut into tiles of side <= sqrt(chunk_size) (see `chunking`), vectors
  into chunks of length <= sqrt(chunk_size); a chunk of `chunk_len` values keeps
  `max(1, round(chunk_len * k / chunk_size))` of them (constant density). Each kept
  value costs its dtype's width plus `ceil(log2(chunk_len))` index bits (12 for a
  64x64 tile). A tensor of fewer than `dense_below` values is sent whole, with no
  index bits.

  Args:
    k: values kept per full chunk, 1 <= k <= chunk_size (64 = 1.5625%, 128 = 3.125%).
    chunk_size: values per full chunk, a perfect square (4096 = 64 x 64 tiles).
    dense_below: tensors with fewer values are not sparsified (0: sparsify all).

  Returns:
    A `Compressor` of kind 'sparsifier'.

  References:
    SparseLoCo, arXiv 2508.15706; DeMo, arXiv 2411.19870.
  """
  select_tree = _chunked_select(k, chunk_size, dense_below,
                                lambda x, key: jnp.abs(x), True)

  def select(updates, state, *, context=None):
    del context
    return select_tree(updates), state

  return sparsifier(stateless_init, select)


def topk_global(density: float, scope: str = 'tensor') -> Compressor:
  """Keeps the largest-magnitude fraction `density` of each tensor, or of the tree.

  Without chunks an index addresses the whole tensor (or the whole concatenated tree
  for scope 'tree', whose kept values then travel as one float32 array): `ceil(log2
  n)` bits each.

  Args:
    density: fraction kept, in (0, 1]; each tensor keeps `max(1, round(density * n))`.
    scope: 'tensor' (top-k per tensor) or 'tree' (one top-k over all tensors).

  Returns:
    A `Compressor` of kind 'sparsifier'.

  References:
    Stich et al., arXiv 1809.07599 (top-k with memory).
  """
  if not 0.0 < density <= 1.0:
    raise ConfigError(f'density must be in (0, 1], got {density!r}.')
  if scope not in ('tensor', 'tree'):
    raise ConfigError(f"scope must be 'tensor' or 'tree', got {scope!r}.")

  def top(x):
    n, flat_N = size(x), x.reshape(-1)
    kk = max(1, round(density * n))
    _, idx = jax.lax.top_k(jnp.abs(flat_N), kk)
    scatter = lambda v: (jnp.zeros((n,), v.dtype).at[idx].set(v).reshape(x.shape),
                         jnp.zeros((n,), bool).at[idx].set(True).reshape(x.shape))
    return flat_N[idx], kk * index_width(n), scatter

  def select(updates, state, *, context=None):
    del context
    leaves, treedef = jax.tree.flatten(updates)
    if scope == 'tensor':
      return _leafwise(treedef, [top(x) for x in leaves]), state
    splits = list(np.cumsum([size(x) for x in leaves])[:-1])
    vals, bits, scatter_flat = top(
        jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in leaves]))

    def scatter(values):
      dense, mask = (jnp.split(t, splits) for t in scatter_flat(values[0]))
      return (jax.tree.unflatten(treedef, [d.reshape(x.shape).astype(x.dtype)
                                           for d, x in zip(dense, leaves)]),
              jax.tree.unflatten(treedef, [m.reshape(x.shape) for m, x in zip(mask, leaves)]))

    return Selection([vals], bits, scatter), state

  return sparsifier(stateless_init, select)


def random_k(k: int = 64, chunk_size: int = 4096, dense_below: int = 0,
             seed: int = 0) -> Compressor:
  """Keeps k random values of every chunk (same chunking and density as topk_chunks).

  The key is `context.key` (the tick's key, shared by all workers) when given, else
  the compressor's own key (seeded by `seed`, split at every update; also the same on
  every worker). Either way the selection is common knowledge: receivers regenerate
  it from the key, so no index bits travel, and all workers keep the same coordinates
  (SparTA-style shared random masks; a quantizer's dither, in contrast, is per worker).

  Args:
    k: values kept per full chunk, 1 <= k <= chunk_size.
    chunk_size: values per full chunk, a perfect square.
    dense_below: tensors with fewer values are not sparsified (0: sparsify all).
    seed: seed of the own key, used when no context key is given.

  Returns:
    A `Compressor` of kind 'sparsifier'.

  References:
    Stich et al., arXiv 1809.07599 (rand-k); SparseLoCo, arXiv 2508.15706 (random-k).
  """
  scores = lambda x, key: jax.random.uniform(key, x.shape)
  select_tree = _chunked_select(k, chunk_size, dense_below, scores, index_bits=False)

  def init(params):
    del params
    return RandomKState(jnp.zeros((), jnp.float32), jax.random.key(seed))

  def select(updates, state, *, context=None):
    next_key, key = jax.random.split(state.key)
    if context is not None and context.key is not None:
      next_key, key = state.key, context.key
    return select_tree(updates, key), state._replace(key=next_key)

  return sparsifier(init, select)
