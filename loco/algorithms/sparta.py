"""SPARTA and SPARTA-DiLoCo: a shared random share of the params averaged every step."""

import optax

from loco.algorithms import optim
from loco.algorithms.diloco import diloco
from loco.algorithms.spec import AlgorithmSpec, Key
from loco.comm.sparta import random_parameter_average
from loco.core.engine import Algorithm, local_updates


def sparta(inner: optax.GradientTransformation, *, fraction: float = 0.005,
           transport_dtype: str = 'float32', mesh=None) -> Algorithm:
  """SPARTA: each worker steps on its own gradient, then a random fraction p of every
  tensor's coordinates (the same on all workers) is averaged across workers.

  Args:
    inner: the per-worker inner optimizer (AdamW).
    fraction: p, the expected share of each tensor averaged per step (0.005).
    transport_dtype: dtype of the averaged values on the wire.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    SPARTA (sparse parameter averaging) as in EXO Gym's `SPARTAStrategy`.
  """
  link = random_parameter_average(fraction, dtype=transport_dtype)
  return local_updates(optax.chain(inner, link), None, 1, mesh=mesh)


def sparta_diloco(inner: optax.GradientTransformation, *, fraction: float = 0.005,
                  sync_every: int = 100, outer_optimizer: str = 'nesterov',
                  outer_lr: float = 0.7, outer_momentum: float = 0.9,
                  transport_dtype: str = 'float32', mesh=None) -> Algorithm:
  """SPARTA inside DiLoCo: SPARTA's averaging every step, DiLoCo's outer step every H.

  Args:
    inner: the per-worker inner optimizer (AdamW).
    fraction: p, SPARTA's expected share of each tensor averaged per step (0.005).
    sync_every: H, inner steps per DiLoCo round (EXO Gym: 100).
    outer_optimizer: DiLoCo's outer optimizer (see `optim.outer_optimizer`).
    outer_lr: outer learning rate (0.7).
    outer_momentum: outer momentum (0.9).
    transport_dtype: dtype on the wire, for both links.
    mesh: optional device mesh with a "workers" axis.

  Returns:
    An `Algorithm`.

  References:
    EXO Gym's `SPARTADiLoCoStrategy`; DiLoCo, arXiv 2311.08105.
  """
  link = random_parameter_average(fraction, dtype=transport_dtype)
  return diloco(optax.chain(inner, link), sync_every=sync_every,
                outer=optim.outer_optimizer(outer_optimizer, outer_lr, outer_momentum),
                transport_dtype=transport_dtype, mesh=mesh)


_FRACTION = {'fraction': Key(float, 'SPARTA: expected share of each tensor averaged per step',
                             'in (0, 1]')}
_SUBSET = ('the shared random subset is averaged by a dense float32 all-reduce of the '
           'masked tensors; the wire record counts only the subset\'s values')
SPARTA = AlgorithmSpec(sparta, keys=_FRACTION, example=dict(fraction=0.1), carrier='all-reduce',
                       simulated_as={'sparta': _SUBSET})
SPARTA_DILOCO = AlgorithmSpec(sparta_diloco, keys=_FRACTION,
                              example=dict(fraction=0.1, sync_every=2), carrier='all-reduce',
                              simulated_as={'sparta_diloco': _SUBSET})
