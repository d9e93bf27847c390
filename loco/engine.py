"""The algorithm engine: the Algorithm contract and the generic local-updates engine.

Every algorithm is an optax-style pure pair over worker-stacked pytrees (DESIGN §2):

  state = alg.init(params, num_workers, key)        # state.params is [M, ...]
  grads = jax.vmap(jax.grad(loss))(state.params, batch_M)
  state, info = alg.step(state, grads)               # optional StepContext

Chains run **per worker with a named axis**: the engine maps each worker's code with
`jax.vmap(..., axis_name=WORKERS)` (sharded over a mesh through `spmd_axis_name`), so an
optax transform sees one worker's tree, and only the communication transforms of
`loco.comm` look across workers, through named-axis collectives.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from loco import comm
from loco import workers
from loco.errors import ConfigError

PyTree = Any


class StepContext(NamedTuple):
  """What is special about one tick; None fields mean 'the algorithm's own default'.

  Attributes:
    active: [M] bool, workers that take an inner step this tick (the others keep their
      params and inner state).
    alive: [M] bool, workers that take part in communication this tick; absent workers
      are left out of averages and adopt what the others agreed on.
    mixing: [M, M] mixing matrix of this tick, overriding a gossip topology.
    sync: bool scalar, whether the outer step happens this tick (overrides the
      every-H-steps schedule), or [M] bool, which workers take an outer step this tick
      (the asynchronous replay: only the workers of this tick's exchanges).
    key: a PRNG key for this tick (random matchings, stochastic rounding).
  """
  active: jax.Array | None = None
  alive: jax.Array | None = None
  mixing: jax.Array | None = None
  sync: jax.Array | None = None
  key: jax.Array | None = None


class StepInfo(NamedTuple):
  """What one step put on the wire, per worker: the single record the network clock
  reads (DESIGN §5), so a run can be timed on any network from it alone.

  Attributes:
    bytes_sent: [M] float32, bytes each worker sent this step.
    bytes_received: [M] float32, bytes each worker received this step.
    comms: [M] int32, communication events each worker took part in this step.
    synced: bool scalar, whether the outer step ran this step.
    kind: [M] int32, each worker's collective this step (an index of `comm.KINDS`:
      none, all_reduce, all_gather, gossip).
    payload: [M] float32, bytes of one message (the all-reduced tree, the gathered
      message, or what crossed one gossip edge).
    peers: [M, M] bool, peers[i, j]: worker i exchanged with worker j this step (the
      edges used, or the other participants of a collective).
    fragment: int32 scalar, the parameter fragment whose sync started this step (-1:
      none), or None for algorithms that sync the whole model (loco.streaming).
    overlap_steps: int32 scalar, inner steps that the communication started this step
      may run behind before its result is needed (Streaming DiLoCo's tau), or None:
      the communication blocks the step.
  """
  bytes_sent: jax.Array
  bytes_received: jax.Array
  comms: jax.Array
  synced: jax.Array
  kind: jax.Array | None = None
  payload: jax.Array | None = None
  peers: jax.Array | None = None
  fragment: jax.Array | None = None
  overlap_steps: jax.Array | None = None


class LocoState(NamedTuple):
  """Training state; every field but `step` and `key` has a leading worker axis.

  Attributes:
    step: int32 scalar, inner steps taken so far.
    params: [M, ...] each worker's current params (phi); gradients are taken here.
    inner_state: [M, ...] each worker's inner optimizer state.
    anchor: [M, ...] outer params (theta) each worker holds, or None without an outer
      chain. Identical across workers for all-reduce algorithms, distinct for gossip.
    outer_state: [M, ...] each worker's outer chain state, or None.
    extra: algorithm-specific per-worker state (() when unused).
    key: PRNG key, shared by all workers, split every step.
  """
  step: jax.Array
  params: PyTree
  inner_state: PyTree
  anchor: PyTree | None
  outer_state: PyTree | None
  extra: PyTree
  key: jax.Array


class AsyncReplay(NamedTuple):
  """What the asynchronous replay (loco/schedule.py) needs to know of an algorithm whose
  rounds are pairwise exchanges in the outer chain (GASLoC, NoLoCo): the schedule is
  simulated before training, so it cannot be read from the steps' StepInfo.

  Attributes:
    sync_every: H, local steps between a worker's exchanges.
    peers: `peers(M)` -> [M, M] bool, who may exchange with whom.
    wire_dtype: the dtype models travel at ('float32', 'bfloat16', ...).
  """
  sync_every: int
  peers: Callable[[int], Any]
  wire_dtype: str = 'float32'


class Algorithm(NamedTuple):
  """An algorithm: `init(params, num_workers, key)` and `step(state, grads, ctx=None)`;
  `replay` is set by algorithms that `network.mode='async'` can drive."""
  init: Callable[..., LocoState]
  step: Callable[..., tuple[LocoState, StepInfo]]
  replay: AsyncReplay | None = None


def per_worker_context(ctx: StepContext | None, num_workers: int):
  """Splits a StepContext into per-worker (mapped) and shared (unmapped) parts."""
  ctx = ctx or StepContext()
  ones = jnp.ones((num_workers,), bool)
  active = ones if ctx.active is None else jnp.asarray(ctx.active, bool)
  alive = ones if ctx.alive is None else jnp.asarray(ctx.alive, bool)
  return active, alive, ctx.mixing, ctx.sync, ctx.key


def _where(pred: jax.Array, new: PyTree, old: PyTree) -> PyTree:
  # A per-worker mask under vmap: each worker keeps or replaces its own tree.
  return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def inner_step(inner: optax.GradientTransformationExtraArgs, params: PyTree,
               inner_state: PyTree, grads: PyTree, active: jax.Array,
               context: comm.WorkerContext):
  """One worker's inner step, inside the worker map; inactive workers keep everything.

  Returns:
    (params, inner_state, wire) of this worker (`comm.Wire`).
  """
  updates, new_inner = inner.update(grads, inner_state, params, context=context)
  new_params = optax.apply_updates(params, updates)
  # Inactive workers neither step nor communicate in the inner chain.
  params = _where(active, new_params, params)
  inner_state = _where(active, new_inner, inner_state)
  return params, inner_state, comm.wire_bytes(new_inner).where(active)


def step_info(wire: comm.Wire, synced: jax.Array, **fields) -> StepInfo:
  """The StepInfo of a step from its worker-stacked `comm.Wire` ([M] leaves)."""
  return StepInfo(bytes_sent=wire.sent, bytes_received=wire.received, comms=wire.events,
                  synced=synced, kind=wire.kind, payload=wire.payload, peers=wire.peers,
                  **fields)


def local_updates(
    inner: optax.GradientTransformation,
    outer: optax.GradientTransformation | None,
    sync_every: int,
    *,
    mesh: jax.sharding.Mesh | None = None,
) -> Algorithm:
  """The generic engine: inner steps every step, an outer step every `sync_every` steps.

  Every step, each worker applies the `inner` chain to its own gradient. Every
  `sync_every` (H) steps each worker forms its pseudo-gradient `anchor - params`, the
  `outer` chain maps it to an anchor update (communication is a link of that chain),
  `anchor <- anchor + update`, and `params <- anchor`. With `outer=None` there is no
  anchor: the inner chain is the whole algorithm (DDP puts its all-reduce there).

  Args:
    inner: per-worker optax chain applied to each worker's gradient every step.
    outer: per-worker optax chain applied to pseudo-gradients at each sync, or None.
    sync_every: H, inner steps between syncs (>= 1).
    mesh: a mesh with a "workers" axis to shard the worker axis over, or None (vmap on
      one device).

  Returns:
    An `Algorithm`.

  References:
    DiLoCo, arXiv 2311.08105 (Algorithm 1).
  """
  if not isinstance(sync_every, int) or sync_every < 1:
    raise ConfigError(f'sync_every (H) must be an integer >= 1, got {sync_every!r}.')
  inner = optax.with_extra_args_support(inner)
  if outer is not None:
    outer = optax.with_extra_args_support(outer)
  vmap = lambda f, in_axes: workers.vmap(f, in_axes=in_axes, mesh=mesh)

  def init(params: PyTree, num_workers: int, key: jax.Array) -> LocoState:
    if num_workers < 1:
      raise ConfigError(f'num_workers must be >= 1, got {num_workers}.')
    stacked = workers.replicate(params, num_workers)
    inner_state = vmap(inner.init, 0)(stacked)
    anchor = outer_state = None
    if outer is not None:
      anchor = jax.tree.map(jnp.copy, stacked)   # its own buffers: the state is donated
      outer_state = vmap(outer.init, 0)(stacked)
    return LocoState(step=jnp.zeros((), jnp.int32), params=stacked,
                     inner_state=inner_state, anchor=anchor,
                     outer_state=outer_state, extra=(), key=key)

  def worker_step(params, inner_state, anchor, outer_state, grads, active, alive,
                  mixing, do_sync, key):
    context = comm.WorkerContext(active=active, alive=alive, mixing=mixing, key=key)
    params, inner_state, wire = inner_step(inner, params, inner_state, grads, active,
                                           context)
    if outer is None:
      return params, inner_state, anchor, outer_state, wire

    def sync(params, anchor, outer_state):
      delta = jax.tree.map(jnp.subtract, anchor, params)
      updates, outer_state = outer.update(delta, outer_state, anchor, context=context)
      anchor = optax.apply_updates(anchor, updates)
      return anchor, anchor, outer_state, comm.wire_bytes(outer_state)

    def no_sync(params, anchor, outer_state):
      return params, anchor, outer_state, comm.no_wire()

    params, anchor, outer_state, outer_wire = jax.lax.cond(
        do_sync, sync, no_sync, params, anchor, outer_state)
    return params, inner_state, anchor, outer_state, wire.merge(outer_wire)

  def step(state: LocoState, grads: PyTree,
           ctx: StepContext | None = None) -> tuple[LocoState, StepInfo]:
    num_workers = workers.num_workers_of(state.params)
    active, alive, mixing, sync, ctx_key = per_worker_context(ctx, num_workers)
    key, step_key = jax.random.split(state.key)
    if ctx_key is not None:
      step_key = ctx_key
    do_sync = (state.step + 1) % sync_every == 0 if sync is None else sync
    do_sync = jnp.asarray(do_sync, bool)
    # A per-worker sync mask is mapped (the cond becomes a select); a shared one keeps
    # the cond, so the outer step costs nothing between syncs.
    sync_axis = 0 if do_sync.ndim else None
    outs = vmap(worker_step, (0, 0, 0, 0, 0, 0, 0, None, sync_axis, None))(
        state.params, state.inner_state, state.anchor, state.outer_state, grads,
        active, alive, mixing, do_sync, step_key)
    params, inner_state, anchor, outer_state, wire = outs
    new_state = state._replace(step=state.step + 1, params=params,
                               inner_state=inner_state, anchor=anchor,
                               outer_state=outer_state, key=key)
    synced = jnp.any(do_sync) if outer is not None else jnp.any(wire.events > 0)
    return new_state, step_info(wire, synced)

  return Algorithm(init=init, step=step)
