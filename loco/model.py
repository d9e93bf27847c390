"""Decoder-only Transformer LM in Flax NNX, used functionally.

The model is written as ordinary `nnx.Module`s, but the rest of loco only sees
the functional API below: `init_params` returns a static `GraphDef` and a plain
nested dict of float32 arrays, and `apply` / `loss_fn` rebuild the module with
`nnx.merge` inside the traced function. Plain dicts can be stacked on a leading
worker axis, vmapped, passed to optax and checkpointed with orbax.

Architecture: token embedding; `num_layers` pre-norm blocks (RMSNorm ->
causal multi-head attention with RoPE and optional QK-norm -> residual;
RMSNorm -> GELU or SwiGLU MLP -> residual); final RMSNorm; output head tied to
the embedding (`logits = h @ E^T`) or untied. No biases, no dropout.

Init: every weight matrix ~ normal(0.02) (GPT-2 / nanoGPT), except the two
projections that write into the residual stream (attention output, MLP output),
which use normal(0.02 / sqrt(2 * num_layers)) so the residual variance at init
does not grow with depth. Norm scales start at 1.

Parameter tree (keys of the pure dict)::

  embed:       (vocab_size, d_model)
  blocks: {i:  (i = 0 .. num_layers - 1, int keys from `nnx.List`)
    attn_norm: {scale: (d_model,)}
    attn: {qkv: (d_model, 3, num_heads, head_dim),
           out: (num_heads, head_dim, d_model),
           [q_norm: {scale: (head_dim,)}, k_norm: {scale: (head_dim,)}]}
    mlp_norm:  {scale: (d_model,)}
    mlp: {w_in: (d_model, d_ff), or (d_model, 2, d_ff) for swiglu,
          w_out: (d_ff, d_model)}
  }
  final_norm:  {scale: (d_model,)}
  [head:       (d_model, vocab_size)]   only when tie_embeddings is False

When restoring these params with orbax, pass an abstract target (for example
from `jax.eval_shape`): restoring without one turns the int block keys into
strings.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from loco.errors import ConfigError

PyTree = Any

_MLPS = ('gelu', 'swiglu')
_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
_INIT_STD = 0.02


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of the Transformer; frozen so it can be a static arg."""

  vocab_size: int = 256
  d_model: int = 256
  num_layers: int = 4
  num_heads: int = 4
  d_ff: int = 1024  # MLP hidden width; for swiglu the gated hidden width.
  max_seq_len: int = 1024
  mlp: str = 'gelu'  # 'gelu' | 'swiglu'
  qk_norm: bool = False
  z_loss: float = 0.0  # Coefficient of the mean (log Z)^2 term, e.g. 1e-4.
  tie_embeddings: bool = True
  rope_theta: float = 10000.0
  dtype: str = 'float32'  # Compute dtype; params are always float32.
  # Per-head width; None means d_model // num_heads. Chinchilla-style models
  # (the DiLoCo paper's 60M/150M) decouple it from d_model: 16 heads x 64 at
  # d_model 896.
  head_dim: int | None = None

  def __post_init__(self):
    for key in ('vocab_size', 'd_model', 'num_layers', 'num_heads', 'd_ff',
                'max_seq_len', 'head_dim'):
      value = getattr(self, key)
      if key == 'head_dim' and value is None:
        continue
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f'model.{key} must be a positive integer'
                          f'{" or None" if key == "head_dim" else ""}, got {value!r}.')
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ConfigError(
          f'model.d_model ({self.d_model}) must be divisible by '
          f'model.num_heads ({self.num_heads}) when model.head_dim is None.')
    if self.resolved_head_dim % 2:
      raise ConfigError(
          f'The per-head width (model.head_dim or d_model // num_heads) must '
          f'be even for RoPE, got {self.resolved_head_dim}.')
    for key, allowed in (('mlp', _MLPS), ('dtype', tuple(_DTYPES))):
      if getattr(self, key) not in allowed:
        raise ConfigError(f'model.{key} must be one of {allowed}, got '
                          f'{getattr(self, key)!r}.')
    if not (self.z_loss >= 0.0 and self.rope_theta > 0.0):
      raise ConfigError(f'model.z_loss must be >= 0 and model.rope_theta > 0, got '
                        f'{self.z_loss!r} and {self.rope_theta!r}.')

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else (
        self.d_model // self.num_heads)

  @property
  def compute_dtype(self) -> jnp.dtype:
    return _DTYPES[self.dtype]


# Paper-scale presets follow the DiLoCo paper's Chinchilla-style models
# (arXiv 2311.08105: layers / d_model / heads / key-value size, vocab 32000):
# 60m 3/896/16/64, 150m 12/896/16/64, 400m 12/1536/12/128; '1b' is a
# 24-layer, d_model 2048 model of the kind used in the DiLoCo scaling-law study
# (arXiv 2503.09799). d_ff = 4 * d_model. Output heads are tied: the parameter
# counts then match the names (59M, 150M, 389M, 1.27B). QK-norm and z-loss
# 1e-4 are on for these: both are cheap and guard the larger learning rates of
# long runs against attention-logit and output-logit blow-ups; the CPU presets
# keep them off so they match the plain reference model of STACK-NOTES.
PRESETS: dict[str, dict[str, Any]] = {
    'nano': dict(vocab_size=256, d_model=32, num_layers=2, num_heads=2,
                 d_ff=64, max_seq_len=128),
    # 'micro': cheap rounds for claim-checking sweeps (experiments/micro.py): 0.4M
    # weights, about 30k tokens/s for 8 workers on 2 CPU cores.
    'micro': dict(vocab_size=256, d_model=128, num_layers=2, num_heads=4,
                  d_ff=512, max_seq_len=1024),
    'tiny': dict(vocab_size=256, d_model=256, num_layers=4, num_heads=4,
                 d_ff=1024, max_seq_len=1024),
    '60m': dict(vocab_size=32000, d_model=896, num_layers=3, num_heads=16,
                head_dim=64, d_ff=3584, max_seq_len=1024, qk_norm=True,
                z_loss=1e-4),
    '150m': dict(vocab_size=32000, d_model=896, num_layers=12, num_heads=16,
                 head_dim=64, d_ff=3584, max_seq_len=1024, qk_norm=True,
                 z_loss=1e-4),
    '400m': dict(vocab_size=32000, d_model=1536, num_layers=12, num_heads=12,
                 head_dim=128, d_ff=6144, max_seq_len=1024, qk_norm=True,
                 z_loss=1e-4),
    '1b': dict(vocab_size=32000, d_model=2048, num_layers=24, num_heads=16,
               head_dim=128, d_ff=8192, max_seq_len=1024, qk_norm=True,
               z_loss=1e-4),
}


def model_config(preset: str, **overrides: Any) -> ModelConfig:
  """Returns the `ModelConfig` of a named preset with `overrides` applied.

  Args:
    preset: one of `PRESETS`.
    **overrides: `ModelConfig` fields to replace.

  Returns:
    The validated config.
  """
  if preset not in PRESETS:
    raise ConfigError(
        f'model preset must be one of {tuple(PRESETS)}, got {preset!r}.')
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ConfigError(
        f'Unknown model config keys {unknown}; allowed keys are '
        f'{sorted(fields)}.')
  return ModelConfig(**{**PRESETS[preset], **overrides})


class _NormalDraws:
  """Hands out scaled normal draws as params: slices of one draw for small models,
  one draw per tensor for large ones.

  One RNG op for the whole model compiles about 5x faster on CPU than one per
  tensor (each threefry call is a large unrolled HLO), which is most of the init
  time of small models; its cost is a transient copy of the weights that a sharded
  init cannot split (XLA rematerialises the slices in full on every device). Above
  `PER_TENSOR_FROM` weights (the 150m and 1b presets) each tensor is drawn from its
  own key (`fold_in(key, index)`), so every device draws only its shard. The rule
  depends on the model alone: the same config gives the same weights on any mesh.
  """

  PER_TENSOR_FROM = 1 << 25      # 33.5M weights

  def __init__(self, key: jax.Array, total: int):
    self._key, self._total = key, total
    self._per_tensor = total >= self.PER_TENSOR_FROM
    self._z = None if self._per_tensor else jax.random.normal(key, (total,), jnp.float32)
    self._offset, self._count = 0, 0

  def param(self, shape: tuple[int, ...], std: float) -> nnx.Param:
    size = math.prod(shape)
    if self._per_tensor:
      z = jax.random.normal(jax.random.fold_in(self._key, self._count), shape, jnp.float32)
    else:
      z = self._z[self._offset:self._offset + size].reshape(shape)
    self._offset += size
    self._count += 1
    return nnx.Param(std * z)

  def check_used_up(self) -> None:
    assert self._offset == self._total, (self._offset, self._total)


def rope(x_BxLxHxK: jax.Array, positions_L: jax.Array,
         theta: float) -> jax.Array:
  """Rotary position embedding (rotate-half convention, arXiv 2104.09864)."""
  half = x_BxLxHxK.shape[-1] // 2
  inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_LxK = positions_L.astype(jnp.float32)[:, None] * inv_freq[None, :]
  # Broadcast over batch and heads: (L, 1, half).
  sin = jnp.sin(angle_LxK)[:, None, :].astype(x_BxLxHxK.dtype)
  cos = jnp.cos(angle_LxK)[:, None, :].astype(x_BxLxHxK.dtype)
  x1, x2 = x_BxLxHxK[..., :half], x_BxLxHxK[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class RMSNorm(nnx.Module):
  """RMSNorm with a learned scale; statistics in float32 for bf16 stability."""

  def __init__(self, dim: int, *, eps: float = 1e-6):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * inv * self.scale[...]).astype(x.dtype)


class Attention(nnx.Module):
  """Causal multi-head self-attention with RoPE and optional QK-norm."""

  def __init__(self, cfg: ModelConfig, *, draws: _NormalDraws):
    self.cfg = cfg
    d, h, k = cfg.d_model, cfg.num_heads, cfg.resolved_head_dim
    # One fused projection: a single large matmul is faster than three on CPU.
    self.qkv = draws.param((d, 3, h, k), _INIT_STD)
    self.out = draws.param((h, k, d), _INIT_STD / math.sqrt(2 * cfg.num_layers))
    if cfg.qk_norm:
      self.q_norm = RMSNorm(k)
      self.k_norm = RMSNorm(k)

  def __call__(self, x_NxD: jax.Array, batch_size: int) -> jax.Array:
    cfg = self.cfg
    dtype = cfg.compute_dtype
    d, h, k = cfg.d_model, cfg.num_heads, cfg.resolved_head_dim
    seq_len = x_NxD.shape[0] // batch_size
    qkv = x_NxD @ self.qkv[...].astype(dtype).reshape(d, 3 * h * k)
    qkv_BxLx3xHxK = qkv.reshape(batch_size, seq_len, 3, h, k)
    q_BxLxHxK = qkv_BxLx3xHxK[:, :, 0]
    k_BxLxHxK = qkv_BxLx3xHxK[:, :, 1]
    v_BxLxHxK = qkv_BxLx3xHxK[:, :, 2]
    if cfg.qk_norm:
      q_BxLxHxK = self.q_norm(q_BxLxHxK)
      k_BxLxHxK = self.k_norm(k_BxLxHxK)
    positions_L = jnp.arange(seq_len)
    q_BxLxHxK = rope(q_BxLxHxK, positions_L, cfg.rope_theta)
    k_BxLxHxK = rope(k_BxLxHxK, positions_L, cfg.rope_theta)
    q_BxLxHxK = q_BxLxHxK * jnp.asarray(1.0 / math.sqrt(k), dtype)
    scores_BxHxLxL = jnp.einsum('bqhk,bshk->bhqs', q_BxLxHxK,
                                k_BxLxHxK).astype(jnp.float32)
    causal_LxL = jnp.tril(jnp.ones((seq_len, seq_len), jnp.bool_))
    # A large finite negative (not -inf) keeps the masked softmax NaN-free.
    scores_BxHxLxL = jnp.where(causal_LxL, scores_BxHxLxL,
                               jnp.finfo(jnp.float32).min)
    probs_BxHxLxL = jax.nn.softmax(scores_BxHxLxL, axis=-1).astype(dtype)
    ctx_BxLxHxK = jnp.einsum('bhqs,bshk->bqhk', probs_BxHxLxL, v_BxLxHxK)
    return (ctx_BxLxHxK.reshape(batch_size * seq_len, h * k)
            @ self.out[...].astype(dtype).reshape(h * k, d))


class MLP(nnx.Module):
  """GELU (tanh approximation) or SwiGLU (arXiv 2002.05202) feed-forward."""

  def __init__(self, cfg: ModelConfig, *, draws: _NormalDraws):
    self.cfg = cfg
    d, f = cfg.d_model, cfg.d_ff
    # SwiGLU's gate and up projections are fused into one matmul.
    in_shape = (d, 2, f) if cfg.mlp == 'swiglu' else (d, f)
    self.w_in = draws.param(in_shape, _INIT_STD)
    self.w_out = draws.param((f, d), _INIT_STD / math.sqrt(2 * cfg.num_layers))

  def __call__(self, x_NxD: jax.Array) -> jax.Array:
    cfg = self.cfg
    dtype = cfg.compute_dtype
    w_in = self.w_in[...].astype(dtype)
    if cfg.mlp == 'swiglu':
      gate_up_Nx2xF = (x_NxD @ w_in.reshape(cfg.d_model, 2 * cfg.d_ff)).reshape(
          -1, 2, cfg.d_ff)
      hidden_NxF = jax.nn.silu(gate_up_Nx2xF[:, 0]) * gate_up_Nx2xF[:, 1]
    else:
      hidden_NxF = jax.nn.gelu(x_NxD @ w_in, approximate=True)
    return hidden_NxF @ self.w_out[...].astype(dtype)


class Block(nnx.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, *, draws: _NormalDraws):
    self.attn_norm = RMSNorm(cfg.d_model)
    self.attn = Attention(cfg, draws=draws)
    self.mlp_norm = RMSNorm(cfg.d_model)
    self.mlp = MLP(cfg, draws=draws)

  def __call__(self, x_NxD: jax.Array, batch_size: int) -> jax.Array:
    x_NxD = x_NxD + self.attn(self.attn_norm(x_NxD), batch_size)
    return x_NxD + self.mlp(self.mlp_norm(x_NxD))


class Transformer(nnx.Module):
  """Decoder-only LM: int tokens (B, L) -> float32 logits (B, L, V)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    head = 0 if cfg.tie_embeddings else cfg.d_model * cfg.vocab_size
    draws = _NormalDraws(rngs.params(), matmul_param_count(cfg) + head)
    self.embed = draws.param((cfg.vocab_size, cfg.d_model), _INIT_STD)
    self.blocks = nnx.List(
        [Block(cfg, draws=draws) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.d_model)
    if not cfg.tie_embeddings:
      self.head = draws.param((cfg.d_model, cfg.vocab_size), _INIT_STD)
    draws.check_used_up()

  def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
    cfg = self.cfg
    batch_size, seq_len = tokens_BxL.shape
    if seq_len > cfg.max_seq_len:
      raise ConfigError(
          f'Sequence length {seq_len} exceeds model.max_seq_len '
          f'({cfg.max_seq_len}); lower the data seq_len or raise max_seq_len.')
    dtype = cfg.compute_dtype
    embed_VxD = self.embed[...].astype(dtype)
    # The residual stream is kept as (tokens, d_model), N = B * L: with a 2-D
    # activation XLA:CPU computes weight gradients without materialising a
    # transposed copy of the (N, d_ff) activations, which made the step 1.5x
    # slower when the activations were (B, L, d).
    x_NxD = jnp.take(embed_VxD, tokens_BxL.reshape(-1), axis=0)
    for block in self.blocks:
      x_NxD = block(x_NxD, batch_size)
    x_NxD = self.final_norm(x_NxD)
    if cfg.tie_embeddings:
      logits_NxV = x_NxD @ embed_VxD.T
    else:
      logits_NxV = x_NxD @ self.head[...].astype(dtype)
    return logits_NxV.astype(jnp.float32).reshape(batch_size, seq_len, -1)


# Jitted because eager init dispatches (and compiles) one small op per
# parameter, which costs seconds even for the nano model.
@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: ModelConfig,
                key: jax.Array) -> tuple[nnx.GraphDef, PyTree]:
  """Initialises the model and splits it into a graphdef and pure params.

  Works under `jax.eval_shape(functools.partial(init_params, cfg), key)` for
  abstract init of paper-scale models (the GraphDef has no array leaves).

  Args:
    cfg: the model config.
    key: a PRNG key (typed or raw uint32).

  Returns:
    `(graphdef, params)`: the static structure for `apply`, and a nested dict
    of float32 arrays (see the module docstring for its keys).
  """
  model = Transformer(cfg, rngs=nnx.Rngs(params=key))
  graphdef, state = nnx.split(model, nnx.Param)
  return graphdef, state.to_pure_dict()


def apply(cfg: ModelConfig, graphdef: nnx.GraphDef, params: PyTree,
          tokens_BxL: jax.Array) -> jax.Array:
  """Returns float32 logits (B, L, V) of one model for int tokens (B, L)."""
  model = nnx.merge(graphdef, params)
  # The graphdef carries the config it was built with; a different `cfg` here
  # (say bfloat16 asked for, float32 built) would be silently ignored.
  if dataclasses.replace(model.cfg, z_loss=cfg.z_loss) != cfg:
    raise ConfigError(
        f'The model config {cfg} differs from the one the graphdef was built '
        f'with ({model.cfg}); call init_params with this config.')
  return model(tokens_BxL)


def loss_fn(cfg: ModelConfig, graphdef: nnx.GraphDef, params: PyTree,
            batch_BxLp1: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Next-token loss of one model on a batch of seq_len + 1 tokens.

  Args:
    cfg: the model config (its `z_loss` coefficient is used).
    graphdef: from `init_params`.
    params: one model's params (vmap over a leading worker axis for many).
    batch_BxLp1: int tokens; inputs are `[:, :-1]`, targets `[:, 1:]`.

  Returns:
    `(loss, aux)` with `loss = ce + z_loss`, `aux['ce']` the mean
    cross-entropy in nats/token and `aux['z_loss']` the added term
    `cfg.z_loss * mean(logsumexp(logits)^2)` (PaLM, arXiv 2204.02311).
  """
  log_z_BxL, target_logit_BxL = _log_z_and_target(cfg, graphdef, params, batch_BxLp1)
  ce = jnp.mean(log_z_BxL - target_logit_BxL)
  z_loss = cfg.z_loss * jnp.mean(jnp.square(log_z_BxL))
  return ce + z_loss, {'ce': ce, 'z_loss': z_loss}


def token_losses(cfg: ModelConfig, graphdef: nnx.GraphDef, params: PyTree,
                 batch_BxLp1: jax.Array) -> jax.Array:
  """Per-token cross-entropy (nats) of one model, float32 [B, L]: what an evaluation
  that keeps each window's loss (with its document) averages."""
  log_z_BxL, target_logit_BxL = _log_z_and_target(cfg, graphdef, params, batch_BxLp1)
  return log_z_BxL - target_logit_BxL


def _log_z_and_target(cfg, graphdef, params, batch_BxLp1):
  inputs_BxL, targets_BxL = batch_BxLp1[:, :-1], batch_BxLp1[:, 1:]
  logits_BxLxV = apply(cfg, graphdef, params, inputs_BxL)
  log_z_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
  target_logit_BxL = jnp.take_along_axis(
      logits_BxLxV, targets_BxL[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return log_z_BxL, target_logit_BxL


@functools.cache
def abstract_params(cfg: ModelConfig) -> PyTree:
  _, params = jax.eval_shape(
      functools.partial(init_params, cfg), jax.random.key(0))
  return params


def param_count(cfg: ModelConfig, *, non_embedding: bool = False) -> int:
  """Exact parameter count from the abstract param shapes (no allocation).

  Args:
    cfg: the model config.
    non_embedding: leave out the input embedding table (vocab_size x
      d_model); an untied output head is still counted (Kaplan et al.'s
      convention, arXiv 2001.08361).

  Returns:
    The number of scalar parameters.
  """
  total = sum(math.prod(leaf.shape)
              for leaf in jax.tree.leaves(abstract_params(cfg)))
  if non_embedding:
    total -= cfg.vocab_size * cfg.d_model
  return total


def matmul_param_count(cfg: ModelConfig) -> int:
  """Weights used in matmuls: the blocks' and the output head (tied or not)."""
  attn = cfg.d_model * 4 * cfg.num_heads * cfg.resolved_head_dim
  mlp = (3 if cfg.mlp == 'swiglu' else 2) * cfg.d_model * cfg.d_ff
  return cfg.num_layers * (attn + mlp) + cfg.d_model * cfg.vocab_size


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token (forward + backward), for MFU.

  `6 * matmul_param_count(cfg) + 12 * num_layers * num_heads * head_dim *
  seq_len`: 2 FLOPs per multiply-add forward and 4 backward for every weight
  in a matmul (block projections and the output head, which is a matmul even
  when tied; the embedding lookup is a gather and free), plus QK^T and AV,
  each 2 * seq_len * (heads * head_dim) FLOPs per token forward, times 3 for
  forward + backward. The full (unmasked) score matrix is counted because it
  is what the kernel computes. Norms, softmax and the loss are left out
  (Kaplan et al., arXiv 2001.08361; PaLM appendix B, arXiv 2204.02311).

  Args:
    cfg: the model config.
    seq_len: tokens per sequence.

  Returns:
    FLOPs per trained token.
  """
  attention = 12 * cfg.num_layers * cfg.num_heads * cfg.resolved_head_dim * (
      seq_len)
  return float(6 * matmul_param_count(cfg) + attention)


def weight_decay_mask(params: PyTree) -> PyTree:
  """An optax weight-decay mask: True for matrices, False for norm scales."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def muon_dimensions(params: PyTree) -> PyTree:
  """How Muon sees each weight as matrices (optax's `MuonDimensionNumbers`), or None for
  the leaves it leaves to Adam.

  The fused qkv kernel (d, 3, h, k) is three (d, h k) matrices, q, k and v each
  orthogonalized alone (the 3 is a batch axis); the attention output (h, k, d) is one
  (h k, d) matrix; the MLP's matrices are themselves. The embedding and an untied head
  (a lookup table and the logits' map, as Muon's authors keep them) and the norm scales
  go to Adam, as does any other tensor of rank above 2.

  References:
    Jordan et al. 2024 (Muon: hidden matrices only); Therien et al., arXiv 2505.23725.
  """
  from optax.contrib import MuonDimensionNumbers as Dims   # optax imports JAX anyway

  def rule(path, p):
    names = {getattr(k, 'key', None) for k in path}
    if p.ndim < 2 or names & {'embed', 'head'}:
      return None
    if 'qkv' in names and p.ndim == 4:
      return Dims(reduction_axis=0, output_axis=(2, 3))
    if 'out' in names and p.ndim == 3:
      return Dims(reduction_axis=(0, 1), output_axis=2)
    return Dims(0, 1) if p.ndim == 2 else None

  return jax.tree_util.tree_map_with_path(rule, params)
