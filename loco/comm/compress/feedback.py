"""Error feedback: compress the accumulated residual and keep what was not sent."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from loco.comm.compress.base import Compressor, Message, PyTree
from loco.errors import ConfigError


class ErrorFeedbackState(NamedTuple):
  """State of `error_feedback`: payload, the residual e (float32), the inner state."""
  bits: jax.Array
  residual: PyTree
  inner: PyTree


def error_feedback(compressor: Compressor, beta: float = 0.95) -> Compressor:
  """Error feedback: compress the accumulated residual and keep what was not sent.

  `e <- beta e + updates`; `sent = C(e)`; `e <- e - decode(sent)`; outputs `sent`
  (in C's code domain; its `decode` is this compressor's). The
  residual is float32 whatever the updates' dtype. A worker that is not alive this
  tick (`context.alive` False) sends nothing and keeps all of e. With beta = 1 and an
  identity C this is the identity; SparseLoCo uses it instead of outer momentum.
  The reference code adds `lr * Delta` to e and steps by lr again; here e adds
  Delta and the outer SGD applies lr once (identical at the paper's lr = 1).

  Args:
    compressor: the compressor applied to the residual.
    beta: residual decay, in [0, 1] (SparseLoCo: 0.95).

  Returns:
    A `Compressor` (kind 'stateful') whose message is that of `compressor`.

  References:
    Seide et al. 2014 (1-bit SGD); Karimireddy et al., arXiv 1901.09847 (EF-SGD);
    SparseLoCo, arXiv 2508.15706; DeMo, arXiv 2411.19870 (momentum as the residual).
  """
  if not isinstance(compressor, Compressor):
    raise ConfigError('error_feedback needs a loco.comm.compress Compressor.')
  if not isinstance(beta, jax.core.Tracer) and not 0.0 <= beta <= 1.0:  # traced: a run knob
    raise ConfigError(f'error feedback beta (algorithm.error_decay) must be in [0, 1], '
                      f'got {beta!r}.')

  def init(params):
    residual = optax.tree.zeros_like(params, jnp.float32)
    return ErrorFeedbackState(jnp.zeros((), jnp.float32), residual, compressor.init(params))

  def encode(updates, state, *, context=None):
    e = optax.tree.add_scale(optax.tree.cast(updates, jnp.float32), beta, state.residual)
    message, inner = compressor.encode(e, state.inner, context=context)
    alive = jnp.asarray(True if context is None or context.alive is None
                        else context.alive, bool)
    sent = optax.tree.where(alive, message.decoded, optax.tree.zeros_like(e))
    sent_mask = (None if message.mask is None
                 else jax.tree.map(lambda m: m & alive, message.mask))
    gate = alive.astype(jnp.float32)
    message = Message(sent, sent_mask, message.index_bits * gate,
                      message.value_bits * gate, message.meta_bits * gate, message.capacity)
    residual = optax.tree.sub(e, optax.tree.cast(compressor.decode(sent), jnp.float32))
    return message, ErrorFeedbackState(jnp.float32(message.bits), residual, inner)

  return Compressor(init, encode, 'stateful', decode=compressor.decode)
