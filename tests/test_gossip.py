"""comm.gossip: mixing properties, dense == sparse == shard_map, bytes, dead workers."""

import json
import os
import subprocess
import sys
import textwrap

from hypothesis import assume, given, settings, strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loco import comm
from loco import topology as topology_lib
from loco.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@settings(max_examples=8, deadline=None)
@given(_graphs(), st.integers(0, 2**16), st.sampled_from([1.0, 0.5]))
def test_every_implementation_is_w_and_preserves_the_mean(topo, seed, gamma):
  m = topo.num_workers
  x = _tree(m, seed)
  want_w = (1 - gamma) * np.eye(m) + gamma * _member(topo, seed)
  impls = ('auto', 'dense', 'sparse')
  results = _run([comm.gossip(topo, 'deltas', step_size=gamma, impl=impl)
                  for impl in impls], x, key=seed)
  outs = {impl: _flat(out) for impl, (out, _) in zip(impls, results)}
  for impl in impls:
    np.testing.assert_allclose(outs[impl].mean(0), _flat(x).mean(0), atol=2e-6)
    np.testing.assert_allclose(outs[impl], want_w @ _flat(x), atol=2e-5)
  np.testing.assert_allclose(outs['dense'], outs['sparse'], atol=2e-6)
  np.testing.assert_allclose(outs['auto'], outs['sparse'], atol=2e-6)


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
    assert float(state.comm.bytes_sent[2]) == 0.0      # the dead worker sends nothing
    assert int(state.comm.events[2]) == 0
  # A dead worker keeps its value.
  np.testing.assert_allclose(_flat(out)[2], _flat(delta)[2], atol=1e-6)


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
  np.testing.assert_array_equal(state.comm.bytes_sent, 2 * size)


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
  np.testing.assert_allclose(state.comm.bytes_sent, messages * size, rtol=1e-6)
  np.testing.assert_allclose(state.comm.bytes_received, messages * size, rtol=1e-6)
  np.testing.assert_array_equal(state.comm.events, 1)
  # With worker 0 dead: it and its links carry nothing; on a ring its neighbours
  # lose one message each.
  alive = np.arange(m) != 0
  _, state = _run(comm.gossip(name, 'deltas', impl=impl, dtype=dtype), x, alive=alive)
  assert float(state.comm.bytes_sent[0]) == 0.0 == float(state.comm.bytes_received[0])
  if name == 'ring' and m == 8:
    np.testing.assert_allclose(np.asarray(state.comm.bytes_sent)[[1, 7]], size)
    np.testing.assert_allclose(np.asarray(state.comm.bytes_sent)[2:7], 2 * size)
  assert float(np.sum(state.comm.bytes_sent)) == pytest.approx(
      float(np.sum(state.comm.bytes_received)))


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


def test_gossip_residual_is_one_step():
  topo = topology_lib.make_topology('torus', 6)
  x = _tree(6, 4)

  def worker(v):
    residual, state = comm.gossip_residual(v, topo)
    return residual, state.bytes_sent

  residual, sent = jax.vmap(worker, axis_name=comm.WORKERS)(x)
  np.testing.assert_allclose(_flat(x) - _flat(residual), topo.weights @ _flat(x), atol=1e-5)
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


_SHARD_MAP_SCRIPT = textwrap.dedent('''
    import json
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import PartitionSpec as P
    from loco import algorithms, comm, workers
    assert len(jax.devices()) == 8
    M = 8
    key = jax.random.PRNGKey(5)
    x = {'a': jax.random.normal(jax.random.PRNGKey(0), (M, 5, 3)),
         'b': jax.random.normal(jax.random.PRNGKey(1), (M, 4))}
    theta = jax.tree.map(lambda v: 0.5 * v + 1.0, x)
    alive = jnp.array([1, 1, 0, 1, 1, 1, 0, 1], bool)
    mesh = workers.make_mesh(8, M)
    diffs = {}
    for name in ('ring', 'matching', 'exponential', 'complete'):
      # 'auto' is 'sparse' except on the complete graph, where it is the all-reduce.
      for impl in ('sparse', 'dense') + (('auto',) if name == 'complete' else ()):
        g = comm.gossip(name, 'models', impl=impl)
        def worker(u, p, a, k):
          out, st = g.update(u, g.init(p), p,
                             context=comm.WorkerContext(alive=a, key=k))
          return out, st.comm.bytes_sent
        def block(u, p, a, k):   # shard_map: one worker per device
          first = lambda t: jax.tree.map(lambda z: z[0], t)
          out, sent = worker(first(u), first(p), a[0], k)
          return jax.tree.map(lambda z: z[None], out), sent[None]
        spec = P(comm.WORKERS)
        ref = jax.jit(jax.vmap(worker, axis_name=comm.WORKERS,
                               in_axes=(0, 0, 0, None)))(x, theta, alive, key)
        sm = jax.jit(jax.shard_map(block, mesh=mesh, in_specs=(spec, spec, spec, P()),
                                   out_specs=(spec, spec)))(x, theta, alive, key)
        on_mesh = jax.jit(workers.vmap(worker, in_axes=(0, 0, 0, None), mesh=mesh))(
            workers.shard(x, mesh), workers.shard(theta, mesh),
            workers.shard(alive, mesh), key)
        for tag, got in (('shard_map', sm), ('mesh_vmap', on_mesh)):
          diffs[f'{name}/{impl}/{tag}'] = max(
              float(jnp.max(jnp.abs(a - b)))
              for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)))
    # The whole engine on the mesh: GASLoC on a ring, a few rounds.
    params = {'w': jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)}
    loss = lambda p: jnp.sum((p['w'] - 0.3) ** 2)
    finals = []
    for m in (None, mesh):
      alg = algorithms.make('gasloc', optax.adam(0.05), sync_every=2, mesh=m)
      state = alg.init(params, M, key)
      step = jax.jit(alg.step)
      for t in range(6):
        grads = jax.vmap(jax.grad(loss))(state.params)
        grads = jax.tree.map(lambda g: g * (1.0 + jnp.arange(M)[:, None, None]), grads)
        state, _ = step(state, grads)
      finals.append(np.asarray(state.params['w']))
    diffs['engine/gasloc'] = float(np.max(np.abs(finals[0] - finals[1])))
    print(json.dumps(diffs))
''')


def test_dense_sparse_and_shard_map_agree_on_8_devices():
  """Runs in a subprocess: 8 CPU devices need XLA_FLAGS before JAX starts."""
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
             JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  result = subprocess.run([sys.executable, '-c', _SHARD_MAP_SCRIPT], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  diffs = json.loads(result.stdout.strip().splitlines()[-1])
  assert len(diffs) == (4 * 2 + 1) * 2 + 1
  bad = {k: v for k, v in diffs.items() if v > 1e-5}
  assert not bad, f'placements disagree: {bad}'
