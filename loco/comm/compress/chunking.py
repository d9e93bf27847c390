"""Chunking: the SparseLoCo reference code's ChunkingTransform, without the DCT.

A matrix is cut into tiles whose side along each dimension is its largest divisor
<= sqrt(chunk_size) (64 for 4096), a vector into chunks of that length. A tensor of
rank > 2 is first viewed as the matrix whose sides are closest to square, the first
on a tie (a (d, 3, h, k) qkv kernel is (d, 3hk), a (h, k, d) output kernel (hk, d)):
the reference code's torch `Linear` weights, up to a transpose.
"""

import math
from typing import NamedTuple

import jax

from loco.errors import ConfigError


def largest_divisor_at_most(n: int, cap: int) -> int:
  """The largest divisor of n that is <= cap (n itself when n <= cap)."""
  return next((d for d in range(min(n, cap), 0, -1) if n % d == 0), 1)


def _matrix_view(shape: tuple[int, ...]) -> tuple[int, int]:
  """A rank > 2 shape as the (rows, cols) split of its dims closest to square."""
  splits = [(math.prod(shape[:i]), math.prod(shape[i:])) for i in range(1, len(shape))]
  return min(splits, key=lambda rc: max(rc) / max(1, min(rc)))   # the first on a tie


class Layout(NamedTuple):
  """How one tensor is cut into chunks: (rows, r, cols, c) tiles, or a vector."""
  shape: tuple[int, ...]
  matrix: tuple[int, int] | None   # (rows, cols) for rank >= 2, None for vectors
  tile: tuple[int, int]            # (r, c) for matrices, (1, c) for vectors
  num_chunks: int
  chunk_len: int


def layout(shape: tuple[int, ...], side: int) -> Layout:
  shape = tuple(shape)
  if len(shape) >= 2:
    rows, cols = shape if len(shape) == 2 else _matrix_view(shape)
    r, c = largest_divisor_at_most(rows, side), largest_divisor_at_most(cols, side)
    return Layout(shape, (rows, cols), (r, c), (rows // r) * (cols // c), r * c)
  n = math.prod(shape)
  c = largest_divisor_at_most(n, side)
  return Layout(shape, None, (1, c), n // c, c)


def to_chunks(x: jax.Array, ch: Layout) -> jax.Array:
  """x -> [num_chunks, chunk_len]."""
  if ch.matrix is None:
    return x.reshape(ch.num_chunks, ch.chunk_len)
  (rows, cols), (r, c) = ch.matrix, ch.tile
  x = x.reshape(rows // r, r, cols // c, c).transpose(0, 2, 1, 3)
  return x.reshape(ch.num_chunks, ch.chunk_len)


def from_chunks(x_CxL: jax.Array, ch: Layout) -> jax.Array:
  if ch.matrix is None:
    return x_CxL.reshape(ch.shape)
  (rows, cols), (r, c) = ch.matrix, ch.tile
  x = x_CxL.reshape(rows // r, cols // c, r, c).transpose(0, 2, 1, 3)
  return x.reshape(ch.shape)


def check_chunk_size(chunk_size: int, name: str = 'chunk_size') -> int:
  """The tile side sqrt(chunk_size); raises unless chunk_size is a positive square."""
  side = math.isqrt(chunk_size) if isinstance(chunk_size, int) and chunk_size > 0 else 0
  if side < 1 or side * side != chunk_size:
    raise ConfigError(f'{name} must be a positive perfect square (matrices are cut into '
                      f'sqrt x sqrt tiles, e.g. 4096 = 64 x 64), got {chunk_size!r}.')
  return side


def chunk_k(chunk_len: int, k: int, chunk_size: int) -> int:
  """Values kept in a chunk of `chunk_len`: k scaled to keep density k / chunk_size.

  As the reference code: `max(1, round(chunk_len * k / chunk_size))`, Python's
  round (half to even), so a full 64x64 tile keeps exactly k and a 64-vector chunk
  keeps k / 64.
  """
  return min(chunk_len, int(max(1, round(chunk_len * k / chunk_size))))
