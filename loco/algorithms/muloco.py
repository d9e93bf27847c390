"""MuLoCo: DiLoCo whose inner optimizer is Muon."""

import optax

from loco.algorithms.diloco import diloco
from loco.algorithms.spec import AlgorithmSpec
from loco.core.engine import Algorithm


def muloco(inner: optax.GradientTransformation, *, sync_every: int = 30,
           outer_optimizer: str = 'nesterov', outer_lr: float = 0.7,
           outer_momentum: float = 0.9, transport_dtype: str = 'float32',
           compression: str = 'none', mesh=None) -> Algorithm:
  """MuLoCo: DiLoCo's rounds with Muon inner steps (the registry's default inner).

  The outer step is DiLoCo's (Nesterov on the averaged pseudo-gradients); what
  changes is the inner optimizer, Muon (momentum orthogonalized by Newton-Schulz on
  the weight matrices, AdamW on the rest: `optax.contrib.muon`), which the paper finds
  gives better-aligned pseudo-gradients as the worker count grows.

  Args:
    inner: the per-worker inner optimizer (Muon, from `optimizer.name`).
    sync_every: H, inner steps per round.
    outer_optimizer: the outer optimizer (see `optim.outer_optimizer`).
    outer_lr: outer learning rate.
    outer_momentum: outer momentum.
    transport_dtype: dtype of pseudo-gradients on the wire.
    compression: a value codec for a compressed all-reduce, or 'none'.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Therien et al., arXiv 2505.23725 (MuLoCo); Jordan et al. 2024 (Muon).
  """
  return diloco(inner, sync_every=sync_every, outer_optimizer=outer_optimizer,
                outer_lr=outer_lr, outer_momentum=outer_momentum,
                transport_dtype=transport_dtype, compression=compression, mesh=mesh)


MULOCO = AlgorithmSpec(muloco, example=dict(sync_every=2), carrier='all-reduce', inner='muon')
