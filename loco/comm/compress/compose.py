"""Composition: a sparsifier then a quantizer on the kept values; codecs by name."""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from loco.comm.compress import quantize
from loco.comm.compress.base import Compressor, Message, PyTree
from loco.errors import ConfigError


class ComposedState(NamedTuple):
  """State of `then(first, second)`."""
  bits: jax.Array
  first: PyTree
  second: PyTree


def then(sparsifier: Compressor, quantizer: Compressor) -> Compressor:
  """Sparsify, then quantize only the kept values (e.g. top-k then 2-bit).

  Payload: the sparsifier's index bits plus the quantizer's value and metadata bits
  (its statistics and scales are computed over the kept values only).

  Args:
    sparsifier: a compressor of kind 'sparsifier'.
    quantizer: a compressor of kind 'quantizer'.

  Returns:
    A `Compressor` of kind 'sparsifier' (its message has a mask).
  """
  if getattr(sparsifier, 'select', None) is None:
    raise ConfigError('then(sparsifier, quantizer): the first operator must be a '
                      'sparsifier (topk_chunks, topk_global, random_k).')
  if getattr(quantizer, 'kind', None) != 'quantizer':
    raise ConfigError('then(sparsifier, quantizer): the second operator must be a '
                      'quantizer (identity, uniform, binned, e3m0, e4m3).')

  def init(params):
    return ComposedState(jnp.zeros((), jnp.float32), sparsifier.init(params),
                         quantizer.init(params))

  def encode(updates, state, *, context=None):
    selection, first = sparsifier.select(updates, state.first, context=context)
    coded, second = quantizer.encode(selection.values, state.second, context=context)
    decoded, mask = selection.scatter(coded.decoded)
    message = Message(decoded, mask, selection.index_bits, coded.value_bits,
                      coded.meta_bits, selection.capacity)
    return message, ComposedState(jnp.float32(message.bits), first, second)

  return Compressor(init, encode, 'sparsifier', decode=sparsifier.decode)


CODECS: dict[str, Callable[[], Compressor]] = {
    'none': quantize.identity,
    '2bit': quantize.binned,
    'int8': lambda: quantize.uniform(8),
    'int4': lambda: quantize.uniform(4),
    'e4m3': quantize.e4m3,
    'e3m0': quantize.e3m0,
}


def by_name(name: str, key: str = 'algorithm.compression') -> Compressor:
  """The value codec called `name` (see CODECS); `key` names the config key in errors."""
  if name not in CODECS:
    raise ConfigError(f'{key} must be one of {sorted(CODECS)}, got {name!r}.')
  return CODECS[name]()
