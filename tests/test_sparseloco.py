"""SparseLoCo and the compressed collectives: oracles, reference numbers, bytes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco.configs import default
from loco import algorithms
from loco import comm
from loco.comm import compress
from loco.algorithms.sparseloco import sparseloco_outer
from loco.comm import WorkerContext
from loco.core.engine import local_updates
from loco.errors import ConfigError


def _toy(seed=0, workers=3, steps=9):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  params = {'w': jax.random.normal(k1, (64, 64)) * 0.1, 'b': jnp.zeros((8,))}
  x = jax.random.normal(k2, (steps, workers, 16, 64))
  def loss(p, xb):
    return jnp.mean((jnp.tanh(xb @ p['w'])[:, :8] + p['b'] - 0.5 * xb[:, :8]) ** 2)
  return params, x, loss


def _run(alg, params, x, loss):
  state = alg.init(params, x.shape[1], jax.random.PRNGKey(0))
  step = jax.jit(lambda s, xb: alg.step(s, jax.vmap(jax.grad(loss))(s.params, xb)))
  infos = []
  for t in range(x.shape[0]):
    state, info = step(state, x[t])
    infos.append(info)
  return state, infos


@pytest.mark.slow
def test_full_density_unquantized_equals_error_feedback_outer_sgd():
  """k = chunk size and no quantization == EF(identity) + all-reduce + SGD(1)."""
  params, x, loss = _toy()
  inner = optax.adam(1e-2)
  ours = algorithms.make('sparseloco', inner, sync_every=3, topk=4096,
                         compression='none', dense_below=0)
  oracle = local_updates(
      inner, optax.chain(compress.error_feedback(compress.identity(), 0.95),
                         comm.all_reduce_mean(), optax.sgd(1.0)), 3)
  s1, _ = _run(ours, params, x, loss)
  s2, _ = _run(oracle, params, x, loss)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # Every coordinate was sent, so the residual is zero and beta never matters.
  residual = s1.outer_state[0].compressor.residual
  assert max(float(jnp.max(jnp.abs(r))) for r in jax.tree.leaves(residual)) == 0.0


def _reference_outer(deltas, residuals, beta, topk, lr=1.0):
  """The reference code's SparseLoCo step (sparseloco.py @ 276fa59) in numpy.

  deltas, residuals: lists over workers of {name: array}. Returns (update, residuals).
  """
  def tiles(a):
    if a.ndim == 1:
      c = max(d for d in range(1, 65) if a.shape[0] % d == 0)
      return a.reshape(-1, c), lambda t: t.reshape(a.shape)
    r, c = (max(d for d in range(1, 65) if n % d == 0) for n in a.shape)
    y, xx = a.shape[0] // r, a.shape[1] // c
    chunks = a.reshape(y, r, xx, c).transpose(0, 2, 1, 3).reshape(y * xx, r * c)
    return chunks, lambda t: t.reshape(y, xx, r, c).transpose(0, 2, 1, 3).reshape(a.shape)

  def quantize(v):
    shift = v.mean()
    cen = v - shift
    std = np.linalg.norm(cen) / math.sqrt(cen.size - 1)
    scale = 6.0 * std / 4
    q = np.clip(np.round(cen / scale + 2), 0, 3).astype(int)
    lookup = np.array([cen[q == b].mean() if np.any(q == b) else 0.0 for b in range(4)])
    return lookup[q] + shift

  update, new_res = {}, [dict(r) for r in residuals]
  for name in deltas[0]:
    total = count = None
    for w, (delta, res) in enumerate(zip(deltas, residuals)):
      e = beta * res[name] + delta[name]
      chunks, untile = tiles(e)
      k = int(max(1, round(chunks.shape[1] * topk / 4096)))
      idx = np.argsort(-np.abs(chunks), axis=1, kind='stable')[:, :k]
      vals = quantize(np.take_along_axis(chunks, idx, 1))
      sent = np.zeros_like(chunks)
      np.put_along_axis(sent, idx, vals, 1)
      chosen = np.zeros_like(chunks)
      np.put_along_axis(chosen, idx, 1.0, 1)
      new_res[w][name] = e - untile(sent)
      total = untile(sent) if total is None else total + untile(sent)
      count = untile(chosen) if count is None else count + untile(chosen)
    update[name] = -lr * total / np.maximum(count, 1.0)
  return update, new_res


@pytest.mark.slow
def test_outer_step_matches_the_reference_code():
  """Two outer steps of 3 workers against a numpy port of the official code."""
  m, beta, topk = 3, 0.95, 128
  outer = sparseloco_outer(error_decay=beta, topk=topk, dense_below=0)
  shapes = {'w': (64, 192), 'v': (128,), 'o': (48, 64)}
  keys = jax.random.split(jax.random.PRNGKey(3), 2 * len(shapes))
  state = jax.vmap(outer.init, axis_name='workers')({k: jnp.zeros((m,) + s) for k, s in shapes.items()})
  update = jax.jit(jax.vmap(lambda d, s: outer.update(d, s, context=WorkerContext()),
                            axis_name='workers'))
  residuals = [{k: np.zeros(s, np.float32) for k, s in shapes.items()} for _ in range(m)]
  for step in range(2):
    deltas = {k: jax.random.normal(keys[2 * i + step], (m,) + s) * (1 + i)
              for i, (k, s) in enumerate(shapes.items())}
    ours, state = update(deltas, state)
    want, residuals = _reference_outer(
        [{k: np.asarray(v[w]) for k, v in deltas.items()} for w in range(m)],
        residuals, beta, topk)
    for k in shapes:
      for w in range(m):
        np.testing.assert_allclose(ours[k][w], want[k], rtol=1e-4, atol=1e-5)
  ef_state = state[0].compressor
  for k in shapes:
    for w in range(m):
      np.testing.assert_allclose(ef_state.residual[k][w], residuals[w][k],
                                 rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('kwargs,bits', [
    # w (128, 64): 2 tiles x 64 kept x (12 index + 2 value bits) + shift + 4 codebook;
    # norm (64,): below one chunk, sent whole: 64 x 2 bits + 160.
    ({}, 2 * 64 * 14 + 160 + 64 * 2 + 160),
    ({'topk': 128}, 2 * 128 * 14 + 160 + 64 * 2 + 160),
    # The reference's rule: norm chunk of 64, k' = 1, 6 index + 2 value bits + 160.
    ({'dense_below': 0}, 2 * 64 * 14 + 160 + 8 + 160),
    ({'compression': 'none'}, 2 * 64 * 44 + 64 * 32),
])
def test_bytes_per_sync_match_hand_count(kwargs, bits):
  params = {'w': jnp.zeros((128, 64)), 'norm': jnp.ones((64,))}
  m = 4
  alg = algorithms.make('sparseloco', optax.sgd(0.1), sync_every=2, **kwargs)
  state = alg.init(params, m, jax.random.PRNGKey(0))
  grads = {'w': jax.random.normal(jax.random.PRNGKey(1), (m, 128, 64)),
           'norm': jax.random.normal(jax.random.PRNGKey(2), (m, 64))}
  step = jax.jit(alg.step)
  state, info = step(state, grads)
  assert not bool(info.synced) and float(info.wire.sent.sum()) == 0.0
  state, info = step(state, grads)
  assert bool(info.synced)
  np.testing.assert_array_equal(info.wire.sent, bits / 8)
  np.testing.assert_array_equal(info.wire.received, (m - 1) * bits / 8)
  np.testing.assert_array_equal(info.wire.events, 1)


def _gather(compressor, x_MxN, divide, alive=None):
  link = comm.sparse_all_gather_mean(compressor, divide=divide)
  m = x_MxN.shape[0]
  alive = jnp.ones((m,), bool) if alive is None else alive
  def one(x, a):
    return link.update({'x': x}, link.init({'x': x}),
                       context=WorkerContext(alive=a))
  out, state = jax.vmap(one, axis_name='workers')(x_MxN, alive)
  return out['x'], state.comm


def test_contributors_versus_workers_division():
  x = jnp.array([[1.0, 0.1, 0.0, 0.0], [0.1, 2.0, 0.0, 0.0]])
  topk = compress.topk_chunks(4, 16)           # a 4-vector is one chunk, k' = 1
  got, _ = _gather(topk, x, 'contributors')
  np.testing.assert_allclose(got, [[1.0, 2.0, 0.0, 0.0]] * 2)
  got, _ = _gather(topk, x, 'workers')
  np.testing.assert_allclose(got, [[0.5, 1.0, 0.0, 0.0]] * 2)
  # Dense messages: both are the plain mean.
  for divide in ('contributors', 'workers'):
    got, state = _gather(None, x, divide)
    np.testing.assert_allclose(got, [[0.55, 1.05, 0.0, 0.0]] * 2)
    np.testing.assert_array_equal(state.sent, 16.0)
    np.testing.assert_array_equal(state.received, 16.0)


@pytest.mark.slow
@pytest.mark.parametrize('divide', ['contributors', 'workers'])
@pytest.mark.parametrize('alive', [None, [True, False, True, True]])
def test_gathering_only_the_sent_coordinates_equals_the_dense_reduction(divide, alive):
  """A sparsified tensor travels as (indices, values) at the message's capacity and is
  scatter-added; the result is the dense psum's (the compiled program's collectives:
  tests/test_mesh.py)."""
  codec = lambda: compress.error_feedback(
      compress.then(compress.topk_chunks(16, 256, dense_below=64), compress.binned()), 0.9)
  x = {'w': jax.random.normal(jax.random.PRNGKey(0), (4, 64, 64)),
       'b': jax.random.normal(jax.random.PRNGKey(1), (4, 8))}       # 'b': sent whole
  alive = None if alive is None else jnp.array(alive)
  def run(transport):
    link = comm.sparse_all_gather_mean(codec(), divide=divide, transport=transport)
    a = jnp.ones((4,), bool) if alive is None else alive
    one = lambda t, a: link.update(t, link.init(t), context=WorkerContext(alive=a))[0]
    return jax.vmap(one, axis_name='workers')(x, a)
  got, want = run('gather'), run('dense')
  for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)


def test_dead_workers_are_left_out_of_the_all_gather():
  x = jnp.array([[1.0, 1.0], [3.0, 3.0], [50.0, 50.0]])
  alive = jnp.array([True, True, False])
  got, state = _gather(None, x, 'contributors', alive)
  np.testing.assert_allclose(got, 2.0)          # every worker adopts the alive mean
  np.testing.assert_array_equal(state.sent, [8.0, 8.0, 0.0])
  # The absent worker sends nothing but downloads the two alive messages it adopts.
  np.testing.assert_array_equal(state.received, [8.0, 8.0, 16.0])
  np.testing.assert_array_equal(state.events, [1, 1, 1])


@pytest.mark.slow
def test_diloco_with_compressed_pseudo_gradients():
  params = {'a': jnp.zeros((10, 7)), 'b': jnp.zeros((3,))}         # 73 values, 2 tensors
  m = 5
  grads = {'a': jax.random.normal(jax.random.PRNGKey(0), (m, 10, 7)),
           'b': jax.random.normal(jax.random.PRNGKey(1), (m, 3))}
  results = {}
  for compression, bits_per_value in (('none', None), ('e4m3', 8), ('e3m0', 4),
                                      ('int8', 8)):
    alg = algorithms.make('diloco', optax.sgd(0.1), sync_every=1, outer_optimizer='sgd',
                          outer_lr=1.0, outer_momentum=0.0, compression=compression)
    state, info = jax.jit(alg.step)(alg.init(params, m, jax.random.PRNGKey(0)), grads)
    results[compression] = state.params
    if bits_per_value is not None:
      size = (73 * bits_per_value + 2 * 32) / 8
      np.testing.assert_allclose(info.wire.sent, 2 * (m - 1) / m * size, rtol=1e-6)
      np.testing.assert_allclose(info.wire.received, 2 * (m - 1) / m * size, rtol=1e-6)
  exact = results['none']
  for compression, tol in (('e4m3', 2 ** -3), ('int8', 0.02), ('e3m0', 1.0)):
    for got, want in zip(jax.tree.leaves(results[compression]), jax.tree.leaves(exact)):
      scale = float(jnp.max(jnp.abs(want)))
      assert float(jnp.max(jnp.abs(got - want))) <= tol * scale, compression
      np.testing.assert_allclose(got[0], got[-1])   # every worker agrees
  with pytest.raises(ConfigError, match='algorithm.compression'):
    algorithms.make('diloco', optax.sgd(0.1), compression='fp4')


def test_config_keys_and_bad_input():
  keys = set(default.get_config().algorithm.keys())
  for name in ('sparseloco', 'diloco'):
    assert set(algorithms.keys_of(name)) <= keys, name
  with pytest.raises(ConfigError, match='algorithm.aggregation'):
    algorithms.make('sparseloco', optax.sgd(0.1), aggregation='median')
  with pytest.raises(ConfigError, match='topk'):
    algorithms.make('sparseloco', optax.sgd(0.1), topk=8192)
  with pytest.raises(ConfigError, match='error_decay'):
    algorithms.make('sparseloco', optax.sgd(0.1), error_decay=2.0)
  with pytest.raises(ConfigError, match='sparsifier'):
    comm.compressed_all_reduce_mean(compress.topk_chunks())
