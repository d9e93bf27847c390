"""SPARTA and SPARTA-DiLoCo: a numpy replay of the update, an oracle, bytes by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import comm
from loco.algorithms.diloco import local_sgd
from loco.algorithms.sparta import sparta, sparta_diloco
from loco.comm.sparta import random_parameter_average, shared_masks
from loco.errors import ConfigError

M, LR, P, STEPS = 4, 0.1, 0.3, 7


def _problem():
  key = jax.random.key(5)
  params = {'b': jax.random.normal(jax.random.fold_in(key, 0), (16,)),
            'w': jax.random.normal(jax.random.fold_in(key, 1), (6, 10))}
  targets = {n: jax.random.normal(jax.random.fold_in(key, 2 + j), (M, *params[n].shape))
             for j, n in enumerate(sorted(params))}
  return params, targets


def _run(alg, params, targets, steps, key=jax.random.key(0)):
  state = alg.init(params, M, key)
  step = jax.jit(lambda s: alg.step(s, jax.tree.map(lambda p, t: p - t, s.params, targets)))
  infos = []
  for _ in range(steps):
    state, info = step(state)
    infos.append(info)
  return state, infos


def _step_masks(params, steps, key=jax.random.key(0)):
  """The masks the run draws: the engine splits its key once per step and hands the
  second half to every worker as the tick's key (the draw is the shared RNG; the
  update itself is replayed below in numpy)."""
  out = []
  for _ in range(steps):
    key, tick = jax.random.split(key)
    out.append({n: np.asarray(m) for n, m in shared_masks(tick, params, P).items()})
  return out


def _replay(params, targets, masks, sync_every=None, outer_lr=0.7, mu=0.9):
  theta = {n: np.repeat(np.asarray(v, np.float64)[None], M, 0) for n, v in params.items()}
  anchor = {n: np.asarray(v, np.float64) for n, v in params.items()}
  velocity = {n: np.zeros(v.shape) for n, v in params.items()}
  for t, mask in enumerate(masks, start=1):
    for n in theta:
      theta[n] = theta[n] - LR * (theta[n] - np.asarray(targets[n]))     # SGD, own gradient
      theta[n] = np.where(mask[n], theta[n].mean(0, keepdims=True), theta[n])
    if sync_every and t % sync_every == 0:       # DiLoCo: Nesterov on the mean delta
      for n in theta:
        delta = (anchor[n] - theta[n]).mean(0)
        velocity[n] = mu * velocity[n] + delta
        anchor[n] = anchor[n] - outer_lr * (delta + mu * velocity[n])
        theta[n] = np.repeat(anchor[n][None], M, 0)
  return theta


@pytest.mark.slow
def test_sparta_matches_numpy_replay():
  params, targets = _problem()
  state, _ = _run(sparta(optax.sgd(LR), fraction=P), params, targets, STEPS)
  expected = _replay(params, targets, _step_masks(params, STEPS))
  for n in params:
    np.testing.assert_allclose(state.params[n], expected[n], atol=1e-5)
  # The workers agree on the averaged coordinates only: they have not collapsed.
  assert float(jnp.max(jnp.abs(state.params['w'][0] - state.params['w'][1]))) > 1e-2


def test_sparta_diloco_matches_numpy_replay():
  params, targets = _problem()
  alg = sparta_diloco(optax.sgd(LR), fraction=P, sync_every=3)
  state, infos = _run(alg, params, targets, STEPS)
  expected = _replay(params, targets, _step_masks(params, STEPS), sync_every=3)
  for n in params:
    np.testing.assert_allclose(state.params[n], expected[n], atol=1e-5)
  # SPARTA's link talks every step; DiLoCo's rounds are every third.
  assert all(float(i.wire.sent[0]) > 0 for i in infos)
  assert [bool(i.synced) for i in infos] == [t % 3 == 0 for t in range(1, STEPS + 1)]


def test_full_fraction_is_model_averaging_every_step():
  """p = 1 averages every coordinate after every step: Local SGD with H = 1."""
  params, targets = _problem()
  ours, _ = _run(sparta(optax.sgd(LR), fraction=1.0), params, targets, 4)
  oracle, _ = _run(local_sgd(optax.sgd(LR), sync_every=1), params, targets, 4)
  for a, b in zip(jax.tree.leaves(ours.params), jax.tree.leaves(oracle.params)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_sparta_bytes_by_hand():
  """Each step n masked values of 4 bytes go through a ring all-reduce of M workers:
  2 (M - 1) / M * 4 n bytes sent and received per worker; no indices (shared mask)."""
  params, targets = _problem()
  _, infos = _run(sparta(optax.sgd(LR), fraction=P), params, targets, 3)
  for info, mask in zip(infos, _step_masks(params, 3)):
    n = sum(int(m.sum()) for m in mask.values())
    assert 0 < n < 76
    expected = 2 * (M - 1) / M * 4 * n
    np.testing.assert_allclose(info.wire.sent, [expected] * M, rtol=1e-6)
    np.testing.assert_allclose(info.wire.received, [expected] * M, rtol=1e-6)
    assert bool(jnp.all(info.wire.kind == comm.ALL_REDUCE))


def test_a_worker_that_is_not_alive_keeps_its_params_and_sends_nothing():
  params, _ = _problem()
  link = random_parameter_average(1.0)
  stacked = jax.tree.map(lambda x: jnp.stack([x + i for i in range(M)]), params)
  alive = jnp.array([True, True, False, True])

  def one(p, a):
    ctx = comm.WorkerContext(alive=a, key=jax.random.key(1))
    zeros = jax.tree.map(jnp.zeros_like, p)
    return link.update(zeros, link.init(p), p, context=ctx)

  out, state = jax.vmap(one, axis_name=comm.WORKERS)(stacked, alive)
  np.testing.assert_array_equal(out['w'][2], 0.0)
  np.testing.assert_allclose(stacked['w'][0] + out['w'][0],
                             params['w'] + (0 + 1 + 3) / 3, rtol=1e-6)
  assert float(state.comm.sent[2]) == 0.0 and float(state.comm.sent[0]) > 0


@pytest.mark.parametrize('fraction', [0.0, 1.5, True])
def test_fraction_out_of_range_is_one_error(fraction):
  with pytest.raises(ConfigError, match='algorithm.fraction'):
    random_parameter_average(fraction)
