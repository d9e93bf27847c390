"""Optimizers shared by all algorithms: the named inner chains (`optimizer.name`) and
named outer optimizers."""

import dataclasses

import jax
import jax.numpy as jnp
import optax
from optax import contrib

from loco.errors import ConfigError
from loco.model import muon_dimensions, weight_decay_mask


INNER_OPTIMIZERS = ('adamw', 'muon', 'sgd', 'signsgd')


def check_name(name: str | None) -> None:
  """Raises a one-sentence ConfigError unless `name` is None or an inner optimizer's."""
  if name is not None and name not in INNER_OPTIMIZERS:
    raise ConfigError(f'optimizer.name must be one of {", ".join(INNER_OPTIMIZERS)}, '
                      f'got {name!r}.')


@dataclasses.dataclass(frozen=True)
class InnerConfig:
  """The inner optimizer, configured once for every algorithm (`optimizer.*`): its kind,
  warm-up + cosine schedule, clipping and decay; its ranges are checked with the config
  (`loco.configs.CONSTRAINTS`)."""
  lr: float = 3e-3              # peak learning rate
  warmup_steps: int = 50        # linear warm-up from 0 to `lr`
  decay_steps: int = 1000       # cosine decay length after warm-up (usually the run's steps)
  final_lr_frac: float = 0.1    # the cosine ends at lr * final_lr_frac
  b1: float = 0.9               # Adam b1; Muon's and SGD's momentum
  b2: float = 0.95              # Adam b2 (Muon: its Adam fallback's)
  eps: float = 1e-8
  weight_decay: float = 0.1     # decoupled, applied to matrices only (not norms)
  clip_norm: float = 1.0        # global-norm gradient clipping per worker; 0 disables
  name: str = 'adamw'           # one of INNER_OPTIMIZERS

  def __post_init__(self):
    check_name(self.name)


def schedule(cfg: InnerConfig) -> optax.Schedule:
  """Linear warm-up from 0 to `lr`, then cosine decay to `lr * final_lr_frac`. A traced
  `lr` (runs batched as an axis, `loco.run.run_axis`) scales the unit schedule instead, the
  same function up to rounding (optax's schedule branches on its peak in Python)."""
  if not isinstance(cfg.lr, (int, float)):
    unit = dataclasses.replace(cfg, lr=1.0)
    return lambda count: cfg.lr * schedule(unit)(count)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
      decay_steps=cfg.warmup_steps + cfg.decay_steps,
      end_value=cfg.lr * cfg.final_lr_frac)


def inner_optimizer(cfg: InnerConfig) -> optax.GradientTransformation:
  """Per-worker clip -> the optimizer `cfg.name` with warm-up and cosine decay; weight
  decay (decoupled, scaled by the schedule) on the model's matrices only
  (`model.weight_decay_mask`: the DiLoCo / Chinchilla recipe).

  - adamw: AdamW (b1, b2, eps).
  - muon: Muon on the model's hidden matrices (`model.muon_dimensions`: q, k, v, the
    attention output, the MLP; Nesterov momentum b1, Newton-Schulz orthogonalized);
    the other leaves (embedding, head, norms) take its Adam fallback (b1, b2, eps),
    decayed by the same mask.
  - sgd: SGD with momentum b1 (0: plain).
  - signsgd: the sign of the gradient times the schedule (DeMo's update rule).

  References:
    Loshchilov & Hutter, arXiv 1711.05101 (AdamW); DiLoCo, arXiv 2311.08105 (inner
    recipe); Jordan et al. 2024, Liu et al., arXiv 2502.16982 (Muon); Bernstein et al.,
    arXiv 1802.04434 (signSGD); Peng et al., arXiv 2411.19870 (DeMo).
  """
  clip = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
  lr = schedule(cfg)
  decay = optax.add_decayed_weights(cfg.weight_decay, weight_decay_mask)
  if cfg.name == 'adamw':
    step = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                       weight_decay=cfg.weight_decay, mask=weight_decay_mask)
  elif cfg.name == 'muon':
    # optax's Adam fallback decays every leaf it gets or none: it gets none here, and
    # the fallback's matrices (the embedding, a head) are decayed after it.
    step = optax.chain(
        optax.contrib.muon(lr, beta=cfg.b1, eps=cfg.eps, weight_decay=cfg.weight_decay,
                           weight_decay_mask=weight_decay_mask, adam_b1=cfg.b1,
                           adam_b2=cfg.b2, muon_weight_dimension_numbers=muon_dimensions),
        _scheduled_decay(cfg.weight_decay, lr, _not_muon_matrix))
  elif cfg.name == 'sgd':
    momentum = [optax.trace(cfg.b1)] if cfg.b1 > 0 else []
    step = optax.chain(*momentum, decay, optax.scale_by_learning_rate(lr))
  else:
    step = optax.chain(optax.scale_by_sign(), decay, optax.scale_by_learning_rate(lr))
  return optax.chain(*clip, step)


def _not_muon_matrix(params):
  """Leaves Muon leaves to its Adam fallback that the decay mask still decays."""
  dims = jax.tree.leaves(muon_dimensions(params),
                         is_leaf=lambda x: x is None or isinstance(x, contrib.MuonDimensionNumbers))
  leaves, treedef = jax.tree.flatten(params)
  return jax.tree.unflatten(treedef, [d is None and p.ndim >= 2 for d, p in zip(dims, leaves)])


def _scheduled_decay(rate: float, lr: optax.Schedule, mask) -> optax.GradientTransformation:
  """`u <- u - lr(t) * rate * p` on the leaves of `mask` (decoupled weight decay)."""

  def init(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update(updates, state, params=None):
    scale = -lr(state.count) * rate
    updates = jax.tree.map(
        lambda u, p, on: (u + scale * p).astype(u.dtype) if on else u,
        updates, params, mask(params))
    return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init, update)


OUTER_OPTIMIZERS = ('sgd', 'nesterov', 'heavy_ball', 'adam')


def positive(x) -> bool:
  """Whether a knob that switches a state on (a momentum) is > 0; a traced value
  (`loco.run.run_axis`, whose batched runs agree on it) counts as positive."""
  return True if isinstance(x, jax.core.Tracer) else x > 0


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
  on = positive(momentum)
  if kind == 'nesterov':
    return optax.sgd(lr, momentum=momentum if on else None, nesterov=on)
  if kind == 'heavy_ball':
    return optax.sgd(lr, momentum=momentum if on else None)
  return optax.adam(lr, b1=momentum, b2=b2)
