"""The engine and every registered algorithm: conformance, oracles, byte accounting."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import comm
from loco import optim
from loco.engine import StepContext, local_updates
from loco.errors import ConfigError

M = 4


def _kwargs(name, sync_every=4):
  return {'sync_every': sync_every} if 'sync_every' in algorithms.keys_of(name) else {}


def _quadratic_setup(key=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(key))
  params = {'w': jax.random.normal(k1, (6, 3)),
            'b': jnp.zeros((3,), jnp.bfloat16)}
  target = {'w': jax.random.normal(k2, (6, 3)), 'b': jnp.ones((3,), jnp.bfloat16)}
  def loss(p):
    return sum(0.5 * jnp.sum((p[k].astype(jnp.float32) - target[k].astype(jnp.float32)) ** 2)
               for k in p)
  return params, target, loss


def _distance(params_MxP, target):
  return float(sum(jnp.sum((x.astype(jnp.float32) - t.astype(jnp.float32)[None]) ** 2)
                   for x, t in zip(jax.tree.leaves(params_MxP), jax.tree.leaves(target))))


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_conformance(name):
  """Every registered algorithm: no retrace, finite state, dtypes kept, converges."""
  params, target, loss = _quadratic_setup()
  alg = algorithms.make(name, optax.sgd(0.1), **_kwargs(name))
  state = alg.init(params, M, jax.random.PRNGKey(1))
  traces = []

  def step(state):
    traces.append(1)
    grads = jax.vmap(jax.grad(loss))(state.params)
    return alg.step(state, grads)

  step = jax.jit(step)
  start = _distance(state.params, target)
  for _ in range(100):
    state, info = step(state)
  assert len(traces) == 1, 'the step was traced more than once (recompilation)'
  assert info.bytes_sent.shape == (M,)
  for leaf in jax.tree.leaves(state):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
    assert got.dtype == want.dtype and got.shape == (M,) + want.shape
  assert _distance(state.params, target) < 0.05 * start


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_silent_steps_do_not_mix_workers(name):
  """If a step reports no communication, no worker's result may depend on another's input."""
  params, _, loss = _quadratic_setup()
  alg = algorithms.make(name, optax.adam(0.05), **_kwargs(name, sync_every=3))
  state = alg.init(params, M, jax.random.PRNGKey(1))
  grads = jax.vmap(jax.grad(loss))(state.params)
  poked = jax.tree.map(lambda g: g.at[1].multiply(-7.0), grads)
  (s1, info), (s2, _) = alg.step(state, grads), alg.step(state, poked)
  if int(info.comms.sum()) > 0:
    pytest.skip(f'{name} communicates on its first step')
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_array_equal(np.delete(np.asarray(a, np.float32), 1, axis=0),
                                  np.delete(np.asarray(b, np.float32), 1, axis=0))


def test_a_user_loop_drives_an_algorithm():
  """The public contract: a hand-written loop with vmapped grads and alg.step."""
  w_true = jnp.linspace(-1.0, 1.0, 8)

  def loss(params, batch_BxD):
    return jnp.mean((batch_BxD @ (params['w'] - w_true)) ** 2)

  alg = algorithms.make('diloco', optax.adamw(1e-2), sync_every=5, outer_lr=0.5)
  state = alg.init({'w': jnp.zeros((8,))}, 3, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  data = jax.random.normal(jax.random.PRNGKey(1), (40, 3, 16, 8))
  first = float(jax.vmap(loss)(state.params, data[0]).mean())
  syncs = 0
  for t in range(40):
    grads = jax.vmap(jax.grad(loss))(state.params, data[t])
    state, info = step(state, grads)
    syncs += int(info.synced)
  assert syncs == 8
  assert float(jax.vmap(loss)(state.params, data[0]).mean()) < 0.5 * first


def _toy_regression(seed=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  params = {'w': jax.random.normal(k1, (5, 2)) * 0.1, 'b': jnp.zeros((2,))}
  x = jax.random.normal(k2, (12, 8, 5))       # [steps, batch, features]
  y = jnp.tanh(x @ jnp.ones((5, 2)))
  def loss(p, xb, yb):
    return jnp.mean((jnp.tanh(xb @ p['w'] + p['b']) - yb) ** 2)
  return params, x, y, loss


def test_ddp_equals_one_worker_at_m_times_the_batch():
  params, x, y, loss = _toy_regression()
  inner = optim.inner_optimizer(optim.InnerConfig(lr=0.05, warmup_steps=2, decay_steps=10))
  ddp = algorithms.make('ddp', inner)
  single = algorithms.make('ddp', inner)
  s_m = ddp.init(params, M, jax.random.PRNGKey(0))
  s_1 = single.init(params, 1, jax.random.PRNGKey(0))
  for t in range(x.shape[0]):
    xb, yb = x[t].reshape(M, -1, 5), y[t].reshape(M, -1, 2)   # M workers x batch 2
    s_m, _ = ddp.step(s_m, jax.vmap(jax.grad(loss))(s_m.params, xb, yb))
    s_1, _ = single.step(s_1, jax.vmap(jax.grad(loss))(s_1.params, x[t][None], y[t][None]))
  for a, b in zip(jax.tree.leaves(s_m.params), jax.tree.leaves(s_1.params)):
    for worker in range(M):
      np.testing.assert_allclose(a[worker], b[0], rtol=1e-5, atol=1e-6)


def test_diloco_one_worker_outer_sgd_lr1_equals_adamw():
  params, x, y, loss = _toy_regression(1)
  inner = optim.inner_optimizer(optim.InnerConfig(lr=0.05, warmup_steps=2, decay_steps=10))
  alg = algorithms.make('diloco', inner, sync_every=3, outer_optimizer='sgd',
                        outer_lr=1.0, outer_momentum=0.0)
  state = alg.init(params, 1, jax.random.PRNGKey(0))
  plain, opt_state = params, inner.init(params)
  for t in range(x.shape[0]):
    state, info = alg.step(state, jax.vmap(jax.grad(loss))(state.params, x[t][None],
                                                           y[t][None]))
    updates, opt_state = inner.update(jax.grad(loss)(plain, x[t], y[t]), opt_state, plain)
    plain = optax.apply_updates(plain, updates)
    assert float(info.bytes_sent[0]) == 0.0       # one worker sends nothing
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(plain)):
    np.testing.assert_allclose(a[0], b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('dtype,itemsize', [('float32', 4), ('bfloat16', 2)])
def test_all_reduce_bytes_match_hand_count(dtype, itemsize):
  params = {'a': jnp.zeros((10, 7)), 'b': jnp.zeros((3,))}        # 73 parameters
  alg = algorithms.make('diloco', optax.sgd(0.1), sync_every=2, transport_dtype=dtype)
  state = alg.init(params, 5, jax.random.PRNGKey(0))
  grads = jax.tree.map(jnp.ones_like, state.params)
  state, info = alg.step(state, grads)
  assert not bool(info.synced) and float(info.bytes_sent.sum()) == 0.0
  state, info = alg.step(state, grads)
  want = 2 * (5 - 1) / 5 * 73 * itemsize
  np.testing.assert_allclose(info.bytes_sent, want, rtol=1e-7)
  np.testing.assert_allclose(info.bytes_received, want, rtol=1e-7)
  np.testing.assert_array_equal(info.comms, 1)
  ddp = algorithms.make('ddp', optax.sgd(0.1), transport_dtype=dtype)
  _, info = ddp.step(ddp.init(params, 5, jax.random.PRNGKey(0)), grads)
  np.testing.assert_allclose(info.bytes_sent, want, rtol=1e-7)


def test_bfloat16_transport_rounds_the_mean():
  params = {'w': jnp.zeros((4,))}
  alg = algorithms.make('ddp', optax.sgd(1.0), transport_dtype='bfloat16')
  state = alg.init(params, 2, jax.random.PRNGKey(0))
  grads = {'w': jnp.array([[1.0 + 2 ** -10] * 4, [1.0] * 4])}
  state, _ = alg.step(state, grads)
  np.testing.assert_array_equal(state.params['w'], -1.0)    # 1 + 2^-10 rounds to 1 in bf16


def test_dead_workers_are_left_out_and_adopt_the_mean():
  params = {'w': jnp.zeros((2,))}
  alg = algorithms.make('diloco', optax.sgd(1.0), sync_every=1, outer_optimizer='sgd',
                        outer_lr=1.0, outer_momentum=0.0)
  state = alg.init(params, 3, jax.random.PRNGKey(0))
  grads = {'w': jnp.array([[1.0, 1.0], [2.0, 2.0], [30.0, 30.0]])}
  ctx = StepContext(alive=jnp.array([True, True, False]))
  state, info = alg.step(state, grads, ctx)
  np.testing.assert_allclose(state.params['w'], -1.5)       # mean of the alive two
  size = 2 * 4
  np.testing.assert_allclose(info.bytes_sent, [size, size, 0.0])   # 2(m-1)/m S, m=2


def test_inactive_workers_do_not_step():
  params = {'w': jnp.zeros((2,))}
  alg = algorithms.make('local_sgd', optax.sgd(1.0), sync_every=10)
  state = alg.init(params, 2, jax.random.PRNGKey(0))
  grads = {'w': jnp.ones((2, 2))}
  state, _ = alg.step(state, grads, StepContext(active=jnp.array([True, False])))
  np.testing.assert_array_equal(state.params['w'], [[-1.0, -1.0], [0.0, 0.0]])
  ddp = algorithms.make('ddp', optax.sgd(1.0))
  _, info = ddp.step(ddp.init(params, 2, jax.random.PRNGKey(0)), grads,
                     StepContext(active=jnp.array([True, False])))
  np.testing.assert_array_equal(info.bytes_sent, [8.0, 0.0])   # the idle worker sends nothing


def test_bad_input():
  with pytest.raises(ConfigError, match='sync_every'):
    local_updates(optax.sgd(1.0), optax.sgd(1.0), 0)
  with pytest.raises(ConfigError, match='algorithm.name'):
    algorithms.make('dilocco', optax.sgd(1.0))
  with pytest.raises(ConfigError, match='outer_optimizer'):
    algorithms.make('diloco', optax.sgd(1.0), outer_optimizer='lamb')
  with pytest.raises(ConfigError, match='does not take'):
    algorithms.make('ddp', optax.sgd(1.0), sync_every=5)
  with pytest.raises(ConfigError, match='transport dtype'):
    comm.all_reduce_mean('int8')
