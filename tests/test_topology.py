"""Tests for loco.comm.topology: mixing matrices, gossip plans, spectral values."""

import functools
import math

from absl.testing import parameterized
import chex
from hypothesis import assume, given, settings, strategies as st
import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import networkx as nx
import numpy as np
import pytest

from loco.comm import topology
from loco.errors import ConfigError
from tests import hlo as hlo_lib

# (name, M, kwargs): every family over a range of sizes, including the
# degenerate ones (M = 1, 2-wide tori, coinciding exponential neighbours).
CASES = (
    [('complete', m, {}) for m in (1, 2, 3, 5, 8)]
    + [('ring', m, {}) for m in (2, 3, 4, 7, 8, 16)]
    + [('torus', m, {}) for m in (4, 6, 8, 9, 12, 15, 16, 20)]
    + [('exponential', m, {}) for m in (2, 3, 5, 6, 8, 13, 16)]
    + [('hypercube', m, {}) for m in (2, 4, 8, 16)]
    + [('erdos_renyi', m, dict(p=0.5, seed=s)) for m, s in
       ((6, 1), (10, 0), (16, 3))]
    + [('matching', m, {}) for m in (2, 4, 6, 8, 10)])
IDS = [f'{n}-{m}-{kw.get("seed", "")}' for n, m, kw in CASES]


def _make(case, weights='metropolis'):
  name, m, kwargs = case
  return topology.make_topology(name, m, weights=weights, **kwargs)


def _members(topo):
  return [topo.weights_for(k) for k in range(topo.num_choices)]


# --- Mixing matrices and plans. ---------------------------------------------


@pytest.mark.parametrize('weights', topology.WEIGHTINGS)
@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_mixing_matrix_is_symmetric_doubly_stochastic(case, weights):
  topo = _make(case, weights)
  m = topo.num_workers
  for w in [topo.weights] + _members(topo):
    assert w.shape == (m, m)
    np.testing.assert_allclose(w, w.T, atol=1e-15)
    np.testing.assert_allclose(w.sum(axis=0), 1, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1, atol=1e-12)
    assert w.min() >= 0
  # Mixing preserves the mean: 1^T W = 1^T.
  x = np.random.default_rng(0).normal(size=(m, 3))
  np.testing.assert_allclose((topo.weights @ x).mean(0), x.mean(0), atol=1e-12)
  topology.validate_mixing_matrix(topo.weights)  # Connected too.
  assert nx.is_connected(nx.from_numpy_array(topo.adjacency.astype(int)))


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_plans_are_valid_ppermutes_and_equal_weights(case):
  topo = _make(case)
  m = topo.num_workers
  for choice in range(topo.num_choices):
    plan, w = topo.plan_for(choice), topo.weights_for(choice)
    np.testing.assert_array_equal(plan.to_dense(), w)
    assert plan.recv_weight.shape == (plan.num_perms, m)
    for k, perm in enumerate(plan.perms):
      srcs, dsts = [s for s, _ in perm], [d for _, d in perm]
      assert len(set(srcs)) == len(srcs) and len(set(dsts)) == len(dsts)
      # Full permutations: lax.ppermute under vmap asserts len(perm) == M.
      assert sorted(srcs) == sorted(dsts) == list(range(m))
      for s, d in perm:
        assert (plan.recv_weight[k, d] > 0) == (s != d)
    distinct = np.count_nonzero(w - np.diag(np.diag(w)), axis=1)
    np.testing.assert_array_equal(plan.sends, distinct)
    np.testing.assert_array_equal(plan.receives, distinct)
    np.testing.assert_array_equal(topo.edges_used(choice), distinct)
  np.testing.assert_allclose(np.mean(_members(topo), axis=0), topo.weights,
                             atol=1e-15)
  if not topo.is_random:
    np.testing.assert_array_equal(topo.plan.to_dense(), topo.weights)
    np.testing.assert_array_equal(topo.plan.sends, topo.degree)


def test_structured_graphs_match_networkx_generators():
  def same(topo, graph):
    want = {tuple(sorted(e)) for e in graph.edges if e[0] != e[1]}
    assert set(topo.edges) == want, topo.name
  for m in (3, 8, 11):
    same(topology.make_topology('ring', m), nx.cycle_graph(m))
    same(topology.make_topology('complete', m), nx.complete_graph(m))
  for m in (5, 8, 16):
    offsets = [1 << k for k in range(m.bit_length()) if (1 << k) < m]
    same(topology.make_topology('exponential', m),
         nx.circulant_graph(m, offsets))
  for m in (4, 6, 12, 16):
    r, c = topology.torus_shape(m)
    grid = nx.grid_2d_graph(r, c, periodic=True)
    same(topology.make_topology('torus', m),
         nx.relabel_nodes(grid, {(a, b): a * c + b for a, b in grid}))
  for d in (2, 3, 4):
    cube = nx.hypercube_graph(d)
    same(topology.make_topology('hypercube', 2**d),
         nx.relabel_nodes(cube, {t: int(''.join(map(str, t)), 2)
                                 for t in cube}))


def test_degrees_with_coinciding_neighbours():
  # M=8 exponential: +4 and -4 coincide, so 5 distinct neighbours, not 6.
  assert set(topology.make_topology('exponential', 8).degree) == {5}
  assert set(topology.make_topology('exponential', 16).degree) == {7}
  assert topology.make_topology('exponential', 8).plan.num_perms == 5
  # A 2-wide torus: up and down coincide.
  assert set(topology.make_topology('torus', 8).degree) == {3}
  assert set(topology.make_topology('torus', 4).degree) == {2}
  assert set(topology.make_topology('ring', 2).degree) == {1}
  assert [topology.torus_shape(m) for m in (4, 6, 8, 12, 16, 36, 35)] == [
      (2, 2), (2, 3), (2, 4), (3, 4), (4, 4), (6, 6), (5, 7)]


@pytest.mark.parametrize('weights', topology.WEIGHTINGS)
def test_complete_graph_is_exact_average(weights):
  for m in (1, 2, 7):
    topo = topology.make_topology('complete', m, weights=weights)
    np.testing.assert_allclose(topo.weights, np.full((m, m), 1 / m),
                               atol=1e-15)
    assert topo.spectral_gap == pytest.approx(1.0)


def test_single_worker():
  topo = topology.make_topology('complete', 1)
  np.testing.assert_array_equal(topo.weights, [[1.0]])
  assert topo.plan.num_perms == 0 and topo.plan.sends.tolist() == [0]
  assert (topo.chi1, topo.chi2, topo.spectral_gap) == (0.0, 0.0, 1.0)
  for name in ('ring', 'exponential', 'erdos_renyi', 'torus', 'hypercube',
               'matching'):
    with pytest.raises(ConfigError, match='num_workers'):
      topology.make_topology(name, 1)


def test_matching_family_is_a_one_factorization():
  m = 8
  topo = topology.make_topology('matching', m)
  assert topo.is_random and topo.num_choices == m - 1
  seen = np.zeros((m, m), dtype=int)
  for choice in range(topo.num_choices):
    plan = topo.plan_for(choice)
    assert plan.num_perms == 1 and plan.sends.tolist() == [1] * m
    (perm,) = plan.perms
    partner = dict(perm)
    want = np.eye(m)
    for i, j in perm:
      assert partner[j] == i != j  # An involution without fixed points.
      e = np.eye(m)[i] - np.eye(m)[j]
      want -= 0.25 * np.outer(e, e)  # Each pair appears twice in perm.
      seen[i, j] += 1
    np.testing.assert_allclose(topo.weights_for(choice), want, atol=1e-15)
  np.testing.assert_array_equal(seen, 1 - np.eye(m, dtype=int))
  # E[W] = I - L(K_M) / (2 (M - 1)); matchings are projections (W^T W = W).
  lap = m * np.eye(m) - np.ones((m, m))
  np.testing.assert_allclose(topo.weights, np.eye(m) - lap / (2 * (m - 1)),
                             atol=1e-15)
  assert topo.spectral_gap == pytest.approx(
      1 - math.sqrt(1 - m / (2 * (m - 1))))
  with pytest.raises(ValueError, match='plan_for'):
    _ = topo.plan


def test_arrays_are_read_only():
  topo = topology.make_topology('ring', 4)
  for a in (topo.weights, topo.rates, topo.adjacency, topo.plan.recv_weight,
            topo.plan.self_weight, topo.plan.sends):
    with pytest.raises(ValueError):
      a[0] = 0


def test_sample_choice_host_and_jax():
  topo = topology.make_topology('matching', 6)
  rng = np.random.default_rng(0)
  host = {topo.sample_choice(rng) for _ in range(200)}
  assert host == set(range(5))
  keys = jax.random.split(jax.random.key(0), 2000)
  draws = jax.jit(jax.vmap(topo.sample_choice_jax))(keys)
  assert draws.dtype == jnp.int32 and draws.shape == (2000,)
  counts = np.bincount(np.asarray(draws), minlength=5)
  assert counts.sum() == 2000 and counts.min() > 300  # ~400 each.
  ring = topology.make_topology('ring', 5)
  assert ring.sample_choice(rng) == 0
  assert int(ring.sample_choice_jax(jax.random.key(1))) == 0


# --- Spectral quantities. -----------------------------------------------------


def _nx_weights(graph, weights):
  """Metropolis / uniform weights, computed independently from nx degrees."""
  m = graph.number_of_nodes()
  deg = dict(graph.degree)
  w = np.zeros((m, m))
  for i, j in graph.edges:
    if weights == 'metropolis':
      w[i, j] = w[j, i] = 1 / (1 + max(deg[i], deg[j]))
    else:
      w[i, j] = w[j, i] = 1 / (1 + max(deg.values()))
  return w + np.diag(1 - w.sum(axis=1))


def _slot_graph(name, m, topo):
  """Graph of A2CiD2 rates, built from each worker's neighbour slots."""
  if name == 'erdos_renyi':
    slots = {i: list(nx.Graph(topo.edges).neighbors(i)) for i in range(m)}
  elif name == 'torus':
    r, c = topology.torus_shape(m)
    slots = {a * c + b: [((a + 1) % r) * c + b, ((a - 1) % r) * c + b,
                         a * c + (b + 1) % c, a * c + (b - 1) % c]
             for a in range(r) for b in range(c)}
  elif name == 'hypercube':
    slots = {i: [i ^ (1 << k) for k in range(m.bit_length() - 1)]
             for i in range(m)}
  elif name == 'complete':
    slots = {i: [j for j in range(m) if j != i] for i in range(m)}
  else:
    offsets = {'ring': [1],
               'exponential': [1 << k for k in range(m.bit_length())
                               if (1 << k) < m]}[name]
    slots = {i: [(i + s * o) % m for o in offsets for s in (1, -1)]
             for i in range(m)}
  graph = nx.Graph()
  graph.add_nodes_from(range(m))
  for i, nbrs in slots.items():
    for j in nbrs:
      # Worker i initiates at rate 1/2 over its slots, both ends add up.
      rate = 0.5 / len(nbrs)
      if graph.has_edge(i, j):
        graph[i][j]['rate'] += rate
      else:
        graph.add_edge(i, j, rate=rate)
  return graph


@st.composite
def _graphs(draw):
  name = draw(st.sampled_from(['ring', 'torus', 'exponential', 'hypercube',
                               'complete', 'erdos_renyi', 'erdos_renyi']))
  if name == 'hypercube':
    m = 2**draw(st.integers(1, 5))
  elif name == 'torus':
    m = draw(st.sampled_from([4, 6, 8, 9, 10, 12, 14, 15, 16, 18, 20, 21, 24,
                              25, 27, 30]))
  elif name == 'erdos_renyi':
    m = draw(st.integers(4, 24))
  else:
    m = draw(st.integers(2, 32))
  kwargs = {}
  if name == 'erdos_renyi':
    kwargs = dict(seed=draw(st.integers(0, 10**6)),
                  p=draw(st.floats(0.15, 0.9)))
  weights = draw(st.sampled_from(topology.WEIGHTINGS))
  return name, m, kwargs, weights


@settings(max_examples=60, deadline=None)
@given(_graphs())
def test_spectral_quantities_match_networkx(graph_case):
  name, m, kwargs, weights = graph_case
  try:
    topo = topology.make_topology(name, m, weights=weights, **kwargs)
  except ConfigError:
    assume(False)  # A disconnected G(M, p) draw.
  graph = nx.Graph()
  graph.add_nodes_from(range(m))
  graph.add_edges_from(topo.edges)
  w = _nx_weights(graph, weights)
  np.testing.assert_allclose(topo.weights, w, atol=1e-14)

  # Spectral gap: the Laplacian of the W-weighted graph is I - W.
  nx.set_edge_attributes(graph, {(i, j): w[i, j] for i, j in graph.edges}, 'w')
  mu = np.sort(nx.laplacian_spectrum(graph, weight='w'))
  assert mu[0] == pytest.approx(0, abs=1e-10)
  gap = 1 - np.abs(1 - mu[1:]).max()
  assert topo.spectral_gap == pytest.approx(gap, abs=1e-10)

  # chi1 = 1/lambda_2(L), chi2 = max edge resistance / 2, L from the rates.
  rates = _slot_graph(name, m, topo)
  np.testing.assert_allclose(
      topo.rates, nx.to_numpy_array(rates, nodelist=range(m), weight='rate'),
      atol=1e-14)
  lam2 = nx.algebraic_connectivity(rates, weight='rate', method='tracemin_lu',
                                   tol=1e-12)
  assert topo.chi1 == pytest.approx(1 / lam2, rel=1e-6)
  # L^+ = (L + 11^T/M)^-1 - 11^T/M. (nx.resistance_distance calls pinv with
  # the default cutoff, which can keep the zero eigenvalue: 0.4% off at M=24.)
  lap = nx.laplacian_matrix(rates, nodelist=range(m), weight='rate').toarray()
  pinv = np.linalg.inv(lap + 1 / m) - 1 / m
  chi2 = max(pinv[i, i] + pinv[j, j] - 2 * pinv[i, j]
             for i, j in rates.edges) / 2
  assert topo.chi2 == pytest.approx(chi2, rel=1e-8)

  # x <- W x contracts ||x - mean|| by at most (1 - gap), with equality on
  # the slowest eigenvector (the bound is tight, not just valid).
  x = np.random.default_rng(m).normal(size=(m, 4))
  for _ in range(10):
    before = np.linalg.norm(x - x.mean(0))
    x_new = topo.weights @ x
    np.testing.assert_allclose(x_new.mean(0), x.mean(0), atol=1e-12)
    assert np.linalg.norm(x_new - x.mean(0)) <= (
        (1 - topo.spectral_gap) * before + 1e-12)
    x = x_new
  evals, evecs = np.linalg.eigh(topo.weights)
  evals[np.argmax(np.abs(evecs.sum(0)))] = 0  # Drop the consensus direction.
  v = evecs[:, np.argmax(np.abs(evals))]
  assert np.linalg.norm(topo.weights @ v) == pytest.approx(
      1 - topo.spectral_gap, abs=1e-10)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([2, 4, 6, 8, 10, 12, 16]), st.integers(0, 1000))
def test_random_matching_contracts_in_mean_square(m, seed):
  topo = topology.make_topology('matching', m)
  x = np.random.default_rng(seed).normal(size=(m, 3))
  x -= x.mean(0)
  rate = np.mean([np.sum((w @ x) ** 2) for w in _members(topo)])
  assert rate <= (1 - topo.spectral_gap)**2 * np.sum(x**2) + 1e-12
  # Its chi's are the complete graph's: each pair is matched once per family.
  complete = topology.make_topology('complete', m)
  np.testing.assert_allclose(topo.rates, complete.rates, atol=1e-15)
  assert topo.chi1 == pytest.approx(complete.chi1)


def _acid_code_chis(neighbours):
  """A transcription of AdelNabli/ACiD `compute_acid_constants` (rate_com 1)."""
  m = len(neighbours)
  w = np.zeros((m, m))
  for i, nbrs in enumerate(neighbours):
    for j in nbrs:
      w[i, j] += 1 / len(nbrs)
  lap = np.eye(m) - w
  chi1 = 1 / np.linalg.eigh(lap)[0][1]
  pinv = np.linalg.pinv(lap)
  chi2 = max(0.5 * (pinv[i, i] + pinv[j, j] - 2 * pinv[i, j])
             for i, nbrs in enumerate(neighbours) for j in nbrs)
  return chi1, chi2


# The paper's values, with half a unit of their last printed digit.
@pytest.mark.parametrize('name,m,chi1,tol,chi2', [
    ('ring', 8, 3.41, 0.005, 0.875),
    ('ring', 16, 13.1, 0.05, None),
    ('ring', 32, 52.0, 0.05, None),
    ('exponential', 8, 1.50, 0.005, None),
    ('exponential', 16, 2.00, 0.005, None),
])
def test_a2cid2_reference_values(name, m, chi1, tol, chi2):
  topo = topology.make_topology(name, m)
  assert topo.chi1 == pytest.approx(chi1, abs=tol), (
      'chi1 no longer matches the A2CiD2 paper (REFERENCES.md); check the '
      'rates convention (neighbour slots, W_ij = 1/deg(i)).')
  if chi2 is not None:
    assert topo.chi2 == pytest.approx(chi2, abs=1e-9)
  log_m = m.bit_length() - 1
  if name == 'ring':
    nbrs = [[(i + 1) % m, (i - 1) % m] for i in range(m)]
  else:
    nbrs = [[(i + s * 2**k) % m for s in (1, -1) for k in range(log_m)]
            for i in range(m)]
  want = _acid_code_chis(nbrs)
  assert (topo.chi1, topo.chi2) == pytest.approx(want, rel=1e-9)


def test_laplacian_quantities_of_a_mixing_matrix_and_rate_com():
  # A stochastic matrix gives L = I - W; rate_com scales L, so chi's scale 1/r.
  ring = topology.make_topology('ring', 8)
  chi1, chi2 = topology.laplacian_quantities(ring.rates, rate_com=2.0)
  assert (chi1, chi2) == pytest.approx((ring.chi1 / 2, ring.chi2 / 2))
  lap = np.eye(8) - ring.weights
  assert topology.laplacian_quantities(ring.weights)[0] == pytest.approx(
      1 / np.sort(np.linalg.eigvalsh(lap))[1])
  with pytest.raises(ConfigError, match='disconnected'):
    topology.laplacian_quantities(np.eye(4))
  with pytest.raises(ConfigError, match='rate_com'):
    topology.laplacian_quantities(ring.rates, rate_com=0.0)


# --- User matrices and the generic (edge-coloured) plan. --------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 30), st.floats(0.1, 0.9), st.integers(0, 10**6))
def test_user_matrix_plan_is_an_edge_colouring(m, p, seed):
  graph = nx.gnp_random_graph(m, p, seed=seed)
  assume(nx.is_connected(graph))
  w = _nx_weights(graph, 'metropolis')
  topo = topology.topology_from_matrix(w)
  np.testing.assert_array_equal(topo.plan.to_dense(), w)
  max_degree = max(d for _, d in graph.degree)
  assert topo.plan.num_perms <= max_degree + 1  # Vizing / Misra-Gries.
  for perm in topo.plan.perms:
    partner = dict(perm)
    assert all(partner[j] == i for i, j in perm)  # Each perm is a matching.
  np.testing.assert_array_equal(topo.plan.sends, [d for _, d in
                                                  sorted(graph.degree)])


def test_validate_mixing_matrix_names_the_failure():
  ok = topology.make_topology('ring', 4).weights
  topology.validate_mixing_matrix(ok)
  cases = [
      (np.ones((2, 3)) / 3, 'square'),
      (np.array([[0.5, 0.5], [np.nan, 0.5]]), 'finite'),
      (np.array([[1.5, -0.5], [-0.5, 1.5]]), 'negative'),
      (np.array([[0.5, 0.5], [0.0, 1.0]]), 'not symmetric'),
      (np.array([[0.5, 0.4], [0.4, 0.5]]), 'row 0 sums to 0.9'),
      (np.eye(3), 'disconnected'),
  ]
  for w, message in cases:
    with pytest.raises(ConfigError, match=message):
      topology.validate_mixing_matrix(w)
  with pytest.raises(ConfigError, match='not symmetric'):
    topology.topology_from_matrix(np.array([[0.5, 0.5], [0.0, 1.0]]))


@pytest.mark.parametrize('name,m,kwargs,message', [
    ('hypercube', 6, {}, 'power of two'),
    ('torus', 7, {}, r'r x c with r, c >= 2; got 7'),
    ('torus', 3, {}, 'no such factorization'),
    ('matching', 7, {}, 'even num_workers'),
    ('erdos_renyi', 20, dict(p=0.01), 'disconnected; use a larger p'),
    ('erdos_renyi', 8, dict(p=0.0), '0 < p <= 1'),
    ('star', 8, {}, "Unknown topology name 'star'; allowed: complete, ring"),
    ('ring', 8, dict(weights='laplacian'),
     "Unknown topology weights 'laplacian'; allowed: metropolis, uniform"),
    ('ring', 0, {}, 'num_workers must be >= 1'),
    ('ring', 2.5, {}, 'num_workers must be an int'),
])
def test_bad_input_raises_config_error(name, m, kwargs, message):
  with pytest.raises(ConfigError, match=message):
    topology.make_topology(name, m, **kwargs)


# --- The plan as comm.py will run it. ----------------------------------------


def _gossip_worker(plan, x_i):
  """One worker's gossip step inside vmap(axis_name='w'), static ppermutes."""
  i = lax.axis_index('w')
  self_w = jnp.asarray(plan.self_weight, jnp.float32)
  recv_w = jnp.asarray(plan.recv_weight, jnp.float32)
  out = self_w[i] * x_i
  for k, perm in enumerate(plan.perms):
    out = out + recv_w[k, i] * lax.ppermute(x_i, 'w', perm)
  return out


_RUN_CASES = (('ring', 8, {}), ('torus', 6, {}), ('exponential', 8, {}),
              ('hypercube', 4, {}), ('complete', 5, {}), ('complete', 1, {}),
              ('erdos_renyi', 10, dict(p=0.4, seed=2)))


class PlanUnderVmapTest(chex.TestCase):
  """The static plans as per-worker ppermutes under vmap, jitted and op by op."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      *[(f'{name}_{m}', (name, m, kw)) for name, m, kw in _RUN_CASES])
  def test_plan_runs_under_vmap_ppermute(self, case):
    topo = _make(case)
    m = topo.num_workers
    x = np.random.default_rng(0).normal(size=(m, 5))
    step = self.variant(jax.vmap(functools.partial(_gossip_worker, topo.plan),
                                 axis_name='w'))
    out = step(jnp.asarray(x, jnp.float32))
    chex.assert_shape(out, (m, 5))
    chex.assert_tree_all_finite(out)
    chex.assert_trees_all_close(out, jnp.asarray(topo.weights @ x, jnp.float32),
                                atol=1e-5)
    # The mean is kept, and a consensus is a fixed point.
    chex.assert_trees_all_close(out.mean(0), jnp.asarray(x.mean(0), jnp.float32),
                                atol=1e-6)
    same = jnp.broadcast_to(jnp.asarray(x[:1], jnp.float32), (m, 5))
    chex.assert_trees_all_close(step(same), same, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_random_family_runs_under_vmap_with_lax_switch(self):
    topo = topology.make_topology('matching', 6)

    def worker(x_i, choice):
      branches = [functools.partial(_gossip_worker, plan) for plan in topo.plans]
      return lax.switch(choice, branches, x_i)

    @self.variant
    def step(x, key):
      choice = topo.sample_choice_jax(key)
      return jax.vmap(worker, axis_name='w', in_axes=(0, None))(x, choice), choice

    x = np.random.default_rng(0).normal(size=(6, 5))
    drawn = set()
    for seed in range(4):
      out, choice = step(jnp.asarray(x, jnp.float32), jax.random.key(seed))
      chex.assert_shape(out, (6, 5))
      chex.assert_trees_all_close(
          out, jnp.asarray(topo.weights_for(int(choice)) @ x, jnp.float32), atol=1e-5)
      drawn.add(int(choice))
    assert len(drawn) > 1      # the key picks the member


# --- The plans on 8 devices: one worker per device, ppermute as a real collective.

def _mesh8() -> Mesh:
  assert len(jax.devices()) >= 8, 'tests/conftest.py gives JAX 8 CPU devices'
  return Mesh(np.array(jax.devices()[:8]), ('w',),
              axis_types=(jax.sharding.AxisType.Auto,))


@pytest.mark.parametrize('case', [
    ('ring', 8, {}), ('torus', 8, {}), ('exponential', 8, {}), ('hypercube', 8, {}),
    ('complete', 8, {}), ('erdos_renyi', 8, dict(p=0.5, seed=1)), ('matching', 8, {}),
], ids=lambda c: c[0])
def test_plans_run_as_collective_permutes_on_8_devices(case):
  """Under shard_map each plan is W, and its program moves data by ppermutes only."""
  topo = _make(case)
  mesh = _mesh8()
  spec = P('w')

  def block(x, choice):    # one worker per device
    branches = [functools.partial(_gossip_worker, plan) for plan in topo.plans]
    return lax.switch(choice, branches, x[0])[None]

  step = jax.jit(jax.shard_map(block, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
  x = np.random.default_rng(1).normal(size=(8, 5))
  x_on_mesh = jax.device_put(jnp.asarray(x, jnp.float32), NamedSharding(mesh, spec))
  for choice in range(topo.num_choices):
    out = step(x_on_mesh, jnp.int32(choice))
    chex.assert_shape(out, (8, 5))
    chex.assert_trees_all_close(
        out, jnp.asarray(topo.weights_for(choice) @ x, jnp.float32), atol=1e-5)
    assert {s.data.shape for s in out.addressable_shards} == {(1, 5)}
  kinds = hlo_lib.kinds(step.lower(x_on_mesh, jnp.int32(0)).compile().as_text())
  assert kinds == {'collective-permute'}, kinds
