"""DeMo: decoupled momentum, its fast components sent as DCT coefficients, a sign step."""

import optax

from loco import comm
from loco.comm import compress
from loco.algorithms.spec import AlgorithmSpec, Key
from loco.comm.compress.dct import dct_topk
from loco.core.engine import Algorithm, local_updates


def demo(inner: optax.GradientTransformation, *, compression_decay: float = 0.999,
         compression_topk: int = 32, compression_chunk: int = 64, mesh=None) -> Algorithm:
  """DeMo: every step, share only the fast components of each worker's momentum.

  Per worker and step: `m <- beta m + g` (beta = `compression_decay`), `q = DCT^-1
  (top-k of each tile's DCT of m)`, `m <- m - q`; the workers' q are all-gathered as
  DCT coefficients (indices and values), averaged per coefficient over the workers
  that sent it (DeMo's scatter-mean) and decoded once; the inner optimizer then steps
  on that average (DeMo: its sign, `theta <- theta - lr sign(.)`: the registry's
  'signsgd' inner). The momentum is error feedback with decay beta around
  `compress.dct_topk`. DeMo's code adds `lr * g` to m; here m adds g, which is the
  same update under a constant lr (top-k and the sign do not see a common scale) and
  weights the history by gradient, not by lr, under a schedule.

  Args:
    inner: the per-worker optimizer applied to the decoded average (sign-SGD).
    compression_decay: beta, the momentum's decay (DeMo: 0.999).
    compression_topk: DCT coefficients kept per tile (DeMo: 32).
    compression_chunk: the largest tile side (DeMo: 64: 32 of 4096 per 64 x 64 tile).
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Peng, Quesnelle & Kingma, arXiv 2411.19870 (DeMo, Algorithm 1).
  """
  codec = compress.error_feedback(dct_topk(compression_topk, compression_chunk),
                                  compression_decay)
  link = comm.sparse_all_gather_mean(codec, divide='contributors')
  return local_updates(optax.chain(link, inner), None, 1, mesh=mesh)


DEMO = AlgorithmSpec(
    demo,
    keys={'compression_decay': Key(float, "DeMo: the momentum's decay beta", 'in [0, 1)'),
          'compression_topk': Key(int, 'DeMo: DCT coefficients kept per tile', '>= 1'),
          'compression_chunk': Key(int, 'DeMo: the largest DCT tile side', '>= 1')},
    example=dict(compression_topk=4, compression_chunk=8), carrier='all-gather',
    inner='signsgd',
    simulated_as={'demo': 'the DCT coefficients are all-gathered as float32 values and '
                          'int32 indices; the wire record counts the packed indices and '
                          'the values at the transport dtype'})
