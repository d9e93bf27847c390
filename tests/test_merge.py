"""Merge policies: the delayed merge by hand, the outer chain split, bad input.

Eager updates are pinned against the behaviour they had inside the engine by
tests/test_streaming.py (an estimate at once, the correction on arrival, tau 0 equal
to the plain merge).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import comm
from loco.core import merge
from loco.core.engine import local_updates
from loco.errors import ConfigError


def _run(policy, steps):
  """Two workers, inner SGD lr 1 on constant gradients, all-reduce + outer SGD lr 1, H 2."""
  alg = local_updates(optax.sgd(1.0), optax.chain(comm.all_reduce_mean(), optax.sgd(1.0)),
                      2, merge=policy)
  state = alg.init({'w': jnp.zeros(3)}, 2, jax.random.PRNGKey(0))
  grads = {'w': jnp.array([[1.0] * 3, [-3.0] * 3])}
  history = []
  for _ in range(steps):
    state, _ = alg.step(state, grads)
    history.append(np.asarray(state.params['w'][:, 0]))
  return state, history


def test_delayed_merge_with_alpha_half_by_hand():
  # After two inner steps phi = -2 g = (-2, 6); the anchor becomes mean(phi) = 2.
  state, history = _run(merge.delayed(0, 0.5), 2)
  np.testing.assert_allclose(history[1], [0.5 * -2 + 0.5 * 2, 0.5 * 6 + 0.5 * 2])
  np.testing.assert_allclose(state.anchor['w'], 2.0)
  # tau 1: the anchor is in flight at step 2; at step 3 phi = (-3, 9) merges with it.
  state, history = _run(merge.delayed(1, 0.5), 3)
  np.testing.assert_allclose(history[1], [-2.0, 6.0])
  np.testing.assert_allclose(history[2], [0.5 * -3 + 0.5 * 2, 0.5 * 9 + 0.5 * 2])
  assert state.extra == ()                          # the delayed merge keeps no state


def test_delayed_without_delay_or_weight_is_the_reset():
  state, history = _run(merge.delayed(), 2)
  np.testing.assert_array_equal(history[1], [2.0, 2.0])
  np.testing.assert_array_equal(state.params['w'], state.anchor['w'])
  # alpha 0 adopts the target exactly, in the params' dtype.
  got = merge.blend({'w': jnp.ones(2, jnp.bfloat16)}, {'w': jnp.full(2, 1 + 2 ** -10)}, 0.0)
  assert got['w'].dtype == jnp.bfloat16
  np.testing.assert_array_equal(got['w'], jnp.full(2, 1 + 2 ** -10).astype(jnp.bfloat16))


def test_eager_state_is_three_float32_trees_of_the_anchor():
  policy = merge.eager(1, 0.5)
  assert policy.needs_link and policy.delay == 1
  state = policy.init({'w': jnp.ones((2, 3))})
  assert isinstance(state, merge.EagerState)
  for tree in state:
    np.testing.assert_array_equal(tree['w'], np.zeros((2, 3)))


def test_outer_split_is_the_chain():
  """`Outer(link, optimizer)` steps exactly as `optax.chain(link, optimizer)`, and
  hands the policy the link's output."""
  link, optimizer = optax.scale(0.5), optax.sgd(0.3, momentum=0.9)
  outer = merge.Outer(optax.with_extra_args_support(link),
                      optax.with_extra_args_support(optimizer))
  chain = optax.chain(link, optimizer)
  anchor, delta = {'w': jnp.arange(3.0)}, {'w': jnp.array([1.0, -2.0, 0.5])}
  s_outer, s_chain = outer.init(anchor), chain.init(anchor)
  for _ in range(3):
    u_outer, s_outer, mean = outer.update(delta, s_outer, anchor, None)
    u_chain, s_chain = chain.update(delta, s_chain, anchor)
    np.testing.assert_array_equal(u_outer['w'], u_chain['w'])
    np.testing.assert_array_equal(mean['w'], 0.5 * delta['w'])
  for a, b in zip(jax.tree.leaves(s_outer), jax.tree.leaves(s_chain)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('make', [merge.delayed, merge.eager])
def test_bad_input(make):
  for tau in (-1, 1.5, True):
    with pytest.raises(ConfigError, match='overlap_steps'):
      make(tau, 0.5)
  for alpha in (-0.1, 1.5):
    with pytest.raises(ConfigError, match='merge_alpha'):
      make(1, alpha)
