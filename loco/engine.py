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

import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco import comm
from loco import axis
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
      none), or None for algorithms that sync the whole model (no `fragments`).
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
    anchor: [M, ...] float32 outer params (theta) each worker holds, or None without
      an outer chain. Identical across workers for all-reduce algorithms, distinct for
      gossip.
    outer_state: [M, ...] each worker's outer chain state (float32), one per fragment
      (a tuple) with `fragments`, or None.
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


def step_info(wire: comm.Wire, synced: jax.Array, **fields) -> StepInfo:
  """The StepInfo of a step from its worker-stacked `comm.Wire` ([M] leaves)."""
  return StepInfo(bytes_sent=wire.sent, bytes_received=wire.received, comms=wire.events,
                  synced=synced, kind=wire.kind, payload=wire.payload, peers=wire.peers,
                  **fields)


class Fragments(NamedTuple):
  """A sync schedule: the parameter fragments and the step of each one's sync.

  Attributes:
    leaf_fragment: the fragment of each leaf, in `jax.tree.leaves` order (0 .. F-1).
    offsets: fragment f syncs at the steps s >= 1 with `s % sync_every == offsets[f]`.
  """
  leaf_fragment: tuple[int, ...]
  offsets: tuple[int, ...]


class EagerState(NamedTuple):
  """Per-worker float32 buffers of eager updates (full trees; fragments are disjoint).

  Attributes:
    prev_mean: each fragment's last averaged pseudo-gradient (as received).
    prev_own: this worker's pseudo-gradient of each fragment's last sync.
    correction: `(1 - alpha) (anchor - theta_hat)` of the fragment in flight, added to
      the params when its average arrives.
  """
  prev_mean: PyTree
  prev_own: PyTree
  correction: PyTree


def check_schedule(offsets: Sequence[int], sync_every: int, overlap_steps: int) -> None:
  """Offsets are distinct steps of the round, and tau is below the fewest steps between
  two syncs, so that at most one fragment is in flight and its anchor cannot change
  before it arrives (the merge reads it there: no delivery buffer is needed)."""
  offsets = sorted(offsets)
  if len(set(offsets)) != len(offsets) or not 0 <= offsets[0] <= offsets[-1] < sync_every:
    raise ConfigError(f'fragment sync offsets {offsets} must be distinct steps in '
                      f'[0, sync_every={sync_every}).')
  gap = min(b - a for a, b in zip(offsets, offsets[1:] + [offsets[0] + sync_every]))
  if overlap_steps >= gap:
    raise ConfigError(f'algorithm.overlap_steps={overlap_steps} must be < {gap}, the '
                      f'fewest steps between two fragment syncs (sync_every={sync_every}, '
                      f'{len(offsets)} fragments), so that a fragment arrives before the '
                      'next one syncs.')


def _put(leaves: list, members: Sequence[int], values: Sequence[Any]) -> list:
  for i, v in zip(members, values):
    leaves[i] = v
  return leaves


def _view(treedef, members: Sequence[int], values: Sequence[Any]) -> PyTree:
  # The fragment as a tree of the full structure with None elsewhere: optax and the
  # compressors skip None, and path-based masks still see the model's own paths.
  return jax.tree.unflatten(treedef, _put([None] * treedef.num_leaves, members, values))


def _merge(params: jax.Array, target: jax.Array, alpha: float) -> jax.Array:
  if alpha == 0.0:       # exact: alpha 0 adopts the anchor, DiLoCo's reset
    return target.astype(params.dtype)
  return (alpha * params.astype(jnp.float32) + (1.0 - alpha) * target).astype(params.dtype)


def local_updates(
    inner: optax.GradientTransformation,
    outer: optax.GradientTransformation | tuple | None,
    sync_every: int,
    *,
    fragments: Callable[[PyTree], Fragments] | None = None,
    overlap_steps: int = 0,
    merge_alpha: float = 0.0,
    eager: bool = False,
    mesh: jax.sharding.Mesh | None = None,
) -> Algorithm:
  """The generic engine: inner steps every step, fragment syncs on a schedule, merges.

  Every step, each worker applies the `inner` chain to its own gradient. The params are
  cut into fragments (`fragments`; default: the whole model is one fragment, synced at
  steps H, 2H, ...). When fragment f syncs, each worker forms its pseudo-gradient
  `anchor_f - params_f`, the `outer` chain maps it to an update of the fragment's anchor
  (communication is a link of that chain; each fragment has its own outer state, so a
  fragment that does not sync keeps its momentum bitwise), `anchor_f <- anchor_f +
  update`, and `overlap_steps` (tau) steps later each worker merges
  `params_f <- alpha params_f + (1 - alpha) anchor_f` (alpha = `merge_alpha`). DiLoCo is
  one fragment, tau 0, alpha 0 (`params <- anchor`); Streaming DiLoCo is several
  fragments at staggered offsets. With `outer=None` there is no anchor: the inner
  chain is the whole algorithm (DDP puts its all-reduce there).

  The anchor and the outer state are float32 whatever the params' dtype (the papers'
  choice: the outer step accumulates small updates); params keep their dtype.

  The outer step runs under one `lax.cond` per fragment, outside the per-worker map, so
  a step without a sync costs only the inner step. `StepContext.sync` overrides the
  schedule (one fragment, tau 0 only): a bool scalar, or an [M] mask, where workers
  whose flag is False keep their state and send nothing.

  Args:
    inner: per-worker optax chain applied to each worker's gradient every step.
    outer: per-worker optax chain applied to pseudo-gradients at each sync; or a pair
      `(link, optimizer)`, the chain `chain(link, optimizer)` split where eager updates
      need it (the link communicates, the optimizer steps the anchor); or None.
    sync_every: H, inner steps between two syncs of a fragment (>= 1).
    fragments: `fragments(params) -> Fragments`, the sync schedule read from a (stacked
      or single) param tree; None: one fragment at offset 0.
    overlap_steps: tau, steps between a fragment's sync and the merge of its anchor;
      below the fewest steps between two syncs.
    merge_alpha: alpha in [0, 1], weight of the local params in the merge.
    eager: (arXiv 2502.12996) merge at the sync with a local estimate of the new anchor,
      the outer step on `Delta_m / M + (1/M) sum_{m' != m} Delta_m'^prev` (its own fresh
      pseudo-gradient for its share of the average, the others' from the fragment's
      previous average; zero before the first), and swap the estimate for the true
      anchor on arrival (`params += (1 - alpha) (anchor - theta_hat)`). Needs `outer` as
      `(link, optimizer)`; costs three float32 copies of the params per worker.
    mesh: a mesh with a "workers" axis to shard the worker axis over, or None (vmap on
      one device).

  Returns:
    An `Algorithm`. With `fragments` set, its `StepInfo` carries `fragment` (the
    fragment synced this step, -1 for none) and `overlap_steps` (tau on a sync step).

  References:
    DiLoCo, arXiv 2311.08105 (Algorithm 1); Streaming DiLoCo, arXiv 2501.18512;
    eager updates, arXiv 2502.12996.
  """
  if not isinstance(sync_every, int) or sync_every < 1:
    raise ConfigError(f'sync_every (H) must be an integer >= 1, got {sync_every!r}.')
  if (not isinstance(overlap_steps, (int, np.integer)) or isinstance(overlap_steps, bool)
      or overlap_steps < 0):
    raise ConfigError(f'algorithm.overlap_steps must be an integer >= 0, got {overlap_steps!r}.')
  if not 0.0 <= merge_alpha <= 1.0:
    raise ConfigError(f'algorithm.merge_alpha must be in [0, 1], got {merge_alpha!r}.')
  if not isinstance(eager, bool):
    raise ConfigError(f'algorithm.eager must be True or False, got {eager!r}.')
  split = isinstance(outer, tuple) and not isinstance(outer, optax.GradientTransformation)
  if eager and not split:
    raise ConfigError('eager updates need outer=(link, optimizer).')
  if outer is None and (fragments is not None or overlap_steps or merge_alpha):
    raise ConfigError('fragments, overlap_steps and merge_alpha need an outer chain.')
  tau, alpha = int(overlap_steps), float(merge_alpha)
  inner = optax.with_extra_args_support(inner)
  if split:
    link, optimizer = (optax.with_extra_args_support(t) for t in outer)
    outer = optax.chain(link, optimizer)
  if outer is not None:
    outer = optax.with_extra_args_support(outer)
  vmap = lambda f, in_axes: axis.vmap(f, in_axes=in_axes, mesh=mesh)

  def schedule_of(params: PyTree) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """The leaves of each fragment and the fragments' sync offsets, checked."""
    schedule = (Fragments((0,) * len(jax.tree.leaves(params)), (0,)) if fragments is None
                else fragments(params))
    check_schedule(schedule.offsets, sync_every, tau)
    return ([tuple(i for i, g in enumerate(schedule.leaf_fragment) if g == f)
             for f in range(len(schedule.offsets))], schedule.offsets)

  # One fragment's outer state stands alone (DiLoCo's state is its chain's state).
  wrap = tuple if fragments is not None else (lambda s: s[0])

  def init(params: PyTree, num_workers: int, key: jax.Array) -> LocoState:
    if num_workers < 1:
      raise ConfigError(f'num_workers must be >= 1, got {num_workers}.')
    stacked = axis.replicate(params, num_workers)
    inner_state = vmap(inner.init, 0)(stacked)
    anchor, outer_state, extra = None, None, ()
    if outer is not None:
      members, _ = schedule_of(params)
      # Its own float32 buffers (the state is donated): the outer step runs in float32.
      anchor = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), stacked)
      leaves, treedef = jax.tree.flatten(anchor)
      outer_state = vmap(lambda a: wrap([outer.init(_view(treedef, m, [a[i] for i in m]))
                                         for m in members]), 0)(leaves)
      if eager:
        extra = EagerState(*(jax.tree.map(jnp.zeros_like, anchor) for _ in range(3)))
    return LocoState(step=jnp.zeros((), jnp.int32), params=stacked,
                     inner_state=inner_state, anchor=anchor, outer_state=outer_state,
                     extra=extra, key=key)

  def arrive(params: list, source: list) -> list:
    if eager:     # swap the estimate for the true anchor: params += correction
      return [(p.astype(jnp.float32) + c).astype(p.dtype) for p, c in zip(params, source)]
    return [_merge(p, g, alpha) for p, g in zip(params, source)]

  def sync_fragment(members, treedef, num_workers, mixing, key, params, anchor, state,
                    buffers, active, alive, me):
    """One worker's sync of a fragment (lists of its leaves), inside the worker map."""
    view = lambda values: _view(treedef, members, values)
    context = comm.WorkerContext(active=active, alive=alive, mixing=mixing, key=key)
    delta = [a - p.astype(jnp.float32) for a, p in zip(anchor, params)]
    if eager:
      (link_state, opt_state), (prev_mean, prev_own, _) = state, buffers
      mean, link_state = link.update(view(delta), link_state, view(anchor), context=context)
      updates, new_opt_state = optimizer.update(mean, opt_state, view(anchor), context=context)
      new_state = (link_state, new_opt_state)
    else:
      updates, new_state = outer.update(view(delta), state, view(anchor), context=context)
    new_anchor = jax.tree.leaves(optax.apply_updates(view(anchor), updates))
    new_params, new_buffers = params, buffers
    if eager:
      # Own fresh share + the others' shares of the last average (arXiv 2502.12996).
      estimate = [pm + (d - po) / num_workers for pm, d, po in zip(prev_mean, delta, prev_own)]
      hat_updates, _ = optimizer.update(view(estimate), opt_state, view(anchor), context=context)
      theta_hat = jax.tree.leaves(optax.apply_updates(view(anchor), hat_updates))
      new_params = [_merge(p, h, alpha) for p, h in zip(params, theta_hat)]
      correction = [(1.0 - alpha) * (g - h) for g, h in zip(new_anchor, theta_hat)]
      mean = [m.astype(jnp.float32) for m in jax.tree.leaves(mean)]
      new_buffers = (mean, delta, correction)
    if tau == 0:     # the update arrives at the end of its own sync step
      new_params = arrive(new_params, new_buffers[2] if eager else new_anchor)
    new = (new_params, new_anchor, new_state, new_buffers)
    wire = comm.wire_bytes(new_state)
    if me is not None:   # the asynchronous replay: only this tick's pairs sync
      new = optax.tree.where(me, new, (params, anchor, state, buffers))
      wire = wire.where(me)
    return new, wire

  def step(state: LocoState, grads: PyTree,
           ctx: StepContext | None = None) -> tuple[LocoState, StepInfo]:
    num_workers = axis.num_workers_of(state.params)
    ctx = ctx or StepContext()
    active, alive = (jnp.ones((num_workers,), bool) if mask is None else jnp.asarray(mask, bool)
                     for mask in (ctx.active, ctx.alive))
    key, step_key = jax.random.split(state.key)
    step_key = step_key if ctx.key is None else ctx.key

    def inner_worker(params, inner_state, grads, active, alive):
      context = comm.WorkerContext(active=active, alive=alive, mixing=ctx.mixing, key=step_key)
      updates, new_inner = inner.update(grads, inner_state, params, context=context)
      # Inactive workers neither step nor communicate in the inner chain.
      return (optax.tree.where(active, optax.apply_updates(params, updates), params),
              optax.tree.where(active, new_inner, inner_state),
              comm.wire_bytes(new_inner).where(active))

    params, inner_state, wire = vmap(inner_worker, 0)(
        state.params, state.inner_state, grads, active, alive)
    s = state.step + 1
    new_state = state._replace(step=s, params=params, inner_state=inner_state, key=key)
    if outer is None:
      return new_state, step_info(wire, jnp.any(wire.events > 0))

    members, offsets = schedule_of(params)
    # slot[r]: the fragment that syncs at the steps s with s % H == r, or -1.
    slot = np.full((sync_every,), -1, np.int32)
    slot[list(offsets)] = np.arange(len(members), dtype=np.int32)
    slot = jnp.asarray(slot)
    sync_index = slot[s % sync_every]
    arrive_index = jnp.where(s > tau, slot[(s - tau) % sync_every], -1)
    if ctx.sync is not None:
      if len(members) > 1 or tau:
        raise ConfigError('StepContext.sync overrides the sync schedule of one fragment '
                          'without overlap; this algorithm follows its own fragment '
                          'schedule.')
      sync_index = jnp.where(jnp.any(ctx.sync), 0, -1)

    p_leaves, treedef = jax.tree.flatten(params)
    a_leaves = jax.tree.leaves(state.anchor)
    e_leaves = [jax.tree.leaves(b) for b in state.extra] if eager else []
    outer_states = list(state.outer_state) if fragments is not None else [state.outer_state]
    no_wire = axis.replicate(comm.no_wire(num_workers), num_workers)
    pick = lambda leaves, f: [leaves[i] for i in members[f]]
    for f in range(len(members)):
      do_sync = sync_index == f if ctx.sync is None else jnp.asarray(ctx.sync, bool)
      me = do_sync if do_sync.ndim else None     # a per-worker mask, inside the map
      fn = functools.partial(sync_fragment, members[f], treedef, num_workers, ctx.mixing,
                             step_key)
      operands = (pick(p_leaves, f), pick(a_leaves, f), outer_states[f],
                  tuple(pick(b, f) for b in e_leaves))
      # One cond outside the worker map: a step without this fragment's sync skips it
      # for every worker (a cond inside the map on an [M] mask would be a select).
      (new_p, new_a, outer_states[f], new_b), outer_wire = jax.lax.cond(
          jnp.any(do_sync),
          lambda ops: vmap(fn, (0, 0, 0, 0, 0, 0, None if me is None else 0))(
              *ops, active, alive, me),
          lambda ops: (ops, no_wire), operands)
      for leaves, values in zip([p_leaves, a_leaves, *e_leaves], [new_p, new_a, *new_b]):
        _put(leaves, members[f], values)
      wire = wire.merge(outer_wire)
      if tau:     # delivery, tau steps after the sync
        source = e_leaves[2] if eager else a_leaves
        _put(p_leaves, members[f], jax.lax.cond(arrive_index == f, arrive, lambda p, _: p,
                                                pick(p_leaves, f), pick(source, f)))
    unflatten = lambda leaves: jax.tree.unflatten(treedef, leaves)
    new_state = new_state._replace(
        params=unflatten(p_leaves), anchor=unflatten(a_leaves), outer_state=wrap(outer_states),
        extra=EagerState(*map(unflatten, e_leaves)) if eager else state.extra)
    synced = sync_index >= 0
    fields = {} if fragments is None else dict(
        fragment=sync_index, overlap_steps=jnp.where(synced, tau, 0).astype(jnp.int32))
    return new_state, step_info(wire, synced, **fields)

  return Algorithm(init=init, step=step)
