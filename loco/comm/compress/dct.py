"""DeMo's codec: each tile's 2-D DCT, its k largest coefficients sent, decoded after the sum.

A tensor is cut into tiles as `chunking` cuts it (sides: the largest divisors of its
matrix view's dimensions <= `chunk`; vectors into chunks of that length), each tile
is taken to its orthonormal 2-D DCT-II coefficients in place (so the code domain has
the tensor's own shape), and the k coefficients of largest magnitude of each tile are
sent with their indices. `decode` is the inverse DCT of every tile: linear, so the
collectives average coefficients (DeMo's scatter-mean over the workers that sent
each one) and decode once, after the sum.
"""

import jax
import jax.numpy as jnp
import numpy as np

from loco.comm.compress import chunking
from loco.comm.compress.base import (Compressor, Message, PyTree, index_width, size, stateless_init,
                                 value_width)
from loco.errors import ConfigError


def dct_matrix(n: int) -> np.ndarray:
  """The orthonormal DCT-II matrix D (n x n): coefficients = D @ x, x = D.T @ coefficients."""
  k, i = np.meshgrid(np.arange(n), np.arange(n), indexing='ij')
  d = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
  d[0] /= np.sqrt(2.0)
  return d.astype(np.float32)


def _tiles(x: jax.Array, ch: chunking.Layout) -> jax.Array:
  """x -> [num_chunks, r, c] tiles (r = 1 for vectors)."""
  return chunking.to_chunks(x, ch).reshape(ch.num_chunks, *ch.tile)


def _untile(t_CxRxC: jax.Array, ch: chunking.Layout) -> jax.Array:
  return chunking.from_chunks(t_CxRxC.reshape(ch.num_chunks, ch.chunk_len), ch)


def _basis(ch: chunking.Layout) -> tuple[jax.Array, jax.Array]:
  return tuple(jnp.asarray(dct_matrix(n)) for n in ch.tile)


def _forward(x: jax.Array, ch: chunking.Layout) -> jax.Array:
  dr, dc = _basis(ch)
  t = _tiles(x.astype(jnp.float32), ch)
  return _untile(jnp.einsum('ij,cjk,lk->cil', dr, t, dc), ch)


def _inverse(coefficients: jax.Array, ch: chunking.Layout) -> jax.Array:
  dr, dc = _basis(ch)
  t = _tiles(coefficients.astype(jnp.float32), ch)
  return _untile(jnp.einsum('ji,cjk,kl->cil', dr, t, dc), ch).astype(coefficients.dtype)


def dct_topk(k: int = 32, chunk: int = 64) -> Compressor:
  """DeMo's fast-component extraction: the top-k coefficients of each tile's 2-D DCT.

  Each tile (at most `chunk` x `chunk`; a vector's chunks at most `chunk` long) keeps
  `min(k, tile size)` coefficients, as DeMo's reference code clamps k (a 64-long
  vector chunk keeps 32 of 64). A kept coefficient costs its float32 width plus
  `ceil(log2(tile size))` index bits (a real encoder's packed index; DeMo's code
  sends int64 indices).

  Args:
    k: coefficients kept per tile (DeMo: 32).
    chunk: the largest tile side (DeMo: 64).

  Returns:
    A `Compressor` of kind 'sparsifier' whose message holds DCT coefficients and whose
    `decode` is the tiles' inverse DCT.

  References:
    DeMo, arXiv 2411.19870 (Algorithm 1, the DCT-based extraction).
  """
  if not isinstance(k, int) or isinstance(k, bool) or k < 1:
    raise ConfigError(f'algorithm.compression_topk must be an integer >= 1 (DCT coefficients '
                      f'kept per tile), got {k!r}.')
  if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
    raise ConfigError(f'algorithm.compression_chunk must be an integer >= 1 (the largest DCT '
                      f'tile side), got {chunk!r}.')

  def layout(x) -> chunking.Layout:
    return chunking.layout(np.shape(x), chunk)

  def encode_leaf(x):
    ch = layout(x)
    kk = min(k, ch.chunk_len)
    coefficients_CxL = chunking.to_chunks(_forward(x, ch), ch)
    _, idx = jax.lax.top_k(jnp.abs(coefficients_CxL), kk)
    rows = jnp.arange(ch.num_chunks)[:, None]
    kept = jnp.zeros_like(coefficients_CxL).at[rows, idx].set(
        jnp.take_along_axis(coefficients_CxL, idx, axis=1))
    mask = jnp.zeros(coefficients_CxL.shape, bool).at[rows, idx].set(True)
    sent = ch.num_chunks * kk
    return (chunking.from_chunks(kept, ch).astype(x.dtype), chunking.from_chunks(mask, ch),
            sent * index_width(ch.chunk_len), sent * value_width(x), sent)

  def encode(updates, state, *, context=None):
    del context
    leaves, treedef = jax.tree.flatten(updates)
    outs = [encode_leaf(x) for x in leaves]
    message = Message(jax.tree.unflatten(treedef, [o[0] for o in outs]),
                      jax.tree.unflatten(treedef, [o[1] for o in outs]),
                      sum(o[2] for o in outs), sum(o[3] for o in outs), 0,
                      tuple(o[4] for o in outs))
    return message, state._replace(bits=jnp.float32(message.bits))

  def decode(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda c: _inverse(c, layout(c)) if size(c) else c, tree)

  return Compressor(stateless_init, encode, 'sparsifier', decode=decode)
