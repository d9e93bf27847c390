"""Compression operators: shapes, error bounds, exact payload bits, error feedback."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import comm
from loco.comm import compress
from loco.comm.compress import chunking
from loco.comm import WorkerContext
from loco.errors import ConfigError


def _tree(seed=0):
  k = jax.random.split(jax.random.key(seed), 4)
  return {'w': jax.random.normal(k[0], (128, 192)),
          'v': jax.random.normal(k[1], (100,)),
          'qkv': jax.random.normal(k[2], (8, 3, 2, 32)),
          'h': jax.random.normal(k[3], (64,)).astype(jnp.bfloat16)}


COMPRESSORS = {
    'topk_chunks': lambda: compress.topk_chunks(64, 4096),
    'topk_global': lambda: compress.topk_global(0.05),
    'topk_global_tree': lambda: compress.topk_global(0.05, scope='tree'),
    'random_k': lambda: compress.random_k(64, 4096),
    'identity': compress.identity,
    'uniform8': lambda: compress.uniform(8),
    'uniform4_chunked': lambda: compress.uniform(4, chunk_size=256),
    'uniform2_stochastic': lambda: compress.uniform(2, stochastic=True, axis_name=None),
    'binned': compress.binned,
    'e3m0': compress.e3m0,
    'e4m3': compress.e4m3,
    'topk_then_2bit': lambda: compress.then(compress.topk_chunks(), compress.binned()),
    'ef_topk_2bit': lambda: compress.error_feedback(
        compress.then(compress.topk_chunks(), compress.binned()), 0.95),
}


_JITTED = {}


def _encode(c, tree, key=0, state=None):
  """c.encode under jit (compiled once per compressor), with a context key."""
  if id(c) not in _JITTED:
    _JITTED[id(c)] = (c, jax.jit(
        lambda t, s, k: c.encode(t, s, context=WorkerContext(key=k))))
  state = c.init(tree) if state is None else state
  return _JITTED[id(c)][1](tree, state, jax.random.key(key))


@pytest.mark.parametrize('name', sorted(COMPRESSORS))
def test_shapes_dtypes_and_optax_update(name):
  tree = _tree()
  c = COMPRESSORS[name]()
  # As an optax link: the update is the decoded tree, with the context extra arg.
  chain = optax.chain(c, optax.scale(-1.0))
  ctx = WorkerContext(key=jax.random.key(0))
  out, (state, _) = jax.jit(lambda t, s: chain.update(t, s, context=ctx))(
      tree, chain.init(tree))
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(tree)):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert bool(jnp.all(jnp.isfinite(got.astype(jnp.float32))))
  assert float(state.bits) > 0


def _tiles(x, side=64):
  r = chunking.largest_divisor_at_most(x.shape[0], side)
  c = chunking.largest_divisor_at_most(x.shape[1], side)
  return (np.asarray(x).reshape(x.shape[0] // r, r, x.shape[1] // c, c)
          .transpose(0, 2, 1, 3).reshape(-1, r * c))


def test_topk_chunks_keeps_exactly_k_largest_per_tile():
  x = jax.random.normal(jax.random.key(3), (96, 100))
  message, _ = _encode(compress.topk_chunks(64, 4096), {'x': x})
  # Tiles 48 x 50 (largest divisors <= 64); k' = round(2400 * 64 / 4096) = round(37.5) = 38.
  assert compress.chunk_k(2400, 64, 4096) == 38
  dec, mask, xs = _tiles(message.decoded['x']), _tiles(message.mask['x']), _tiles(x)
  assert dec.shape == (4, 2400)
  np.testing.assert_array_equal(mask.sum(1), 38)
  for row in range(4):
    kept = np.sort(np.abs(xs[row][mask[row]]))
    dropped = np.abs(xs[row][~mask[row]])
    assert kept.min() > dropped.max()
  np.testing.assert_array_equal(dec, np.where(mask, xs, 0.0))
  assert message.index_bits == 4 * 38 * 12           # ceil(log2 2400) = 12
  assert message.value_bits == 4 * 38 * 32


def test_vector_and_rank3_chunking():
  assert compress.chunk_k(64, 128, 4096) == 2          # the reference's 1-D k'
  assert compress.chunk_k(64, 64, 4096) == 1
  assert compress.chunk_k(3, 64, 4096) == 1
  x = jnp.arange(4 * 64 * 256, dtype=jnp.float32).reshape(4, 64, 256)
  ch = chunking.layout(x.shape, 64)
  assert ch.matrix == (256, 256) and ch.chunk_len == 4096 and ch.num_chunks == 16
  np.testing.assert_array_equal(chunking.from_chunks(chunking.to_chunks(x, ch), ch), x)
  assert chunking.layout((256, 3, 4, 64), 64).matrix == (256, 768)
  assert chunking.layout((2, 3, 3, 2), 64).matrix == (6, 6)     # closest to square
  assert chunking.layout((2, 4, 2), 64).matrix == (2, 8)          # the first on a tie


def _static_bits(c, tree):
  box = []
  def trace(t, s):
    message, _ = c.encode(t, s, context=WorkerContext(key=jax.random.key(0)))
    box.append(message.bits)
    return 0
  jax.eval_shape(trace, tree, c.init(tree))
  assert isinstance(box[0], int)
  return box[0]


def test_payload_bits_hand_counts():
  tree = {'w': jnp.ones((128, 128)) * jnp.arange(128.0), 'v': jnp.arange(64.0)}
  n = 128 * 128 + 64
  sparse_2bit = compress.then(compress.topk_chunks(64), compress.binned())
  # w: 4 tiles x 64 kept x (12 index + 2 value) + shift + 4 codebook floats;
  # v: one 64-chunk, k' = 1, 6 index bits + 2 value bits + 160.
  want = {
      'sparse_2bit': (sparse_2bit, 4 * 64 * 14 + 160 + 1 * 8 + 160),
      'topk128': (compress.topk_chunks(128), 4 * 128 * (12 + 32) + 2 * (6 + 32)),
      'dense_below': (compress.topk_chunks(64, dense_below=100), 4 * 64 * 44 + 64 * 32),
      'random_k': (compress.random_k(64), (4 * 64 + 1) * 32),     # no indices
      'global': (compress.topk_global(0.01), 164 * (14 + 32) + 1 * (6 + 32)),
      'global_tree': (compress.topk_global(0.01, scope='tree'),
                      round(0.01 * n) * (15 + 32)),
      'identity': (compress.identity(), n * 32),
      'uniform8': (compress.uniform(8), n * 8 + 2 * 32),
      'uniform4_chunks': (compress.uniform(4, chunk_size=4096), n * 4 + (4 + 1) * 32),
      'e3m0': (compress.e3m0(), n * 4 + 2 * 32),
      'e4m3': (compress.e4m3(), n * 8 + 2 * 32),
      'binned': (compress.binned(), n * 2 + 2 * 160),
      'binned16': (compress.binned(16), n * 4 + 2 * 17 * 32),
  }
  for name, (c, bits) in want.items():
    assert _static_bits(c, tree) == bits, name      # a Python int: known at trace time
  message, state = _encode(sparse_2bit, tree)
  assert float(message.bits) == float(state.bits) == want['sparse_2bit'][1]
  bf16 = {'h': jnp.ones((10,), jnp.bfloat16)}
  assert _static_bits(compress.identity(), bf16) == 160


def test_uniform_error_bounds_and_determinism():
  x = jax.random.normal(jax.random.key(1), (64, 64)) * 3.0
  for bits in (2, 4, 8):
    dec = _encode(compress.uniform(bits), {'x': x})[0].decoded['x']
    scale = float(jnp.max(jnp.abs(x))) / (2 ** (bits - 1) - 1)
    assert float(jnp.max(jnp.abs(dec - x))) <= scale / 2 * (1 + 1e-5)
  chunked = _encode(compress.uniform(4, chunk_size=256), {'x': x})[0].decoded['x']
  scales = np.abs(_tiles(x, 16)).max(1, keepdims=True) / 7
  assert np.all(np.abs(_tiles(chunked - x, 16)) <= scales / 2 * (1 + 1e-5))
  sto = compress.uniform(4, stochastic=True, axis_name=None)   # one worker, no map
  a = _encode(sto, {'x': x}, key=5)[0].decoded['x']
  b = _encode(sto, {'x': x}, key=5)[0].decoded['x']
  c = _encode(sto, {'x': x}, key=6)[0].decoded['x']
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  scale = float(jnp.max(jnp.abs(x))) / 7
  assert float(jnp.max(jnp.abs(a - x))) < scale
  # Unbiased: the mean over keys approaches x.
  keys = jax.random.split(jax.random.key(0), 64)
  many = jax.jit(jax.vmap(lambda k: sto.encode({'x': x}, sto.init({'x': x}),
                                               context=WorkerContext(key=k))[0]
                          .decoded['x']))(keys)
  assert float(jnp.mean(jnp.abs(many.mean(0) - x))) < 0.1 * scale


def test_stochastic_rounding_dithers_each_worker_on_its_own():
  """One tick key, identical inputs: each worker draws its own dither, deterministically."""
  assert compress.quantize.WORKERS == comm.WORKERS
  x = jnp.broadcast_to(jax.random.normal(jax.random.key(1), (64, 64)) * 3.0, (2, 64, 64))
  sto = compress.uniform(4, stochastic=True)
  run = jax.jit(jax.vmap(
      lambda t, k: sto.encode({'x': t}, sto.init({'x': t}),
                              context=WorkerContext(key=k))[0].decoded['x'],
      in_axes=(0, None), axis_name=comm.WORKERS))
  key = jax.random.key(5)
  out = run(x, key)
  assert not np.array_equal(out[0], out[1])
  np.testing.assert_array_equal(out, run(x, key))
  # Worker i's draw is one worker's with the tick key folded with i.
  alone = compress.uniform(4, stochastic=True, axis_name=None)
  one = jax.jit(lambda t, k: alone.encode({'x': t}, alone.init({'x': t}),
                                         context=WorkerContext(key=k))[0].decoded['x'])
  for i in range(2):
    np.testing.assert_array_equal(out[i], one(x[i], jax.random.fold_in(key, i)))


def test_e3m0_grid_and_relative_error():
  x = jnp.concatenate([jax.random.normal(jax.random.key(2), (4000,)),
                       jnp.array([5.0, -1e-4, 0.0])])
  dec = np.asarray(_encode(compress.e3m0(), {'x': x})[0].decoded['x'])
  x = np.asarray(x)
  scale = 5.0
  assert dec[-3] == 5.0 and dec[-2] == 0.0 and dec[-1] == 0.0   # max exact, tiny flushed
  big = np.abs(x) >= 2 ** -6.5 * scale
  assert np.all(np.abs(dec[big] - x[big]) <= (math.sqrt(2) - 1) * np.abs(x[big]) + 1e-6)
  assert np.all(np.abs(dec[~big]) == 0.0)
  nonzero = dec[dec != 0]
  exponents = np.log2(np.abs(nonzero) / scale)
  np.testing.assert_allclose(exponents, np.round(exponents), atol=1e-5)
  assert exponents.min() >= -6 and exponents.max() <= 0
  assert np.all(np.sign(nonzero) == np.sign(x[dec != 0]))


def test_e4m3_relative_error():
  x = jax.random.normal(jax.random.key(4), (4096,)) * 10.0
  dec = np.asarray(_encode(compress.e4m3(), {'x': x})[0].decoded['x'])
  x = np.asarray(x)
  scale = np.abs(x).max() / 448.0
  normal = np.abs(x) >= 2 ** -6 * scale
  assert np.all(np.abs(dec - x)[normal] <= 2 ** -4 * np.abs(x[normal]) * (1 + 1e-5))
  assert np.all(np.abs(dec - x)[~normal] <= 2 ** -10 * scale * (1 + 1e-5))
  assert np.abs(dec).max() == pytest.approx(np.abs(x).max(), rel=1e-6)


def _reference_binned(v, bins=4, range_sigmas=6.0):
  """The SparseLoCo reference quantizer (TopKCompressor._quantize), in numpy."""
  shift = v.mean()
  c = v - shift
  std = np.linalg.norm(c) / math.sqrt(c.size - 1) if c.size > 1 else 0.0
  scale = range_sigmas * std / bins
  scale = scale if scale > 0 and np.isfinite(scale) else 1.0
  q = np.clip(np.round(c / scale + bins // 2), 0, bins - 1).astype(int)
  lookup = np.array([c[q == b].mean() if np.any(q == b) else 0.0 for b in range(bins)])
  return lookup[q] + shift


def test_binned_matches_reference_on_kept_values_and_preserves_sums():
  x = jax.random.normal(jax.random.key(7), (128, 64)) + 0.3
  message, _ = _encode(compress.then(compress.topk_chunks(64), compress.binned()),
                       {'x': x})
  mask = np.asarray(message.mask['x'])
  dec = np.asarray(message.decoded['x'])
  kept = np.asarray(x)[mask]
  np.testing.assert_allclose(dec[mask], _reference_binned(kept), rtol=1e-5, atol=1e-6)
  assert np.all(dec[~mask] == 0.0)
  assert len(np.unique(dec[mask])) <= 4
  # Each bin decodes to its members' mean, so the sum of what is sent is exact.
  np.testing.assert_allclose(dec.sum(), kept.sum(), rtol=1e-4)
  dense = np.asarray(_encode(compress.binned(), {'x': x})[0].decoded['x'])
  np.testing.assert_allclose(dense.ravel(), _reference_binned(np.asarray(x).ravel()),
                             rtol=1e-5, atol=1e-6)


def test_random_k_is_deterministic_given_a_key():
  x = {'x': jnp.ones((64, 128))}
  rk = compress.random_k(64)
  m1, _ = _encode(rk, x, key=1)
  m2, _ = _encode(rk, x, key=1)
  m3, _ = _encode(rk, x, key=2)
  np.testing.assert_array_equal(m1.mask['x'], m2.mask['x'])
  assert not np.array_equal(m1.mask['x'], m3.mask['x'])
  np.testing.assert_array_equal(_tiles(m1.mask['x']).sum(1), 64)
  # Without a context key, the compressor's own seeded key is used and advanced.
  state = rk.init(x)
  a, state = rk.encode(x, state)
  b, _ = rk.encode(x, state)
  a2, _ = rk.encode(x, rk.init(x))
  np.testing.assert_array_equal(a.mask['x'], a2.mask['x'])
  assert not np.array_equal(a.mask['x'], b.mask['x'])


@pytest.mark.parametrize('beta', [0.0, 0.5, 0.95, 1.0])
def test_error_feedback_conserves_mass(beta):
  ef = compress.error_feedback(compress.then(compress.topk_chunks(64), compress.binned()),
                               beta)
  tree = _tree()
  state = ef.init(tree)
  encode = jax.jit(lambda t, s: ef.encode(t, s))
  for step in range(3):
    inputs = jax.tree.map(lambda x: x * (step + 1), _tree(step + 1))
    message, new = encode(inputs, state)
    for old, inp, sent, res in zip(jax.tree.leaves(state.residual), jax.tree.leaves(inputs),
                                   jax.tree.leaves(message.decoded),
                                   jax.tree.leaves(new.residual)):
      assert res.dtype == jnp.float32 and sent.dtype == jnp.float32
      want = beta * old + inp.astype(jnp.float32)
      np.testing.assert_allclose(sent + res, want, rtol=1e-6, atol=1e-6)
    state = new


def test_error_feedback_of_identity_is_identity_and_top_k_is_exact():
  tree = _tree()
  ef = compress.error_feedback(compress.identity(), 0.9)
  message, state = _encode(ef, tree)
  for d, x in zip(jax.tree.leaves(message.decoded), jax.tree.leaves(tree)):
    np.testing.assert_array_equal(d, x)
  assert all(float(jnp.max(jnp.abs(r))) == 0.0 for r in jax.tree.leaves(state.residual))
  ef = compress.error_feedback(compress.topk_chunks(64), 1.0)
  message, state = _encode(ef, tree)
  x, r, d = tree['w'], state.residual['w'], message.decoded['w']
  np.testing.assert_array_equal(d + r, x)                   # exact without quantization
  np.testing.assert_array_equal(np.where(message.mask['w'], r, 0.0), 0.0)


def test_error_feedback_of_a_dead_worker_keeps_everything():
  tree = {'x': jnp.arange(1.0, 65.0)}
  ef = compress.error_feedback(compress.topk_chunks(64), 0.5)
  message, state = ef.encode(tree, ef.init(tree),
                             context=WorkerContext(alive=jnp.array(False)))
  np.testing.assert_array_equal(message.decoded['x'], 0.0)
  np.testing.assert_array_equal(state.residual['x'], tree['x'])
  assert float(message.bits) == 0.0 and not bool(message.mask['x'].any())


def test_compressors_are_per_worker_under_vmap():
  x = jax.random.normal(jax.random.key(0), (3, 64, 64))
  c = compress.then(compress.topk_chunks(64), compress.e3m0())
  per_worker = jax.vmap(lambda t: c.encode({'x': t}, c.init({'x': t}))[0].decoded['x'],
                        axis_name='workers')(x)
  for i in range(3):
    alone = _encode(c, {'x': x[i]})[0].decoded['x']
    np.testing.assert_array_equal(per_worker[i], alone)


def test_bad_input():
  with pytest.raises(ConfigError, match='topk'):
    compress.topk_chunks(5000, 4096)            # k larger than the chunk
  with pytest.raises(ConfigError, match='topk'):
    compress.random_k(0)
  with pytest.raises(ConfigError, match='perfect square'):
    compress.topk_chunks(64, 1000)              # a chunk size that does not tile
  with pytest.raises(ConfigError, match='perfect square'):
    compress.uniform(8, chunk_size=-4)
  with pytest.raises(ConfigError, match='bits'):
    compress.uniform(1)
  with pytest.raises(ConfigError, match='bits'):
    compress.uniform(16)
  with pytest.raises(ConfigError, match='power of two'):
    compress.binned(3)
  with pytest.raises(ConfigError, match='density'):
    compress.topk_global(1.5)
  with pytest.raises(ConfigError, match='sparsifier'):
    compress.then(compress.binned(), compress.topk_chunks())
  with pytest.raises(ConfigError, match='beta'):
    compress.error_feedback(compress.identity(), 1.5)
  with pytest.raises(ConfigError, match='algorithm.compression'):
    compress.by_name('fp4')
  with pytest.raises(ConfigError, match='dense_below'):
    compress.topk_chunks(64, dense_below=-1)
