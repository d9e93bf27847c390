"""Compression operators with exact payload accounting, and error feedback.

Every operator is a `Compressor`: an optax transformation over ONE worker's tree
(DESIGN §2, per worker with a named axis) that maps updates to their **decoded**
compressed value, i.e. what the receivers will reconstruct, and records in its state
the exact payload of its last update in bits (`state.bits`). Besides optax's
`init`/`update`, a compressor has `encode`, which returns the whole `Message`: the
decoded tree, the selection mask (which coordinates were sent; None when all were)
and the payload split into index, value and metadata bits. Communication transforms
(`loco.comm.sparse`) take a compressor as an argument and call `encode`, so they
count the bytes that travel and know which workers sent which coordinate; a chain
link could not read the previous link's state.

Payload bits are counted as a real encoder would put them on the wire (DESIGN §5):
values at their bit width, each sent index at the width its chunk needs
(`ceil(log2(chunk_len))`), every scale, shift and codebook entry at 32 bits. All
counts are static (known at trace time), so they are exact Python integers until
they are stored as float32 scalars (error feedback multiplies them by the traced
`alive` flag).

Operators:

  sparsifiers   topk_chunks (SparseLoCo/DeMo tiles), topk_global, random_k
  quantizers    identity (values at their dtype), uniform (b-bit, deterministic or
                stochastic, per tensor or per chunk), binned (SparseLoCo's 2-bit
                codebook), e3m0 (4-bit float), e4m3 (8-bit float)
  composition   then(sparsifier, quantizer): quantize only the kept values
  memory        error_feedback(compressor, beta)
  by name       by_name('none' | '2bit' | 'int8' | 'int4' | 'e4m3' | 'e3m0')

Chunking follows the SparseLoCo reference code (`ChunkingTransform`): a matrix is cut
into tiles whose side along each dimension is the largest divisor of that dimension
that is <= sqrt(chunk_size) (64 for the default 4096), a vector into chunks of that
length. A tensor of rank > 2 is first viewed as the matrix whose two sides are
closest to square, the first such split on a tie (a (d, 3, h, k) qkv kernel becomes
(d, 3hk), a (h, k, d) output kernel (hk, d)): the reference code's torch `Linear`
weights, up to a transpose.
"""

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco.errors import ConfigError

PyTree = Any
Bits = int | jax.Array

META_BITS = 32           # every scale, shift and codebook entry travels as a float32
E4M3_MAX = 448.0         # largest finite float8_e4m3fn
E3M0_MIN_EXPONENT = -6   # E3M0 codes 1..7 are 2^-6 .. 2^0 times the scale; code 0 is zero
UNIFORM_BITS = tuple(range(2, 9))


class Message(NamedTuple):
  """One worker's compressed message, as its receivers decode it.

  Attributes:
    decoded: the updates' tree (shapes kept): the values the receivers reconstruct,
      zero where nothing was sent; in the updates' dtype, except under error
      feedback, whose float32 residual is what is encoded.
    mask: bool tree, True where a value was sent; None when every coordinate was.
    index_bits: bits of the sent indices.
    value_bits: bits of the sent values.
    meta_bits: bits of scales, shifts and codebooks.
  """
  decoded: PyTree
  mask: PyTree | None
  index_bits: Bits
  value_bits: Bits
  meta_bits: Bits

  @property
  def bits(self) -> Bits:
    return self.index_bits + self.value_bits + self.meta_bits


class Selection(NamedTuple):
  """What a sparsifier keeps, before its values are coded.

  Attributes:
    values: list of compact arrays of kept values, one per tensor (`[chunks, k']`
      for chunked top-k), or one for the whole tree (`topk_global(scope='tree')`).
    index_bits: bits of the indices that locate them.
    scatter: maps coded `values` (same shapes) to the dense `(decoded, mask)` trees.
  """
  values: list[jax.Array]
  index_bits: int
  scatter: Callable[[list[jax.Array]], tuple[PyTree, PyTree]]


class CompressState(NamedTuple):
  """State of a stateless compressor: the payload of its last update."""
  bits: jax.Array   # float32 scalar


class RandomKState(NamedTuple):
  """State of `random_k`: the payload of its last update and its own PRNG key."""
  bits: jax.Array
  key: jax.Array


class ComposedState(NamedTuple):
  """State of `then(first, second)`."""
  bits: jax.Array
  first: PyTree
  second: PyTree


class ErrorFeedbackState(NamedTuple):
  """State of `error_feedback`: payload, the residual e (float32), the inner state."""
  bits: jax.Array
  residual: PyTree
  inner: PyTree


EncodeFn = Callable[..., tuple[Message, PyTree]]
SelectFn = Callable[..., tuple[Selection, PyTree]]


class Compressor(optax.GradientTransformationExtraArgs):
  """An optax transformation mapping updates to their decoded compressed value.

  `update(updates, state, params=None, *, context=None)` returns the decoded tree in
  the updates' dtypes; `encode(updates, state, *, context=None)` returns the whole
  `Message` and the new state. `kind` is 'sparsifier' (messages with a mask; the
  plain sparsifiers also have `select(updates, state, *, context=None) ->
  (Selection, state)`, so that `then` can quantize only the kept values),
  'quantizer' (dense codecs) or 'stateful' (error feedback).
  """

  def __new__(cls, init: Callable[[PyTree], PyTree], encode: EncodeFn, kind: str,
              select: SelectFn | None = None):
    def update(updates, state, params=None, *, context=None, **extra):
      del params, extra
      message, state = encode(updates, state, context=context)
      return jax.tree.map(lambda d, u: d.astype(u.dtype), message.decoded, updates), state

    self = super().__new__(cls, init, update)
    # A NamedTuple subclass without __slots__ has a __dict__: optax.chain still sees a
    # GradientTransformationExtraArgs (so `context` reaches us), comm sees `encode`.
    self.encode = encode
    self.kind = kind
    self.select = select
    return self


def _bits(value: Bits) -> jax.Array:
  return jnp.asarray(value, jnp.float32)


def _stateless_init(params: PyTree) -> CompressState:
  del params
  return CompressState(bits=jnp.zeros((), jnp.float32))


def _size(x) -> int:
  return math.prod(np.shape(x))


def _index_width(n: int) -> int:
  """Bits to address one of `n` positions (0 for a single position)."""
  return max(0, math.ceil(math.log2(n))) if n > 1 else 0


# ---------------------------------------------------------------------------------
# Chunking (the reference code's ChunkingTransform, without the DCT).


def largest_divisor_at_most(n: int, cap: int) -> int:
  """The largest divisor of n that is <= cap (n itself when n <= cap)."""
  for d in range(min(n, cap), 0, -1):
    if n % d == 0:
      return d
  return 1


def _matrix_view(shape: tuple[int, ...]) -> tuple[int, int]:
  """A rank > 2 shape as the (rows, cols) split of its dims closest to square."""
  best = None
  for split in range(1, len(shape)):
    rows, cols = math.prod(shape[:split]), math.prod(shape[split:])
    ratio = max(rows, cols) / max(1, min(rows, cols))
    if best is None or ratio < best[0]:
      best = (ratio, (rows, cols))
  return best[1]


class _Chunking(NamedTuple):
  """How one tensor is cut into chunks: (rows, r, cols, c) tiles, or a vector."""
  shape: tuple[int, ...]
  matrix: tuple[int, int] | None   # (rows, cols) for rank >= 2, None for vectors
  tile: tuple[int, int]            # (r, c) for matrices, (1, c) for vectors
  num_chunks: int
  chunk_len: int


def _chunking(shape: tuple[int, ...], side: int) -> _Chunking:
  shape = tuple(shape)
  if len(shape) >= 2:
    rows, cols = shape if len(shape) == 2 else _matrix_view(shape)
    r, c = largest_divisor_at_most(rows, side), largest_divisor_at_most(cols, side)
    return _Chunking(shape, (rows, cols), (r, c), (rows // r) * (cols // c), r * c)
  n = math.prod(shape)
  c = largest_divisor_at_most(n, side)
  return _Chunking(shape, None, (1, c), n // c, c)


def _to_chunks(x: jax.Array, ch: _Chunking) -> jax.Array:
  """x -> [num_chunks, chunk_len]."""
  if ch.matrix is None:
    return x.reshape(ch.num_chunks, ch.chunk_len)
  (rows, cols), (r, c) = ch.matrix, ch.tile
  x = x.reshape(rows // r, r, cols // c, c).transpose(0, 2, 1, 3)
  return x.reshape(ch.num_chunks, ch.chunk_len)


def _from_chunks(x_CxL: jax.Array, ch: _Chunking) -> jax.Array:
  if ch.matrix is None:
    return x_CxL.reshape(ch.shape)
  (rows, cols), (r, c) = ch.matrix, ch.tile
  x = x_CxL.reshape(rows // r, cols // c, r, c).transpose(0, 2, 1, 3)
  return x.reshape(ch.shape)


def _check_chunk_size(chunk_size: int, name: str = 'chunk_size') -> int:
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


# ---------------------------------------------------------------------------------
# Sparsifiers: `select` keeps values (compact) and says how to scatter them back;
# alone, the kept values travel at their dtype.


def _value_width(x) -> int:
  return jnp.dtype(x.dtype).itemsize * 8


def _sparsifier(init: Callable, select: SelectFn) -> Compressor:
  """A sparsifier Compressor from its `select`: values sent at their own dtype."""

  def encode(updates, state, *, context=None):
    selection, state = select(updates, state, context=context)
    decoded, mask = selection.scatter(selection.values)
    value_bits = sum(_size(v) * _value_width(v) for v in selection.values)
    message = Message(decoded, mask, selection.index_bits, value_bits, 0)
    return message, state._replace(bits=_bits(message.bits))

  return Compressor(init, encode, 'sparsifier', select)


def _scatter_rows(shape, idx_CxK: jax.Array, vals_CxK: jax.Array, fill) -> jax.Array:
  rows = jnp.arange(shape[0])[:, None]
  return jnp.full(shape, fill, vals_CxK.dtype).at[rows, idx_CxK].set(vals_CxK)


def _chunked_select(k: int, chunk_size: int, dense_below: int, scores_fn,
                    index_bits: bool):
  """select(updates, keys) for a per-chunk sparsifier ranking `scores_fn(x, key)`."""
  side = _check_chunk_size(chunk_size)
  if not isinstance(k, int) or not 1 <= k <= chunk_size:
    raise ConfigError(f'topk must be an integer in [1, chunk_size={chunk_size}] (values '
                      f'kept per chunk), got {k!r}.')
  if not isinstance(dense_below, int) or dense_below < 0:
    raise ConfigError(f'dense_below must be an integer >= 0, got {dense_below!r}.')

  def select_leaf(x, key):
    """Returns (compact values, index bits, scatter(values) -> (dense, mask))."""
    if _size(x) < dense_below:
      # Sent whole: every value, no indices (the value codec still applies).
      return x, 0, lambda v: (v, jnp.ones(x.shape, bool))
    ch = _chunking(x.shape, side)
    kk = chunk_k(ch.chunk_len, k, chunk_size)
    x_CxL = _to_chunks(x, ch)
    _, idx = jax.lax.top_k(scores_fn(x_CxL, key), kk)
    vals = jnp.take_along_axis(x_CxL, idx, axis=1)
    bits = ch.num_chunks * kk * _index_width(ch.chunk_len) if index_bits else 0

    def scatter(v):
      dense = _scatter_rows(x_CxL.shape, idx, v, 0)
      mask = _scatter_rows(x_CxL.shape, idx, jnp.ones(idx.shape, bool), False)
      return _from_chunks(dense, ch), _from_chunks(mask, ch)

    return vals, bits, scatter

  def select_tree(updates, keys):
    leaves, treedef = jax.tree.flatten(updates)
    outs = [select_leaf(x, key) for x, key in zip(leaves, keys)]

    def scatter(values):
      pairs = [out[2](v) for out, v in zip(outs, values)]
      return (jax.tree.unflatten(treedef, [d for d, _ in pairs]),
              jax.tree.unflatten(treedef, [m for _, m in pairs]))

    return Selection([o[0] for o in outs], sum(o[1] for o in outs), scatter)

  return select_tree


def topk_chunks(k: int = 64, chunk_size: int = 4096, dense_below: int = 0) -> Compressor:
  """Keeps the k largest-magnitude values of every chunk (SparseLoCo / DeMo tiles).

  Matrices are cut into tiles of side <= sqrt(chunk_size) (see the module doc),
  vectors into chunks of length <= sqrt(chunk_size); a chunk of `chunk_len` values
  keeps `max(1, round(chunk_len * k / chunk_size))` of them (constant density). Each
  kept value costs its dtype's width plus `ceil(log2(chunk_len))` index bits (12 for
  a 64x64 tile). A tensor of fewer than `dense_below` values is sent whole, with no
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
    return select_tree(updates, [None] * len(jax.tree.leaves(updates))), state

  return _sparsifier(_stateless_init, select)


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

  def top(flat_N):
    kk = max(1, round(density * flat_N.shape[0]))
    _, idx = jax.lax.top_k(jnp.abs(flat_N), kk)
    n = flat_N.shape[0]
    scatter = lambda v: (jnp.zeros((n,), v.dtype).at[idx].set(v),
                         jnp.zeros((n,), bool).at[idx].set(True))
    return flat_N[idx], kk * _index_width(n), scatter

  def select(updates, state, *, context=None):
    del context
    leaves, treedef = jax.tree.flatten(updates)
    if scope == 'tensor':
      outs = [top(x.reshape(-1)) for x in leaves]

      def scatter(values):
        pairs = [out[2](v) for out, v in zip(outs, values)]
        return (jax.tree.unflatten(treedef, [d.reshape(x.shape)
                                             for (d, _), x in zip(pairs, leaves)]),
                jax.tree.unflatten(treedef, [m.reshape(x.shape)
                                             for (_, m), x in zip(pairs, leaves)]))

      return Selection([o[0] for o in outs], sum(o[1] for o in outs), scatter), state
    sizes = [_size(x) for x in leaves]
    splits = list(np.cumsum(sizes)[:-1])
    vals, bits, scatter_flat = top(
        jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in leaves]))

    def scatter(values):
      dense, mask = scatter_flat(values[0])
      return (jax.tree.unflatten(treedef, [
          d.reshape(x.shape).astype(x.dtype)
          for d, x in zip(jnp.split(dense, splits), leaves)]),
              jax.tree.unflatten(treedef, [
                  m.reshape(x.shape) for m, x in zip(jnp.split(mask, splits), leaves)]))

    return Selection([vals], bits, scatter), state

  return _sparsifier(_stateless_init, select)


def random_k(k: int = 64, chunk_size: int = 4096, dense_below: int = 0,
             seed: int = 0) -> Compressor:
  """Keeps k random values of every chunk (same chunking and density as topk_chunks).

  The key is `context.key` (the tick's key, shared by all workers) when given, else
  the compressor's own key (seeded by `seed`, split at every update; also the same on
  every worker). Either way the selection is common knowledge: receivers regenerate
  it from the key, so no index bits travel, and all workers keep the same coordinates
  (SparTA-style shared random masks).

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
    return RandomKState(jnp.zeros((), jnp.float32), jax.random.PRNGKey(seed))

  def select(updates, state, *, context=None):
    next_key, key = jax.random.split(state.key)
    if context is not None and context.key is not None:
      next_key, key = state.key, context.key
    n = len(jax.tree.leaves(updates))
    selection = select_tree(updates, [jax.random.fold_in(key, i) for i in range(n)])
    return selection, state._replace(key=next_key)

  return _sparsifier(init, select)


# ---------------------------------------------------------------------------------
# Quantizers: dense codecs over every value of the tree they are given (after a
# sparsifier, the compact kept values of each tensor).


def _quantizer(encode_leaf: Callable, meta_per_tensor: int = 0) -> Compressor:
  """A quantizer Compressor from a per-tensor codec.

  `encode_leaf(x_f32, key) -> (decoded_f32, bits_per_value or None (the dtype's),
  extra_meta_bits)`; `meta_per_tensor` bits are added for every tensor.
  """

  def encode(updates, state, *, context=None):
    leaves, treedef = jax.tree.flatten(updates)
    key = None if context is None else context.key
    decoded, value_bits, meta_bits = [], 0, 0
    for i, x in enumerate(leaves):
      leaf_key = None if key is None else jax.random.fold_in(key, i)
      dec, width, extra_meta = encode_leaf(x.astype(jnp.float32), leaf_key)
      decoded.append(dec.astype(x.dtype))
      value_bits += _size(x) * (width if width is not None else _value_width(x))
      meta_bits += meta_per_tensor + extra_meta
    message = Message(jax.tree.unflatten(treedef, decoded), None, 0, value_bits,
                      meta_bits)
    return message, state._replace(bits=_bits(message.bits))

  return Compressor(_stateless_init, encode, 'quantizer')


def _max_abs(x: jax.Array, axis=None) -> jax.Array:
  scale = jnp.max(jnp.abs(x), axis=axis, keepdims=axis is not None)
  # An all-zero tensor has no scale; any positive one decodes it exactly.
  return jnp.where(scale > 0, scale, 1.0)


def identity() -> Compressor:
  """No compression: values travel at their own dtype (32 bits for float32).

  Composed after a sparsifier it sends the kept values unquantized.

  Returns:
    A `Compressor` of kind 'quantizer'.
  """
  return _quantizer(lambda x, key: (x, None, 0))


def uniform(bits: int = 8, *, stochastic: bool = False,
            chunk_size: int | None = None) -> Compressor:
  """Symmetric uniform b-bit quantizer with a max-abs scale per tensor or per chunk.

  `scale = max|x| / (2^(b-1) - 1)`, `q = round(x / scale)` (deterministic: error
  <= scale / 2) or `floor(x / scale + u)`, u ~ U[0, 1) from `context.key`
  (stochastic: unbiased, error < scale). Payload: b bits per value plus one float32
  scale per tensor, or per chunk (the chunking of `topk_chunks`, applied to the
  array the quantizer is given: after a sparsifier, a tile of the `[chunks, k']`
  kept values).

  Args:
    bits: value width b, 2..8 (2^(b-1) - 1 levels on each side of zero).
    stochastic: stochastic rounding (needs `context.key`) instead of nearest.
    chunk_size: None for one scale per tensor, or a perfect square for one per chunk.

  Returns:
    A `Compressor` of kind 'quantizer'.

  References:
    Alistarh et al., arXiv 1610.02132 (QSGD, stochastic rounding).
  """
  if bits not in UNIFORM_BITS:
    raise ConfigError(f'uniform quantizer bits must be one of {UNIFORM_BITS}, '
                      f'got {bits!r}.')
  side = None if chunk_size is None else _check_chunk_size(chunk_size)
  levels = 2 ** (bits - 1) - 1

  def encode_leaf(x, key):
    if side is None:
      scale, n_scales, xs, unchunk = _max_abs(x) / levels, 1, x, lambda y: y
    else:
      ch = _chunking(x.shape, side)
      xs = _to_chunks(x, ch)
      scale, n_scales = _max_abs(xs, axis=1) / levels, ch.num_chunks
      unchunk = lambda y: _from_chunks(y, ch)
    if stochastic:
      if key is None:
        raise ConfigError('uniform(stochastic=True) needs a PRNG key in context.key.')
      q = jnp.floor(xs / scale + jax.random.uniform(key, xs.shape))
    else:
      q = jnp.round(xs / scale)
    q = jnp.clip(q, -levels, levels)
    return unchunk(q * scale), bits, META_BITS * n_scales

  return _quantizer(encode_leaf)


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
    raise ConfigError('binned quantizer range_sigmas must be positive, got '
                      f'{range_sigmas}.')
  width = int(math.log2(bins))

  def encode_leaf(x, key):
    del key
    n = _size(x)
    shift = jnp.mean(x)
    c = x - shift
    sigma = jnp.sqrt(jnp.sum(c * c) / max(n - 1, 1)) if n > 1 else jnp.zeros(())
    scale = range_sigmas * sigma / bins
    scale = jnp.where((scale > 0) & jnp.isfinite(scale), scale, 1.0)
    q = jnp.clip(jnp.round(c / scale + bins // 2), 0, bins - 1).astype(jnp.int32)
    members = jnp.zeros((bins,), jnp.float32).at[q.reshape(-1)].add(1.0)
    sums = jnp.zeros((bins,), jnp.float32).at[q.reshape(-1)].add(c.reshape(-1))
    codebook = jnp.where(members > 0, sums / jnp.maximum(members, 1.0), 0.0)
    return codebook[q] + shift, width, 0

  return _quantizer(encode_leaf, META_BITS * (bins + 1))


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
    return jnp.where(flushed, 0.0, jnp.sign(x) * jnp.exp2(exponent) * scale), 4, 0

  return _quantizer(encode_leaf, META_BITS)


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
    return q.astype(jnp.float32) * scale, 8, 0

  return _quantizer(encode_leaf, META_BITS)


# ---------------------------------------------------------------------------------
# Composition and memory.


def then(sparsifier: Compressor, quantizer: Compressor) -> Compressor:
  """Sparsify, then quantize only the kept values (e.g. top-k then 2-bit).

  Payload: the sparsifier's index bits plus the quantizer's value and metadata bits
  (its statistics and scales are computed over the kept values only).

  Args:
    sparsifier: a compressor of kind 'sparsifier'.
    quantizer: a compressor of kind 'quantizer'.

  Returns:
    A `Compressor` of kind 'sparsifier' (its message has a mask).
  """
  if getattr(sparsifier, 'select', None) is None:
    raise ConfigError('then(sparsifier, quantizer): the first operator must be a '
                      'sparsifier (topk_chunks, topk_global, random_k).')
  if getattr(quantizer, 'kind', None) != 'quantizer':
    raise ConfigError('then(sparsifier, quantizer): the second operator must be a '
                      'quantizer (identity, uniform, binned, e3m0, e4m3).')

  def init(params):
    return ComposedState(jnp.zeros((), jnp.float32), sparsifier.init(params),
                         quantizer.init(params))

  def encode(updates, state, *, context=None):
    selection, first = sparsifier.select(updates, state.first, context=context)
    coded, second = quantizer.encode(selection.values, state.second, context=context)
    decoded, mask = selection.scatter(coded.decoded)
    message = Message(decoded, mask, selection.index_bits, coded.value_bits,
                      coded.meta_bits)
    return message, ComposedState(_bits(message.bits), first, second)

  return Compressor(init, encode, 'sparsifier')


def error_feedback(compressor: Compressor, beta: float = 0.95) -> Compressor:
  """Error feedback: compress the accumulated residual and keep what was not sent.

  `e <- beta e + updates`; `sent = C(e)`; `e <- e - sent`; outputs `sent`. The
  residual is float32 whatever the updates' dtype. A worker that is not alive this
  tick (`context.alive` False) sends nothing and keeps all of e. With beta = 1 and an
  identity C this is the identity; SparseLoCo uses it instead of outer momentum.
  The reference code adds `lr * Delta` to e and steps by lr again; here e adds
  Delta and the outer SGD applies lr once (identical at the paper's lr = 1).

  Args:
    compressor: the compressor applied to the residual.
    beta: residual decay, in [0, 1] (SparseLoCo: 0.95).

  Returns:
    A `Compressor` (kind 'stateful') whose message is that of `compressor`.

  References:
    Seide et al. 2014 (1-bit SGD); Karimireddy et al., arXiv 1901.09847 (EF-SGD);
    SparseLoCo, arXiv 2508.15706.
  """
  if not isinstance(compressor, Compressor):
    raise ConfigError('error_feedback needs a loco.compress Compressor.')
  if not 0.0 <= beta <= 1.0:
    raise ConfigError(f'error feedback beta (algorithm.error_decay) must be in [0, 1], '
                      f'got {beta!r}.')

  def init(params):
    residual = jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), jnp.float32), params)
    return ErrorFeedbackState(jnp.zeros((), jnp.float32), residual,
                              compressor.init(params))

  def encode(updates, state, *, context=None):
    e = jax.tree.map(lambda r, u: beta * r + u.astype(jnp.float32),
                     state.residual, updates)
    message, inner = compressor.encode(e, state.inner, context=context)
    alive = (jnp.ones((), bool) if context is None or context.alive is None
             else jnp.asarray(context.alive, bool))
    sent = jax.tree.map(lambda d: jnp.where(alive, d, 0.0), message.decoded)
    residual = jax.tree.map(jnp.subtract, e, sent)
    sent_mask = (None if message.mask is None
                 else jax.tree.map(lambda m: m & alive, message.mask))
    gate = alive.astype(jnp.float32)
    message = Message(sent, sent_mask, message.index_bits * gate,
                      message.value_bits * gate, message.meta_bits * gate)
    return message, ErrorFeedbackState(_bits(message.bits), residual, inner)

  return Compressor(init, encode, 'stateful')


CODECS: dict[str, Callable[[], Compressor]] = {
    'none': identity,
    '2bit': binned,
    'int8': lambda: uniform(8),
    'int4': lambda: uniform(4),
    'e4m3': e4m3,
    'e3m0': e3m0,
}


def by_name(name: str, key: str = 'algorithm.compression') -> Compressor:
  """The value codec called `name` (see CODECS); `key` names the config key in errors."""
  if name not in CODECS:
    raise ConfigError(f'{key} must be one of {sorted(CODECS)}, got {name!r}.')
  return CODECS[name]()
