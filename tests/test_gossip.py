"""comm.gossip and the all-reduces: mixing properties, dense == sparse == shard_map, bytes.

Properties of every mixing operator run with and without jit (chex variants); the
placement tests run in-process on the 8 CPU devices that tests/conftest.py gives JAX.
"""

import re

from absl.testing import parameterized
import chex
from hypothesis import assume, given, settings, strategies as st
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import comm
from loco.comm import topology as topology_lib
from loco import wire as wire_lib
from loco.comm import axis
from loco.run import placement
from loco.errors import ConfigError
from tests import hlo as hlo_lib


def _run(transform, updates, params=None, *, alive=None, mixing=None, key=0):
  """Applies a per-worker transform (or a list of them) to worker-stacked trees.

  One jit per call, with the tick key as an argument: a list of transforms
  compiles once, and a jitted call can be reused over keys (`_runner`).
  """
  return _runner(transform, mixing)(updates, params, alive, key)


def _runner(transform, mixing=None):
  many = isinstance(transform, list)
  transforms = transform if many else (transform,)

  @jax.jit
  def run(updates, params, alive, key):
    num = jax.tree.leaves(updates)[0].shape[0]
    alive = jnp.ones((num,), bool) if alive is None else jnp.asarray(alive, bool)

    def worker(u, p, a):
      context = comm.WorkerContext(alive=a, mixing=mixing, key=jax.random.PRNGKey(key))
      return tuple(t.update(u, t.init(u), p, context=context) for t in transforms)

    outs = jax.vmap(worker, axis_name=comm.WORKERS)(updates, params, alive)
    return outs if many else outs[0]

  return run


def _tree(m, seed=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  return {'w': jax.random.normal(k1, (m, 3, 2)), 'b': jax.random.normal(k2, (m, 4))}


def _flat(tree):
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1)
                         for x in jax.tree.leaves(tree)], axis=1)


def _member(topo, key):
  """The member a random family uses for the tick key `key` (what gossip draws)."""
  if not topo.is_random:
    return topo.weights
  context = comm.WorkerContext(key=jax.random.PRNGKey(key))
  return topo.weights_for(int(topo.sample_choice_jax(comm.round_key(context, 0, 0))))


@st.composite
def _graphs(draw):
  name = draw(st.sampled_from(['ring', 'torus', 'exponential', 'hypercube', 'complete',
                               'erdos_renyi', 'matching']))
  if name == 'hypercube':
    m = 2 ** draw(st.integers(1, 3))
  elif name == 'torus':
    m = draw(st.sampled_from([4, 6, 8, 9]))
  elif name == 'matching':
    m = draw(st.sampled_from([2, 4, 6, 8]))
  else:
    m = draw(st.integers(2, 9))
  kwargs = {'seed': draw(st.integers(0, 100)), 'p': 0.6} if name == 'erdos_renyi' else {}
  weights = draw(st.sampled_from(topology_lib.WEIGHTINGS))
  try:
    topo = topology_lib.make_topology(name, m, weights=weights, **kwargs)
  except ConfigError:
    assume(False)   # a disconnected G(M, p) draw
  return topo


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(_graphs(), st.integers(0, 2**16), st.sampled_from([1.0, 0.5]))
def test_every_implementation_is_w_and_preserves_the_mean(topo, seed, gamma):
  m = topo.num_workers
  x = _tree(m, seed)
  want_w = (1 - gamma) * np.eye(m) + gamma * _member(topo, seed)
  impls = ('auto', 'dense', 'sparse')
  results = _run([comm.gossip(topo, 'deltas', step_size=gamma, impl=impl)
                  for impl in impls], x, key=seed)
  for out, state in results:
    chex.assert_trees_all_equal_shapes_and_dtypes(out, x)
    chex.assert_tree_all_finite(out)
    chex.assert_shape(state.comm.sent, (m,))
  outs = {impl: _flat(out) for impl, (out, _) in zip(impls, results)}
  for impl in impls:
    np.testing.assert_allclose(outs[impl].mean(0), _flat(x).mean(0), atol=2e-6)
    np.testing.assert_allclose(outs[impl], want_w @ _flat(x), atol=2e-5)
  np.testing.assert_allclose(outs['dense'], outs['sparse'], atol=2e-6)
  np.testing.assert_allclose(outs['auto'], outs['sparse'], atol=2e-6)


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(_graphs(), st.integers(0, 2**16))
def test_contracts_to_consensus_at_the_spectral_gap_rate(topo, seed):
  assume(not topo.is_random)
  m = topo.num_workers
  x = _tree(m, seed)
  step = _runner(comm.gossip(topo, 'deltas'))
  start = np.linalg.norm(_flat(x) - _flat(x).mean(0))
  for _ in range(6):
    x, _ = step(x, None, None, 0)
  dist = np.linalg.norm(_flat(x) - _flat(x).mean(0))
  assert dist <= (1 - topo.spectral_gap) ** 6 * start * (1 + 1e-4) + 1e-5


def test_random_matchings_contract_in_mean_square():
  topo = topology_lib.make_topology('matching', 8)
  x = _tree(8, 1)
  flat = _flat(x) - _flat(x).mean(0)
  seen = {}
  run = _runner(comm.gossip(topo, 'deltas'))
  for key in range(60):
    out, _ = run(x, None, None, key)
    w = _member(topo, key)
    np.testing.assert_allclose(_flat(out), w @ _flat(x), atol=1e-5)
    seen[w.tobytes()] = np.sum((w @ flat) ** 2)
  assert len(seen) == topo.num_choices        # every member of the family is drawn
  assert np.mean(list(seen.values())) <= (1 - topo.spectral_gap) ** 2 * np.sum(flat ** 2)


@pytest.mark.slow
@pytest.mark.parametrize('mix', ['models', 'deltas', 'params'])
@pytest.mark.parametrize('name', ['ring', 'matching', 'exponential', 'complete'])
def test_mixes_and_dead_workers_match_the_dense_reference(name, mix):
  m = 6
  topo = topology_lib.make_topology(name, m)
  alive = np.array([True, True, False, True, True, True])
  delta, theta = _tree(m, 1), _tree(m, 2)
  w = _member(topo, 3)
  if name == 'complete':    # the all-reduce: alive workers average among themselves
    w_alive = np.where(np.outer(alive, alive), 1.0 / alive.sum(), 0.0)
  else:                     # a dead edge's weight goes back to both diagonals
    w_alive = np.where(np.outer(alive, alive), w, 0.0)
  w_alive[np.diag_indices(m)] = 0.0
  w_alive[np.diag_indices(m)] = 1.0 - w_alive.sum(1)
  np.testing.assert_allclose(w_alive.sum(0), 1.0)
  source = {'models': _flat(theta) - _flat(delta), 'deltas': _flat(delta),
            'params': _flat(theta)}[mix]
  mixed = w_alive @ source
  want = {'models': _flat(theta) - mixed, 'deltas': mixed,
          'params': _flat(delta) + mixed - source}[mix]
  impls = ('auto',) if name == 'complete' else ('auto', 'dense', 'sparse')
  results = _run([comm.gossip(topo, mix, impl=impl) for impl in impls],
                 delta, theta, alive=alive, key=3)
  for impl, (out, state) in zip(impls, results):
    np.testing.assert_allclose(_flat(out), want, atol=2e-5, err_msg=impl)
    assert float(state.comm.sent[2]) == 0.0      # the dead worker sends nothing
    assert int(state.comm.events[2]) == 0
  # A dead worker keeps its value.
  np.testing.assert_allclose(_flat(out)[2], _flat(delta)[2], atol=1e-6)


@pytest.mark.slow
def test_complete_uniform_is_the_all_reduce_exactly():
  for m in (3, 4, 5):
    x = _tree(m, m)
    got, _ = _run(comm.gossip('complete', 'deltas'), x)
    want, _ = _run(comm.all_reduce_mean(), x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)
    # 'models' with equal anchors: theta - mean(phi) computed as mean(delta), exactly.
    theta = jax.tree.map(lambda v: jnp.broadcast_to(v[:1], v.shape), _tree(m, 7))
    got, _ = _run(comm.gossip('complete', 'models'), x, theta)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)


def test_per_tick_mixing_matrix_overrides_the_topology():
  m = 4
  x = _tree(m, 0)
  mixing = topology_lib.make_topology('ring', m).weights
  out, state = _run(comm.gossip('complete', 'deltas'), x,
                    mixing=jnp.asarray(mixing, jnp.float32))
  np.testing.assert_allclose(_flat(out), mixing @ _flat(x), atol=1e-5)
  size = (3 * 2 + 4) * 4
  np.testing.assert_array_equal(state.comm.sent, 2 * size)


@pytest.mark.parametrize('alive', [None, [True, True, False, True, True, True]])
def test_a_pairwise_mixing_matrix_gathers_only_the_partner(alive):
  """The asynchronous replay's matrices (each worker averages with at most one other)
  take the partner path, whose program has no [M, M, ...] array; any W the general one."""
  m = 6
  x = _tree(m, 2)
  w = np.eye(m)
  for a, b in ((0, 3), (1, 2)):       # workers 4 and 5 sit out
    w[[a, b, a, b], [a, b, b, a]] = 0.5
  live = np.ones(m, bool) if alive is None else np.array(alive)
  w_alive = np.where(np.outer(live, live), w, 0.0)
  w_alive[np.diag_indices(m)] = 0.0
  w_alive[np.diag_indices(m)] = 1.0 - w_alive.sum(1)
  mixing = jnp.asarray(w, jnp.float32)
  out, state = _run(comm.gossip('ring', 'deltas'), x, alive=alive, mixing=mixing)
  np.testing.assert_allclose(_flat(out), w_alive @ _flat(x), atol=1e-6)
  used = (w_alive > 0) & ~np.eye(m, dtype=bool)
  np.testing.assert_array_equal(state.comm.peers, used)
  np.testing.assert_array_equal(state.comm.sent, used.sum(1) * 10 * 4)
  np.testing.assert_array_equal(state.comm.kind, np.where(used.any(1), comm.GOSSIP,
                                                          comm.NO_COMM))
  live = jnp.asarray(live)
  text = _runner(comm.gossip('ring', 'deltas'), mixing).lower(x, None, live, 0).compile()
  assert not re.search(rf'f32\[{m},{m},3,2\]', text.as_text())


def test_absent_workers_download_what_they_adopt():
  """An absent worker sends nothing; where it adopts the result (the all-reduces) it
  receives it: the reduced tree, which the alive workers upload (each a third of it
  here, so the bytes received are bytes sent), or the alive workers' messages.
  Gossip's dead keep their own value and receive nothing."""
  m, size = 4, 10 * 4
  alive = np.array([True, False, True, True])
  transforms = [comm.all_reduce_mean(), comm.sparse_all_gather_mean(),
                comm.gossip('complete', 'deltas')]
  (_, reduced), (_, gathered), (_, gossiped) = _run(transforms, _tree(m), alive=alive)
  ring = 2 * 2 / 3 * size
  upload = size / 3
  np.testing.assert_allclose(reduced.sent, [ring + upload, 0, ring + upload,
                                                  ring + upload], rtol=1e-6)
  assert float(np.sum(reduced.sent)) == pytest.approx(float(np.sum(reduced.received)))
  np.testing.assert_allclose(reduced.received, [ring, size, ring, ring], rtol=1e-6)
  np.testing.assert_allclose(gathered.comm.sent, [size, 0, size, size])
  np.testing.assert_allclose(gathered.comm.received, [2 * size, 3 * size, 2 * size,
                                                            2 * size])
  others = alive[None, :] & ~np.eye(m, dtype=bool)
  for wire, kind in ((reduced, comm.ALL_REDUCE), (gathered.comm, comm.ALL_GATHER)):
    np.testing.assert_array_equal(wire.events, 1)
    np.testing.assert_array_equal(wire.kind, kind)
    np.testing.assert_array_equal(wire.peers, others)     # the absent one downloads too
  for counter in gossiped.comm[:3]:
    assert float(counter[1]) == 0.0


def test_complete_graph_models_are_the_all_reduce_of_the_deltas_for_equal_anchors():
  """On the complete graph, 'models' is `mean(delta) + (theta_i - mean(theta))`: for
  equal anchors exactly DiLoCo's all-reduce of the pseudo-gradients, for any anchors
  `theta_i - mean(phi)`, and an absent worker keeps its own model. It keeps no state
  about the anchors: each round reads them."""
  m = 4
  g = comm.gossip('complete', 'models')
  delta, theta, other = _tree(m, 1), _consensus(_tree(m, 2)), _tree(m, 3)

  @jax.jit
  def run(d, t, s, alive):
    update = lambda d, t, s, a: g.update(d, s, t, context=comm.WorkerContext(alive=a))
    return jax.vmap(update, axis_name=comm.WORKERS)(d, t, s, alive)

  everyone = jnp.ones((m,), bool)
  state = jax.vmap(g.init, axis_name=comm.WORKERS)(theta)
  mean, _ = _run(comm.all_reduce_mean(), delta)
  first, state = run(delta, theta, state, everyone)
  chex.assert_trees_all_equal(first, mean)
  out, state = run(delta, other, state, everyone)
  phi = _flat(other) - _flat(delta)
  np.testing.assert_allclose(_flat(out), _flat(other) - phi.mean(0), atol=1e-5)
  absent = jnp.array([True, False, True, True])
  out, _ = run(delta, other, state, absent)
  alive_phi = phi[np.asarray(absent)].mean(0)
  np.testing.assert_allclose(_flat(out)[np.asarray(absent)],
                             _flat(other)[np.asarray(absent)] - alive_phi, atol=1e-5)
  np.testing.assert_allclose(_flat(out)[1], _flat(delta)[1], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('name,m,impl,dtype,messages', [
    ('ring', 8, 'sparse', 'float32', 2),
    ('ring', 8, 'dense', 'bfloat16', 2),
    ('ring', 2, 'sparse', 'float32', 1),       # the two neighbours coincide
    ('matching', 8, 'sparse', 'float32', 1),
    ('matching', 6, 'dense', 'float16', 1),
    ('exponential', 8, 'sparse', 'float32', 5),
    ('torus', 9, 'sparse', 'float32', 4),
    ('complete', 5, 'sparse', 'float32', 4),   # forced peer-to-peer: M - 1 messages
    ('complete', 5, 'auto', 'float32', 2 * 4 / 5),   # ring all-reduce: 2 (M-1)/M S
])
def test_bytes_per_step_equal_hand_counts(name, m, impl, dtype, messages):
  x = _tree(m)
  size = (3 * 2 + 4) * {'float32': 4, 'bfloat16': 2, 'float16': 2}[dtype]
  _, state = _run(comm.gossip(name, 'deltas', impl=impl, dtype=dtype), x)
  np.testing.assert_allclose(state.comm.sent, messages * size, rtol=1e-6)
  np.testing.assert_allclose(state.comm.received, messages * size, rtol=1e-6)
  np.testing.assert_array_equal(state.comm.events, 1)
  # With worker 0 dead: it and its links carry nothing; on a ring its neighbours
  # lose one message each.
  alive = np.arange(m) != 0
  _, state = _run(comm.gossip(name, 'deltas', impl=impl, dtype=dtype), x, alive=alive)
  assert float(state.comm.sent[0]) == 0.0 == float(state.comm.received[0])
  if name == 'ring' and m == 8:
    np.testing.assert_allclose(np.asarray(state.comm.sent)[[1, 7]], size)
    np.testing.assert_allclose(np.asarray(state.comm.sent)[2:7], 2 * size)
  assert float(np.sum(state.comm.sent)) == pytest.approx(
      float(np.sum(state.comm.received)))


def test_transport_dtype_rounds_what_neighbours_receive():
  x = {'w': jnp.array([[1.0 + 2 ** -10], [1.0], [1.0], [1.0]])}
  out, _ = _run(comm.gossip('ring', 'deltas', dtype='bfloat16'), x)
  out = np.asarray(out['w'])[:, 0]
  # Neighbours receive 1 + 2^-10 rounded to bf16, i.e. 1; a worker's own value is exact.
  np.testing.assert_array_equal(out[1:], 1.0)
  np.testing.assert_allclose(out[0], 1.0 + 2 ** -10 / 3, rtol=1e-7)
  # The complete graph is the all-reduce, which rounds every contribution.
  out, _ = _run(comm.gossip('complete', 'deltas', dtype='bfloat16'), x)
  np.testing.assert_array_equal(out['w'], 1.0)


def test_pairwise_families():
  ring = topology_lib.make_topology('ring', 8)
  fam = comm.pairwise_family(ring)
  assert fam.is_random and fam.num_choices == 2     # even and odd edges
  assert all(p.sends.tolist() == [1] * 8 for p in fam.plans)
  assert fam.chi1 == pytest.approx(ring.chi1) and fam.chi2 == pytest.approx(ring.chi2)
  assert comm.pairwise_family(topology_lib.make_topology('exponential', 8)).num_choices == 5
  assert comm.pairwise_family(topology_lib.make_topology('complete', 8)).num_choices == 7
  matching = topology_lib.make_topology('matching', 6)
  assert comm.pairwise_family(matching) is matching
  odd = comm.pairwise_family(topology_lib.make_topology('ring', 5))
  topology_lib.validate_mixing_matrix(odd.weights)
  assert sorted(odd.edges) == sorted(topology_lib.make_topology('ring', 5).edges)


@pytest.mark.slow
@pytest.mark.parametrize('step', [1.0, 0.25])
def test_mixing_step_is_one_step(step):
  topo = topology_lib.make_topology('torus', 6)
  x = _tree(6, 4)

  def worker(v):
    mixed, state = comm.mixing_step(v, topo, step=step)
    return mixed, state.sent

  mixed, sent = jax.vmap(worker, axis_name=comm.WORKERS)(x)
  want = _flat(x) - step * (_flat(x) - topo.weights @ _flat(x))
  np.testing.assert_allclose(_flat(mixed.new), want, atol=1e-5)
  np.testing.assert_allclose(_flat(mixed.moved), want - _flat(x), atol=1e-5)
  np.testing.assert_array_equal(sent, 3 * 10 * 4)


def test_bad_input():
  with pytest.raises(ConfigError, match="algorithm.mix must be one of models, deltas"):
    comm.gossip('ring', 'gradients')
  with pytest.raises(ConfigError, match='gossip impl'):
    comm.gossip('ring', impl='fast')
  with pytest.raises(ConfigError, match='transport dtype'):
    comm.gossip('ring', dtype='int8')
  with pytest.raises(ConfigError, match="algorithm.topology must be one of complete, ring"):
    comm.gossip('star')
  with pytest.raises(ConfigError, match='algorithm.weights'):
    comm.gossip('ring', weights='laplacian')
  with pytest.raises(ConfigError, match='gossip_step'):
    comm.gossip('ring', step_size=1.5)
  x = _tree(6)
  with pytest.raises(ConfigError, match="topology='hypercube' does not fit num_workers=6.*"
                                        'power of two'):
    _run(comm.gossip('hypercube'), x, x)
  with pytest.raises(ConfigError, match='has 4 workers but the run has num_workers=6'):
    _run(comm.gossip(topology_lib.make_topology('ring', 4)), x, x)


# --- Properties of every mixing operator, with and without jit. ---------------


def _worker_means(tree):
  return jax.tree.map(lambda v: jnp.mean(v, axis=0), tree)


def _consensus(tree):
  """Every worker holds worker 0's value."""
  return jax.tree.map(lambda v: jnp.broadcast_to(v[:1], v.shape), tree)


def _apply_w(w, tree):
  w = jnp.asarray(w, jnp.float32)
  return jax.tree.map(lambda v: jnp.einsum('ij,j...->i...', w, v), tree)


class MixingOperatorTest(chex.TestCase):
  """Each property runs twice: the per-worker map jitted and op by op (chex variants)."""

  def _mixer(self, transform, alive=None):
    """A variant of `x, key -> vmap over workers of transform.update`, with its bytes."""
    @self.variant
    def mix(x, key):
      num = jax.tree.leaves(x)[0].shape[0]
      live = jnp.ones((num,), bool) if alive is None else jnp.asarray(alive, bool)

      def worker(u, a):
        out, state = transform.update(u, transform.init(u), None,
                                      context=comm.WorkerContext(alive=a, key=key))
        wire = wire_lib.collect(state)
        return out, (wire.sent, wire.received, wire.events)

      return jax.vmap(worker, axis_name=comm.WORKERS)(x, live)
    return mix

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ('ring_sparse', 'ring', 8, 'sparse'),
      ('ring_dense', 'ring', 8, 'dense'),
      ('torus', 'torus', 6, 'auto'),
      ('exponential', 'exponential', 8, 'auto'),
      ('matching_sparse', 'matching', 6, 'sparse'),
      ('matching_dense', 'matching', 6, 'dense'),
      ('complete_all_reduce', 'complete', 5, 'auto'),
      ('complete_peer_to_peer', 'complete', 5, 'sparse'),
  )
  def test_gossip_is_w_keeps_the_mean_and_fixes_consensus(self, name, m, impl):
    topo = topology_lib.make_topology(name, m)
    mix = self._mixer(comm.gossip(topo, 'deltas', impl=impl))
    x, key = _tree(m, 3), jax.random.PRNGKey(3)
    out, (sent, received, events) = mix(x, key)
    chex.assert_trees_all_equal_shapes_and_dtypes(out, x)
    chex.assert_tree_all_finite(out)
    chex.assert_shape((sent, received, events), (m,))
    # x <- W x with the family member the tick key draws, and 1^T W = 1^T.
    chex.assert_trees_all_close(out, _apply_w(_member(topo, 3), x), atol=2e-5)
    chex.assert_trees_all_close(_worker_means(out), _worker_means(x), atol=2e-6)
    np.testing.assert_array_equal(events, 1)
    chex.assert_trees_all_close(jnp.sum(sent), jnp.sum(received))
    # Consensus is a fixed point: exactly in the Laplacian form (equal neighbours
    # contribute 0), to rounding on the all-reduce path (psum / M).
    same = _consensus(x)
    fixed, _ = mix(same, key)
    if impl == 'auto' and name == 'complete':
      chex.assert_trees_all_close(fixed, same, rtol=1e-6)
    else:
      chex.assert_trees_all_equal(fixed, same)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ('ring_sparse', 'ring', 'sparse'),
      ('ring_dense', 'ring', 'dense'),
      ('matching', 'matching', 'sparse'),
      ('exponential', 'exponential', 'sparse'),
      ('complete_all_reduce', 'complete', 'auto'),
  )
  def test_gossip_with_dead_workers_keeps_the_alive_mean(self, name, impl):
    m = 6
    alive = np.array([True, True, False, True, True, False])
    mix = self._mixer(comm.gossip(name, 'deltas', impl=impl), alive)
    x = _tree(m, 4)
    out, (sent, received, events) = mix(x, jax.random.PRNGKey(4))
    chex.assert_tree_all_finite(out)
    alive_mean = lambda t: jax.tree.map(lambda v: jnp.mean(v[alive], axis=0), t)
    chex.assert_trees_all_close(alive_mean(out), alive_mean(x), atol=2e-6)
    # The dead keep their value exactly, and neither send nor receive.
    chex.assert_trees_all_equal(jax.tree.map(lambda v: v[~alive], out),
                                jax.tree.map(lambda v: v[~alive], x))
    for counter in (sent, received, events):
      np.testing.assert_array_equal(np.asarray(counter)[~alive], 0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ('all_reduce_float32', lambda: comm.all_reduce_mean(), False),
      ('sparse_all_gather_dense', lambda: comm.sparse_all_gather_mean(), True),
      ('sparse_all_gather_workers', lambda: comm.sparse_all_gather_mean(divide='workers'),
       True),
      ('gossip_complete', lambda: comm.gossip('complete', 'deltas'), False),
  )
  def test_all_reduces_give_every_worker_the_mean(self, make, gather):
    m = 5
    mix = self._mixer(make())
    x = _tree(m, 5)
    out, (sent, received, events) = mix(x, jax.random.PRNGKey(0))
    chex.assert_trees_all_equal_shapes_and_dtypes(out, x)
    chex.assert_tree_all_finite(out)
    want = jax.tree.map(lambda v: jnp.broadcast_to(v.mean(0), v.shape), x)
    chex.assert_trees_all_close(out, want, atol=2e-6)
    # Every worker holds the same mean, bitwise, and mixing it again changes nothing.
    chex.assert_trees_all_equal(out, _consensus(out))
    again, _ = mix(out, jax.random.PRNGKey(1))
    chex.assert_trees_all_close(again, out, rtol=1e-6)
    np.testing.assert_array_equal(events, 1)
    size = (3 * 2 + 4) * 4.0      # the tree's float32 bytes
    if gather:    # each worker's message goes once to each of the M - 1 others
      chex.assert_trees_all_close(sent, jnp.full((m,), size))
      chex.assert_trees_all_close(received, jnp.full((m,), (m - 1) * size))
    else:         # a ring all-reduce sends and receives 2 (M - 1) / M of the tree
      chex.assert_trees_all_close(sent, jnp.full((m,), 2 * (m - 1) / m * size))
      chex.assert_trees_all_close(received, sent)


# --- Placement: the same per-worker code on 8 devices. ------------------------

def _float_collectives(jitted, *args) -> set[str]:
  """The kinds of collective that move floating-point data in the compiled program."""
  return hlo_lib.float_kinds(jitted.lower(*args).compile().as_text())


def _mesh8():
  assert len(jax.devices()) >= 8, 'tests/conftest.py gives JAX 8 CPU devices'
  return placement.make_mesh(8, 8)


def _gossip_placements(name, impl, mesh):
  """The per-worker gossip step as vmap, as shard_map on `mesh`, and as mesh vmap."""
  g = comm.gossip(name, 'models', impl=impl)

  def worker(u, p, a, k):
    out, state = g.update(u, g.init(p), p, context=comm.WorkerContext(alive=a, key=k))
    return out, state.comm.sent

  def block(u, p, a, k):   # shard_map: one worker per device
    first = lambda t: jax.tree.map(lambda z: z[0], t)
    out, sent = worker(first(u), first(p), a[0], k)
    return jax.tree.map(lambda z: z[None], out), sent[None]

  spec = P(comm.WORKERS)
  return (jax.jit(jax.vmap(worker, axis_name=comm.WORKERS, in_axes=(0, 0, 0, None))),
          jax.jit(jax.shard_map(block, mesh=mesh, in_specs=(spec, spec, spec, P()),
                                out_specs=(spec, spec))),
          jax.jit(axis.vmap(worker, in_axes=(0, 0, 0, None), mesh=mesh)))


def _mesh_inputs(mesh=None):
  """(updates, anchors, alive, key) of 8 workers; placed on `mesh` if given."""
  m = 8
  x = {'a': jax.random.normal(jax.random.PRNGKey(0), (m, 5, 3)),
       'b': jax.random.normal(jax.random.PRNGKey(1), (m, 4))}
  theta = jax.tree.map(lambda v: 0.5 * v + 1.0, x)
  alive = jnp.array([1, 1, 0, 1, 1, 1, 0, 1], bool)
  return placement.shard((x, theta, alive), mesh) + (jax.random.PRNGKey(5),)


# The float data of each path moves by: ppermutes (sparse), an all-gather of the
# tree (dense), a psum (the all-reduce). The alive mask is all-gathered as bools.
_DATA_COLLECTIVE = {'sparse': 'collective-permute', 'dense': 'all-gather',
                    'auto': 'all-reduce'}


@pytest.mark.slow
@pytest.mark.parametrize('name,impl', [
    (name, impl) for name in ('ring', 'matching', 'exponential', 'complete')
    for impl in ('sparse', 'dense')] + [('complete', 'auto')])
def test_dense_sparse_and_shard_map_agree_on_8_devices(name, impl):
  """One worker per device: shard_map and mesh vmap give the one-device numbers."""
  mesh = _mesh8()
  args = _mesh_inputs(mesh)
  reference, shard_mapped, mesh_vmapped = _gossip_placements(name, impl, mesh)
  want = reference(*_mesh_inputs())
  for got in (shard_mapped(*args), mesh_vmapped(*args)):
    chex.assert_trees_all_equal_shapes_and_dtypes(got, want)
    chex.assert_tree_all_finite(got)
    chex.assert_trees_all_close(got, want, atol=1e-5)
    for leaf in jax.tree.leaves(got[0]):   # each device holds its own worker's tree
      assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, P(comm.WORKERS)),
                                            leaf.ndim)
      assert {s.data.shape[0] for s in leaf.addressable_shards} == {1}
  # The shard_map program moves the float data by the path's own collective only.
  floats = _float_collectives(shard_mapped, *args)
  assert floats == {_DATA_COLLECTIVE[impl]}, floats


def test_mesh_vmap_gossip_moves_the_ring_by_collective_permute():
  """axis.vmap on a mesh (the engine's and train.run's path) is shard_map + vmap:
  the ring moves by collective-permutes only (with vmap's spmd_axis_name it used to
  all-gather every worker's tree to every device)."""
  mesh = _mesh8()
  args = _mesh_inputs(mesh)
  _, _, mesh_vmapped = _gossip_placements('ring', 'sparse', mesh)
  floats = _float_collectives(mesh_vmapped, *args)
  assert floats == {'collective-permute'}, floats


def _place(state, mesh):
  """A LocoState on `mesh`: per-worker fields on the workers axis, step and key replicated.

  Without it the mesh engine would run on the one device its inputs live on.
  """
  if mesh is None:
    return state
  replicated = NamedSharding(mesh, P())
  per_worker = {k: v for k, v in state._asdict().items() if k not in ('step', 'key')}
  return state._replace(step=jax.device_put(state.step, replicated),
                        key=jax.device_put(state.key, replicated),
                        **placement.shard(per_worker, mesh))


@pytest.mark.slow
def test_gasloc_engine_on_8_devices_matches_one_device():
  """The whole engine: GASLoC on a ring, 3 rounds, worker axis on the mesh vs vmap."""
  mesh = _mesh8()
  m = 8
  params = {'w': jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)}
  loss = lambda p: jnp.sum((p['w'] - 0.3) ** 2)
  scale = (1.0 + jnp.arange(m))[:, None, None]     # workers disagree
  finals = []
  for on in (None, mesh):
    alg = algorithms.make('gasloc', optax.adam(0.05), sync_every=2, mesh=on)
    state = _place(alg.init(params, m, jax.random.PRNGKey(5)), on)
    step = jax.jit(alg.step)
    for _ in range(6):
      grads = jax.tree.map(lambda g: g * scale, jax.vmap(jax.grad(loss))(state.params))
      state, info = step(state, grads)
    finals.append(state.params)
    chex.assert_shape(info.wire.sent, (m,))
  chex.assert_tree_all_finite(finals[1])
  chex.assert_trees_all_close(finals[1], finals[0], atol=1e-5)
  assert finals[1]['w'].sharding.is_equivalent_to(NamedSharding(mesh, P(comm.WORKERS)), 3)
  assert {s.data.shape for s in finals[1]['w'].addressable_shards} == {(1, 4, 3)}
