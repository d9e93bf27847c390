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
    attn: {qkv: (d_model, 3, num_heads, head_dim), out: (num_heads, head_dim, d_model),
           [q_norm: {scale: (head_dim,)}, k_norm: {scale: (head_dim,)}]}
    mlp_norm:  {scale: (d_model,)}
    mlp: {w_in: (d_model, d_ff) | (d_model, 2, d_ff) for swiglu, w_out: (d_ff, d_model)}
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
                'max_seq_len'):
      value = getattr(self, key)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(
            f'model.{key} must be a positive integer, got {value!r}.')
    if self.head_dim is None:
      if self.d_model % self.num_heads:
        raise ConfigError(
            f'model.d_model ({self.d_model}) must be divisible by '
            f'model.num_heads ({self.num_heads}) when model.head_dim is None.')
    elif (not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool)
          or self.head_dim <= 0):
      raise ConfigError(
          f'model.head_dim must be None or a positive integer, got '
          f'{self.head_dim!r}.')
    if self.resolved_head_dim % 2:
      raise ConfigError(
          f'The per-head width (model.head_dim or d_model // num_heads) must '
          f'be even for RoPE, got {self.resolved_head_dim}.')
    if self.mlp not in _MLPS:
      raise ConfigError(
          f'model.mlp must be one of {_MLPS}, got {self.mlp!r}.')
    if self.dtype not in _DTYPES:
      raise ConfigError(
          f'model.dtype must be one of {tuple(_DTYPES)}, got {self.dtype!r}.')
    if not self.z_loss >= 0.0:
      raise ConfigError(
          f'model.z_loss must be a non-negative float, got {self.z_loss!r}.')
    if not self.rope_theta > 0.0:
      raise ConfigError(
          f'model.rope_theta must be a positive float, got '
          f'{self.rope_theta!r}.')

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else (
        self.d_model // self.num_heads)

  @property
  def compute_dtype(self) -> jnp.dtype:
    return _DTYPES[self.dtype]


# Paper-scale presets follow the DiLoCo paper's Chinchilla-style table
# (arXiv 2311.08105, Table 5: layers / hidden / heads / K-V size, vocab 32000):
# 60m 3/896/16/64, 150m 12/896/16/64, 400m 12/1536/12/128; '1b' is the
# 24-layer d2048 model of the DiLoCo scaling-law paper (arXiv 2503.09799).
# d_ff = 4 * d_model. Output heads are tied (the parameter counts match the
# paper's names only when tied: 59M, 150M, 389M, 1.27B). QK-norm and z-loss
# are on for the large presets: both are cheap and make the higher learning
# rates of the DiLoCo inner AdamW stable; the CPU presets keep them off so they
# match the plain reference model of STACK-NOTES.
PRESETS: dict[str, dict[str, Any]] = {
    'nano': dict(vocab_size=256, d_model=32, num_layers=2, num_heads=2,
                 d_ff=64, max_seq_len=128),
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


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], std: float) -> nnx.Param:
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32))


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

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h, k = cfg.d_model, cfg.num_heads, cfg.resolved_head_dim
    # One fused projection: a single large matmul is faster than three on CPU.
    self.qkv = _normal(rngs, (d, 3, h, k), _INIT_STD)
    self.out = _normal(rngs, (h, k, d),
                       _INIT_STD / math.sqrt(2 * cfg.num_layers))
    if cfg.qk_norm:
      self.q_norm = RMSNorm(k)
      self.k_norm = RMSNorm(k)

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    cfg = self.cfg
    dtype = cfg.compute_dtype
    seq_len = x_BxLxD.shape[1]
    qkv = jnp.einsum('bld,dthk->tblhk', x_BxLxD, self.qkv[...].astype(dtype))
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = qkv[0], qkv[1], qkv[2]
    if cfg.qk_norm:
      q_BxLxHxK = self.q_norm(q_BxLxHxK)
      k_BxLxHxK = self.k_norm(k_BxLxHxK)
    positions_L = jnp.arange(seq_len)
    q_BxLxHxK = rope(q_BxLxHxK, positions_L, cfg.rope_theta)
    k_BxLxHxK = rope(k_BxLxHxK, positions_L, cfg.rope_theta)
    scale = 1.0 / math.sqrt(cfg.resolved_head_dim)
    scores_BxHxLxL = jnp.einsum('bqhk,bshk->bhqs', q_BxLxHxK * scale,
                                k_BxLxHxK).astype(jnp.float32)
    causal_LxL = jnp.tril(jnp.ones((seq_len, seq_len), jnp.bool_))
    # A large finite negative (not -inf) keeps the masked softmax NaN-free.
    scores_BxHxLxL = jnp.where(causal_LxL, scores_BxHxLxL,
                               jnp.finfo(jnp.float32).min)
    probs_BxHxLxL = jax.nn.softmax(scores_BxHxLxL, axis=-1).astype(dtype)
    ctx_BxLxHxK = jnp.einsum('bhqs,bshk->bqhk', probs_BxHxLxL, v_BxLxHxK)
    return jnp.einsum('blhk,hkd->bld', ctx_BxLxHxK, self.out[...].astype(dtype))


class MLP(nnx.Module):
  """GELU (tanh approximation) or SwiGLU (arXiv 2002.05202) feed-forward."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, f = cfg.d_model, cfg.d_ff
    # SwiGLU's gate and up projections are fused into one matmul.
    in_shape = (d, 2, f) if cfg.mlp == 'swiglu' else (d, f)
    self.w_in = _normal(rngs, in_shape, _INIT_STD)
    self.w_out = _normal(rngs, (f, d),
                         _INIT_STD / math.sqrt(2 * cfg.num_layers))

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    dtype = self.cfg.compute_dtype
    w_in = self.w_in[...].astype(dtype)
    if self.cfg.mlp == 'swiglu':
      gate_up = jnp.einsum('bld,dtf->tblf', x_BxLxD, w_in)
      hidden_BxLxF = jax.nn.silu(gate_up[0]) * gate_up[1]
    else:
      hidden_BxLxF = jax.nn.gelu(x_BxLxD @ w_in, approximate=True)
    return hidden_BxLxF @ self.w_out[...].astype(dtype)


class Block(nnx.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.d_model)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.d_model)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    x_BxLxD = x_BxLxD + self.attn(self.attn_norm(x_BxLxD))
    return x_BxLxD + self.mlp(self.mlp_norm(x_BxLxD))


class Transformer(nnx.Module):
  """Decoder-only Transformer LM: int32 tokens (B, L) -> float32 logits (B, L, V)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _normal(rngs, (cfg.vocab_size, cfg.d_model), _INIT_STD)
    self.blocks = nnx.List(
        [Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.d_model)
    if not cfg.tie_embeddings:
      self.head = _normal(rngs, (cfg.d_model, cfg.vocab_size), _INIT_STD)

  def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
    cfg = self.cfg
    if tokens_BxL.shape[-1] > cfg.max_seq_len:
      raise ConfigError(
          f'Sequence length {tokens_BxL.shape[-1]} exceeds model.max_seq_len '
          f'({cfg.max_seq_len}); lower the data seq_len or raise max_seq_len.')
    dtype = cfg.compute_dtype
    embed_VxD = self.embed[...].astype(dtype)
    x_BxLxD = jnp.take(embed_VxD, tokens_BxL, axis=0)
    for block in self.blocks:
      x_BxLxD = block(x_BxLxD)
    x_BxLxD = self.final_norm(x_BxLxD)
    if cfg.tie_embeddings:
      logits = jnp.einsum('bld,vd->blv', x_BxLxD, embed_VxD)
    else:
      logits = x_BxLxD @ self.head[...].astype(dtype)
    return logits.astype(jnp.float32)


def init_params(cfg: ModelConfig, key: jax.Array) -> tuple[nnx.GraphDef, PyTree]:
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
  del cfg  # The graphdef carries the config; kept for a uniform signature.
  model = nnx.merge(graphdef, params)
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
  inputs_BxL, targets_BxL = batch_BxLp1[:, :-1], batch_BxLp1[:, 1:]
  logits_BxLxV = apply(cfg, graphdef, params, inputs_BxL)
  log_z_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
  target_logit_BxL = jnp.take_along_axis(
      logits_BxLxV, targets_BxL[..., None].astype(jnp.int32), axis=-1)[..., 0]
  ce = jnp.mean(log_z_BxL - target_logit_BxL)
  z_loss = cfg.z_loss * jnp.mean(jnp.square(log_z_BxL))
  return ce + z_loss, {'ce': ce, 'z_loss': z_loss}


@functools.cache
def _abstract_params(cfg: ModelConfig) -> PyTree:
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
              for leaf in jax.tree.leaves(_abstract_params(cfg)))
  if non_embedding:
    total -= cfg.vocab_size * cfg.d_model
  return total


def matmul_param_count(cfg: ModelConfig) -> int:
  """Weights used in matmuls per token: blocks plus the output head (tied or not)."""
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
  """True for weight matrices and embeddings, False for norm scales (for optax)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)
