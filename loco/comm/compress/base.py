"""The Compressor: encode -> payload (the `Message`) -> decode, as an optax transformation.

A codec may code in another basis than the updates' (DeMo's chunked DCT): its message
then carries coefficients, and `decode` maps a coefficient tree back to the updates'
space. Decoding is linear, so a collective sums the gathered payloads in the code
domain and decodes once, after the sum, as a deployment of such a codec does.
"""

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
  """One worker's compressed message: the payload that travels, as its receivers read it.

  Attributes:
    decoded: the sent values as the receivers reconstruct them in the codec's code
      domain (the updates' own for all codecs but a basis change such as the DCT), in
      the updates' shapes (zero where nothing was sent) and dtype (under error
      feedback, the float32 of its residual). `Compressor.decode` maps it to the
      updates' space.
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
  """An optax transformation mapping updates to their compressed-then-decoded value.

  `encode(updates, state, *, context=None)` returns the `Message` (the payload) and
  the new state; `decode(tree)` maps a tree in the code domain (a message's
  `decoded`, or the sum of several) to the updates' space: the identity for codecs
  that code the updates themselves, an inverse transform for a basis change (it must
  be linear, so that it commutes with the collectives' sums). `update(updates, state,
  params=None, *, context=None)` is `decode(encode(...).decoded)` in the updates'
  dtypes. `kind`: 'sparsifier' (messages with a mask; plain ones also
  `select(updates, state, *, context=None) -> (Selection, state)`, for `then`),
  'quantizer' (dense codecs) or 'stateful' (error feedback).
  """

  def __new__(cls, init: Callable[[PyTree], PyTree], encode: Callable, kind: str,
              select: Callable | None = None, decode: Callable[[PyTree], PyTree] | None = None):
    decode = decode or identity_decode

    def update(updates, state, params=None, *, context=None, **extra):
      del params, extra
      message, state = encode(updates, state, context=context)
      return optax.tree.cast_like(decode(message.decoded), updates), state

    self = super().__new__(cls, init, update)
    # A NamedTuple subclass without __slots__ has a __dict__: optax.chain still sees a
    # GradientTransformationExtraArgs (so `context` reaches us), comm sees `encode`.
    self.encode, self.kind, self.select, self.decode = encode, kind, select, decode
    return self


def identity_decode(tree: PyTree) -> PyTree:
  """The decode of a codec that codes the updates in their own space."""
  return tree


def stateless_init(params: PyTree) -> CompressState:
  del params
  return CompressState(bits=jnp.zeros((), jnp.float32))


def size(x) -> int:
  return math.prod(np.shape(x))


def index_width(n: int) -> int:
  """Bits to address one of `n` positions (0 for a single position)."""
  return math.ceil(math.log2(n)) if n > 1 else 0


def value_width(x) -> int:
  return jnp.dtype(x.dtype).itemsize * 8
