"""Optimizers shared by all algorithms: the inner AdamW chain and named outer optimizers."""

import dataclasses

import optax

from loco.errors import ConfigError
from loco.model import weight_decay_mask


@dataclasses.dataclass(frozen=True)
class InnerConfig:
  """The inner optimizer, configured once for every algorithm (AdamW, warm-up + cosine);
  its ranges are checked with the config (`loco.configs.CONSTRAINTS`)."""
  lr: float = 3e-3              # peak learning rate
  warmup_steps: int = 50        # linear warm-up from 0 to `lr`
  decay_steps: int = 1000       # cosine decay length after warm-up (usually the run's steps)
  final_lr_frac: float = 0.1    # the cosine ends at lr * final_lr_frac
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1     # decoupled, applied to matrices only (not norms)
  clip_norm: float = 1.0        # global-norm gradient clipping per worker; 0 disables


def schedule(cfg: InnerConfig) -> optax.Schedule:
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
      decay_steps=cfg.warmup_steps + cfg.decay_steps,
      end_value=cfg.lr * cfg.final_lr_frac)


def inner_optimizer(cfg: InnerConfig) -> optax.GradientTransformation:
  """Per-worker clip -> AdamW with warm-up and cosine decay; weight decay on the
  model's matrices only (`model.weight_decay_mask`: the DiLoCo / Chinchilla recipe).

  References:
    Loshchilov & Hutter, arXiv 1711.05101 (AdamW); DiLoCo, arXiv 2311.08105 (inner recipe).
  """
  clip = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
  return optax.chain(*clip, optax.adamw(schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                                        weight_decay=cfg.weight_decay, mask=weight_decay_mask))


OUTER_OPTIMIZERS = ('sgd', 'nesterov', 'heavy_ball', 'adam')


def outer_optimizer(kind: str, lr: float, momentum: float = 0.0,
                    b2: float = 0.99) -> optax.GradientTransformation:
  """A named outer optimizer applied to (averaged) pseudo-gradients.

  Args:
    kind: 'sgd' (plain, momentum ignored), 'nesterov', 'heavy_ball' or 'adam'
      (b1 = momentum, as in DiLoCo's outer-optimizer ablation).
    lr: outer learning rate.
    momentum: outer momentum (Nesterov / heavy-ball) or Adam's b1.
    b2: Adam's b2.

  Returns:
    An optax transformation.
  """
  if kind not in OUTER_OPTIMIZERS:
    raise ConfigError(f'algorithm.outer_optimizer must be one of {OUTER_OPTIMIZERS}, '
                      f'got {kind!r}.')
  if kind == 'sgd':
    return optax.sgd(lr)
  if kind == 'nesterov':
    return optax.sgd(lr, momentum=momentum or None, nesterov=momentum > 0)
  if kind == 'heavy_ball':
    return optax.sgd(lr, momentum=momentum or None)
  return optax.adam(lr, b1=momentum, b2=b2)
