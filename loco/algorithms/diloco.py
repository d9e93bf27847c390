"""DiLoCo and Local SGD: H local AdamW steps, then an all-reduced outer step."""

import optax

from loco import comm
from loco.comm import compress
from loco.algorithms import optim
from loco.algorithms.spec import AlgorithmSpec, Key
from loco.core.engine import Algorithm, local_updates
from loco.errors import ConfigError


def diloco(inner: optax.GradientTransformation, *, sync_every: int = 500,
           outer_optimizer: str = 'nesterov', outer_lr: float = 0.7,
           outer_momentum: float = 0.9, transport_dtype: str = 'float32',
           compression: str = 'none', prune: float = 0.0,
           outer: optax.GradientTransformation | None = None, mesh=None) -> Algorithm:
  """DiLoCo: every H inner steps, average pseudo-gradients and take an outer step.

  `Delta = mean_i(theta - phi_i)`, then the outer optimizer (Nesterov by default:
  `v <- mu v + Delta`, `theta <- theta - eta (Delta + mu v)`). Inner AdamW moments are
  never reset.

  Args:
    inner: the per-worker inner optimizer.
    sync_every: H, inner steps per round (the paper's 500; scale down for tiny runs).
    outer_optimizer: 'nesterov', 'sgd', 'heavy_ball' or 'adam' (the paper's ablation).
    outer_lr: outer learning rate eta (0.7).
    outer_momentum: outer momentum mu (0.9).
    transport_dtype: dtype of pseudo-gradients on the wire.
    compression: 'none', or a codec of `loco.comm.compress.CODECS` ('e3m0', 'e4m3',
      'int8', ...) for a compressed all-reduce (FP32 reduction; overrides
      transport_dtype).
    prune: the fraction of each pseudo-gradient tensor pruned by magnitude before the
      workers' values are merged by sign (`comm.ties_mean`; the paper's Table 6
      ablation); 0: the plain mean.
    outer: any optax chain to use as the outer optimizer instead of the named one.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    Douillard et al., arXiv 2311.08105.
  """
  if outer is None:
    outer = optim.outer_optimizer(outer_optimizer, outer_lr, outer_momentum)
  if not 0.0 <= prune < 1.0:
    raise ConfigError(f'algorithm.prune must be in [0, 1), got {prune!r}.')
  if prune and compression != 'none':
    raise ConfigError('algorithm.prune sends float32 values; it does not combine with '
                      f'algorithm.compression={compression!r}.')
  if prune:
    link = comm.ties_mean(1.0 - prune)
  else:
    link = (comm.all_reduce_mean(transport_dtype) if compression == 'none' else
            comm.compressed_all_reduce_mean(compress.by_name(compression)))
  return local_updates(inner, optax.chain(link, outer), sync_every, mesh=mesh)


def local_sgd(inner: optax.GradientTransformation, *, sync_every: int = 50,
              transport_dtype: str = 'float32', mesh=None) -> Algorithm:
  """Local SGD / FedAvg: DiLoCo with plain outer SGD at learning rate 1 (model averaging).

  References:
    McMahan et al., arXiv 1602.05629 (FedAvg); Stich, arXiv 1805.09767 (Local SGD).
  """
  return diloco(inner, sync_every=sync_every, transport_dtype=transport_dtype,
                outer=optax.sgd(1.0), mesh=mesh)


DILOCO = AlgorithmSpec(
    diloco, keys={'prune': Key(float, 'DiLoCo: fraction of each outer gradient pruned by '
                               'magnitude, merged by sign (TIES; 0: none)', 'in [0, 1)')},
    example=dict(sync_every=2), carrier='all-reduce')
LOCAL_SGD = AlgorithmSpec(local_sgd, example=dict(sync_every=2), carrier='all-reduce')
