"""The Compressor: an optax transformation with `encode`, and the Message it sends."""

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any
Bits = int | jax.Array

META_BITS = 32           # every scale, shift and codebook entry travels as a float32


class Message(NamedTuple):
  """One worker's compressed message, as its receivers decode it.

  Attributes:
    decoded: what the receivers reconstruct, in the updates' shapes (zero where nothing
      was sent) and dtype (under error feedback, the float32 of its residual).
    mask: bool tree, True where a value was sent; None when every coordinate was.
    index_bits: bits of the sent indices.
    value_bits: bits of the sent values.
    meta_bits: bits of scales, shifts and codebooks.
    capacity: per tensor (in tree order), the most coordinates the message can send
      (a static bound: the kept values of a top-k); None when unknown or dense. A
      collective uses it to gather only what was sent.
  """
  decoded: PyTree
  mask: PyTree | None
  index_bits: Bits
  value_bits: Bits
  meta_bits: Bits
  capacity: tuple[int, ...] | None = None

  @property
  def bits(self) -> Bits:
    return self.index_bits + self.value_bits + self.meta_bits


class CompressState(NamedTuple):
  """State of a stateless compressor: the payload of its last update."""
  bits: jax.Array   # float32 scalar


class Compressor(optax.GradientTransformationExtraArgs):
  """An optax transformation mapping updates to their decoded compressed value.

  `update(updates, state, params=None, *, context=None)` returns the decoded tree in
  the updates' dtypes; `encode(updates, state, *, context=None)` returns the whole
  `Message` and the new state. `kind`: 'sparsifier' (messages with a mask; plain ones
  also `select(updates, state, *, context=None) -> (Selection, state)`, for `then`),
  'quantizer' (dense codecs) or 'stateful' (error feedback).
  """

  def __new__(cls, init: Callable[[PyTree], PyTree], encode: Callable, kind: str,
              select: Callable | None = None):
    def update(updates, state, params=None, *, context=None, **extra):
      del params, extra
      message, state = encode(updates, state, context=context)
      return optax.tree.cast_like(message.decoded, updates), state

    self = super().__new__(cls, init, update)
    # A NamedTuple subclass without __slots__ has a __dict__: optax.chain still sees a
    # GradientTransformationExtraArgs (so `context` reaches us), comm sees `encode`.
    self.encode, self.kind, self.select = encode, kind, select
    return self


def stateless_init(params: PyTree) -> CompressState:
  del params
  return CompressState(bits=jnp.zeros((), jnp.float32))


def size(x) -> int:
  return math.prod(np.shape(x))


def value_width(x) -> int:
  return jnp.dtype(x.dtype).itemsize * 8
