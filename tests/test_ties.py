"""DiLoCo's outer-gradient pruning (comm.ties_mean, algorithm.prune) against a numpy
replay of TIES' trim / elect / disjoint mean, with bytes counted by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import comm
from loco.comm import WorkerContext
from loco.errors import ConfigError


def _ties(x_MxN: np.ndarray, density: float, alive: np.ndarray) -> np.ndarray:
  """TIES, written from its definition: per worker keep the top round(density n) by
  magnitude; per coordinate elect the sign of the kept values' sum; average the kept
  values of that sign (0 if none)."""
  m, n = x_MxN.shape
  k = max(1, round(density * n))
  kept = np.zeros_like(x_MxN)
  for i in range(m):
    if alive[i]:
      top = np.argsort(-np.abs(x_MxN[i]), kind='stable')[:k]
      kept[i, top] = x_MxN[i, top]
  sign = np.sign(kept.sum(0))
  out = np.zeros(n)
  for j in range(n):
    agree = [kept[i, j] for i in range(m) if kept[i, j] != 0 and np.sign(kept[i, j]) == sign[j]]
    out[j] = np.mean(agree) if agree else 0.0
  return out


def _link(x_MxN, density, alive):
  link = comm.ties_mean(density)

  def one(x, a):
    return link.update({'x': x}, link.init({'x': x}), context=WorkerContext(alive=a))
  out, state = jax.vmap(one, axis_name='workers')(jnp.asarray(x_MxN), jnp.asarray(alive))
  return np.asarray(out['x']), state.comm


@pytest.mark.parametrize('density', [0.25, 0.5, 0.75, 1.0])
def test_ties_mean_is_trim_elect_and_disjoint_mean(density):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 64)).astype(np.float32)
  alive = np.array([True, True, False, True, True])
  got, wire = _link(x, density, alive)
  want = _ties(x, density, alive)
  for row in got:
    np.testing.assert_allclose(row, want, rtol=1e-6, atol=1e-7)
  # Bytes by hand: k values of 32 bits and k indices of ceil(log2 64) = 6 bits each.
  k = round(density * 64)
  sent = k * (32 + 6) / 8
  np.testing.assert_array_equal(wire.sent, np.where(alive, sent, 0.0))
  np.testing.assert_array_equal(wire.received, np.where(alive, 3 * sent, 4 * sent))


def test_the_sign_election_drops_the_minority():
  # Coordinate 0: +3 and +1 against -2: the sign is +, the mean of +3 and +1 is 2;
  # coordinate 1: +1 against -0.5 and -4: the sign is -, the mean of -0.5 and -4.
  x = np.array([[3.0, 1.0], [1.0, -0.5], [-2.0, -4.0]], np.float32)
  got, _ = _link(x, 1.0, np.ones(3, bool))
  np.testing.assert_allclose(got[0], [2.0, -2.25])
  # Half pruned: each worker keeps its larger value only (3, 1 at 0; -4 at 1).
  got, _ = _link(x, 0.5, np.ones(3, bool))
  np.testing.assert_allclose(got[0], [2.0, -4.0])


def test_diloco_prune_steps_with_the_ties_link_and_zero_is_plain_diloco():
  inner = optax.sgd(0.1)
  params = {'w': jnp.arange(8.0).reshape(2, 4) / 8}
  grads = lambda s: jax.tree.map(lambda p: jnp.sin(7 * p + jnp.arange(3)[:, None, None]), s.params)
  plain = algorithms.make('diloco', inner, sync_every=1, outer_lr=1.0)
  pruned0 = algorithms.make('diloco', inner, sync_every=1, outer_lr=1.0, prune=0.0)
  pruned = algorithms.make('diloco', inner, sync_every=1, outer_lr=1.0, prune=0.5)
  states = [a.init(params, 3, jax.random.key(0)) for a in (plain, pruned0, pruned)]
  outs = [jax.jit(a.step)(s, grads(s)) for a, s in zip((plain, pruned0, pruned), states)]
  np.testing.assert_array_equal(outs[0][0].params['w'], outs[1][0].params['w'])
  assert not np.allclose(outs[0][0].params['w'], outs[2][0].params['w'])
  # Bytes: 4 of 8 values kept, 32 + 3 index bits each, sent to 2 peers and received.
  np.testing.assert_array_equal(outs[2][1].wire.sent, 4 * 35 / 8)
  np.testing.assert_array_equal(outs[2][1].wire.received, 2 * 4 * 35 / 8)
  for bad, match in ((1.0, 'in \\[0, 1\\)'), (-0.1, 'in \\[0, 1\\)')):
    with pytest.raises(ConfigError, match=match):
      algorithms.make('diloco', inner, sync_every=1, prune=bad)
  with pytest.raises(ConfigError, match='does not combine'):
    algorithms.make('diloco', inner, sync_every=1, prune=0.5, compression='e3m0')
  assert math.isclose(algorithms.settings_of('diloco', {})['prune'], 0.0)
