"""Eager merges, SPARTA, MuLoCo, TIES pruning, one-peer GASLoC and the sparse
all-gather's absent workers: numpy replays and hand counts written from the definitions.

Each block pins what its module docstring states: the eager estimate, its correction
on arrival and the outer state it steps from (loco/core/merge.py); SPARTA's per-tensor shared
masks and its bytes at the transport dtype (loco/comm/sparta.py); MuLoCo's defaults
(loco/algorithms/muloco.py and its registry entry); the fraction DiLoCo's `prune` cuts
from each tensor (loco/comm/ties.py); GASLoC's `pairwise` rounds (one neighbour, one
model's bytes); what an absent worker sends and receives in the sparse all-gather.
"""

import functools
import math

from hypothesis import given, settings, strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import contrib
import pytest

from loco import algorithms
from loco import comm
from loco.comm import compress
from loco.run import experiment
from loco.core import merge
from loco import model as model_lib
from loco.sim import network
from loco.algorithms import optim
from loco.comm import topology as topology_lib
from loco.algorithms.muloco import muloco
from loco.comm import WorkerContext
from loco.comm.sparta import random_parameter_average
from loco.core.engine import StepContext
from loco.core.participation import Participation

ITEMSIZE = {'float32': 4, 'bfloat16': 2, 'float16': 2}


def _per_worker(fn, *args):
  """`fn` per worker under the named worker axis."""
  return jax.vmap(fn, axis_name=comm.WORKERS)(*args)


def _flat(tree_MxP) -> np.ndarray:
  leaves = jax.tree.leaves(tree_MxP)
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1) for x in leaves],
                        axis=1)


# --- Streaming DiLoCo's eager merge ---------------------------------------------------


def _nesterov(x, trace, lr, mu):
  """optax.sgd(lr, mu, nesterov=True) by hand: (update, new trace)."""
  trace = mu * trace + x
  return -lr * (x + mu * trace), trace


def _fixed_link(mean):
  """A link whose output (the 'average') is `mean`, whatever the worker sends."""
  return optax.GradientTransformationExtraArgs(
      lambda params: optax.EmptyState(),
      lambda updates, state, params=None, **extra: (mean, state))


@settings(max_examples=20, deadline=None)
@given(alpha=st.floats(0.0, 1.0), num_workers=st.integers(1, 8),
       values=st.lists(st.floats(-3.0, 3.0), min_size=12, max_size=12))
def test_eager_at_sync_steps_the_estimate_from_the_outer_state_before_the_sync(
    alpha, num_workers, values):
  """At a sync, the estimate `prev_mean + (Delta - prev_own) / M` takes the outer step
  from the momentum held *before* this sync, the params merge with that theta_hat, and
  the correction `(1 - alpha) (new anchor - theta_hat)` is what arrival adds."""
  lr, mu = 0.7, 0.9
  v = np.asarray(values, np.float32).reshape(6, 2)
  anchor, params, mean, prev_mean, prev_own, trace = v
  delta = anchor - params
  optimizer = optax.with_extra_args_support(optax.sgd(lr, momentum=mu, nesterov=True))
  outer = merge.Outer(_fixed_link({'w': jnp.asarray(mean)}), optimizer)
  tree = lambda x: {'w': jnp.asarray(x)}                       # noqa: E731
  # An optimizer state whose momentum trace is `trace` (one step from zero).
  _, opt_state = optimizer.update(tree(trace), optimizer.init(tree(anchor)), tree(anchor))
  outer_state = (optax.EmptyState(), opt_state)
  policy = merge.eager(2, alpha)
  state = merge.EagerState(tree(prev_mean), tree(prev_own), tree(np.zeros(2)))
  new_params, new_anchor, new_outer, new_state = policy.at_sync(
      outer, tree(params), tree(anchor), tree(delta), outer_state, tuple(state),
      context=None, num_workers=num_workers)
  a64 = anchor.astype(np.float64)
  step, want_trace = _nesterov(mean.astype(np.float64), trace, lr, mu)
  want_anchor = a64 + step
  estimate = prev_mean + (delta - prev_own) / num_workers
  hat_step, _ = _nesterov(estimate.astype(np.float64), trace, lr, mu)
  theta_hat = a64 + hat_step
  tol = dict(rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(new_anchor['w'], want_anchor, **tol)
  np.testing.assert_allclose(new_params['w'], alpha * params + (1 - alpha) * theta_hat, **tol)
  # The outer state moves with the true average, not with the estimate.
  np.testing.assert_allclose(jax.tree.leaves(new_outer[1])[0], want_trace, **tol)
  new_state = merge.EagerState(*new_state)
  np.testing.assert_allclose(new_state.prev_mean['w'], mean, **tol)
  np.testing.assert_allclose(new_state.prev_own['w'], delta, **tol)
  correction = (1 - alpha) * (want_anchor - theta_hat)
  np.testing.assert_allclose(new_state.correction['w'], correction, **tol)
  arrived = policy.on_arrival(tree(params), new_anchor, tuple(new_state))
  np.testing.assert_allclose(arrived['w'], params + correction, **tol)


def _eager_replay(init_BxD, targets_MxBxD, steps, *, sync_every, tau, alpha, inner_lr,
                  outer_lr, mu):
  """Streaming DiLoCo with eager updates in float64, block b being fragment b: fragment
  1 syncs at s = H/2 mod H, fragment 0 at s = 0 mod H, each merged at once with its
  estimate and corrected tau steps later."""
  m = targets_MxBxD.shape[0]
  params = np.repeat(init_BxD[None].astype(np.float64), m, 0)          # [M, B, D]
  anchor = init_BxD.astype(np.float64).copy()                           # [B, D]
  trace = np.zeros_like(anchor)
  prev_mean = np.zeros_like(anchor)
  prev_own = np.zeros_like(params)
  correction = np.zeros_like(params)
  arrival = {}
  offsets = {1: sync_every // 2, 0: 0}
  for s in range(1, steps + 1):
    params = params - inner_lr * (params - targets_MxBxD)               # inner SGD
    for b, offset in offsets.items():
      if s % sync_every != offset:
        continue
      delta = anchor[b] - params[:, b]
      mean = delta.mean(0)
      step, new_trace = _nesterov(mean, trace[b], outer_lr, mu)
      estimate = prev_mean[b] + (delta - prev_own[:, b]) / m
      hat_step, _ = _nesterov(estimate, trace[b], outer_lr, mu)
      theta_hat = anchor[b] + hat_step
      correction[:, b] = (1 - alpha) * (anchor[b] + step - theta_hat)
      params[:, b] = alpha * params[:, b] + (1 - alpha) * theta_hat
      prev_mean[b], prev_own[:, b] = mean, delta
      anchor[b], trace[b] = anchor[b] + step, new_trace
      arrival[b] = s + tau
    for b, when in arrival.items():
      if when == s:
        params[:, b] += correction[:, b]
  return params, anchor


@pytest.mark.slow
@pytest.mark.parametrize('tau,alpha', [(1, 0.5), (0, 0.25)])
def test_streaming_eager_matches_a_numpy_replay_with_outer_momentum(tau, alpha):
  """Three rounds of two fragments with Nesterov momentum: the estimate uses the last
  average after the first round, and every arrival swaps the estimate for the anchor."""
  m, h, steps, inner_lr, outer_lr, mu = 3, 4, 13, 0.1, 0.7, 0.9
  init = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)             # blocks 0, 1
  params = {'blocks': {b: {'w': jnp.asarray(init[b])} for b in range(2)}}
  targets = np.asarray(jax.random.normal(jax.random.key(3), (m, 2, 2)), np.float64)
  alg = algorithms.make('streaming_diloco', optax.sgd(inner_lr), sync_every=h,
                        num_fragments=2, overlap_steps=tau, merge_alpha=alpha,
                        compression='none', eager=True, outer_optimizer='nesterov',
                        outer_lr=outer_lr, outer_momentum=mu)
  state = alg.init(params, m, jax.random.key(0))
  goal = {'blocks': {b: {'w': jnp.asarray(targets[:, b], jnp.float32)} for b in range(2)}}
  step = jax.jit(lambda s: alg.step(s, jax.tree.map(lambda p, t: p - t, s.params, goal)))
  for s in range(1, steps + 1):
    state, info = step(state)
    want = 1 if s % h == h // 2 else 0 if s % h == 0 else -1
    np.testing.assert_array_equal(info.wire.fragment, [want] * m)
  want_params, want_anchor = _eager_replay(init, targets, steps, sync_every=h, tau=tau,
                                           alpha=alpha, inner_lr=inner_lr,
                                           outer_lr=outer_lr, mu=mu)
  for b in range(2):
    np.testing.assert_allclose(state.params['blocks'][b]['w'], want_params[:, b], atol=2e-5)
    np.testing.assert_allclose(state.anchor['blocks'][b]['w'],
                               np.broadcast_to(want_anchor[b], (m, 2)), atol=2e-5)


# --- SPARTA ---------------------------------------------------------------------------


def _sparta_once(x_MxP, fraction, dtype, alive, key=jax.random.key(11)):
  """One application of SPARTA's link to stacked params (zero optimizer updates):
  (the params after it, its wire)."""
  link = random_parameter_average(fraction, dtype=dtype)

  def one(p, a):
    zeros = jax.tree.map(jnp.zeros_like, p)
    return link.update(zeros, link.init(p), p, context=WorkerContext(alive=a, key=key))

  out, state = jax.jit(lambda x, a: _per_worker(one, x, a))(x_MxP, jnp.asarray(alive))
  return jax.tree.map(lambda x, u: np.asarray(x + u), x_MxP, out), state.comm


def _distinct(shapes, m, seed=0):
  key = jax.random.key(seed)
  return {n: jax.random.normal(jax.random.fold_in(key, i), (m, *s))
          for i, (n, s) in enumerate(sorted(shapes.items()))}


@pytest.mark.slow
def test_sparta_draws_an_independent_mask_for_each_tensor():
  """Two tensors of one shape get different coordinates, each about p of its own;
  every worker averages the same ones, exactly, and leaves the rest alone."""
  m, p = 3, 0.25
  x = _distinct({'a': (32, 32), 'b': (32, 32), 'c': (10,)}, m)
  new, wire = _sparta_once(x, p, 'float32', [True] * m)
  masks = {n: new[n][0] != np.asarray(x[n][0]) for n in x}
  n = 32 * 32
  sd = math.sqrt(n * p * (1 - p))
  for name in ('a', 'b'):
    assert abs(masks[name].sum() - p * n) < 5 * sd, name
  overlap = int(np.sum(masks['a'] & masks['b']))
  sd2 = math.sqrt(n * p * p * (1 - p * p))
  assert abs(overlap - p * p * n) < 6 * sd2, overlap        # independent, not one mask
  for name in x:
    xs, mask = np.asarray(x[name]), masks[name]
    for i in range(m):
      np.testing.assert_array_equal(new[name][i] != xs[i], mask)
      np.testing.assert_allclose(new[name][i][mask], xs.mean(0)[mask], rtol=1e-6, atol=1e-7)
      np.testing.assert_array_equal(new[name][i][~mask], xs[i][~mask])
  count = sum(int(mk.sum()) for mk in masks.values())
  np.testing.assert_allclose(wire.sent, [2 * (m - 1) / m * 4 * count] * m, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('dtype,fraction', [('bfloat16', 1.0), ('float16', 0.5),
                                            ('float32', 0.5)])
def test_sparta_bytes_and_values_at_the_transport_dtype(dtype, fraction):
  """The masked values travel at the transport dtype: each of the m alive workers sends
  and receives `2 (m - 1) / m * n * itemsize` (no indices: the mask is shared), the
  average is of the rounded values, and an absent worker sends nothing, receives
  nothing and keeps its params."""
  live = np.array([True, False, True, True])
  m, k = len(live), int(live.sum())
  x = _distinct({'w': (6, 5), 'b': (7,)}, m)
  new, wire = _sparta_once(x, fraction, dtype, live)
  count = 0
  for name in x:
    xs = np.asarray(x[name])
    mask = new[name][0] != xs[0]
    count += int(mask.sum())
    rounded = np.asarray(jnp.asarray(xs).astype(dtype).astype(jnp.float32), np.float64)
    want = rounded[live].mean(0)
    for i in range(m):
      if live[i]:
        np.testing.assert_allclose(new[name][i][mask], want[mask], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(new[name][i][~mask], xs[i][~mask])
      else:
        np.testing.assert_array_equal(new[name][i], xs[i])
  if fraction == 1.0:
    assert count == 6 * 5 + 7
  else:
    assert 0 < count < 6 * 5 + 7
  ring = 2 * (k - 1) / k * count * ITEMSIZE[dtype]
  np.testing.assert_allclose(wire.sent, np.where(live, ring, 0.0), rtol=1e-6)
  np.testing.assert_allclose(wire.received, np.where(live, ring, 0.0), rtol=1e-6)


@pytest.mark.slow
def test_sparta_in_training_counts_bfloat16_bytes():
  """Through the algorithm, `transport_dtype='bfloat16'` at p = 1 sends
  `2 (M - 1) / M * 2 n` bytes per step: every value at 2 bytes, no indices."""
  m = 4
  params = {'w': jnp.zeros((8, 8)), 'b': jnp.zeros((5,))}
  alg = algorithms.make('sparta', optax.sgd(0.1), fraction=1.0, transport_dtype='bfloat16')
  _, info = jax.jit(alg.step)(alg.init(params, m, jax.random.key(0)),
                              _distinct({'w': (8, 8), 'b': (5,)}, m))
  np.testing.assert_allclose(info.wire.sent, [2 * (m - 1) / m * 2 * 69] * m, rtol=1e-6)
  np.testing.assert_allclose(info.wire.received, [2 * (m - 1) / m * 2 * 69] * m, rtol=1e-6)


# --- MuLoCo ---------------------------------------------------------------------------


def test_muloco_defaults_are_diloco_nesterov_every_30_steps():
  """At its defaults MuLoCo syncs every 30 steps with DiLoCo's outer Nesterov step
  (lr 0.7, momentum 0.9) on the float32 mean pseudo-gradient; a numpy replay of two
  rounds (the second one with momentum)."""
  m, lr, h = 2, 0.05, 30
  assert algorithms.settings_of('muloco', {}) == {
      'sync_every': 30, 'outer_optimizer': 'nesterov', 'outer_lr': 0.7,
      'outer_momentum': 0.9, 'transport_dtype': 'float32', 'compression': 'none',
      'local_steps': None}
  w0 = np.array([1.0, -0.5, 2.0], np.float32)
  targets = np.array([[0.0, 1.0, -1.0], [2.0, 0.5, 3.0]])
  alg = muloco(optax.sgd(lr))
  state = alg.init({'w': jnp.asarray(w0)}, m, jax.random.key(0))
  step = jax.jit(lambda s: alg.step(s, {'w': s.params['w'] - jnp.asarray(targets, jnp.float32)}))
  w = np.repeat(w0[None].astype(np.float64), m, 0)
  anchor, trace = w0.astype(np.float64), np.zeros(3)
  for t in range(1, 2 * h + 1):
    state, info = step(state)
    w = w - lr * (w - targets)
    if t % h == 0:
      update, trace = _nesterov((anchor - w).mean(0), trace, 0.7, 0.9)
      anchor = anchor + update
      w = np.repeat(anchor[None], m, 0)
    assert bool(info.synced) == (t % h == 0), t
    # A ring all-reduce of 3 float32 values: 2 (M - 1) / M * 12 bytes.
    np.testing.assert_array_equal(info.wire.sent, [12.0 * (t % h == 0)] * m)
  np.testing.assert_allclose(state.params['w'], w, rtol=1e-5, atol=1e-6)


def test_muloco_config_without_an_optimizer_trains_with_muon(nano_config):
  """`optimizer.name` None gives MuLoCo its registry default, Muon: the run's inner
  optimizer keeps Muon state, and the algorithm's round is the default H 30."""
  assert algorithms.spec_of('muloco').inner == 'muon'
  nano_config.algorithm.name = 'muloco'
  nano_config.optimizer.name = None
  exp = experiment.parse_config(nano_config)
  assert exp.inner.name == 'muon'
  assert exp.algorithm_kwargs == {}
  alg = experiment.build_algorithm(exp)
  assert alg.round_steps == 30
  _, params = model_lib.init_params(exp.model, jax.random.key(0))
  inner_state = optim.inner_optimizer(exp.inner).init(params)
  is_muon = lambda x: isinstance(x, contrib.MuonState)       # noqa: E731
  assert any(is_muon(x) for x in jax.tree.leaves(inner_state, is_leaf=is_muon))
  # An explicit name still wins over the default.
  nano_config.optimizer.name = 'adamw'
  assert experiment.parse_config(nano_config).inner.name == 'adamw'


# --- TIES pruning ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize('prune', [0.25, 0.9])
def test_diloco_prune_cuts_that_fraction_of_each_tensor(prune):
  """`prune` is the fraction pruned: each tensor keeps its `max(1, round((1 - prune) n))`
  largest magnitudes (per tensor, not over the tree). Two workers with one pseudo-
  gradient agree on every sign, so the outer step is exactly the kept values."""
  m = 2
  params = {'w': jnp.zeros((4, 5)), 'b': jnp.zeros((7,))}
  key = jax.random.key(4)
  g = {'w': jax.random.normal(key, (4, 5)),
       'b': 3 * jax.random.normal(jax.random.fold_in(key, 1), (7,))}
  grads = jax.tree.map(lambda x: jnp.stack([x] * m), g)
  alg = algorithms.make('diloco', optax.sgd(1.0), sync_every=1, outer_optimizer='sgd',
                        outer_lr=1.0, prune=prune)
  state, info = jax.jit(alg.step)(alg.init(params, m, jax.random.key(0)), grads)
  bits = 0
  for name, n, index_bits in (('w', 20, 5), ('b', 7, 3)):
    x = np.asarray(g[name]).reshape(-1)
    k = max(1, round((1 - prune) * n))
    kept = np.zeros(n, bool)
    kept[np.argsort(-np.abs(x))[:k]] = True
    step = -np.asarray(state.params[name][0]).reshape(-1)
    np.testing.assert_allclose(step, np.where(kept, x, 0.0), rtol=1e-6)
    bits += k * (32 + index_bits)
  np.testing.assert_allclose(info.wire.sent, [bits / 8] * m)
  np.testing.assert_allclose(info.wire.received, [(m - 1) * bits / 8] * m)


@pytest.mark.slow
@pytest.mark.parametrize('density', [0.05, 0.3, 0.75])
def test_ties_keeps_round_density_n_largest_values_of_each_tensor(density):
  """Workers that agree: the merge is the identity on each tensor's top
  `max(1, round(density n))` magnitudes and zero elsewhere; each sends k values with
  ceil(log2 n) index bits per tensor."""
  m = 3
  rng = np.random.default_rng(0)
  sizes = (1, 2, 7, 20, 40)
  xs = {f't{n}': rng.permutation(np.arange(1, n + 1)) * np.where(np.arange(n) % 2, 1.0, -1.0)
        for n in sizes}
  link = comm.ties_mean(density)
  one = lambda v: link.update(v, link.init(v), context=WorkerContext())  # noqa: E731
  stacked = {name: jnp.asarray(np.stack([x] * m), jnp.float32) for name, x in xs.items()}
  out, state = jax.jit(lambda t: _per_worker(one, t))(stacked)
  bits = 0
  for n in sizes:
    x = xs[f't{n}']
    k = max(1, round(density * n))
    np.testing.assert_array_equal(out[f't{n}'][0], np.where(np.abs(x) > n - k, x, 0.0))
    bits += k * (32 + (math.ceil(math.log2(n)) if n > 1 else 0))
  np.testing.assert_allclose(state.comm.sent, [bits / 8] * m)


# --- GASLoC, one peer per round -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize('topology,m,dtype', [('ring', 5, 'float32'),
                                              ('exponential', 8, 'bfloat16')])
def test_gasloc_pairwise_rounds_use_one_neighbour_and_one_models_bytes(topology, m, dtype):
  """Each round the models mix by one matching of the graph (a member of its pairwise
  family): a matched worker averages with its one neighbour and sends and receives one
  model at the transport dtype; a worker left out of the matching keeps its model and
  sends nothing. The matching changes between rounds."""
  alg = algorithms.make('gasloc', optax.sgd(0.0), sync_every=1, topology=topology,
                        pairwise=True, outer_optimizer='sgd', outer_lr=1.0,
                        transport_dtype=dtype)
  params = {'w': jnp.zeros((3, 2)), 'b': jnp.zeros((4,))}
  state = alg.init(params, m, jax.random.key(1))
  zero = jax.tree.map(jnp.zeros_like, state.params)
  step = jax.jit(alg.step)
  graph = topology_lib.make_topology(topology, m).weights > 0
  members = comm.resolve_topology(topology, m, pairwise=True).member_weights
  model_bytes = 10 * ITEMSIZE[dtype]
  tol = 1e-5 if dtype == 'float32' else 2e-2
  chosen = set()
  for r in range(4):
    # Fresh, distinct models each round, so that one matching alone explains the mix.
    state = state._replace(params=_distinct({'w': (3, 2), 'b': (4,)}, m, seed=r))
    before = _flat(state.params)
    state, info = step(state, zero)
    after = _flat(state.params)
    errors = [np.abs(w @ before - after).max() for w in members]
    choice = int(np.argmin(errors))
    assert errors[choice] < tol * max(1.0, np.abs(before).max()), errors
    chosen.add(choice)
    partner = (members[choice] > 0) & ~np.eye(m, dtype=bool)
    assert np.all(partner.sum(1) <= 1) and np.all(partner == partner.T)
    assert np.all(graph[partner])                              # a neighbour in the graph
    matched = partner.any(1)
    if m % 2:                                                   # someone sits out
      assert not matched.all()
      np.testing.assert_allclose(after[~matched], before[~matched], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(info.wire.sent, matched * model_bytes)
    np.testing.assert_array_equal(info.wire.received, matched * model_bytes)
    np.testing.assert_array_equal(info.wire.peers, partner)
  assert len(chosen) > 1


# --- The sparse all-gather's absent workers --------------------------------------------


@functools.lru_cache(maxsize=None)
def _gather_wire(sparse: bool):
  """The sparse all-gather's wire for 5 workers, as a function of (alive, adopt)."""
  codec = (compress.then(compress.topk_chunks(4, 16), compress.binned()) if sparse
           else None)
  link = comm.sparse_all_gather_mean(codec)
  x = jax.random.normal(jax.random.key(5), (5, 32))

  def one(v, a, d):
    return link.update({'x': v}, link.init({'x': v}),
                       context=WorkerContext(alive=a, adopt=d))[1].comm

  return jax.jit(lambda alive, adopt: _per_worker(one, x, alive, adopt))


@settings(max_examples=25, deadline=None)
@given(alive=st.lists(st.booleans(), min_size=5, max_size=5),
       adopt=st.lists(st.booleans(), min_size=5, max_size=5), sparse=st.booleans())
def test_sparse_all_gather_bytes_of_absent_workers(alive, adopt, sparse):
  """An alive worker whose message someone receives (another alive worker, or an absent
  one that adopts the result) sends its payload S and receives the other alive
  workers'; an absent worker sends nothing and, if it adopts the result, downloads
  every alive worker's message (a alive workers: a S), else nothing. A lone alive
  worker that nobody hears puts nothing on the wire. S by hand: 32 float32 values are
  128 bytes; top-1 of each 4-value chunk (k 4 of 16), 2-bit, is 8 x (2 index + 2 value
  bits) + 160 bits = 24 bytes."""
  live, adopts = np.asarray(alive), np.asarray(adopt)
  m, a = len(live), int(live.sum())
  size = 24.0 if sparse else 128.0
  wire = _gather_wire(sparse)(jnp.asarray(live), jnp.asarray(adopts))
  downloads = ~live & adopts & (a > 0)
  heard = live & ((a > 1) | downloads.any())
  np.testing.assert_allclose(wire.sent, np.where(heard, size, 0.0))
  np.testing.assert_allclose(wire.received,
                             np.where(live, (a - 1) * size, np.where(downloads, a * size, 0.0)))
  events = heard | downloads
  np.testing.assert_array_equal(wire.events, events.astype(int))
  np.testing.assert_array_equal(wire.kind, np.where(events, comm.ALL_GATHER, comm.NO_COMM))
  np.testing.assert_array_equal(wire.peers,
                                live[None, :] & ~np.eye(m, dtype=bool) & events[:, None])


def test_one_worker_all_gather_sends_nothing():
  """With a single worker nothing goes on the wire (as the all-reduce of one)."""
  for link in (comm.sparse_all_gather_mean(), comm.ties_mean(0.5)):
    def one(v, link=link):
      return link.update({'x': v}, link.init({'x': v}), context=WorkerContext())[1].comm
    wire = _per_worker(one, jnp.ones((1, 8)))
    np.testing.assert_array_equal(wire.sent, [0.0])
    np.testing.assert_array_equal(wire.received, [0.0])
    np.testing.assert_array_equal(wire.events, [0])


@pytest.mark.slow
def test_sparseloco_sync_with_absent_workers_counts_and_times_their_download():
  """SparseLoCo at a sync with worker 1 absent: it sends nothing and downloads the three
  alive messages; the alive workers each receive the other two. Cut off (isolated), it
  neither sends nor receives. With worker 0 the only one alive, its message is what
  the three absent workers download: an all-gather event of one sender, which the
  network clock times; if they are all cut off, nothing moves. Payload by hand: the
  (64, 64) matrix is one tile x 64 kept x (12 index + 2 value bits) + 160, the
  64-vector 64 x 2 bits + 160."""
  m = 4
  size = (64 * 14 + 160 + 64 * 2 + 160) / 8
  params = {'w': jnp.zeros((64, 64)), 'norm': jnp.ones((64,))}
  alg = algorithms.make('sparseloco', optax.sgd(0.1), sync_every=1)
  grads = {'w': jax.random.normal(jax.random.key(1), (m, 64, 64)),
           'norm': jax.random.normal(jax.random.key(2), (m, 64))}
  step = jax.jit(alg.step)
  state = alg.init(params, m, jax.random.key(0))

  def wire(alive, cut=(False,) * m):
    ctx = StepContext(alive=jnp.array(alive), participation=Participation(
        keep=jnp.array(cut), isolate=jnp.array(cut)))
    return jax.tree.map(np.asarray, step(state, grads, ctx)[1].wire)

  got = wire([True, False, True, True])
  np.testing.assert_array_equal(got.sent, [size, 0, size, size])
  np.testing.assert_array_equal(got.received, [2 * size, 3 * size, 2 * size, 2 * size])
  np.testing.assert_array_equal(got.peers[1], [True, False, True, True])
  got = wire([True, False, True, True], [False, True, False, False])
  np.testing.assert_array_equal(got.sent, [size, 0, size, size])
  np.testing.assert_array_equal(got.received, [2 * size, 0, 2 * size, 2 * size])
  lone = wire([True, False, False, False])
  np.testing.assert_array_equal(lone.sent, [size, 0, 0, 0])
  np.testing.assert_array_equal(lone.received, [0, size, size, size])
  np.testing.assert_array_equal(lone.events, [1, 1, 1, 1])
  np.testing.assert_array_equal(lone.kind, [comm.ALL_GATHER] * m)
  bandwidth = 1e3                                       # bytes per second, every link
  net = network.Network(step_seconds=np.ones(m), bandwidth=np.full((m, m), bandwidth),
                        latency=np.zeros((m, m)))
  clock = network.Clock(net)
  clock.step(lone, np.ones(m, bool))
  np.testing.assert_allclose(clock.now, [1.0] + [1.0 + size / bandwidth] * 3)
  alone = wire([True, False, False, False], [False, True, True, True])
  np.testing.assert_array_equal(alone.sent, 0.0)
  np.testing.assert_array_equal(alone.received, 0.0)
  np.testing.assert_array_equal(alone.events, 0)
