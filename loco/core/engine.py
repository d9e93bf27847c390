"""The algorithm engine: the Algorithm contract and the generic local-updates engine.

Every algorithm is an optax-style pure pair over worker-stacked pytrees (DESIGN §2):

  state = alg.init(params, num_workers, key)        # state.params is [M, ...]
  grads = jax.vmap(jax.grad(loss))(state.params, batch_M)
  state, info = alg.step(state, grads)               # optional StepContext

Chains run **per worker with a named axis**: the engine maps each worker's code with
`jax.vmap(..., axis_name=WORKERS)` (sharded over a mesh through `spmd_axis_name`), so an
optax transform sees one worker's tree, and only the communication transforms of
`loco.comm` look across workers, through named-axis collectives.

`local_updates` reads three policies as values: a `loco.core.sync_plan.SyncPlan` (which
fragments of the params sync at which step), a `loco.core.merge.Merge` (how a fragment's
outer step reaches the params, and when) and, per tick, a
`loco.core.participation.Participation` (who takes part in a sync, and how); it has no
algorithm-specific branches.
"""

import contextlib
import contextvars
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco import comm
from loco.core import merge as merge_lib
from loco.core import participation as participation_lib
from loco.core import sync_plan
from loco.comm import axis
from loco import wire as wire_lib
from loco.comm import drift as drift_lib
from loco.errors import ConfigError
from loco.wire import Wire

PyTree = Any


class StepContext(NamedTuple):
  """What is special about one tick; None fields mean 'the algorithm's own default'.

  Attributes:
    active: [M] bool, workers that take an inner step this tick (the others keep their
      params and inner state).
    alive: [M] bool, workers that take part in communication this tick; absent workers
      are left out of averages and adopt what the others agreed on.
    mixing: [M, M] mixing matrix of this tick, overriding a gossip topology.
    key: a PRNG key for this tick (random matchings, stochastic rounding).
    participation: a `loco.core.participation.Participation`: who takes part in this tick's
      sync and how beyond `alive` (the sync override, keep-local and offline dropout,
      rejoining, the overlapped asynchronous replay's snapshots), or None: every worker.
  """
  active: jax.Array | None = None
  alive: jax.Array | None = None
  mixing: jax.Array | None = None
  key: jax.Array | None = None
  participation: participation_lib.Participation | None = None


class StepInfo(NamedTuple):
  """The step's record: what it put on the wire, per worker, the single record the
  network clock reads (DESIGN §5), so a run can be timed on any network from it alone.

  Attributes:
    wire: a `loco.wire.Wire` with [M] leaves (peers [M, M]: peers[i, j], worker i
      exchanged with worker j): the merge of every transform's wire of the step. With
      a fragmented sync plan the engine fills `fragment` (the fragment whose sync
      started this step, -1 for none) and `overlap` (tau on a sync step, else 0);
      both None otherwise.
    synced: bool scalar, whether the outer step ran this step.
    drift: a `loco.comm.drift.Drift` of [M] leaves (the same value on every worker): the
      drift diagnostics of this step's sync, measured over the worker axis on the
      fragment that synced (zeros on a step without a sync); None for an algorithm
      without an outer chain (no rounds) or one built with `diagnostics(False)`.
  """
  wire: Wire
  synced: jax.Array
  drift: drift_lib.Drift | None = None


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
    extra: the merge policy's per-worker state (`merge.Merge.init`; () for none).
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
  """What the asynchronous replay (loco/sim/schedule.py) needs to know of an algorithm whose
  rounds are pairwise exchanges in the outer chain (GASLoC, NoLoCo): the schedule is
  simulated before training, so it cannot be read from the steps' StepInfo.

  Attributes:
    sync_every: H, local steps between a worker's exchanges.
    peers: `peers(M)` -> [M, M] bool, who may exchange with whom.
    wire_dtype: the dtype models travel at ('float32', 'bfloat16', ...).
    exchange_bytes: `exchange_bytes(params, M)` -> bytes one worker sends in one exchange,
      measured from the algorithm's own outer chain (`pair_exchange_bytes`), or None:
      the params at `wire_dtype`.
    overlapped: `overlapped()` -> the same algorithm with gossip snapshots
      (`comm.gossip(stale=True)`), which the overlapped replay needs, or None.
    snapshots: whether this algorithm keeps those snapshots (`Participation.send` works).
  """
  sync_every: int
  peers: Callable[[int], Any]
  wire_dtype: str = 'float32'
  exchange_bytes: Callable[[Any], float] | None = None
  overlapped: Callable[[], 'Algorithm'] | None = None
  snapshots: bool = False


def pair_exchange_bytes(outer: optax.GradientTransformation, params: PyTree,
                        num_workers: int) -> float:
  """Bytes one worker sends in one pairwise exchange of the outer chain `outer`.

  A concrete evaluation of the chain on zeros of the params' shapes (float32, as the
  engine's anchor) for M workers of which the first two exchange: what the chain's
  communication transforms report (`wire.collect`) is what the engine's StepInfo
  reports for that exchange, compression and transport dtype included.

  Args:
    outer: the outer chain (an optax transformation with extra arg `context`).
    params: one model's params, or their `jax.ShapeDtypeStruct`s.
    num_workers: M (the chain's topology must fit it).

  Returns:
    Bytes sent by one worker in one exchange.
  """
  outer = optax.with_extra_args_support(outer)
  zeros = jax.tree.map(lambda x: jnp.zeros((num_workers, *x.shape), jnp.float32), params)
  pair = jnp.eye(num_workers, dtype=jnp.float32).at[:2, :2].set(0.5)

  def worker(anchor):
    context = comm.WorkerContext(mixing=pair)
    _, state = outer.update(anchor, outer.init(anchor), anchor, context=context)
    return wire_lib.collect(state, num_workers).sent

  return float(jax.jit(jax.vmap(worker, axis_name=axis.WORKERS))(zeros)[0])


class Algorithm(NamedTuple):
  """An algorithm: `init(params, num_workers, key)` and `step(state, grads, ctx=None)`.

  Attributes:
    init: `init(params, num_workers, key) -> LocoState`.
    step: `step(state, grads, ctx=None) -> (state, StepInfo)`.
    replay: set by algorithms that `network.mode='async'` can drive.
    round_steps: inner steps per round, the algorithm's own declaration (H for the
      local-update algorithms, 1 for per-step ones): dropout draws absent workers per
      round, and local steps count within it.
    keeps_local: whether a sync can leave absent workers with their own state
      (`Participation.keep`): False for merges that reach the params tau > 0 steps after
      the sync (the delivery does not know who was absent).
    local_steps: per-worker H_i when fixed (`with_local_steps`), for the clock; None:
      every worker steps throughout its round.
  """
  init: Callable[..., LocoState]
  step: Callable[..., tuple[LocoState, StepInfo]]
  replay: AsyncReplay | None = None
  round_steps: int = 1
  keeps_local: bool = True
  local_steps: tuple[int, ...] | None = None


_DIAGNOSTICS = contextvars.ContextVar('loco_diagnostics', default=True)


@contextlib.contextmanager
def diagnostics(enabled: bool):
  """Whether the algorithms built inside this block measure drift at their syncs
  (`StepInfo.drift`; `local_updates`' `diagnostics=None` reads it; on by default).

  Off, the compiled program holds only the algorithm's own collectives: on a mesh the
  diagnostics are all-reduces over the worker axis that a deployment would not run
  (`metrics.diagnostics` in a config; the tests that count a program's collectives).
  """
  token = _DIAGNOSTICS.set(bool(enabled))
  try:
    yield
  finally:
    _DIAGNOSTICS.reset(token)


def _put(leaves: list, members: Sequence[int], values: Sequence[Any]) -> list:
  for i, v in zip(members, values):
    leaves[i] = v
  return leaves


def _view(treedef, members: Sequence[int], values: Sequence[Any]) -> PyTree:
  # The fragment as a tree of the full structure with None elsewhere: optax and the
  # compressors skip None, and path-based masks still see the model's own paths.
  return jax.tree.unflatten(treedef, _put([None] * treedef.num_leaves, members, values))


def local_updates(
    inner: optax.GradientTransformation,
    outer: optax.GradientTransformation | tuple | None,
    plan: int | sync_plan.SyncPlan,
    *,
    merge: merge_lib.Merge | None = None,
    shared_anchor: bool = True,
    mesh: jax.sharding.Mesh | None = None,
    diagnostics: bool | None = None,
) -> Algorithm:
  """The generic engine: inner steps every step, fragment syncs on a plan, merges.

  Every step, each worker applies the `inner` chain to its own gradient. When a fragment
  of the params syncs (`plan`), each worker forms its pseudo-gradient `anchor - params`
  of the fragment and the `merge` policy runs the `outer` chain on it (communication is
  a link of that chain; each fragment has its own outer state, so a fragment that does
  not sync keeps its momentum bitwise), then brings the new anchor to the params, at
  once or tau steps later. DiLoCo is `plan=H` with the default merge, `params <-
  anchor`; Streaming DiLoCo is `sync_plan.streaming(...)` with `merge.delayed(tau,
  alpha)` or `merge.eager(tau, alpha)`. With `outer=None` there is no anchor: the
  inner chain is the whole algorithm (DDP puts its all-reduce there).

  The anchor and the outer state are float32 whatever the params' dtype (the papers'
  choice: the outer step accumulates small updates). Each fragment's sync runs under one
  `lax.cond` outside the per-worker map, so a step without a sync costs only the inner
  step; inside it, before the outer step, the engine measures the sync's drift over the
  workers taking part (`StepInfo.drift`). Who takes part and how is the tick's
  `Participation` (`loco.core.participation`), applied around each fragment's sync.

  Args:
    inner: per-worker optax chain applied to each worker's gradient every step.
    outer: per-worker optax chain applied to pseudo-gradients at each sync; or a pair
      `(link, optimizer)`, that chain split where a merge policy reads the average
      (`merge.eager`); or None.
    plan: H, inner steps between two syncs of the whole model, or a `SyncPlan`.
    merge: a `merge.Merge` policy; None: `merge.delayed(0, 0.0)`, `params <- anchor`.
    shared_anchor: whether the workers' anchors are one value (the all-reduce family),
      which a worker rejoining after offline dropout copies (`Participation.rejoin`);
      False for gossip, whose anchors are each worker's own.
    mesh: a mesh with a "workers" axis to shard the worker axis over, or None (vmap on
      one device).
    diagnostics: whether syncs measure drift (`StepInfo.drift`); None: as the enclosing
      `diagnostics(...)` block says (on by default).

  Returns:
    An `Algorithm` (`round_steps` H). With a fragmented plan, its `StepInfo.wire` carries
    `fragment` (the fragment synced this step, -1 for none) and `overlap` (tau on a sync
    step), [M] like its other leaves.

  References:
    DiLoCo, arXiv 2311.08105 (Algorithm 1); Streaming DiLoCo, arXiv 2501.18512.
  """
  plan = plan if isinstance(plan, sync_plan.SyncPlan) else sync_plan.every(plan)
  if outer is None and (plan.fragments is not None or merge is not None):
    raise ConfigError('a fragmented sync plan or a merge policy needs an outer chain.')
  merge = merge_lib.delayed() if merge is None else merge
  measure = outer is not None and (_DIAGNOSTICS.get() if diagnostics is None else diagnostics)
  split = isinstance(outer, tuple) and not isinstance(outer, optax.GradientTransformation)
  if merge.needs_link and not split:
    raise ConfigError('this merge policy (eager updates) needs outer=(link, optimizer).')
  inner = optax.with_extra_args_support(inner)
  if outer is not None:
    outer = merge_lib.Outer(*(optax.with_extra_args_support(t) if t is not None else None
                              for t in (outer if split else (None, outer))))
  vmap = lambda f, in_axes: axis.vmap(f, in_axes=in_axes, mesh=mesh)
  fragmented = plan.fragments is not None
  # One fragment's outer state stands alone (DiLoCo's state is its chain's state).
  wrap = tuple if fragmented else (lambda s: s[0])

  init = functools.partial(_init_state, inner, outer, plan, merge, vmap, wrap)

  def step(state: LocoState, grads: PyTree,
           ctx: StepContext | None = None) -> tuple[LocoState, StepInfo]:
    num_workers = axis.num_workers_of(state.params)
    ctx = ctx or StepContext()
    active, alive = (jnp.ones((num_workers,), bool) if mask is None else jnp.asarray(mask, bool)
                     for mask in (ctx.active, ctx.alive))
    key, step_key = jax.random.split(state.key)
    step_key = step_key if ctx.key is None else ctx.key

    inner_worker = functools.partial(_inner_step, inner, num_workers, ctx.mixing, step_key)
    params, inner_state, wire = vmap(inner_worker, 0)(
        state.params, state.inner_state, grads, active, alive)
    s = state.step + 1
    new_state = state._replace(step=s, params=params, inner_state=inner_state, key=key)
    if outer is None:
      return new_state, StepInfo(wire, jnp.any(wire.events > 0))

    schedule = plan.schedule(params, merge.delay)
    # Who takes part in each fragment's sync, and how: one value applied around it.
    syncing, policy = participation_lib.policy(ctx.participation, schedule, s, active, alive,
                                               shared_anchor=shared_anchor, vmap=vmap)
    p_leaves, treedef = jax.tree.flatten(params)
    a_leaves = jax.tree.leaves(state.anchor)
    m_leaves = [jax.tree.leaves(b) for b in state.extra]    # the merge state's trees
    outer_states = list(state.outer_state) if fragmented else [state.outer_state]
    silent = axis.replicate(wire_lib.empty(num_workers), num_workers)
    drift = still = axis.replicate(drift_lib.zeros(), num_workers) if measure else None
    for f, members in enumerate(schedule.members):
      view = functools.partial(_view, treedef, members)
      operands = lambda f=f, members=members: (   # the fragment's leaves as they are now
          [p_leaves[i] for i in members], [a_leaves[i] for i in members], outer_states[f],
          tuple([b[i] for i in members] for b in m_leaves))
      sync = functools.partial(_sync_fragment, merge, outer, view, num_workers, ctx.mixing,
                               step_key)
      deliver = lambda p, a, m, view=view: jax.tree.leaves(
          merge.on_arrival(view(p), view(a), tuple(map(view, m))))

      def synced_fragment(ops, sync=sync, deliver=deliver):
        # Measured before the outer step: the params as the round's inner steps left them.
        measured = _drift(measure, mesh, vmap, ops, policy.taking_part)
        arrive = (None if merge.delay     # else at the end of its own sync step
                  else lambda new: (deliver(new[0], new[1], new[3]), *new[1:]))
        return (*policy.sync(sync, ops, arrive), *measured)

      # One cond outside the worker map: a step without this fragment's sync skips it
      # for every worker (a cond inside the map on an [M] mask would be a select).
      (new_p, new_a, outer_states[f], new_m), outer_wire, *measured = jax.lax.cond(
          syncing == f, synced_fragment,
          lambda ops: (ops, silent, *((still,) if measure else ())), operands())
      if measure:   # at most one fragment syncs in a step: its measurement is the step's
        drift = jax.tree.map(lambda d, m, f=f: jnp.where(syncing == f, m, d), drift,
                             measured[0])
      for leaves, values in zip([p_leaves, a_leaves, *m_leaves], [new_p, new_a, *new_m]):
        _put(leaves, members, values)
      wire = wire.merge(outer_wire)
      outer_states[f] = policy.snapshots(sync, operands())   # after the merges
      if merge.delay:     # delivery, tau steps after the sync (elementwise: no map)
        p, a, _, m = operands()
        _put(p_leaves, members, jax.lax.cond(schedule.arriving(s) == f, deliver,
                                             lambda p, a, m: p, p, a, m))
    unflatten = functools.partial(jax.tree.unflatten, treedef)
    # The merge state's own container (() or a NamedTuple) around its rebuilt trees.
    container = jax.tree.structure(state.extra, is_leaf=lambda x: x is not state.extra)
    new_state = new_state._replace(
        params=unflatten(p_leaves), anchor=unflatten(a_leaves), outer_state=wrap(outer_states),
        extra=jax.tree.unflatten(container, [unflatten(b) for b in m_leaves]))
    synced = syncing >= 0
    if fragmented:     # the step's, on every worker's record
      wire = wire._replace(
          fragment=jnp.full((num_workers,), syncing, jnp.int32),
          overlap=jnp.full((num_workers,), jnp.where(synced, merge.delay, 0), jnp.int32))
    return new_state, StepInfo(wire, synced, drift)

  return Algorithm(init=init, step=step, round_steps=plan.sync_every,
                   keeps_local=outer is None or not merge.delay)


def _init_state(inner, outer, plan, merge, vmap, wrap, params: PyTree, num_workers: int,
                key: jax.Array) -> LocoState:
  """`local_updates`' init: every worker starts from `params`."""
  if num_workers < 1:
    raise ConfigError(f'num_workers must be >= 1, got {num_workers}.')
  stacked = axis.replicate(params, num_workers)
  inner_state = vmap(inner.init, 0)(stacked)
  anchor, outer_state, extra = None, None, ()
  if outer is not None:
    members = plan.schedule(params, merge.delay).members
    # Its own float32 buffers (the state is donated): the outer step runs in float32.
    anchor = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), stacked)
    leaves, treedef = jax.tree.flatten(anchor)
    outer_state = vmap(lambda a: wrap([outer.init(_view(treedef, m, [a[i] for i in m]))
                                       for m in members]), 0)(leaves)
    extra = merge.init(anchor)
  return LocoState(step=jnp.zeros((), jnp.int32), params=stacked,
                   inner_state=inner_state, anchor=anchor, outer_state=outer_state,
                   extra=extra, key=key)


def _inner_step(inner, num_workers, mixing, key, params, inner_state, grads, active, alive):
  """One worker's inner step (inside the worker map), and what it put on the wire."""
  context = comm.WorkerContext(active=active, alive=alive, mixing=mixing, key=key)
  updates, new_inner = inner.update(grads, inner_state, params, context=context)
  # Inactive workers neither step nor communicate in the inner chain.
  return (optax.tree.where(active, optax.apply_updates(params, updates), params),
          optax.tree.where(active, new_inner, inner_state),
          wire_lib.collect(new_inner, num_workers).where(active))


def _drift(measure: bool, mesh, vmap, ops, taking_part: jax.Array) -> tuple:
  """The sync's drift over the workers `taking_part`, from the fragment's (params,
  anchor) leaves in `ops` before the outer step: one `Drift`, or () when not measured."""
  if not measure:
    return ()
  if mesh is None:     # the stacked leaves: two Gram matrices
    return (drift_lib.measure_stacked(ops[0], ops[1], taking_part),)
  # Inside the worker map: reductions over the worker axis.
  return (vmap(drift_lib.measure, 0)(ops[0], ops[1], taking_part),)


def _sync_fragment(merge, outer, view, num_workers, mixing, key, params, anchor,
                   outer_state, merge_state, active, alive, adopt, phase=None):
  """One worker's outer step of a fragment (lists of its leaves), inside the worker
  map, before the merge reaches the params; and what it put on the wire. With phase
  'send' (the overlapped asynchronous replay) only the snapshot of what this worker
  sends is kept, and nothing moves."""
  context = comm.WorkerContext(active=active, alive=alive, mixing=mixing, key=key,
                               adopt=adopt, snapshot=phase)
  delta = [a - p.astype(jnp.float32) for a, p in zip(anchor, params)]
  new_params, new_anchor, new_outer, new_merge = merge.at_sync(
      outer, view(params), view(anchor), view(delta), outer_state,
      tuple(map(view, merge_state)), context=context, num_workers=num_workers)
  new = (jax.tree.leaves(new_params), jax.tree.leaves(new_anchor), new_outer,
         tuple(jax.tree.leaves(m) for m in new_merge))
  if phase == 'send':    # only the snapshot of what is sent is kept
    return ((params, anchor, comm.keep_snapshots(outer_state, new_outer), merge_state),
            wire_lib.empty(num_workers))
  return new, wire_lib.collect(new_outer, num_workers)


def pairwise_gossip(inner: optax.GradientTransformation,
                    outer_chain: Callable[[bool], optax.GradientTransformation],
                    sync_every: int, peers: Callable[[int], Any], wire_dtype: str,
                    mesh=None) -> Algorithm:
  """A local-updates algorithm whose rounds are pairwise gossip in the outer chain
  (GASLoC, NoLoCo), with the `AsyncReplay` that `network.mode='async'` drives.

  Args:
    inner: the per-worker inner chain.
    outer_chain: `outer_chain(stale)`: the outer chain, its gossip keeping snapshots of
      what it sends when `stale` (the overlapped replay merges partners' snapshots).
    sync_every: H.
    peers: `peers(M)` -> [M, M] bool, who may exchange with whom.
    wire_dtype: the dtype models travel at.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    The algorithm (anchors are each worker's own: `shared_anchor=False`); its
    `replay.overlapped()` builds the snapshot-keeping variant.
  """
  measure = _DIAGNOSTICS.get()    # the overlapped variant is built later, outside the block

  def build(stale: bool) -> Algorithm:
    algorithm = local_updates(inner, outer_chain(stale), sync_every, shared_anchor=False,
                              mesh=mesh, diagnostics=measure)
    return algorithm._replace(replay=AsyncReplay(
        sync_every, peers, wire_dtype,
        exchange_bytes=functools.partial(pair_exchange_bytes, outer_chain(False)),
        overlapped=None if stale else lambda: build(True), snapshots=stale))
  return build(False)


def with_local_steps(algorithm: Algorithm, local_steps: Sequence[int]) -> Algorithm:
  """Per-worker local steps: worker i takes inner steps only in the first
  `local_steps[i]` steps of each round (`algorithm.round_steps`) and then waits for
  the round's sync (its params and inner state are kept; the clock charges the wait as
  idle time, `Algorithm.local_steps`).

  Args:
    algorithm: an algorithm with rounds (`round_steps` > 1).
    local_steps: H_i in [1, H], one per worker.

  Returns:
    The algorithm, its `active` mask narrowed to each worker's H_i.

  References:
    GASLoC, arXiv 2606.11081 (per-worker local steps).
  """
  h = algorithm.round_steps
  budget = np.asarray(local_steps)
  if h <= 1:
    raise ConfigError('algorithm.local_steps needs an algorithm with rounds of several '
                      'steps (sync_every > 1).')
  if budget.ndim != 1 or not np.issubdtype(budget.dtype, np.integer) or not (
      (budget >= 1) & (budget <= h)).all():
    raise ConfigError(f'algorithm.local_steps must be integers in [1, sync_every={h}], '
                      f'one per worker; got {list(local_steps)}.')

  def check(num_workers: int) -> None:
    if len(budget) != num_workers:
      raise ConfigError(f'algorithm.local_steps has {len(budget)} entries for '
                        f'num_workers={num_workers}.')

  def init(params, num_workers, key):
    check(num_workers)
    return algorithm.init(params, num_workers, key)

  def step(state, grads, ctx: StepContext | None = None):
    check(axis.num_workers_of(state.params))
    ctx = ctx or StepContext()
    mine = jnp.asarray(budget) > state.step % h
    active = mine if ctx.active is None else jnp.asarray(ctx.active, bool) & mine
    return algorithm.step(state, grads, ctx._replace(active=active))

  return algorithm._replace(init=init, step=step, local_steps=tuple(int(b) for b in budget))
