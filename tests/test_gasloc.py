"""GASLoC and the gossip baselines: oracles, hand-computed steps, bytes, bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import comm
from loco.algorithms import optim
from loco.comm import topology as topology_lib
from loco.core.engine import StepContext
from loco.errors import ConfigError


def _problem(m, seed=0):
  """A small regression whose data differ per worker (so workers drift apart)."""
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  params = {'w': jax.random.normal(k1, (5, 2)) * 0.1, 'b': jnp.zeros((2,))}
  x = jax.random.normal(k2, (16, m, 8, 5))            # [steps, workers, batch, features]
  y = jnp.tanh(x @ jnp.linspace(-1.0, 1.0, 10).reshape(5, 2))

  def loss(p, xb, yb):
    return jnp.mean((jnp.tanh(xb @ p['w'] + p['b']) - yb) ** 2)

  return params, x, y, loss


def _train(alg, m, steps=12, seed=0, ctx=None):
  params, x, y, loss = _problem(m, seed)
  state = alg.init(params, m, jax.random.PRNGKey(seed))
  step = jax.jit(alg.step)
  infos = []
  for t in range(steps):
    grads = jax.vmap(jax.grad(loss))(state.params, x[t], y[t])
    state, info = step(state, grads, ctx)
    infos.append(info)
  return state, infos


def _inner():
  return optim.inner_optimizer(optim.InnerConfig(lr=0.05, warmup_steps=2, decay_steps=10))


def _assert_trees_equal(a, b):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(u, v)


@pytest.mark.slow
@pytest.mark.parametrize('m,mix', [(3, 'models'), (4, 'deltas')])
def test_gasloc_on_the_complete_graph_is_diloco_exactly(m, mix):
  kw = dict(sync_every=3, outer_optimizer='nesterov', outer_lr=0.7, outer_momentum=0.9)
  ref, ref_infos = _train(algorithms.make('diloco', _inner(), **kw), m)
  got, got_infos = _train(algorithms.make('gasloc', _inner(), topology='complete',
                                          weights='uniform', mix=mix, **kw), m)
  _assert_trees_equal(got.params, ref.params)
  _assert_trees_equal(got.anchor, ref.anchor)
  _assert_trees_equal(got.outer_state[1], ref.outer_state[1])     # Nesterov traces
  for a, b in zip(got_infos, ref_infos):
    np.testing.assert_array_equal(a.wire.sent, b.wire.sent)
    assert bool(a.synced) == bool(b.synced)


@pytest.mark.slow
def test_gasloc_h1_outer_sgd_lr1_is_dsgd():
  ref, _ = _train(algorithms.make('dsgd', _inner(), topology='ring'), 5)
  got, _ = _train(algorithms.make('gasloc', _inner(), sync_every=1, topology='ring',
                                  outer_optimizer='sgd', outer_lr=1.0,
                                  outer_momentum=0.0), 5)
  _assert_trees_equal(got.params, ref.params)


@pytest.mark.slow
def test_noloco_is_gasloc_on_random_matchings_with_heavy_ball():
  ref, _ = _train(algorithms.make('noloco', _inner(), sync_every=3), 6)
  got, _ = _train(algorithms.make('gasloc', _inner(), sync_every=3, topology='matching',
                                  outer_optimizer='heavy_ball', outer_lr=0.7,
                                  outer_momentum=0.5), 6)
  _assert_trees_equal(got.params, ref.params)


def _flat(tree):
  return np.concatenate([np.asarray(v, np.float64).reshape(v.shape[0], -1)
                         for v in jax.tree.leaves(tree)], axis=1)


def test_gasloc_round_on_a_ring_by_hand():
  """H = 2 inner SGD steps, then theta_i <- theta_i - lr (theta_i - sum_j W_ij phi_j)."""
  m, lr, outer_lr = 6, 0.1, 0.5
  alg = algorithms.make('gasloc', optax.sgd(lr), sync_every=2, topology='ring',
                        outer_optimizer='sgd', outer_lr=outer_lr)
  params, x, y, loss = _problem(m)
  state = alg.init(params, m, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  phi = _flat(state.params)
  sizes = []
  for t in range(2):
    grads = jax.vmap(jax.grad(loss))(state.params, x[t], y[t])
    phi = phi - lr * _flat(grads)
    state, info = step(state, grads)
    sizes.append(np.asarray(info.wire.sent))
  w = topology_lib.make_topology('ring', m).weights
  theta = _flat(jax.tree.map(lambda v: jnp.broadcast_to(v, (m,) + v.shape), params))
  want = theta - outer_lr * (theta - w @ phi)
  np.testing.assert_allclose(_flat(state.anchor), want, atol=1e-6)
  np.testing.assert_allclose(_flat(state.params), want, atol=1e-6)
  np.testing.assert_array_equal(sizes[0], 0.0)                 # no sync, nothing sent
  np.testing.assert_array_equal(sizes[1], 2 * (10 + 2) * 4)    # two neighbours, 12 floats


# GASLoC as stated (form='proposed_points'): theta <- W_alpha y + gamma (y - y_prev),
# y = theta - eta Delta.

@pytest.mark.slow
def test_proposed_points_on_the_complete_graph_without_momentum_is_diloco_with_outer_sgd():
  ref, ref_infos = _train(algorithms.make('diloco', _inner(), sync_every=3,
                                          outer_optimizer='sgd', outer_lr=0.6), 4)
  got, got_infos = _train(algorithms.make('gasloc', _inner(), sync_every=3,
                                          form='proposed_points', topology='complete',
                                          weights='uniform', outer_lr=0.6,
                                          outer_momentum=0.0), 4)
  for name in ('params', 'anchor'):
    for u, v in zip(jax.tree.leaves(getattr(got, name)), jax.tree.leaves(getattr(ref, name))):
      np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
  for a, b in zip(got_infos, ref_infos):
    np.testing.assert_array_equal(a.wire.sent, b.wire.sent)


@pytest.mark.slow
@pytest.mark.parametrize('topology', ['ring', 'exponential'])
def test_proposed_points_at_eta_1_without_momentum_is_the_reconstruction_at_outer_sgd_1(topology):
  kw = dict(sync_every=3, topology=topology, outer_lr=1.0, gossip_step=0.8)
  ref, ref_infos = _train(algorithms.make('gasloc', _inner(), outer_optimizer='sgd',
                                          outer_momentum=0.0, **kw), 8)
  got, got_infos = _train(algorithms.make('gasloc', _inner(), form='proposed_points',
                                          outer_momentum=0.0, **kw), 8)
  _assert_trees_equal(got.params, ref.params)
  _assert_trees_equal(got.anchor, ref.anchor)
  for a, b in zip(got_infos, ref_infos):
    np.testing.assert_array_equal(a.wire.sent, b.wire.sent)


@pytest.mark.parametrize('local_steps', [None, (1, 2, 2, 1, 2, 2)])
def test_proposed_points_rounds_on_a_ring_by_hand(local_steps):
  """Three rounds of H = 2 inner SGD steps (or per-worker H_i: workers 0 and 3 take one
  step per round and wait); eta, alpha != 1 and heavy-ball gamma on the proposed points
  (none before the first)."""
  m, lr, eta, alpha, gamma = 6, 0.1, 0.8, 0.5, 0.6
  alg = algorithms.make('gasloc', optax.sgd(lr), sync_every=2, topology='ring',
                        form='proposed_points', outer_lr=eta, gossip_step=alpha,
                        outer_momentum=gamma, local_steps=local_steps)
  budget = np.full(m, 2) if local_steps is None else np.asarray(local_steps)
  params, x, y, loss = _problem(m)
  state = alg.init(params, m, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  w = topology_lib.make_topology('ring', m).weights
  w_alpha = (1 - alpha) * np.eye(m) + alpha * w          # I - alpha Lambda
  theta = _flat(state.anchor)
  phi, previous = theta.copy(), None
  for t in range(6):
    grads = jax.vmap(jax.grad(loss))(state.params, x[t], y[t])
    phi = phi - lr * (budget > t % 2)[:, None] * _flat(grads)
    state, _ = step(state, grads)
    if t % 2 == 1:
      proposed = theta + eta * (phi - theta)
      theta = w_alpha @ proposed + (0.0 if previous is None else gamma * (proposed - previous))
      phi, previous = theta.copy(), proposed
      np.testing.assert_allclose(_flat(state.anchor), theta, atol=1e-6)
  np.testing.assert_allclose(_flat(state.params), theta, atol=1e-6)
  assert not np.allclose(theta[0], theta[1])     # the ring has not reached consensus


def test_a_dead_worker_keeps_its_own_round():
  """Gossip drops a dead worker's edges: it steps on its own delta, the rest mix."""
  m = 4
  alive = jnp.array([True, False, True, True])
  alg = algorithms.make('gasloc', optax.sgd(0.1), sync_every=1, topology='ring',
                        outer_optimizer='sgd', outer_lr=1.0)
  params, x, y, loss = _problem(m)
  state = alg.init(params, m, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  grads = jax.vmap(jax.grad(loss))(state.params, x[0], y[0])
  phi = _flat(state.params) - 0.1 * _flat(grads)
  state, info = step(state, grads, StepContext(alive=alive))
  w = topology_lib.make_topology('ring', m).weights * np.outer(alive, alive)
  w[np.diag_indices(m)] = 0.0
  w[np.diag_indices(m)] = 1.0 - w.sum(1)
  np.testing.assert_allclose(_flat(state.params), w @ phi, atol=1e-6)
  np.testing.assert_allclose(_flat(state.params)[1], phi[1], atol=1e-7)
  np.testing.assert_array_equal(np.asarray(info.wire.sent), [48, 0, 48, 96])


def test_dsgd_step_by_hand():
  m, lr = 5, 0.1
  alg = algorithms.make('dsgd', optax.sgd(lr), topology='exponential')
  params, x, y, loss = _problem(m)
  state = alg.init(params, m, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  state, _ = step(state, jax.vmap(jax.grad(loss))(state.params, x[0], y[0]))
  grads = jax.vmap(jax.grad(loss))(state.params, x[1], y[1])
  before = _flat(state.params)
  state, info = step(state, grads)
  w = topology_lib.make_topology('exponential', m).weights
  np.testing.assert_allclose(_flat(state.params), w @ (before - lr * _flat(grads)),
                             atol=1e-6)
  assert bool(info.synced)


def _member(family, state_key):
  """The matching the engine's step with `state.key` draws."""
  _, step_key = jax.random.split(state_key)
  key = comm.round_key(comm.WorkerContext(key=step_key), 0, 0)
  return family.weights_for(int(family.sample_choice_jax(key)))


def test_adpsgd_averages_with_a_partner_then_steps():
  m, lr = 8, 0.1
  alg = algorithms.make('adpsgd', optax.sgd(lr))
  params, x, y, loss = _problem(m)
  state = alg.init(params, m, jax.random.PRNGKey(3))
  step = jax.jit(alg.step)
  family = comm.resolve_topology('exponential', m, pairwise=True)
  assert family.num_choices == 5
  for t in range(3):
    grads = jax.vmap(jax.grad(loss))(state.params, x[t], y[t])
    w = _member(family, state.key)
    want = w @ _flat(state.params) - lr * _flat(grads)    # gradient at x_i, pre-averaging
    state, info = step(state, grads)
    np.testing.assert_allclose(_flat(state.params), want, atol=1e-6)
    np.testing.assert_array_equal(info.wire.sent, 12 * 4)   # one partner per step


def test_a2cid2_tick_by_hand():
  m, lr = 6, 0.1
  alg = algorithms.make('a2cid2', optax.sgd(lr), topology='ring')
  params, x, y, loss = _problem(m)
  state = alg.init(params, m, jax.random.PRNGKey(1))
  step = jax.jit(alg.step)
  family = comm.resolve_topology('ring', m, pairwise=True)
  assert family.chi1 == pytest.approx(topology_lib.make_topology('ring', m).chi1)
  eta = 0.5 / math.sqrt(family.chi1 * family.chi2)
  alpha = 0.5 * math.sqrt(family.chi1 / family.chi2)
  a, b = (1 + math.exp(-eta)) / 2, (1 - math.exp(-eta)) / 2     # half a unit of time
  xs, xt = _flat(state.params), _flat(state.params)
  for t in range(4):
    grads = jax.vmap(jax.grad(loss))(state.params, x[t], y[t])
    w = _member(family, state.key)
    xs, xt = xs - lr * _flat(grads), xt - lr * _flat(grads)
    xs, xt = a * xs + b * xt, b * xs + a * xt
    xt = xt + 2 * alpha * (w @ xs - xs)                   # alpha~ (x_j - x_i)
    xs = w @ xs                                           # pairs average
    xs, xt = a * xs + b * xt, b * xs + a * xt
    state, info = step(state, grads)
    np.testing.assert_allclose(_flat(state.params), xs, atol=1e-5)
  tilde = state.inner_state[1].tilde
  np.testing.assert_allclose(_flat(tilde), xt, atol=1e-5)
  np.testing.assert_array_equal(info.wire.sent, 12 * 4)


def test_a2cid2_with_no_gradient_reaches_consensus_and_keeps_the_mean():
  m = 8
  alg = algorithms.make('a2cid2', optax.sgd(0.0), topology='ring')
  params, _, _, _ = _problem(m)
  state = alg.init(params, m, jax.random.PRNGKey(0))
  spread = jax.tree.map(lambda v: v + jax.random.normal(jax.random.PRNGKey(2), v.shape),
                        state.params)
  state = state._replace(params=spread)
  zero = jax.tree.map(jnp.zeros_like, spread)
  step = jax.jit(alg.step)
  start = _flat(spread)
  start_tilde = _flat(state.inner_state[1].tilde)     # x~ starts at the initial params
  for _ in range(60):
    state, _ = step(state, zero)
  end = _flat(state.params) + _flat(state.inner_state[1].tilde)
  # x + x~ summed over workers is invariant; the spread shrinks.
  np.testing.assert_allclose(end.sum(0), (start + start_tilde).sum(0), atol=1e-4)
  final = _flat(state.params)
  assert np.linalg.norm(final - final.mean(0)) < 0.05 * np.linalg.norm(start - start.mean(0))


def test_bad_input():
  with pytest.raises(ConfigError, match="'hypercube' does not fit num_workers=6.*power of two"):
    algorithms.make('gasloc', optax.sgd(0.1), topology='hypercube').init(
        {'w': jnp.zeros(3)}, 6, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match="'torus' does not fit num_workers=7"):
    algorithms.make('dsgd', optax.sgd(0.1), topology='torus').init(
        {'w': jnp.zeros(3)}, 7, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match="'matching' does not fit num_workers=5.*even"):
    algorithms.make('noloco', optax.sgd(0.1)).init({'w': jnp.zeros(3)}, 5,
                                                   jax.random.PRNGKey(0))
  for name in ('gasloc', 'dsgd', 'adpsgd', 'a2cid2', 'noloco'):
    with pytest.raises(ConfigError, match='algorithm.topology must be one of'):
      algorithms.make(name, optax.sgd(0.1), topology='star')
  with pytest.raises(ConfigError, match="algorithm.mix must be 'models' or 'deltas'"):
    algorithms.make('gasloc', optax.sgd(0.1), mix='params')
  with pytest.raises(ConfigError, match='algorithm.weights'):
    algorithms.make('gasloc', optax.sgd(0.1), weights='max_degree')
  with pytest.raises(ConfigError, match='gossip_step'):
    algorithms.make('dsgd', optax.sgd(0.1), gossip_step=0.0)
  with pytest.raises(ConfigError, match='does not take'):
    algorithms.make('a2cid2', optax.sgd(0.1), sync_every=5)
  with pytest.raises(ConfigError, match='algorithm.form must be one of diloco_outer, '
                                        'proposed_points'):
    algorithms.make('gasloc', optax.sgd(0.1), form='stated')
  with pytest.raises(ConfigError, match=r'local_steps must be integers in \[1, sync_every=4\]'):
    algorithms.make('gasloc', optax.sgd(0.1), sync_every=4, local_steps=[4, 5])
  with pytest.raises(ConfigError, match='local_steps has 2 entries for num_workers=3'):
    algorithms.make('gasloc', optax.sgd(0.1), sync_every=4, local_steps=[4, 2]).init(
        {'w': jnp.zeros(3)}, 3, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match="form='proposed_points'.*mix 'models' only"):
    algorithms.make('gasloc', optax.sgd(0.1), form='proposed_points', mix='deltas')


def test_gasloc_pairwise_averages_with_one_ring_neighbour_per_round():
  """pairwise=True: each round every worker averages its model with one neighbour of the
  ring (a random matching of the graph), and sends its model to that one peer only."""
  m, lr = 6, 0.1
  kw = dict(sync_every=1, topology='ring', outer_optimizer='sgd', outer_lr=1.0,
            outer_momentum=0.0)
  params, x, y, loss = _problem(m)
  for pairwise, peers in ((True, 1), (False, 2)):
    alg = algorithms.make('gasloc', optax.sgd(lr), pairwise=pairwise, **kw)
    state = alg.init(params, m, jax.random.PRNGKey(0))
    step = jax.jit(alg.step)
    partners = []
    for t in range(4):
      grads = jax.vmap(jax.grad(loss))(state.params, x[t], y[t])
      phi = _flat(state.params) - lr * _flat(grads)
      state, info = step(state, grads, None)
      model_bytes = 4 * phi.shape[1]
      np.testing.assert_array_equal(info.wire.sent, peers * model_bytes)
      if pairwise:
        got = _flat(state.params)
        for i in range(m):
          match = [j for j in ((i - 1) % m, (i + 1) % m)
                   if np.allclose(got[i], (phi[i] + phi[j]) / 2, atol=1e-6)]
          assert len(match) == 1, (t, i)
          partners.append(match[0])
    if pairwise:   # the matchings change between rounds
      assert len({tuple(partners[r * m:(r + 1) * m]) for r in range(4)}) > 1
