"""Streaming DiLoCo: fragments synced in turn, overlapped and 4-bit quantized.

A composition of the engine's policies (`loco.core.sync_plan`, `loco.core.merge`):

  fragments  transformer blocks cut into P fragments, strided (the paper's default) or
  schedule   sequential, one fragment syncing every H/F steps: `sync_plan.streaming`
             (its module docstring has the details, and MaxText's and torchft's
             conventions).
  overlap    The pseudo-gradient is taken at the sync step and merged tau steps later
             (MaxText's convention; torchft takes it tau steps before its merge step:
             same staleness, offsets shifted by tau, REFERENCES §6.4); tau < H // F:
             `merge.delayed(tau, alpha)`, or `merge.eager(tau, alpha)`.

Bytes are what the link counts (the quantized payload plus per-tensor scales for the
compressed all-reduce), for the synced fragment only, on its sync step; the `fragment`
and `overlap` of `StepInfo.wire` tell the network clock that this traffic is due by the
end of step s + tau.
"""

import optax

from loco import comm
from loco.comm import compress
from loco.core import merge
from loco.algorithms import optim
from loco.core import sync_plan
from loco.algorithms.spec import AlgorithmSpec, Key
from loco.core.engine import Algorithm, local_updates
from loco.errors import ConfigError


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
      4-bit float), 'none' (transport_dtype) or any of `loco.comm.compress.CODECS`.
    transport_dtype: dtype on the wire when compression is 'none'.
    eager: eager updates (arXiv 2502.12996): merge at once with a local estimate of
      the average, corrected when the average arrives (`merge.eager`).
    outer_optimizer: 'nesterov', 'sgd', 'heavy_ball' or 'adam'.
    outer_lr: outer learning rate (the paper's 0.4; DiLoCo's 0.7 as a key).
    outer_momentum: outer momentum (0.9).
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm` whose `StepInfo.wire` has `fragment` and `overlap` set.

  References:
    Douillard et al., arXiv 2501.18512 (Streaming DiLoCo); Kale et al., arXiv
    2502.12996 (eager updates).
  """
  if not isinstance(eager, bool):
    raise ConfigError(f'algorithm.eager must be True or False, got {eager!r}.')
  plan = sync_plan.streaming(sync_every, num_fragments, layers_per_fragment=layers_per_fragment,
                             fragment_pattern=fragment_pattern, non_block=non_block)
  policy = (merge.eager if eager else merge.delayed)(overlap_steps, merge_alpha)
  optimizer = optim.outer_optimizer(outer_optimizer, outer_lr, outer_momentum)
  link = (comm.all_reduce_mean(transport_dtype) if compression == 'none' else
          comm.compressed_all_reduce_mean(compress.by_name(compression)))
  if num_fragments is not None:   # fail early; the tree may add a non-block fragment
    sync_plan.check_schedule(sync_plan.sync_offsets(num_fragments, sync_every), sync_every,
                             policy.delay)
  return local_updates(inner, (link, optimizer), plan, merge=policy, mesh=mesh)


STREAMING_DILOCO = AlgorithmSpec(
    streaming_diloco,
    keys={'num_fragments': Key(int, 'Streaming: P block fragments (None: one per block)', '>= 1'),
          'layers_per_fragment': Key(int, 'Streaming: blocks per fragment, instead of P', '>= 1'),
          'fragment_pattern': Key(str, 'Streaming: strided | sequential blocks per fragment'),
          'non_block': Key(str, 'Streaming: embeddings/norm/head fragment: own | first'),
          'overlap_steps': Key(int, 'Streaming: tau, steps from a sync to its merge', '>= 0'),
          'merge_alpha': Key(float, 'Streaming: alpha, weight of local params in the merge',
                             'in [0, 1)', why=(
                                 'alpha weighs the local parameters in the merge, so alpha '
                                 '= 1 never adopts a synced fragment: the workers train '
                                 'independent models, averaged only at the end (0.5 is the '
                                 "paper's, 0 adopts the synced fragment whole).")),
          'eager': Key(bool, 'Streaming: eager updates (arXiv 2502.12996)')},
    # 2 fragments (embeddings and norms; the blocks): one syncs every 2 steps, tau 1.
    example=dict(sync_every=4, num_fragments=1, overlap_steps=1), carrier='all-reduce',
    simulated_as={'streaming_diloco': 'the E3M0 pseudo-gradient is summed by a dense float32 '
                                      'all-reduce of its rounded values; the wire record '
                                      'counts 4 bits a value'})
