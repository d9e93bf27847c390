"""Streaming DiLoCo: fragments synced in turn, overlapped and 4-bit quantized.

Its math, read from the key paths; the engine (`local_updates`) runs the schedule:

  fragments  The transformer blocks are cut into P fragments, strided (fragment p holds
             blocks p, p+P, p+2P, ...; the paper's default) or sequential (contiguous
             runs). A leaf's block comes from its key path (`block_index`: `blocks/3/...`,
             `layers_3/...`); leaves without one (embeddings, final norm, head) form their
             own fragment (`non_block='own'`, MaxText's fragment 0) or join the first
             (`'first'`). A tree without blocks is one fragment, i.e. plain DiLoCo.
             Fragments are whole leaves: a model whose blocks are stacked into one
             scanned array needs a per-block split first (loco's model is not scanned).
  schedule   With F fragments in all, fragment f syncs every H steps, at the steps
             s = 1, 2, ... with `s % H == (f * H) // F`: one fragment every H/F steps,
             as torchft and MaxText space them (so fragment f's first round is only
             (f H) // F steps long). The non-block fragment (index 0 under 'own') syncs
             at the end of the round, s = H, 2H, ..., like MaxText's. When F does not
             divide H, the offsets are floored instead of MaxText's rounding of the
             spacing, so every fragment keeps a period of exactly H.
  overlap    The pseudo-gradient is taken at the sync step and merged tau steps later
             (MaxText's convention; torchft takes it tau steps before its merge step:
             same staleness, offsets shifted by tau, REFERENCES §6.4); tau < H // F.

Bytes are what the link counts (the quantized payload plus per-tensor scales for the
compressed all-reduce), for the synced fragment only, on its sync step; `StepInfo`'s
`fragment` and `overlap_steps` tell the network clock that this traffic is due by the
end of step s + tau.
"""

import re
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np
import optax

from loco import comm
from loco import compress
from loco import optim
from loco.algorithms.spec import AlgorithmSpec, Key
from loco.engine import Algorithm, Fragments, check_schedule, local_updates
from loco.errors import ConfigError

PyTree = Any

PATTERNS = ('strided', 'sequential')
NON_BLOCK = ('own', 'first')
# Keys whose integer child is a block index (`blocks/3/...`, nnx.List; `layers[3]`).
BLOCK_CONTAINERS = ('blocks', 'block', 'layers', 'layer', 'h')
# Keys that name a block themselves (Flax linen's `layers_3`, `blocks_3`).
_NAMED_BLOCK = re.compile(r'^(?:blocks?|layers?|h)_(\d+)$')


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
    **keys: `layers_per_fragment`, `fragment_pattern`, `non_block`, as in
      `streaming_diloco`.

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


def streaming_diloco(inner: optax.GradientTransformation, *, sync_every: int = 100,
                     num_fragments: int | None = None,
                     layers_per_fragment: int | None = None,
                     fragment_pattern: str = 'strided', non_block: str = 'own',
                     overlap_steps: int = 1, merge_alpha: float = 0.5,
                     compression: str = 'e3m0', transport_dtype: str = 'float32',
                     eager: bool = False, outer_optimizer: str = 'nesterov',
                     outer_lr: float = 0.4, outer_momentum: float = 0.9,
                     mesh=None) -> Algorithm:
  """Streaming DiLoCo: DiLoCo whose fragments sync in turn, overlapped with training.

  Fragments and their schedule as the module docstring says; a fragment's
  pseudo-gradient travels E3M0-quantized (summed in float32), the outer step updates
  its anchor and momentum only, and tau steps later each worker merges `alpha * params
  + (1 - alpha) * anchor`. With one fragment (`num_fragments=1, non_block='first'`), tau
  0, alpha 0 and no compression this is DiLoCo: the same engine, configured.

  Args:
    inner: the per-worker inner optimizer.
    sync_every: H, steps between two syncs of a fragment (the paper's 100).
    num_fragments: P, fragments of transformer blocks; None: one per block (or
      blocks / layers_per_fragment). A tree without blocks is one fragment.
    layers_per_fragment: blocks per fragment instead of num_fragments (the paper's 1B
      model: 3 of 24 layers, P = 8).
    fragment_pattern: 'strided' (the paper's default) or 'sequential'.
    non_block: 'own' (embeddings, norms and head form fragment 0, as MaxText) or
      'first' (they join the first block fragment).
    overlap_steps: tau, steps between a sync and the merge of its result (1);
      0 <= tau < H // fragments.
    merge_alpha: alpha, weight of the local params in the merge (0.5).
    compression: codec of the pseudo-gradients on the wire: 'e3m0' (the paper's
      4-bit float), 'none' (transport_dtype) or any of `loco.compress.CODECS`.
    transport_dtype: dtype on the wire when compression is 'none'.
    eager: eager updates (arXiv 2502.12996): merge at once with a local estimate of
      the average, corrected when the average arrives (see `local_updates`).
    outer_optimizer: 'nesterov', 'sgd', 'heavy_ball' or 'adam'.
    outer_lr: outer learning rate (the paper's 0.4; DiLoCo's 0.7 as a key).
    outer_momentum: outer momentum (0.9).
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm` whose `StepInfo` has `fragment` and `overlap_steps` set.

  References:
    Douillard et al., arXiv 2501.18512 (Streaming DiLoCo); Kale et al., arXiv
    2502.12996 (eager updates).
  """
  assign = fragmenter(num_fragments, layers_per_fragment=layers_per_fragment,
                      fragment_pattern=fragment_pattern, non_block=non_block)

  def fragments(params: PyTree) -> Fragments:
    cut = assign(params)
    return Fragments(cut.leaf_fragment, sync_offsets(cut.num_fragments, sync_every))

  optimizer = optim.outer_optimizer(outer_optimizer, outer_lr, outer_momentum)
  link = (comm.all_reduce_mean(transport_dtype) if compression == 'none' else
          comm.compressed_all_reduce_mean(compress.by_name(compression)))
  algorithm = local_updates(inner, (link, optimizer), sync_every, fragments=fragments,
                            overlap_steps=overlap_steps, merge_alpha=merge_alpha,
                            eager=eager, mesh=mesh)
  if num_fragments is not None:   # fail early; the tree may add a non-block fragment
    check_schedule(sync_offsets(num_fragments, sync_every), sync_every, overlap_steps)
  return algorithm


STREAMING_DILOCO = AlgorithmSpec(
    streaming_diloco,
    keys={'num_fragments': Key(int, 'Streaming: P block fragments (None: one per block)', '>= 1'),
          'layers_per_fragment': Key(int, 'Streaming: blocks per fragment, instead of P', '>= 1'),
          'fragment_pattern': Key(str, 'Streaming: strided | sequential blocks per fragment'),
          'non_block': Key(str, 'Streaming: embeddings/norm/head fragment: own | first'),
          'overlap_steps': Key(int, 'Streaming: tau, steps from a sync to its merge', '>= 0'),
          'merge_alpha': Key(float, 'Streaming: alpha, weight of local params in the merge',
                             'in [0, 1]'),
          'eager': Key(bool, 'Streaming: eager updates (arXiv 2502.12996)')},
    # 2 fragments (embeddings and norms; the blocks): one syncs every 2 steps, tau 1.
    example=dict(sync_every=4, num_fragments=1, overlap_steps=1), carrier='all-reduce')
