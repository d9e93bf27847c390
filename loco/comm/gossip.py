"""Gossip: each worker mixes with its graph neighbours, `x_i <- sum_j W_ij x_j`.

Everything here runs per worker inside the engine's map over the "workers" axis
(`jax.vmap(..., axis_name="workers")`, a vmap with `spmd_axis_name` over a mesh, or
`jax.shard_map`); workers meet only through named-axis collectives, so one function
serves all placements. The graphs, plans and random families are `loco.comm.topology`'s.

One pure mixing step, `mixing_step`: `x_i <- x_i - step (x_i - sum_j W_ij x_j)`, in
three implementations, equal to float tolerance:
  mean    the complete graph with uniform weights (`topology.is_all_reduce`) is the
          all-reduce of the alive workers, the code of `all_reduce_mean`. 'auto'
          picks it; 'dense' or 'sparse' model a peer-to-peer exchange with all M - 1.
  sparse  the topology's static `GossipPlan`s, one `lax.ppermute` per permutation; a
          random family (`Topology.is_random`) picks this round's member with
          `lax.switch` on an index drawn from the tick's shared key.
  dense   a per-tick mixing matrix (`WorkerContext.mixing`, the asynchronous replay)
          or impl='dense'. Pairwise exchanges (each row of W has at most one
          off-diagonal entry) gather only the partner's tree, which XLA turns into one
          O(M P) gather under vmap (scripts/bench_gossip.py --partner); any other W
          contracts this worker's row with all the trees, O(M^2 P) under vmap.
Sparse and dense are written in Laplacian form, `x_i - sum_j W_ij (x_i - x_j)`: a dead
link drops out, and equal neighbours leave x exactly unchanged.

`gossip` is the optax transform: three small adapters choose what is mixed (the
local models, the pseudo-gradients, or the params; see its docstring).

Dead workers (`WorkerContext.alive` False) neither send nor mix: every edge with a dead
end is dropped for the tick and its weight goes back to both ends' diagonals, so W
stays doubly stochastic on the alive workers (their mean is kept) and a dead worker
keeps its value. On the 'mean' path the alive workers average among themselves.

Bytes (DESIGN §5): S = the tree's bytes at the transport dtype; per edge used this
tick a worker sends S and receives S (`Wire.peers` are those edges, `payload` S);
the 'mean' path counts the ring all-reduce, 2 (m - 1) / m S. Values are rounded to
the transport dtype before they leave a worker; a worker's own value is never rounded
(except on the 'mean' path, as in `all_reduce_mean`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco.comm import topology as topology_lib
from loco.comm.core import (GOSSIP, NO_COMM, WORKERS, Wire, WorkerContext, alive_of,
                            empty_wire, ring_all_reduce_state, static_num_workers,
                            transport_dtype, tree_bytes, worker_mean)
from loco.errors import ConfigError
from loco.comm import axis as comm_axis

PyTree = Any

MIXES = ('models', 'deltas', 'params')
IMPLS = ('auto', 'dense', 'sparse')
# Folded into the tick's key so the member draw is independent of other users of it.
_KEY_SALT = 0x60551


class GossipState(NamedTuple):
  """State of the `gossip` transform."""
  count: jax.Array          # int32: applications so far (seeds the draw without a key)
  comm: Wire                # what the last application put on the wire
  # With `stale=True`: the value this worker last sent, at the transport dtype (what
  # its partners merge in the overlapped asynchronous replay); () otherwise.
  snapshot: PyTree = ()


def keep_snapshots(old: PyTree, new: PyTree) -> PyTree:
  """`old` (a chain state) with the `GossipState.snapshot`s of `new`, nothing else:
  a 'send' tick stores what is sent and moves no other state."""
  is_gossip = lambda x: isinstance(x, GossipState)
  return jax.tree.map(lambda o, n: o._replace(snapshot=n.snapshot) if is_gossip(o) else o,
                      old, new, is_leaf=is_gossip)


class Mixed(NamedTuple):
  """One mixing step of a tree, in float32: `new = x + moved`, each computed directly."""
  new: PyTree
  moved: PyTree


def round_key(context: WorkerContext | None, seed: int, count: jax.Array) -> jax.Array:
  """This round's key for drawing a family member: the tick's shared key, else a counter."""
  if context is not None and context.key is not None:
    return jax.random.fold_in(context.key, _KEY_SALT)
  return jax.random.fold_in(jax.random.key(seed), count)


# ---------------------------------------------------------------------------
# The mixing step.


def _f32(tree: PyTree) -> PyTree:
  return optax.tree.cast(tree, jnp.float32)


def _gossip_state(sent, received, peers, size) -> Wire:
  events = sent + received > 0
  return Wire(sent, received, events.astype(jnp.int32),
              jnp.where(events, GOSSIP, NO_COMM).astype(jnp.int32),
              jnp.where(events, jnp.float32(size), 0.0), peers)


def _sparse_residual(x32, sent_x, plan, i, alive_all, size, axis_name):
  """One static plan: a ppermute per permutation, edge-wise differences."""
  residual = optax.tree.zeros_like(x32)
  sent = received = jnp.zeros((), jnp.float32)
  peers = jnp.zeros((plan.num_workers,), bool)
  for k, perm in enumerate(plan.perms):
    src_i = jnp.asarray(plan.sources[k])[i]
    dst_i = jnp.asarray([d for _, d in perm])[i]     # perm is sorted by source
    ok_in = (src_i != i) & alive_all[i] & alive_all[src_i]
    ok_out = (dst_i != i) & alive_all[i] & alive_all[dst_i]
    w = jnp.where(ok_in, jnp.asarray(plan.recv_weight[k], jnp.float32)[i], 0.0)
    recv = comm_axis.ppermute(sent_x, axis_name, perm)
    residual = jax.tree.map(lambda r, x, y, w=w: r + w * (x - y.astype(jnp.float32)),
                            residual, x32, recv)
    received = received + ok_in * jnp.float32(size)
    sent = sent + ok_out * jnp.float32(size)
    peers = peers.at[src_i].max(ok_in).at[dst_i].max(ok_out)
  return residual, _gossip_state(sent, received, peers, size)


def _dense_residual(x32, sent_x, w, i, alive_all, size, axis_name, partners=None):
  """This worker's row of W against the gathered trees (only the partner's if pairwise).

  With `partners` (this worker's snapshot), the other workers' snapshots are gathered
  instead of their current values, and each merge counts one exchange both ways (S
  sent, S received per partner): W's rows are the merging workers' alone.
  """
  m = w.shape[0]
  ok = (jnp.arange(m) != i) & alive_all & alive_all[i]
  w_in = jnp.where(ok, w[i], 0.0).astype(jnp.float32)
  w_out = w_in if partners is not None else jnp.where(ok, w[:, i], 0.0).astype(jnp.float32)
  gathered = comm_axis.all_gather(sent_x if partners is None else partners, axis_name)
  # W is shared by all workers, so this is one branch for all (a real cond under vmap).
  pairwise = jnp.all(jnp.sum((w != 0) & ~jnp.eye(m, dtype=bool), axis=1) <= 1)

  def partner(_):
    p = jnp.argmax(w_in > 0)
    return jax.tree.map(lambda x, g: w_in[p] * (x - g[p].astype(jnp.float32)), x32, gathered)

  def every_row(_):   # a scan over the senders keeps the memory O(P) per worker
    def add(residual, w_g):
      w_j, g_j = w_g
      return jax.tree.map(lambda r, x, g: r + w_j * (x - g.astype(jnp.float32)),
                          residual, x32, g_j), None
    return jax.lax.scan(add, optax.tree.zeros_like(x32), (w_in, gathered))[0]

  residual = jax.lax.cond(pairwise, partner, every_row, None)
  return residual, _gossip_state(jnp.sum(w_in > 0) * jnp.float32(size),
                                 jnp.sum(w_out > 0) * jnp.float32(size),
                                 (w_in > 0) | (w_out > 0), size)


def _path(topo: topology_lib.Topology, impl: str, context: WorkerContext | None) -> str:
  if context is not None and context.mixing is not None:
    return 'dense'
  if impl == 'auto':
    return 'mean' if topology_lib.is_all_reduce(topo) else 'sparse'
  return impl


def _is_one(step) -> bool:
  """Whether the gossip step is exactly 1 (a traced run knob is not known to be)."""
  return not isinstance(step, jax.core.Tracer) and step == 1.0


def mixing_step(x: PyTree, topo: topology_lib.Topology, *, step: float = 1.0,
                context: WorkerContext | None = None, key: jax.Array | None = None,
                dtype: str = 'float32', impl: str = 'auto',
                axis_name: str = WORKERS,
                partners: PyTree | None = None) -> tuple[Mixed, Wire]:
  """One gossip step on this worker's tree: `x_i - step (x_i - sum_j W_ij x_j)`.

  Args:
    x: this worker's tree.
    topo: a resolved `Topology` of the worker-axis size (`topology.resolve_topology`).
    step: the gossip step size in (0, 1].
    context: this tick's `WorkerContext` (alive mask, per-tick mixing matrix).
    key: the round's key for a random family (`round_key`); required for one.
    dtype: transport dtype of what neighbours receive.
    impl: 'auto', 'dense' or 'sparse' (see the module docstring).
    axis_name: the worker axis name.
    partners: this worker's snapshot (what it sent): x_j is then read from the other
      workers' snapshots, not their current trees (the overlapped asynchronous replay;
      the tick's `mixing` is required).

  Returns:
    (the `Mixed` tree in float32, the `Wire` of this step).
  """
  wire = _check(impl, dtype)
  if topo.num_workers != _axis_size(axis_name):
    raise ConfigError(f'the topology has {topo.num_workers} workers but the worker axis '
                      f'has {_axis_size(axis_name)}.')
  alive = alive_of(context)
  x32, sent_x = _f32(x), optax.tree.cast(x, wire)
  size = float(tree_bytes(x, wire))
  path = _path(topo, impl, context)
  if partners is not None and path != 'dense':
    raise ValueError('gossip from snapshots needs the tick\'s mixing matrix (the dense path).')
  if path == 'mean':
    mean = worker_mean(sent_x, alive.astype(jnp.float32), axis_name)
    # Exactly the mean at step 1 (the all-reduce).
    toward = mean if _is_one(step) else optax.tree.add_scale(x32, step, optax.tree.sub(mean, x32))
    new = optax.tree.where(alive, toward, x32)
    moved = optax.tree.where(alive, optax.tree.scale(step, optax.tree.sub(mean, x32)),
                             optax.tree.zeros_like(x32))
    return Mixed(new, moved), ring_all_reduce_state(alive, size, axis_name,
                                                    absent_receive=False)
  i = comm_axis.axis_index(axis_name)
  alive_all = comm_axis.all_gather(alive, axis_name)
  choice = topo.sample_choice_jax(key) if topo.is_random else 0
  if path == 'dense':
    w = (context.mixing if context is not None and context.mixing is not None
         else jnp.asarray(topo.member_weights, jnp.float32)[choice])
    residual, comm = _dense_residual(x32, sent_x, jnp.asarray(w, jnp.float32), i,
                                     alive_all, size, axis_name, partners)
  else:
    branches = [functools.partial(_sparse_residual, plan=plan, i=i, alive_all=alive_all,
                                  size=size, axis_name=axis_name) for plan in topo.plans]
    residual, comm = jax.lax.switch(choice, branches, x32, sent_x)
  moved = optax.tree.scale(-step, residual)
  return Mixed(optax.tree.add(x32, moved), moved), comm


def _check(impl: str, dtype: str):
  if impl not in IMPLS:
    raise ConfigError(f'gossip impl must be one of {", ".join(IMPLS)}, got {impl!r}.')
  return transport_dtype(dtype)


def _axis_size(axis_name: str) -> int:
  m = static_num_workers(axis_name)
  if m is None:
    raise ValueError(f'gossip runs per worker: call it inside jax.vmap(..., axis_name='
                     f'{axis_name!r}) or a shard_map over a {axis_name!r} mesh axis.')
  return m


def _models_by_all_reduce(delta, theta, mix_deltas, alive, step, axis_name):
  """'models' on the all-reduce path: (`theta_i - z_i`, Wire), z the mixed models."""
  # theta_i - mean(phi) = mean(delta) + (theta_i - mean(theta)) (at step 1; a smaller
  # step scales the difference from delta_i alike): the deltas go through
  # all_reduce_mean's code, and the anchor term is reduced centred on the max over
  # workers, so that it is exactly 0 for equal anchors (models averaged from equal
  # anchors equal the all-reduce of the pseudo-gradients bit for bit, as DiLoCo's).
  # The bytes are those of one all-reduce of the tree: a real implementation would
  # all-reduce the models; the pmax and the anchor reduction are not counted.
  mixed, comm = mix_deltas(delta)
  theta32 = _f32(theta)
  centred = optax.tree.sub(theta32, comm_axis.pmax(theta32, axis_name))
  mean_centred = worker_mean(centred, alive.astype(jnp.float32), axis_name)
  anchor_term = optax.tree.scale(step, optax.tree.sub(centred, mean_centred))
  out = optax.tree.add(mixed.new, optax.tree.where(alive, anchor_term,
                                                   optax.tree.zeros_like(anchor_term)))
  return out, comm


# ---------------------------------------------------------------------------
# The optax transform: what is mixed, around one mixing step.


def gossip(topology: str | topology_lib.Topology, mix: str = 'models', *,
           step_size: float = 1.0, dtype: str = 'float32', impl: str = 'auto',
           weights: str = 'metropolis', seed: int = 0, pairwise: bool = False,
           stale: bool = False,
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
    topology: a name from `loco.comm.topology.TOPOLOGIES` ('complete', 'ring', 'torus',
      'exponential', 'hypercube', 'erdos_renyi', 'matching') or a `Topology`.
    mix: 'models', 'deltas' or 'params'.
    step_size: gossip step gamma (1: plain gossip; < 1 damps it).
    dtype: transport dtype ('float32', 'bfloat16', 'float16').
    impl: 'auto' (all-reduce on the complete uniform graph, else sparse), 'dense'
      or 'sparse'.
    weights: 'metropolis' or 'uniform' mixing weights for a named topology.
    seed: seed of an 'erdos_renyi' graph and of the member draws when the tick
      carries no key.
    pairwise: use one random matching of the graph per round
      (`topology.pairwise_family`).
    stale: keep a snapshot of what this worker sends (`GossipState.snapshot`), for the
      overlapped asynchronous replay: a tick whose context says `snapshot='send'`
      stores the mixed value, one that says 'merge' mixes this worker's current value
      with its partners' snapshots (their models as they were when sent).
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
  traced = isinstance(step_size, jax.core.Tracer)    # a run knob (loco.run.run_axis)
  if not traced and not 0.0 < step_size <= 1.0:
    raise ConfigError(f'algorithm.gossip_step must be in (0, 1], got {step_size}.')
  wire = _check(impl, dtype)
  topology_lib.check_spec(topology, weights)
  gamma = step_size if traced else float(step_size)

  def resolve() -> topology_lib.Topology:
    return topology_lib.resolve_topology(topology, _axis_size(axis_name), weights=weights,
                                         seed=seed, pairwise=pairwise)

  def init(params):
    if static_num_workers(axis_name) is not None:
      resolve()            # a topology that does not fit M fails at init
    snapshot = optax.tree.cast(optax.tree.zeros_like(params), wire) if stale else ()
    return GossipState(jnp.zeros((), jnp.int32), empty_wire(axis_name),
                       snapshot)

  def value(updates, params):
    """What this worker mixes (and sends)."""
    if mix == 'deltas':
      return updates
    if mix == 'params':
      return params
    return optax.tree.sub(_f32(params), _f32(updates))

  def update(updates, state, params=None, *, context: WorkerContext | None = None, **extra):
    del extra
    topo = resolve()
    if mix != 'deltas' and params is None:
      raise ValueError(f"gossip(mix={mix!r}) needs params (the anchor or the model).")
    phase = None if context is None else context.snapshot
    if phase is not None and not stale:
      raise ValueError('the overlapped asynchronous replay needs gossip(..., stale=True).')
    if phase == 'send':
      return updates, state._replace(snapshot=optax.tree.cast(value(updates, params), wire))
    key = round_key(context, seed, state.count) if topo.is_random else None
    mix_step = functools.partial(mixing_step, topo=topo, step=gamma, context=context,
                                 key=key, dtype=dtype, impl=impl, axis_name=axis_name,
                                 partners=state.snapshot if phase == 'merge' else None)
    if mix == 'deltas':
      mixed, comm = mix_step(updates)
      out = mixed.new
    elif mix == 'params':
      mixed, comm = mix_step(params)
      out = optax.tree.add(_f32(updates), mixed.moved)
    elif _path(topo, impl, context) == 'mean':
      out, comm = _models_by_all_reduce(updates, params, mix_step, alive_of(context), gamma,
                                        axis_name)
    else:   # theta - (phi + moved) = delta - moved
      mixed, comm = mix_step(optax.tree.sub(_f32(params), _f32(updates)))
      out = optax.tree.sub(_f32(updates), mixed.moved)
    return optax.tree.cast_like(out, updates), GossipState(state.count + 1, comm,
                                                           state.snapshot)

  return optax.GradientTransformationExtraArgs(init, update)
