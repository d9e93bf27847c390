"""Quantizers: dense codecs over every value of the tree they are given (after a
sparsifier, in `then`, the compact kept values of each tensor)."""

import math
from typing import Callable

import jax
import jax.numpy as jnp

from loco.comm import axis as comm_axis
from loco.comm.axis import WORKERS
from loco.comm.compress import chunking
from loco.comm.compress.base import (META_BITS, Compressor, Message, size, stateless_init,
                                     value_width)
from loco.errors import ConfigError

E4M3_MAX = 448.0         # largest finite float8_e4m3fn
E3M0_MIN_EXPONENT = -6   # E3M0 codes 1..7 are 2^-6 .. 2^0 times the scale; code 0 is zero
UNIFORM_BITS = tuple(range(2, 9))


def quantizer(encode_leaf: Callable, axis_name: str | None = None) -> Compressor:
  """A quantizer Compressor from a per-tensor codec.

  `encode_leaf(x_f32, key) -> (decoded_f32, bits_per_value or None (the dtype's),
  meta_bits)`. Tensor i gets `context.key` folded with i and, when `axis_name` is
  given, with this worker's index on that axis first (the tick's key is shared by all
  workers; each worker draws its own numbers).
  """

  def encode(updates, state, *, context=None):
    leaves, treedef = jax.tree.flatten(updates)
    key = None if context is None else context.key
    if key is not None and axis_name is not None:
      key = jax.random.fold_in(key, comm_axis.axis_index(axis_name))
    decoded, value_bits, meta_bits = [], 0, 0
    for i, x in enumerate(leaves):
      leaf_key = None if key is None else jax.random.fold_in(key, i)
      dec, width, meta = encode_leaf(x.astype(jnp.float32), leaf_key)
      decoded.append(dec.astype(x.dtype))
      value_bits += size(x) * (width if width is not None else value_width(x))
      meta_bits += meta
    message = Message(jax.tree.unflatten(treedef, decoded), None, 0, value_bits, meta_bits)
    return message, state._replace(bits=jnp.float32(message.bits))

  return Compressor(stateless_init, encode, 'quantizer')


def _max_abs(x: jax.Array, axis=None) -> jax.Array:
  scale = jnp.max(jnp.abs(x), axis=axis, keepdims=axis is not None)
  return jnp.where(scale > 0, scale, 1.0)   # all zeros: any positive scale is exact


def identity() -> Compressor:
  """No compression: values (after a sparsifier, the kept ones) travel at their dtype.

  Returns:
    A `Compressor` of kind 'quantizer'.
  """
  return quantizer(lambda x, key: (x, None, 0))


def uniform(bits: int = 8, *, stochastic: bool = False, chunk_size: int | None = None,
            axis_name: str | None = WORKERS) -> Compressor:
  """Symmetric uniform b-bit quantizer with a max-abs scale per tensor or per chunk.

  `scale = max|x| / (2^(b-1) - 1)`, `q = round(x / scale)` (deterministic: error
  <= scale / 2) or `floor(x / scale + u)`, u ~ U[0, 1) from `context.key` and this
  worker's index (stochastic: unbiased, error < scale, independent across workers).
  Payload: b bits per value plus one float32 scale per tensor, or per chunk (the
  chunking of `topk_chunks` on the array given: after a sparsifier, `[chunks, k']`).

  Args:
    bits: value width b, 2..8 (2^(b-1) - 1 levels on each side of zero).
    stochastic: stochastic rounding (needs `context.key`) instead of nearest.
    chunk_size: None for one scale per tensor, or a perfect square for one per chunk.
    axis_name: the worker axis the stochastic encoder runs under (the engine's
      per-worker map); None outside any map (one worker).

  Returns:
    A `Compressor` of kind 'quantizer'.

  References:
    Alistarh et al., arXiv 1610.02132 (QSGD, stochastic rounding).
  """
  if bits not in UNIFORM_BITS:
    raise ConfigError(f'uniform quantizer bits must be one of {UNIFORM_BITS}, got {bits!r}.')
  side = None if chunk_size is None else chunking.check_chunk_size(chunk_size)
  levels = 2 ** (bits - 1) - 1

  def encode_leaf(x, key):
    if side is None:
      scale, n_scales, xs, unchunk = _max_abs(x) / levels, 1, x, lambda y: y
    else:
      ch = chunking.layout(x.shape, side)
      xs = chunking.to_chunks(x, ch)
      scale, n_scales = _max_abs(xs, axis=1) / levels, ch.num_chunks
      unchunk = lambda y: chunking.from_chunks(y, ch)
    if stochastic:
      if key is None:
        raise ConfigError('uniform(stochastic=True) needs a PRNG key in context.key.')
      q = jnp.floor(xs / scale + jax.random.uniform(key, xs.shape))
    else:
      q = jnp.round(xs / scale)
    q = jnp.clip(q, -levels, levels)
    return unchunk(q * scale), bits, META_BITS * n_scales

  return quantizer(encode_leaf, axis_name=axis_name if stochastic else None)


def binned(bins: int = 4, range_sigmas: float = 6.0) -> Compressor:
  """SparseLoCo's statistical quantizer: bins of the centred values, decoded as means.

  Per tensor, over the values it encodes: `shift = mean(v)`, `c = v - shift`,
  `sigma` = unbiased std of c, `scale = range_sigmas * sigma / bins` (1.5 sigma for
  the defaults; 1 when sigma is 0), `q = clip(round(c / scale + bins // 2), 0,
  bins - 1)`; the codebook entry of a bin is the mean of its members' c (0 if
  empty), and a value decodes as `codebook[q] + shift`. Payload: log2(bins) bits per
  value plus the shift and the codebook, `32 * (bins + 1)` bits per tensor.

  Args:
    bins: number of bins, a power of two >= 2 (4 = 2 bits).
    range_sigmas: the bins span this many standard deviations (6).

  Returns:
    A `Compressor` of kind 'quantizer'.

  References:
    SparseLoCo, arXiv 2508.15706 (reference code `TopKCompressor._quantize`).
  """
  if not isinstance(bins, int) or bins < 2 or bins & (bins - 1):
    raise ConfigError(f'binned quantizer bins must be a power of two >= 2, got {bins!r}.')
  if not range_sigmas > 0:
    raise ConfigError(f'binned quantizer range_sigmas must be positive, got {range_sigmas}.')
  width = int(math.log2(bins))

  def encode_leaf(x, key):
    del key
    n = size(x)
    shift = jnp.mean(x)
    c = x - shift
    sigma = jnp.sqrt(jnp.sum(c * c) / max(n - 1, 1)) if n > 1 else jnp.zeros(())
    scale = range_sigmas * sigma / bins
    scale = jnp.where((scale > 0) & jnp.isfinite(scale), scale, 1.0)
    q = jnp.clip(jnp.round(c / scale + bins // 2), 0, bins - 1).astype(jnp.int32)
    members = jnp.zeros((bins,), jnp.float32).at[q.reshape(-1)].add(1.0)
    sums = jnp.zeros((bins,), jnp.float32).at[q.reshape(-1)].add(c.reshape(-1))
    codebook = jnp.where(members > 0, sums / jnp.maximum(members, 1.0), 0.0)
    return codebook[q] + shift, width, META_BITS * (bins + 1)

  return quantizer(encode_leaf)


def e3m0() -> Compressor:
  """4-bit float without mantissa (1 sign, 3 exponent bits) and a per-tensor scale.

  The scaling choice (the sources do not give one): `scale = max|x|` per tensor, sent
  as a float32, so the largest magnitude is exact. Exponent code 0 means zero and
  codes 1..7 mean `2^(code - 7) * scale`, i.e. magnitudes scale * {2^-6, ..., 2^0}
  (bias 7 relative to the scale). A magnitude rounds to the nearest power of two in
  log space (`round(log2(|x| / scale))`), so the relative error is at most
  sqrt(2) - 1 for |x| >= 2^-6.5 * scale; smaller magnitudes flush to zero (absolute
  error < 2^-6.5 * scale). Payload: 4 bits per value plus 32 bits per tensor.

  Returns:
    A `Compressor` of kind 'quantizer'.

  References:
    Streaming DiLoCo, arXiv 2501.18512 (E3M0 pseudo-gradients).
  """
  def encode_leaf(x, key):
    del key
    scale = _max_abs(x)
    mag = jnp.abs(x) / scale
    exponent = jnp.clip(jnp.round(jnp.log2(jnp.maximum(mag, 1e-30))),
                        E3M0_MIN_EXPONENT, 0)
    flushed = mag < 2.0 ** (E3M0_MIN_EXPONENT - 0.5)
    return jnp.where(flushed, 0.0, jnp.sign(x) * jnp.exp2(exponent) * scale), 4, META_BITS

  return quantizer(encode_leaf)


def e4m3() -> Compressor:
  """8-bit float (float8_e4m3fn) with a per-tensor scale mapping max|x| to 448.

  Round to nearest even: relative error <= 2^-4 for normal values, absolute error
  <= 2^-10 * scale below the normal range. Payload: 8 bits per value plus 32 bits
  per tensor.

  Returns:
    A `Compressor` of kind 'quantizer'.

  References:
    Micikevicius et al., arXiv 2209.05433 (FP8 formats).
  """
  def encode_leaf(x, key):
    del key
    scale = _max_abs(x) / E4M3_MAX
    q = jnp.clip(x / scale, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
    return q.astype(jnp.float32) * scale, 8, META_BITS

  return quantizer(encode_leaf)
