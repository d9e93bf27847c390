"""Gossip: each worker mixes with its graph neighbours, `x_i <- sum_j W_ij x_j`.

Everything here runs per worker inside the engine's map over the "workers" axis
(`jax.vmap(..., axis_name="workers")`, a vmap with `spmd_axis_name` over a mesh, or
`jax.shard_map` with one worker per device); workers meet only through named-axis
collectives, so one function serves all three placements.

Three implementations of one mixing step, equal to float tolerance:
  sparse  the topology's static `GossipPlan`: one `lax.ppermute` per permutation,
          O(M d P) work; a random family (`Topology.is_random`, e.g. the
          1-factorization of random matchings) picks this round's member with
          `lax.switch` on an index drawn from the tick's shared key.
  dense   this worker's row of W contracted with the `lax.all_gather`ed tree
          (O(M^2 P) under vmap: small M only); always used for a per-tick mixing
          matrix (`WorkerContext.mixing`, the asynchronous replay).
  mean    the complete graph with uniform weights is the all-reduce: `psum / M`,
          exactly the code of `all_reduce_mean` (so GASLoC on the complete graph
          is DiLoCo bit for bit). 'auto' picks it; forcing 'dense' or 'sparse'
          models a peer-to-peer exchange with all M - 1 others instead.

Sparse and dense are written in Laplacian form, `x_i - sum_j W_ij (x_i - x_j)`:
a dead link then simply drops out, and equal neighbours leave x exactly unchanged.

Dead workers (`WorkerContext.alive` False) neither send nor mix: every edge with a
dead end is dropped for the tick and its weight goes back to both ends' diagonals,
so W stays symmetric and doubly stochastic on the alive workers (their mean is
preserved) and a dead worker keeps its value. On the 'mean' path the alive workers
average among themselves (the complete graph on the alive set) and the dead keep
their value.

Bytes (DESIGN §5): S = the tree's bytes at the transport dtype; per edge actually
used this tick a worker sends S and receives S (ring: 2 S each way, a matching: S,
a dead worker: 0); the 'mean' path counts the ring all-reduce, 2 (m - 1) / m S.
Values are rounded to the transport dtype before they leave a worker; a worker's
own value is never rounded (except on the 'mean' path, as in `all_reduce_mean`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco import topology as topology_lib
from loco.comm.core import (GOSSIP, NO_COMM, WORKERS, CommState, WorkerContext,
                            empty_comm_state, ring_all_reduce_state, transport_dtype,
                            tree_bytes, worker_mean)
from loco.errors import ConfigError

PyTree = Any

MIXES = ('models', 'deltas', 'params')
IMPLS = ('auto', 'dense', 'sparse')
# Folded into the tick's key so the member draw is independent of other users of it.
_KEY_SALT = 0x60551


class GossipState(NamedTuple):
  """State of the `gossip` transform."""
  count: jax.Array    # int32: applications so far (seeds the draw without a context key)
  comm: CommState     # what the last application put on the wire


# ---------------------------------------------------------------------------
# Topologies, resolved once the number of workers is known (at trace time).


def _read_only(a: np.ndarray) -> np.ndarray:
  a = np.array(a)
  a.setflags(write=False)
  return a


def _cycle_matchings(perm: topology_lib.Perm) -> list[list[tuple[int, int]]]:
  """Splits the cycles of a permutation into at most 3 matchings (2 if all even)."""
  dst = dict(perm)
  seen, out = set(), [[], [], []]
  for start in sorted(dst):
    if start in seen or dst[start] == start:
      continue
    cycle, v = [], start
    while v not in seen:
      seen.add(v)
      cycle.append(v)
      v = dst[v]
    length = len(cycle)
    if length == 2:
      out[0].append(tuple(sorted(cycle)))
      continue
    for k in range(length):
      edge = tuple(sorted((cycle[k], cycle[(k + 1) % length])))
      colour = 2 if (length % 2 and k == length - 1) else k % 2
      out[colour].append(edge)
  return [m for m in out if m]


@functools.lru_cache(maxsize=64)
def pairwise_family(topo: topology_lib.Topology) -> topology_lib.Topology:
  """The random family 'one matching of `topo`'s graph per round, pairs average'.

  A random-matching topology is returned as is. Otherwise the graph's edges are
  split into matchings (each permutation of the plan into its cycles' alternate
  edges, duplicates dropped: a ring of even M gives 2 perfect matchings, the
  exponential graph of M = 2^k its degree), one of which is drawn per round, so
  every worker makes about one exchange per round, as in AD-PSGD and A2CiD2. The
  family's `rates` are the probabilities that an edge is used in a round, so its
  chi1, chi2 are the A2CiD2 constants of this simulation (at one exchange per
  gradient step they equal the A2CiD2 paper's for rings and the complete graph).

  Args:
    topo: a resolved topology.

  Returns:
    A random-family `Topology` whose members are matchings with weight 1/2.
  """
  m = topo.num_workers
  if topo.is_random and all(
      p.num_perms == 1 and np.all(p.recv_weight[p.recv_weight > 0] == 0.5)
      for p in topo.plans):
    return topo
  if m == 1:
    return topo
  covered, matchings = set(), []
  for plan in topo.plans:
    for perm in plan.perms:
      for matching in _cycle_matchings(perm):
        fresh = [e for e in matching if e not in covered]
        covered.update(fresh)
        if fresh:
          matchings.append(fresh)
  plans = []
  for pairs in matchings:
    dst = list(range(m))
    for a, b in pairs:
      dst[a], dst[b] = b, a
    matched = np.array([dst[i] != i for i in range(m)])
    plans.append(topology_lib.GossipPlan(
        perms=(tuple((i, dst[i]) for i in range(m)),),
        self_weight=_read_only(np.where(matched, 0.5, 1.0)),
        recv_weight=_read_only(np.where(matched, 0.5, 0.0)[None]),
        sends=_read_only(matched.astype(np.int64))))
  weights = np.mean([p.to_dense() for p in plans], axis=0)
  rates = 2.0 * (weights - np.diag(np.diag(weights)))
  return topology_lib.Topology(
      name=f'{topo.name}/pairwise', num_workers=m, weights=_read_only(weights),
      plans=tuple(plans), adjacency=_read_only(rates > 0), rates=_read_only(rates),
      weighting='pairwise', is_random=True)


@functools.lru_cache(maxsize=64)
def resolve_topology(spec: str | topology_lib.Topology, num_workers: int, *,
                     weights: str = 'metropolis', seed: int = 0,
                     pairwise: bool = False) -> topology_lib.Topology:
  """The `Topology` a gossip step uses for `num_workers` workers (cached).

  Args:
    spec: a topology name (see `loco.topology.TOPOLOGIES`) or a built `Topology`.
    num_workers: M, the static size of the worker axis.
    weights: 'metropolis' or 'uniform' (for a name).
    seed: the 'erdos_renyi' graph's seed.
    pairwise: one random matching of the graph per round (`pairwise_family`).

  Returns:
    A Topology of `num_workers` workers.

  Raises:
    ConfigError: an unknown name or weighting, or a graph that cannot have M workers.
  """
  if isinstance(spec, topology_lib.Topology):
    if spec.num_workers != num_workers:
      raise ConfigError(f'algorithm.topology has {spec.num_workers} workers but the run '
                        f'has num_workers={num_workers}; build it for {num_workers}.')
    topo = spec
  elif isinstance(spec, str):
    try:
      topo = topology_lib.make_topology(spec, num_workers, weights=weights, seed=seed)
    except ConfigError as e:
      raise ConfigError(f'algorithm.topology={spec!r} does not fit num_workers='
                        f'{num_workers}: {e}') from None
  else:
    raise ConfigError(f'algorithm.topology must be a name ({", ".join(topology_lib.TOPOLOGIES)}) '
                      f'or a loco.topology.Topology, got {spec!r}.')
  return pairwise_family(topo) if pairwise else topo


def is_all_reduce(topo: topology_lib.Topology) -> bool:
  """Whether `topo` is the complete graph with uniform weights (W = 11^T / M)."""
  m = topo.num_workers
  return not topo.is_random and bool(np.allclose(topo.weights, 1.0 / m, atol=1e-12))


def round_key(context: WorkerContext | None, seed: int, count: jax.Array) -> jax.Array:
  """This round's key for drawing a family member: the tick's shared key, else a counter."""
  if context is not None and context.key is not None:
    return jax.random.fold_in(context.key, _KEY_SALT)
  return jax.random.fold_in(jax.random.PRNGKey(seed), count)


# ---------------------------------------------------------------------------
# One mixing step on this worker's tree.


class _Mixed(NamedTuple):
  residual: PyTree | None   # float32 x_i - sum_j W_ij x_j (sparse/dense paths)
  mean: PyTree | None       # float32 mean over alive workers (the all-reduce path)
  comm: CommState


def _f32(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


def _zero() -> jax.Array:
  return jnp.zeros((), jnp.float32)


def _gossip_state(sent, received, peers, size) -> CommState:
  events = (sent + received > 0).astype(jnp.int32)
  return CommState(sent, received, events,
                   jnp.where(events > 0, GOSSIP, NO_COMM).astype(jnp.int32),
                   jnp.where(events > 0, jnp.asarray(size, jnp.float32), 0.0), peers)


def _plan_residual(x32, wire_x, plan, i, alive_all, size, axis_name):
  """Sparse Laplacian step of one static plan: ppermutes, edge-wise differences."""
  m = plan.num_workers
  ids = np.arange(m)
  recv_w = jnp.asarray(plan.recv_weight, jnp.float32)
  sources = plan.sources
  residual = jax.tree.map(jnp.zeros_like, x32)
  sent = received = _zero()
  peers = jnp.zeros((m,), bool)
  for k, perm in enumerate(plan.perms):
    dst = ids.copy()
    for s, d in perm:
      dst[s] = d
    src_i = jnp.asarray(sources[k])[i]
    dst_i = jnp.asarray(dst)[i]
    ok_in, ok_out = src_i != i, dst_i != i
    if alive_all is not None:
      ok_in = ok_in & alive_all[i] & alive_all[src_i]
      ok_out = ok_out & alive_all[i] & alive_all[dst_i]
    w = jnp.where(ok_in, recv_w[k, i], 0.0)
    recv = jax.lax.ppermute(wire_x, axis_name, perm)
    residual = jax.tree.map(lambda r, x, y, w=w: r + w * (x - y.astype(jnp.float32)),
                            residual, x32, recv)
    received = received + ok_in.astype(jnp.float32) * size
    sent = sent + ok_out.astype(jnp.float32) * size
    peers = peers.at[src_i].max(ok_in).at[dst_i].max(ok_out)
  return residual, _gossip_state(sent, received, peers, size)


def _dense_residual(x32, wire_x, row, col, i, alive_all, size, axis_name):
  """Dense Laplacian step: this worker's row of W against the gathered tree."""
  m = row.shape[0]
  off = jnp.arange(m) != i
  w_in = jnp.where(off, row, 0.0).astype(jnp.float32)
  w_out = jnp.where(off, col, 0.0).astype(jnp.float32)
  if alive_all is not None:
    both = (alive_all & alive_all[i]).astype(jnp.float32)
    w_in, w_out = w_in * both, w_out * both
  gathered = jax.lax.all_gather(wire_x, axis_name)
  residual = jax.tree.map(
      lambda x, g: jnp.tensordot(w_in, x[None] - g.astype(jnp.float32), axes=1),
      x32, gathered)
  received = jnp.sum(w_in > 0).astype(jnp.float32) * size
  sent = jnp.sum(w_out > 0).astype(jnp.float32) * size
  return residual, _gossip_state(sent, received, (w_in > 0) | (w_out > 0), size)


def _all_reduce(wire_x, alive, size, axis_name):
  """The complete graph: the all-reduce mean over the alive workers (all_reduce_mean)."""
  mean = worker_mean(wire_x, alive.astype(jnp.float32), axis_name)
  return mean, ring_all_reduce_state(alive, size, axis_name)


def _path(topo: topology_lib.Topology, impl: str, mixing) -> str:
  if mixing is not None:
    return 'dense'
  if impl == 'auto':
    return 'mean' if is_all_reduce(topo) else 'sparse'
  return impl


def _mix(x: PyTree, topo: topology_lib.Topology, *, key: jax.Array | None,
         alive: jax.Array | None, mixing: jax.Array | None, wire, impl: str,
         axis_name: str) -> _Mixed:
  """One gossip step on this worker's tree `x` (see the module docstring)."""
  path = _path(topo, impl, mixing)
  wire_x = jax.tree.map(lambda v: v.astype(wire), x)
  size = float(tree_bytes(x, wire))
  if path == 'mean':
    alive = jnp.ones((), bool) if alive is None else jnp.asarray(alive, bool)
    mean, comm = _all_reduce(wire_x, alive, size, axis_name)
    return _Mixed(None, mean, comm)
  x32 = _f32(x)
  i = jax.lax.axis_index(axis_name)
  alive_all = None
  if alive is not None:
    alive_all = jax.lax.all_gather(jnp.asarray(alive, bool), axis_name)
  if path == 'dense':
    if mixing is not None:
      w = jnp.asarray(mixing, jnp.float32)
      row, col = w[i], w[:, i]
    else:
      members = jnp.asarray(np.stack([topo.weights_for(c) for c in range(topo.num_choices)]),
                            jnp.float32)
      choice = topo.sample_choice_jax(key) if topo.is_random else 0
      row, col = members[choice, i], members[choice, :, i]
    residual, comm = _dense_residual(x32, wire_x, row, col, i, alive_all, size, axis_name)
    return _Mixed(residual, None, comm)
  branches = [functools.partial(_plan_residual, plan=plan, i=i, alive_all=alive_all,
                                size=size, axis_name=axis_name)
              for plan in topo.plans]
  if len(branches) == 1:
    residual, comm = branches[0](x32, wire_x)
  else:
    residual, comm = jax.lax.switch(topo.sample_choice_jax(key),
                                    [lambda a, b, f=f: f(a, b) for f in branches],
                                    x32, wire_x)
  return _Mixed(residual, None, comm)


def _check(impl: str, dtype: str):
  if impl not in IMPLS:
    raise ConfigError(f'gossip impl must be one of {", ".join(IMPLS)}, got {impl!r}.')
  return transport_dtype(dtype)


def gossip_residual(tree: PyTree, topo: topology_lib.Topology, *,
                    context: WorkerContext | None = None, key: jax.Array | None = None,
                    dtype: str = 'float32', impl: str = 'auto',
                    axis_name: str = WORKERS) -> tuple[PyTree, CommState]:
  """This worker's disagreement with its neighbours, `x_i - sum_j W_ij x_j`.

  The building block for algorithms with their own update around a gossip step
  (A2CiD2): `x_i - residual` is one gossip step. With a random matching family,
  `x_j - x_i = -2 residual` for a matched pair.

  Args:
    tree: this worker's tree.
    topo: a resolved `Topology` of the worker-axis size (`resolve_topology`).
    context: this tick's `WorkerContext` (alive mask, mixing matrix).
    key: the round's key for a random family (`round_key`); required for one.
    dtype: transport dtype of what neighbours receive.
    impl: 'auto', 'dense' or 'sparse' (see the module docstring).
    axis_name: the worker axis name.

  Returns:
    (the residual in float32, the `CommState` of this step).
  """
  wire = _check(impl, dtype)
  _check_size(topo, axis_name)
  mixed = _mix(tree, topo, key=key, alive=_alive_of(context), mixing=_mixing_of(context),
               wire=wire, impl=impl, axis_name=axis_name)
  if mixed.residual is not None:
    return mixed.residual, mixed.comm
  alive = _alive_of(context)
  residual = jax.tree.map(lambda x, m: x.astype(jnp.float32) - m, tree, mixed.mean)
  if alive is not None:
    residual = jax.tree.map(lambda r: jnp.where(alive, r, 0.0), residual)
  return residual, mixed.comm


def _alive_of(context):
  return None if context is None or context.alive is None else jnp.asarray(context.alive, bool)


def _mixing_of(context):
  return None if context is None else context.mixing


def static_num_workers(axis_name: str = WORKERS) -> int | None:
  """The static number of workers M inside the per-worker map; None outside it."""
  try:
    return jax.lax.axis_size(axis_name)
  except NameError:
    return None


def _axis_size(axis_name: str) -> int:
  m = static_num_workers(axis_name)
  if m is None:
    raise ValueError(f'gossip runs per worker: call it inside jax.vmap(..., axis_name='
                     f'{axis_name!r}) or a shard_map over a {axis_name!r} mesh axis.')
  return m


def _check_size(topo, axis_name):
  m = _axis_size(axis_name)
  if topo.num_workers != m:
    raise ConfigError(f'the topology has {topo.num_workers} workers but the worker axis '
                      f'has {m}.')


# ---------------------------------------------------------------------------
# The optax transform.


def gossip(topology: str | topology_lib.Topology, mix: str = 'models', *,
           step_size: float = 1.0, dtype: str = 'float32', impl: str = 'auto',
           weights: str = 'metropolis', seed: int = 0, pairwise: bool = False,
           axis_name: str = WORKERS) -> optax.GradientTransformationExtraArgs:
  """Gossip over a graph: `x_i <- x_i + step_size (sum_j W_ij x_j - x_i)`.

  The mixed quantity `x` depends on `mix`:
    'models'  (outer chain) the local models `phi = params - updates`, with the
              anchor `theta` as optax params and the pseudo-gradient
              `delta = theta - phi` as updates; returns `theta_i - z_i`, `z` the
              mixed models (GASLoC, D-SGD, NoLoCo).
    'deltas'  (outer chain) the pseudo-gradients themselves.
    'params'  (inner chain, after the optimizer) the params the gradient was taken
              at; returns `updates + step_size (sum_j W_ij x_j - x_i)`, so the step
              is gossip-then-local-step, `x <- W x + u` (AD-PSGD).

  The topology is built when the worker-axis size M is known (at init and at trace
  time, inside the per-worker map), so one factory serves any M that fits the graph.

  Args:
    topology: a name from `loco.topology.TOPOLOGIES` ('complete', 'ring', 'torus',
      'exponential', 'hypercube', 'erdos_renyi', 'matching') or a `Topology`.
    mix: 'models', 'deltas' or 'params'.
    step_size: gossip step gamma (1: plain gossip; < 1 damps it).
    dtype: transport dtype ('float32', 'bfloat16', 'float16').
    impl: 'auto' (all-reduce on the complete uniform graph, else sparse), 'dense'
      or 'sparse'.
    weights: 'metropolis' or 'uniform' mixing weights for a named topology.
    seed: seed of an 'erdos_renyi' graph and of the member draws when the tick
      carries no key.
    pairwise: use one random matching of the graph per round (`pairwise_family`).
    axis_name: the worker axis name.

  Returns:
    An optax transformation with extra arg `context: WorkerContext | None`, whose
    state is a `GossipState`.

  References:
    Lian et al., arXiv 1705.09056 (D-PSGD); Koloskova et al., arXiv 2003.10422
    (gossip with changing topologies); GASLoC, arXiv 2606.11081.
  """
  if mix not in MIXES:
    raise ConfigError(f'algorithm.mix must be one of {", ".join(MIXES)}, got {mix!r}.')
  if not 0.0 < step_size <= 1.0:
    raise ConfigError(f'algorithm.gossip_step must be in (0, 1], got {step_size}.')
  wire = _check(impl, dtype)
  if isinstance(topology, str) and topology not in topology_lib.TOPOLOGIES:
    raise ConfigError(f'algorithm.topology must be one of '
                      f'{", ".join(topology_lib.TOPOLOGIES)}, got {topology!r}.')
  if weights not in topology_lib.WEIGHTINGS:
    raise ConfigError(f'algorithm.weights must be one of '
                      f'{", ".join(topology_lib.WEIGHTINGS)}, got {weights!r}.')
  gamma = float(step_size)

  def resolve() -> topology_lib.Topology:
    return resolve_topology(topology, _axis_size(axis_name), weights=weights, seed=seed,
                            pairwise=pairwise)

  def init(params):
    del params
    if static_num_workers(axis_name) is not None:
      resolve()            # a topology that does not fit M fails at init
    return GossipState(jnp.zeros((), jnp.int32), empty_comm_state(axis_name=axis_name))

  def update(updates, state, params=None, *, context: WorkerContext | None = None,
             **extra):
    del extra
    topo = resolve()
    if mix != 'deltas' and params is None:
      raise ValueError(f"gossip(mix={mix!r}) needs params (the anchor or the model).")
    alive = _alive_of(context)
    key = round_key(context, seed, state.count) if topo.is_random else None
    keep = (lambda new, old: new) if alive is None else (
        lambda new, old: jnp.where(alive, new, old))
    if mix == 'models' and _path(topo, impl, _mixing_of(context)) == 'mean':
      out, comm = _all_reduce_models(updates, params, gamma, keep, alive, wire, axis_name)
    else:
      if mix == 'models':
        source = jax.tree.map(lambda t, d: t.astype(jnp.float32) - d.astype(jnp.float32),
                              params, updates)
      else:
        source = updates if mix == 'deltas' else params
      mixed = _mix(source, topo, key=key, alive=alive, mixing=_mixing_of(context),
                   wire=wire, impl=impl, axis_name=axis_name)
      comm = mixed.comm
      if mixed.residual is not None:
        # models: theta - (phi - gamma L phi) = delta + gamma L phi; else x - gamma L x.
        sign = gamma if mix == 'models' else -gamma
        out = jax.tree.map(lambda u, r: u.astype(jnp.float32) + sign * r,
                           updates, mixed.residual)
      elif mix == 'deltas':
        out = jax.tree.map(lambda d, mean: keep(_toward(d, mean, gamma), _f32(d)),
                           updates, mixed.mean)
      else:
        out = jax.tree.map(
            lambda u, x, mean: u.astype(jnp.float32) + keep(
                gamma * (mean - x.astype(jnp.float32)), 0.0),
            updates, params, mixed.mean)
    out = jax.tree.map(lambda o, u: o.astype(u.dtype), out, updates)
    return out, GossipState(state.count + 1, comm)

  return optax.GradientTransformationExtraArgs(init, update)


def _all_reduce_models(delta, theta, gamma, keep, alive, wire, axis_name):
  """Models mixed by the all-reduce, written so that equal anchors give DiLoCo exactly.

  `theta_i - mean(phi) = mean(delta) + (theta_i - mean(theta))`: the pseudo-gradients
  are averaged with `all_reduce_mean`'s own code, and the anchor term is computed
  around a shared reference (the max over workers), so it is exactly 0 when the
  anchors agree, as they do on the complete graph.
  """
  alive_b = jnp.ones((), bool) if alive is None else alive
  mean_delta, comm = _all_reduce(jax.tree.map(lambda d: d.astype(wire), delta), alive_b,
                                 float(tree_bytes(delta, wire)), axis_name)
  weight = alive_b.astype(jnp.float32)
  centred = jax.tree.map(lambda t: t.astype(jnp.float32) - jax.lax.pmax(
      t.astype(jnp.float32), axis_name), theta)
  mean_centred = worker_mean(centred, weight, axis_name)

  def one(d, mean_d, c, mean_c):
    return keep(_toward(d, mean_d, gamma) + gamma * (c - mean_c), _f32(d))

  out = jax.tree.map(one, delta, mean_delta, centred, mean_centred)
  return out, comm


def _toward(x, mean, gamma):
  """`x + gamma (mean - x)`, exactly `mean` at gamma 1 (the all-reduce)."""
  return mean if gamma == 1.0 else _f32(x) + gamma * (mean - _f32(x))
