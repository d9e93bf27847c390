"""Streaming DiLoCo: parameter fragments, a staggered sync schedule, overlapped delivery.

`streaming(inner, link, optimizer, H, ...)` turns the outer chain `chain(link,
optimizer)` of DiLoCo into a streaming one (arXiv 2501.18512, DESIGN §4):

  fragments  The transformer blocks are cut into P fragments, strided (fragment p holds
             blocks p, p+P, p+2P, ...; the paper's default) or sequential (contiguous
             runs). A leaf's block comes from its key path (`block_index`: `blocks/3/...`,
             `layers_3/...`); leaves without one (embeddings, final norm, head) form their
             own fragment (`non_block='own'`, MaxText's fragment 0) or join the first
             (`'first'`). A tree without blocks is one fragment, i.e. plain DiLoCo.
  schedule   With F fragments in all, fragment f syncs every H steps, at the steps
             s = 1, 2, ... with `s % H == (f * H) // F`: one fragment every H/F steps,
             as torchft and MaxText space them (so fragment f's first round is only
             (f H) // F steps long). The non-block fragment (index 0 under
             'own') syncs at the end of the round, s = H, 2H, ..., like MaxText's. When F
             does not divide H, the offsets are floored instead of MaxText's rounding of
             the spacing, so every fragment keeps a period of exactly H.
  sync       Fragment f's pseudo-gradient `anchor_f - params_f` goes through the link
             (communication, e.g. an E3M0-quantized all-reduce with a float32 sum), then
             the outer optimizer updates the fragment's anchor. Each fragment has its
             own outer state (link and optimizer), so a fragment that does not sync
             keeps its momentum bitwise (optax.trace would otherwise decay every leaf on
             every update; REFERENCES §6.8). The anchor and the outer state are float32
             whatever the params' dtype.
  overlap    The averaged update travels while training goes on: tau steps after the
             sync, at the end of step s + tau, each worker merges
             `params_f <- alpha * params_f + (1 - alpha) * anchor_f`. The pseudo-gradient
             is taken at the sync step and the merge comes tau steps later (MaxText's
             convention; torchft takes it tau steps before its merge step: same
             staleness, offsets shifted by tau, REFERENCES §6.4). tau must be below the
             spacing H // F, so at most one fragment is in flight and the fragment's
             anchor cannot change before its merge: the merge reads it there, and the
             schedule (a pure function of the step counter) needs no delivery buffer.
  eager      (arXiv 2502.12996) A worker does not wait for the average: at the sync it
             merges at once with its own estimate of the new anchor,
             `params_f <- alpha * params_f + (1 - alpha) * theta_hat_m`, where
             theta_hat_m is the outer step (from the committed outer state, whose
             update is then dropped) on `Delta_hat_m = Delta_m / M + (1/M)
             sum_{m' != m} Delta_m'^prev`: its own fresh pseudo-gradient stands in for
             its share of the average, and the others' shares come from the fragment's
             previous, arrived average, `Delta_bar^prev - Delta_m^prev / M` (the
             formula as recalled in REFERENCES §2; M counts all workers; zero before
             the first average). When the true average arrives the estimate is swapped
             for it, `params_f += (1 - alpha) (anchor_f - theta_hat_m)`, so the tau local
             steps are kept, re-based on the true anchor; with tau = 0 this equals the
             plain merge up to rounding. It costs three float32 copies of the params
             per worker (`EagerState`).

Bytes are what the link counts (the quantized payload plus per-tensor scales for the
compressed all-reduce), for the synced fragment only, on its sync step. `StepInfo`
also carries `fragment` (the fragment synced this step, -1 for none) and
`overlap_steps` (tau on a sync step) for the network clock: that traffic is due by the
end of step s + tau, not the end of step s.

Fragments are whole leaves: models whose blocks are stacked into one scanned array
need a per-block split first (MaxText slices the scan axis); loco's model is not
scanned.
"""

import re
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco import comm
from loco import engine
from loco import workers
from loco.engine import Algorithm, LocoState, StepContext, StepInfo
from loco.errors import ConfigError

PyTree = Any
BlockIndexFn = Callable[[tuple], int | None]

PATTERNS = ('strided', 'sequential')
NON_BLOCK = ('own', 'first')
# Keys whose integer child is a block index (`blocks/3/...`, nnx.List; `layers[3]`).
BLOCK_CONTAINERS = ('blocks', 'block', 'layers', 'layer', 'h')
# Keys that name a block themselves (Flax linen's `layers_3`, `blocks_3`).
_NAMED_BLOCK = re.compile(r'^(?:blocks?|layers?|h)_(\d+)$')


def _key_name(entry) -> Any:
  for attr in ('key', 'idx', 'name'):
    if hasattr(entry, attr):
      return getattr(entry, attr)
  return str(entry)


def block_index(path: Sequence[Any]) -> int | None:
  """The transformer block a leaf belongs to, read from its key path, or None.

  An integer key (or a string of digits, as orbax restores int keys) right after a key
  named 'blocks', 'layers', 'h', ... is the block index; so is the number in a key
  named like 'layers_3'. Leaves without one (embeddings, final norm, head) are
  non-block leaves.
  """
  previous = None
  for entry in path:
    name = _key_name(entry)
    if previous in BLOCK_CONTAINERS:
      if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        return int(name)
      if isinstance(name, str) and name.isdigit():
        return int(name)
    if isinstance(name, str):
      match = _NAMED_BLOCK.match(name)
      if match:
        return int(match.group(1))
    previous = name
  return None


class Fragmentation(NamedTuple):
  """How a param tree is cut into fragments (static: read from the key paths).

  Attributes:
    leaf_fragment: the fragment of each leaf, in `jax.tree.leaves` order.
    blocks: the block indices in each fragment.
    non_block: the fragment holding the leaves without a block index, or None.
  """
  leaf_fragment: tuple[int, ...]
  blocks: tuple[tuple[int, ...], ...]
  non_block: int | None

  @property
  def num_fragments(self) -> int:
    return len(self.blocks)

  def members(self, fragment: int) -> tuple[int, ...]:
    """Leaf indices of `fragment`."""
    return tuple(i for i, f in enumerate(self.leaf_fragment) if f == fragment)


def _check_choice(value, allowed, key: str):
  if value not in allowed:
    raise ConfigError(f'{key} must be one of {allowed}, got {value!r}.')


def _check_count(value, key: str, allow_none: bool = True):
  if value is None and allow_none:
    return
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ConfigError(f'{key} must be an integer >= 1{" or None" if allow_none else ""}, '
                      f'got {value!r}.')


def assign_fragments(params: PyTree, num_fragments: int | None = None, *,
                     layers_per_fragment: int | None = None,
                     fragment_pattern: str = 'strided', non_block: str = 'own',
                     block_index_fn: BlockIndexFn = block_index) -> Fragmentation:
  """Cuts `params` into fragments of transformer blocks.

  Args:
    params: a param tree (one model's, or worker-stacked: only the key paths are read).
    num_fragments: P, fragments the blocks are cut into (1 .. number of blocks); None:
      one block per fragment, or blocks / layers_per_fragment.
    layers_per_fragment: blocks per fragment (must divide the number of blocks); an
      alternative to num_fragments.
    fragment_pattern: 'strided' (fragment p = blocks p, p+P, ...) or 'sequential'.
    non_block: 'own' (leaves without a block are fragment 0 and the block fragments
      follow, P + 1 fragments in all) or 'first' (they join block fragment 0).
    block_index_fn: maps a key path to its block index or None.

  Returns:
    A `Fragmentation`. A tree without blocks is one fragment (P may then be None or 1).

  References:
    Streaming DiLoCo, arXiv 2501.18512 (§2.1, strided fragments).
  """
  _check_count(num_fragments, 'algorithm.num_fragments')
  _check_count(layers_per_fragment, 'algorithm.layers_per_fragment')
  _check_choice(fragment_pattern, PATTERNS, 'algorithm.fragment_pattern')
  _check_choice(non_block, NON_BLOCK, 'algorithm.non_block')
  if num_fragments is not None and layers_per_fragment is not None:
    raise ConfigError('set algorithm.num_fragments or algorithm.layers_per_fragment, '
                      'not both.')
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  leaf_blocks = [block_index_fn(path) for path in paths]
  blocks = sorted({b for b in leaf_blocks if b is not None})
  n = len(blocks)
  if n == 0:
    if num_fragments not in (None, 1):
      raise ConfigError(f'algorithm.num_fragments={num_fragments} but the params have no '
                        'transformer blocks (key paths like blocks/<i>/...); use 1 or None.')
    return Fragmentation((0,) * len(paths), ((),), None)
  if layers_per_fragment is not None:
    if n % layers_per_fragment:
      raise ConfigError(f'algorithm.layers_per_fragment={layers_per_fragment} must divide '
                        f'the number of transformer blocks ({n}).')
    num_fragments = n // layers_per_fragment
  num_fragments = n if num_fragments is None else num_fragments
  if num_fragments > n:
    raise ConfigError(f'algorithm.num_fragments={num_fragments} is larger than the number '
                      f'of transformer blocks ({n}); use 1 .. {n}.')
  position = {b: k for k, b in enumerate(blocks)}
  if fragment_pattern == 'strided':
    block_fragment = {b: position[b] % num_fragments for b in blocks}
  else:   # contiguous runs whose lengths differ by at most one
    block_fragment = {b: position[b] * num_fragments // n for b in blocks}
  has_non_block = any(b is None for b in leaf_blocks)
  shift = 1 if non_block == 'own' and has_non_block else 0
  leaf_fragment = tuple(0 if b is None else block_fragment[b] + shift
                        for b in leaf_blocks)
  fragment_blocks = [()] * shift + [
      tuple(b for b in blocks if block_fragment[b] == p) for p in range(num_fragments)]
  return Fragmentation(leaf_fragment, tuple(fragment_blocks),
                       0 if has_non_block else None)


def sync_offsets(num_fragments: int, sync_every: int) -> tuple[int, ...]:
  """Fragment f syncs at the steps s >= 1 with `s % sync_every == offsets[f]`."""
  if sync_every < num_fragments:
    raise ConfigError(f'algorithm.sync_every={sync_every} must be >= the number of '
                      f'fragments ({num_fragments}) so that fragments sync at distinct steps.')
  return tuple(f * sync_every // num_fragments for f in range(num_fragments))


def check_overlap(overlap_steps: int, num_fragments: int, sync_every: int) -> None:
  """tau must be below the spacing of fragment syncs: one fragment in flight at a time."""
  spacing = sync_every // num_fragments
  if overlap_steps >= spacing:
    raise ConfigError(f'algorithm.overlap_steps={overlap_steps} must be < sync_every // '
                      f'fragments = {sync_every} // {num_fragments} = {spacing}, so that a '
                      'fragment arrives before the next one syncs.')


def fragment_sizes(params: PyTree, fragmentation: Fragmentation) -> list[int]:
  """Number of values in each fragment (peak bandwidth follows the largest)."""
  sizes = [0] * fragmentation.num_fragments
  for f, x in zip(fragmentation.leaf_fragment, jax.tree.leaves(params)):
    sizes[f] += int(np.prod(np.shape(x)))
  return sizes


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


def _view(leaves: list, treedef, members: tuple[int, ...]) -> PyTree:
  # The fragment as a tree of the full structure with None elsewhere: optax and the
  # compressors skip None, and path-based masks still see the model's own paths.
  keep = set(members)
  return jax.tree.unflatten(treedef, [x if i in keep else None
                                      for i, x in enumerate(leaves)])


def _merge(params: jax.Array, target: jax.Array, alpha: float) -> jax.Array:
  if alpha == 0.0:       # exact: alpha 0 adopts the anchor, as DiLoCo's reset does
    return target.astype(params.dtype)
  return (alpha * params.astype(jnp.float32)
          + (1.0 - alpha) * target).astype(params.dtype)


def streaming(
    inner: optax.GradientTransformation,
    link: optax.GradientTransformation,
    optimizer: optax.GradientTransformation,
    sync_every: int,
    *,
    num_fragments: int | None = None,
    layers_per_fragment: int | None = None,
    fragment_pattern: str = 'strided',
    non_block: str = 'own',
    overlap_steps: int = 1,
    merge_alpha: float = 0.5,
    eager: bool = False,
    block_index_fn: BlockIndexFn = block_index,
    mesh: jax.sharding.Mesh | None = None,
) -> Algorithm:
  """Streaming DiLoCo over the outer chain `chain(link, optimizer)`.

  Every step each worker applies `inner`; fragment f syncs every H steps at offset
  (f H) // F (see the module doc): its pseudo-gradient goes through `link` (the
  communication, e.g. `comm.compressed_all_reduce_mean(compress.e3m0())`) and
  `optimizer` (the outer optimizer, float32, one state per fragment), and the result
  is merged `overlap_steps` steps later as `alpha * params + (1 - alpha) * anchor`.
  The link and the optimizer are separate because eager updates run the optimizer on
  a local estimate without communicating. With one fragment, `overlap_steps=0` and
  `merge_alpha=0` this is `local_updates(inner, chain(link, optimizer), H)`.

  Args:
    inner: per-worker inner optax chain (AdamW).
    link: per-worker communication transform mapping pseudo-gradients to their mean.
    optimizer: per-worker outer optimizer (Nesterov).
    sync_every: H, steps between two syncs of the same fragment.
    num_fragments: P, fragments the transformer blocks are cut into; None: one per
      block (or blocks / layers_per_fragment). See `assign_fragments`.
    layers_per_fragment: blocks per fragment, instead of num_fragments.
    fragment_pattern: 'strided' or 'sequential'.
    non_block: 'own' (embeddings, norms and head are fragment 0) or 'first'.
    overlap_steps: tau, steps between a fragment's sync and the merge of its update;
      0 <= tau < H // F.
    merge_alpha: alpha in [0, 1], weight of the local params in the merge.
    eager: merge at the sync with a local estimate, corrected on arrival (arXiv
      2502.12996).
    block_index_fn: maps a key path to its block index or None.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm` whose `StepInfo` has `fragment` and `overlap_steps` set.

  References:
    Douillard et al., arXiv 2501.18512 (Streaming DiLoCo); Kale et al., arXiv
    2502.12996 (eager updates).
  """
  _check_count(sync_every, 'algorithm.sync_every', allow_none=False)
  if (not isinstance(overlap_steps, (int, np.integer)) or isinstance(overlap_steps, bool)
      or overlap_steps < 0):
    raise ConfigError(f'algorithm.overlap_steps must be an integer >= 0, got '
                      f'{overlap_steps!r}.')
  if not 0.0 <= merge_alpha <= 1.0:
    raise ConfigError(f'algorithm.merge_alpha must be in [0, 1], got {merge_alpha!r}.')
  if not isinstance(eager, bool):
    raise ConfigError(f'algorithm.eager must be True or False, got {eager!r}.')
  _check_count(num_fragments, 'algorithm.num_fragments')
  _check_count(layers_per_fragment, 'algorithm.layers_per_fragment')
  _check_choice(fragment_pattern, PATTERNS, 'algorithm.fragment_pattern')
  _check_choice(non_block, NON_BLOCK, 'algorithm.non_block')
  if num_fragments is not None and layers_per_fragment is not None:
    raise ConfigError('set algorithm.num_fragments or algorithm.layers_per_fragment, '
                      'not both.')
  if num_fragments is not None:     # the tree may add a non-block fragment at init
    sync_offsets(num_fragments, sync_every)
    check_overlap(overlap_steps, num_fragments, sync_every)
  alpha = float(merge_alpha)
  tau = int(overlap_steps)
  inner = optax.with_extra_args_support(inner)
  link = optax.with_extra_args_support(link)
  optimizer = optax.with_extra_args_support(optimizer)
  vmap = lambda f, in_axes: workers.vmap(f, in_axes=in_axes, mesh=mesh)

  def fragments_of(params: PyTree) -> tuple[Fragmentation, tuple[int, ...]]:
    fragmentation = assign_fragments(
        params, num_fragments, layers_per_fragment=layers_per_fragment,
        fragment_pattern=fragment_pattern, non_block=non_block,
        block_index_fn=block_index_fn)
    count = fragmentation.num_fragments
    offsets = sync_offsets(count, sync_every)
    check_overlap(tau, count, sync_every)
    return fragmentation, offsets

  def outer_init(anchor: PyTree, fragmentation: Fragmentation):
    leaves, treedef = jax.tree.flatten(anchor)
    states = []
    for f in range(fragmentation.num_fragments):
      view = _view(leaves, treedef, fragmentation.members(f))
      states.append((link.init(view), optimizer.init(view)))
    return tuple(states)

  def init(params: PyTree, num_workers: int, key: jax.Array) -> LocoState:
    if num_workers < 1:
      raise ConfigError(f'num_workers must be >= 1, got {num_workers}.')
    fragmentation, _ = fragments_of(params)
    stacked = workers.replicate(params, num_workers)
    inner_state = vmap(inner.init, 0)(stacked)
    # Its own float32 buffers (the state is donated): the outer step runs in float32.
    anchor = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), stacked)
    outer_state = vmap(lambda a: outer_init(a, fragmentation), 0)(anchor)
    extra = ()
    if eager:
      zeros = lambda: jax.tree.map(jnp.zeros_like, anchor)
      extra = EagerState(zeros(), zeros(), zeros())
    return LocoState(step=jnp.zeros((), jnp.int32), params=stacked,
                     inner_state=inner_state, anchor=anchor, outer_state=outer_state,
                     extra=extra, key=key)

  def make_worker_step(fragmentation: Fragmentation, num_workers: int):
    members = [fragmentation.members(f) for f in range(fragmentation.num_fragments)]

    def pick(leaves, f):
      return [leaves[i] for i in members[f]]

    def put(leaves, f, values):
      leaves = list(leaves)
      for i, v in zip(members[f], values):
        leaves[i] = v
      return leaves

    def sync_fragment(f, treedef, context):
      """The branch run when fragment f syncs: (params, anchor, state, eager) -> new."""
      view = lambda values: _view(put([None] * treedef.num_leaves, f, values),
                                  treedef, members[f])

      def sync(params, anchor, state, buffers):
        link_state, opt_state = state
        delta = view([a - p.astype(jnp.float32) for a, p in zip(anchor, params)])
        mean, link_state = link.update(delta, link_state, view(anchor), context=context)
        mean = jax.tree.map(lambda m: m.astype(jnp.float32), mean)
        updates, new_opt_state = optimizer.update(mean, opt_state, view(anchor),
                                                  context=context)
        new_anchor = jax.tree.leaves(optax.apply_updates(view(anchor), updates))
        new_state = (link_state, new_opt_state)
        if eager:
          prev_mean, prev_own, _ = buffers
          own = jax.tree.leaves(delta)
          # Own fresh share + the others' shares of the last average (arXiv 2502.12996).
          estimate = [pm + (d - po) / num_workers
                      for pm, d, po in zip(prev_mean, own, prev_own)]
          hat_updates, _ = optimizer.update(view(estimate), opt_state, view(anchor),
                                            context=context)
          theta_hat = jax.tree.leaves(optax.apply_updates(view(anchor), hat_updates))
          params = [_merge(p, h, alpha) for p, h in zip(params, theta_hat)]
          correction = [(1.0 - alpha) * (g - h) for g, h in zip(new_anchor, theta_hat)]
          buffers = (jax.tree.leaves(mean), own, correction)
        return params, new_anchor, new_state, buffers, comm.wire_bytes(new_state)

      def no_sync(params, anchor, state, buffers):
        return params, anchor, state, buffers, comm.no_wire()

      return sync, no_sync

    def arrive(params, source):
      if eager:     # swap the estimate for the true anchor: params += correction
        return [(p.astype(jnp.float32) + c).astype(p.dtype) for p, c in zip(params, source)]
      return [_merge(p, g, alpha) for p, g in zip(params, source)]

    def worker_step(params, inner_state, anchor, outer_state, extra, grads, active,
                    alive, mixing, key, sync_fragment_index, arrive_fragment_index):
      context = comm.WorkerContext(active=active, alive=alive, mixing=mixing, key=key)
      params, inner_state, wire = engine.inner_step(
          inner, params, inner_state, grads, active, context)
      p_leaves, treedef = jax.tree.flatten(params)
      a_leaves = jax.tree.leaves(anchor)
      e_leaves = [jax.tree.leaves(b) for b in extra] if eager else None
      outer_state = list(outer_state)
      # One cond per fragment over its own leaves only: a sync touches one fragment,
      # and the others (their momentum included) pass through bitwise.
      for f in range(fragmentation.num_fragments):
        sync, no_sync = sync_fragment(f, treedef, context)
        buffers = tuple(pick(b, f) for b in e_leaves) if eager else ()
        out = jax.lax.cond(sync_fragment_index == f, sync, no_sync,
                           pick(p_leaves, f), pick(a_leaves, f), outer_state[f], buffers)
        new_p, new_a, outer_state[f], new_buffers, outer_wire = out
        p_leaves, a_leaves = put(p_leaves, f, new_p), put(a_leaves, f, new_a)
        if eager:
          e_leaves = [put(b, f, nb) for b, nb in zip(e_leaves, new_buffers)]
        wire = wire.merge(outer_wire)
      # Delivery, tau steps after the sync (the same step, after it, when tau = 0).
      for f in range(fragmentation.num_fragments):
        source = pick(e_leaves[2] if eager else a_leaves, f)
        new_p = jax.lax.cond(arrive_fragment_index == f, arrive, lambda p, _: list(p),
                             pick(p_leaves, f), source)
        p_leaves = put(p_leaves, f, new_p)
      params = jax.tree.unflatten(treedef, p_leaves)
      anchor = jax.tree.unflatten(treedef, a_leaves)
      if eager:
        extra = EagerState(*(jax.tree.unflatten(treedef, b) for b in e_leaves))
      return params, inner_state, anchor, tuple(outer_state), extra, wire

    return worker_step

  def step(state: LocoState, grads: PyTree,
           ctx: StepContext | None = None) -> tuple[LocoState, StepInfo]:
    if ctx is not None and ctx.sync is not None:
      raise ConfigError('Streaming DiLoCo follows its own fragment schedule; '
                        'StepContext.sync is not supported.')
    num_workers = workers.num_workers_of(state.params)
    active, alive, mixing, _, ctx_key = engine.per_worker_context(ctx, num_workers)
    key, step_key = jax.random.split(state.key)
    if ctx_key is not None:
      step_key = ctx_key
    fragmentation, offsets = fragments_of(state.params)
    # slot[r] = the fragment that syncs at steps s with s % H == r, or -1.
    slot = np.full((sync_every,), -1, np.int32)
    slot[list(offsets)] = np.arange(len(offsets), dtype=np.int32)
    slot = jnp.asarray(slot)
    s = state.step + 1
    sync_index = slot[s % sync_every]
    synced_at = s - tau
    arrive_index = jnp.where(synced_at >= 1, slot[synced_at % sync_every], -1)
    worker_step = make_worker_step(fragmentation, num_workers)
    outs = vmap(worker_step, (0, 0, 0, 0, 0, 0, 0, 0, None, None, None, None))(
        state.params, state.inner_state, state.anchor, state.outer_state, state.extra,
        grads, active, alive, mixing, step_key, sync_index, arrive_index)
    params, inner_state, anchor, outer_state, extra, wire = outs
    new_state = state._replace(step=s, params=params, inner_state=inner_state,
                               anchor=anchor, outer_state=outer_state, extra=extra,
                               key=key)
    synced = sync_index >= 0
    info = engine.step_info(wire, synced, fragment=sync_index,
                            overlap_steps=jnp.where(synced, tau, 0).astype(jnp.int32))
    return new_state, info

  return Algorithm(init=init, step=step)
