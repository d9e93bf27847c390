"""The sync plan: which parameter fragments sync at which step (DESIGN §2, §4).

A plan is a small value that `engine.local_updates` reads; it holds no arrays:

  SyncPlan   H (`sync_every`) and how a param tree is cut into fragments, each with its
             sync offset within the round (None: the whole model is one fragment at
             offset 0, DiLoCo's schedule).
  Schedule   the plan read from one param tree and a merge delay tau: the leaves of
             each fragment, the offsets, and the slot table `step -> fragment syncing`
             (and the fragment whose result arrives, tau steps after its sync).

Streaming DiLoCo's fragments are transformer blocks read from the key paths:

  fragments  The blocks are cut into P fragments, strided (fragment p holds blocks p,
             p+P, p+2P, ...; the paper's default) or sequential (contiguous runs). A
             leaf's block comes from its key path (`block_index`: `blocks/3/...`,
             `layers_3/...`); leaves without one (embeddings, final norm, head) form
             their own fragment (`non_block='own'`, MaxText's fragment 0) or join the
             first (`'first'`). A tree without blocks is one fragment, i.e. plain DiLoCo.
             Fragments are whole leaves: a model whose blocks are stacked into one
             scanned array needs a per-block split first (loco's model is not scanned).
  offsets    With F fragments in all, fragment f syncs every H steps, at the steps
             s = 1, 2, ... with `s % H == (f * H) // F`: one fragment every H/F steps,
             as torchft and MaxText space them (so fragment f's first round is only
             (f H) // F steps long). The non-block fragment (index 0 under 'own') syncs
             at the end of the round, s = H, 2H, ..., like MaxText's. When F does not
             divide H, the offsets are floored instead of MaxText's rounding of the
             spacing, so every fragment keeps a period of exactly H.
"""

import re
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loco.errors import ConfigError

PyTree = Any

PATTERNS = ('strided', 'sequential')
NON_BLOCK = ('own', 'first')
# Keys whose integer child is a block index (`blocks/3/...`, nnx.List; `layers[3]`).
BLOCK_CONTAINERS = ('blocks', 'block', 'layers', 'layer', 'h')
# Keys that name a block themselves (Flax linen's `layers_3`, `blocks_3`).
_NAMED_BLOCK = re.compile(r'^(?:blocks?|layers?|h)_(\d+)$')


class Fragments(NamedTuple):
  """The fragments of one param tree and the step of each one's sync.

  Attributes:
    leaf_fragment: the fragment of each leaf, in `jax.tree.leaves` order (0 .. F-1).
    offsets: fragment f syncs at the steps s >= 1 with `s % sync_every == offsets[f]`.
  """
  leaf_fragment: tuple[int, ...]
  offsets: tuple[int, ...]


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


class Schedule(NamedTuple):
  """A plan read from one param tree: static, so the step's branches are fixed.

  Attributes:
    members: the leaf indices (`jax.tree.leaves` order) of each fragment.
    offsets: fragment f syncs at the steps s >= 1 with `s % sync_every == offsets[f]`.
    sync_every: H.
    delay: tau, steps between a fragment's sync and the arrival of its result.
  """
  members: tuple[tuple[int, ...], ...]
  offsets: tuple[int, ...]
  sync_every: int
  delay: int

  @property
  def slots(self) -> np.ndarray:
    """[H] int32: `slots[r]` is the fragment that syncs at the steps s with s % H == r,
    or -1."""
    slot = np.full((self.sync_every,), -1, np.int32)
    slot[list(self.offsets)] = np.arange(len(self.offsets), dtype=np.int32)
    return slot

  def syncing(self, step: jax.Array,
              override: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
    """The fragment that syncs at `step` (-1: none), and which workers sync.

    `override` is `Participation.sync`: a bool scalar (sync now, or not), or an [M] mask
    of the workers that sync (the asynchronous replay); it replaces the slot table of a
    one-fragment schedule without delay. The second value is that mask, or None: all.
    """
    if override is None:
      return jnp.asarray(self.slots)[step % self.sync_every], None
    if len(self.members) > 1 or self.delay:
      raise ConfigError('Participation.sync overrides the sync schedule of one fragment '
                        'without overlap; this algorithm follows its own fragment '
                        'schedule.')
    override = jnp.asarray(override, bool)
    return (jnp.where(jnp.any(override), 0, -1).astype(jnp.int32),
            override if override.ndim else None)

  def arriving(self, step: jax.Array) -> jax.Array:
    """The fragment whose result arrives at `step`, tau steps after its sync, or -1."""
    return jnp.where(step > self.delay,
                     jnp.asarray(self.slots)[(step - self.delay) % self.sync_every], -1)


class SyncPlan(NamedTuple):
  """When each part of the params syncs.

  Attributes:
    sync_every: H, inner steps between two syncs of a fragment.
    fragments: `fragments(params) -> Fragments`, read from a (stacked or single) param
      tree; None: the whole model is one fragment, synced at steps H, 2H, ...
  """
  sync_every: int
  fragments: Callable[[PyTree], Fragments] | None = None

  def schedule(self, params: PyTree, delay: int = 0) -> Schedule:
    """The schedule of `params` for a merge `delay` (tau), checked."""
    cut = (Fragments((0,) * len(jax.tree.leaves(params)), (0,)) if self.fragments is None
           else self.fragments(params))
    check_schedule(cut.offsets, self.sync_every, delay)
    members = tuple(tuple(i for i, g in enumerate(cut.leaf_fragment) if g == f)
                    for f in range(len(cut.offsets)))
    return Schedule(members, tuple(cut.offsets), self.sync_every, int(delay))


def every(sync_every: int) -> SyncPlan:
  """The whole model syncs every `sync_every` (H) steps: DiLoCo's plan.

  References:
    DiLoCo, arXiv 2311.08105.
  """
  if not isinstance(sync_every, int) or sync_every < 1:
    raise ConfigError(f'sync_every (H) must be an integer >= 1, got {sync_every!r}.')
  return SyncPlan(sync_every)


def streaming(sync_every: int, num_fragments: int | None = None, *,
              layers_per_fragment: int | None = None, fragment_pattern: str = 'strided',
              non_block: str = 'own') -> SyncPlan:
  """Fragments of transformer blocks that sync in turn, one every H / F steps.

  Args:
    sync_every: H, steps between two syncs of a fragment.
    num_fragments: P, fragments the blocks are cut into; None: one per block (or
      blocks / layers_per_fragment). A tree without blocks is one fragment.
    layers_per_fragment: blocks per fragment instead of num_fragments.
    fragment_pattern: 'strided' (the paper's default) or 'sequential'.
    non_block: 'own' (leaves outside blocks form fragment 0) or 'first'.

  Returns:
    A `SyncPlan` (see the module docstring for the fragments and offsets).

  References:
    Streaming DiLoCo, arXiv 2501.18512 (§2.1, strided fragments).
  """
  plan = every(sync_every)
  assign = fragmenter(num_fragments, layers_per_fragment=layers_per_fragment,
                      fragment_pattern=fragment_pattern, non_block=non_block)

  def fragments(params: PyTree) -> Fragments:
    cut = assign(params)
    return Fragments(cut.leaf_fragment, sync_offsets(cut.num_fragments, sync_every))

  return plan._replace(fragments=fragments)


def block_index(path: Sequence[Any]) -> int | None:
  """The transformer block a leaf belongs to, read from its key path, or None.

  An integer key (or a string of digits, as orbax restores int keys) right after a key
  named 'blocks', 'layers', 'h', ... is the block index; so is the number in a key
  named like 'layers_3'. Leaves without one (embeddings, final norm, head) are
  non-block leaves.
  """
  previous = None
  for entry in path:
    name = jax.tree_util.keystr((entry,), simple=True)
    if previous in BLOCK_CONTAINERS and name.isdigit():
      return int(name)
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


def fragmenter(num_fragments: int | None = None, *, layers_per_fragment: int | None = None,
               fragment_pattern: str = 'strided', non_block: str = 'own'
               ) -> Callable[[PyTree], Fragmentation]:
  """Checks the fragment keys; returns `params -> Fragmentation` (see `assign_fragments`)."""
  for value, allowed, key in ((fragment_pattern, PATTERNS, 'fragment_pattern'),
                              (non_block, NON_BLOCK, 'non_block')):
    if value not in allowed:
      raise ConfigError(f'algorithm.{key} must be one of {allowed}, got {value!r}.')
  if num_fragments is not None and layers_per_fragment is not None:
    raise ConfigError('set algorithm.num_fragments or algorithm.layers_per_fragment, not both.')

  def assign(params: PyTree) -> Fragmentation:
    leaf_blocks = [block_index(path)
                   for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    blocks = sorted({b for b in leaf_blocks if b is not None})
    n = len(blocks)
    if n == 0:
      if num_fragments not in (None, 1):
        raise ConfigError(f'algorithm.num_fragments={num_fragments} but the params have '
                          'no transformer blocks (key paths like blocks/<i>/...); use 1 '
                          'or None.')
      return Fragmentation((0,) * len(leaf_blocks), ((),), None)
    count = n if num_fragments is None else num_fragments
    if layers_per_fragment is not None:
      if n % layers_per_fragment:
        raise ConfigError(f'algorithm.layers_per_fragment={layers_per_fragment} must '
                          f'divide the number of transformer blocks ({n}).')
      count = n // layers_per_fragment
    if count > n:
      raise ConfigError(f'algorithm.num_fragments={count} is larger than the number '
                        f'of transformer blocks ({n}); use 1 .. {n}.')
    # 'sequential': contiguous runs whose lengths differ by at most one.
    block_fragment = {b: k % count if fragment_pattern == 'strided' else k * count // n
                      for k, b in enumerate(blocks)}
    has_non_block = any(b is None for b in leaf_blocks)
    shift = 1 if non_block == 'own' and has_non_block else 0
    leaf_fragment = tuple(0 if b is None else block_fragment[b] + shift for b in leaf_blocks)
    fragment_blocks = [()] * shift + [
        tuple(b for b in blocks if block_fragment[b] == p) for p in range(count)]
    return Fragmentation(leaf_fragment, tuple(fragment_blocks), 0 if has_non_block else None)

  return assign


def assign_fragments(params: PyTree, num_fragments: int | None = None,
                     **keys: Any) -> Fragmentation:
  """Cuts `params` into fragments of transformer blocks.

  Args:
    params: a param tree (one model's, or worker-stacked: only the key paths are read).
    num_fragments: P, fragments the blocks are cut into (1 .. number of blocks); None:
      one block per fragment, or blocks / layers_per_fragment.
    **keys: `layers_per_fragment`, `fragment_pattern`, `non_block`, as in `streaming`.

  Returns:
    A `Fragmentation`. A tree without blocks is one fragment (P may then be None or 1).

  References:
    Streaming DiLoCo, arXiv 2501.18512 (§2.1, strided fragments).
  """
  return fragmenter(num_fragments, **keys)(params)


def sync_offsets(num_fragments: int, sync_every: int) -> tuple[int, ...]:
  """Fragment f syncs at the steps s >= 1 with `s % sync_every == offsets[f]`."""
  if sync_every < num_fragments:
    raise ConfigError(f'algorithm.sync_every={sync_every} must be >= the number of '
                      f'fragments ({num_fragments}) so that fragments sync at distinct steps.')
  return tuple(f * sync_every // num_fragments for f in range(num_fragments))


def fragment_sizes(params: PyTree, fragmentation: Fragmentation) -> list[int]:
  """Number of values in each fragment (peak bandwidth follows the largest)."""
  sizes = [0] * fragmentation.num_fragments
  for f, x in zip(fragmentation.leaf_fragment, jax.tree.leaves(params)):
    sizes[f] += int(np.prod(np.shape(x)))
  return sizes
