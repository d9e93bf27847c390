"""DDP: mean the gradients over workers every step, then one inner step."""

import optax

from loco import comm
from loco.algorithms.spec import AlgorithmSpec
from loco.core.engine import Algorithm, local_updates


def ddp(inner: optax.GradientTransformation, *, transport_dtype: str = 'float32',
        mesh=None) -> Algorithm:
  """Data-parallel training: all-reduce the gradients, then the inner optimizer.

  Every worker holds the same params; with M workers at batch b this equals one
  worker at batch M*b. The quality baseline.

  Args:
    inner: the per-worker inner optimizer (AdamW); it sees the averaged gradient.
    transport_dtype: dtype of the gradients on the wire.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Li et al., arXiv 2006.15704 (PyTorch DDP).
  """
  return local_updates(optax.chain(comm.all_reduce_mean(transport_dtype), inner),
                       None, 1, mesh=mesh)


DDP = AlgorithmSpec(ddp, example={}, carrier='all-reduce')
