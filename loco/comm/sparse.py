"""Compressed collectives: the sparse all-gather mean and the compressed all-reduce mean.

Each transform takes a `loco.comm.compress.Compressor` (error feedback, top-k, quantizers,
compositions) and runs it itself, because the collective needs what only the
compressor knows: the exact payload of this worker's message (for the bytes) and
which coordinates it sent (for the per-coordinate average). So a compressor goes
*inside* the communication link, not before it in a chain:

  chain(sparse_all_gather_mean(error_feedback(then(topk_chunks(), binned()), 0.95)),
        sgd(1.0))

Like `all_reduce_mean`, these run inside the engine's per-worker map and only use
named-axis collectives. Values are decoded and reduced in float32. On a mesh the sparse
all-gather gathers, for each sparsified tensor, only the sent coordinates (int32
indices and decoded float32 values, at the message's static capacity) and
scatter-adds them, as a real all-gather-then-scatter-add does; on one device, and for
tensors sent whole, a `psum` of the dense decoded values gives the same sums faster.
The bytes counted are the encoded payload (packed indices, 2-bit codes, scales), which
the program does not bit-pack.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from loco.comm import compress
from loco.comm.core import (ALL_GATHER, NO_COMM, WORKERS, Wire, WorkerContext, adopts,
                            alive_of, alive_peers, empty_wire, ring_all_reduce_state,
                            worker_mean)
from loco.errors import ConfigError
from loco.comm import axis as comm_axis

PyTree = Any

DIVIDE = ('contributors', 'workers')
TRANSPORTS = ('auto', 'gather', 'dense')


class CompressedState(NamedTuple):
  """A compressed collective's state: bytes on the wire, and its compressor's state."""
  comm: Wire
  compressor: PyTree


def _compressor_or_identity(compressor):
  if compressor is None:
    return compress.identity()
  if not isinstance(compressor, compress.Compressor):
    raise ConfigError('a compressed collective needs a loco.comm.compress Compressor or None, '
                      f'got {type(compressor).__name__}.')
  return compressor


def _weighted(tree, weight):
  return optax.tree.scale(weight, optax.tree.cast(tree, jnp.float32))


def _gathered_sum(decoded, mask, capacity: int, weight, axis_name):
  """Every worker's sent coordinates of one tensor, gathered and scatter-added:
  (sum of the weighted decoded values, number of weighted senders), both dense."""
  flat_mask = mask.reshape(-1)
  index = jnp.nonzero(flat_mask, size=capacity, fill_value=0)[0].astype(jnp.int32)
  sent = jnp.where(weight > 0, jnp.sum(flat_mask, dtype=jnp.int32), 0)
  value = jnp.where(jnp.arange(capacity) < sent,
                    decoded.reshape(-1).astype(jnp.float32)[index], 0.0)
  index_MxK, value_MxK, sent_M = comm_axis.all_gather((index, value, sent), axis_name)
  valid_MxK = (jnp.arange(capacity)[None, :] < sent_M[:, None]).astype(jnp.float32)
  zeros = jnp.zeros((mask.size,), jnp.float32)
  summed = zeros.at[index_MxK.reshape(-1)].add(value_MxK.reshape(-1))
  count = zeros.at[index_MxK.reshape(-1)].add(valid_MxK.reshape(-1))
  return summed.reshape(mask.shape), count.reshape(mask.shape)


def compressed_init(compressor, axis_name=WORKERS):
  """The init of a compressed collective: an empty wire and the compressor's state."""
  def init(params):
    return CompressedState(empty_wire(axis_name), compressor.init(params))
  return init


def gather_wire(bits, alive, context, axis_name=WORKERS) -> Wire:
  """The wire of an all-gather of `bits` per alive worker (DESIGN section 5): each
  sends its payload and receives the others'; an absent worker that adopts the result
  downloads every message and sends nothing. A lone alive worker sends its payload
  only to absent workers that download it (one worker alone: nothing moves, as in
  `ring_all_reduce_state`)."""
  weight = alive.astype(jnp.float32)
  alive_count = comm_axis.psum(weight, axis_name)
  listens = alive | adopts(context)
  downloads = comm_axis.psum((listens & ~alive).astype(jnp.float32), axis_name)
  heard = alive & ((alive_count > 1) | (downloads > 0))   # someone receives its message
  sent = jnp.where(heard, jnp.asarray(bits, jnp.float32) / 8.0, 0.0)
  received = jnp.where(listens, comm_axis.psum(sent, axis_name) - sent, 0.0)
  events = jnp.where(alive, heard, listens & (alive_count > 0))
  return Wire(sent, received, events.astype(jnp.int32),
              jnp.where(events, ALL_GATHER, NO_COMM).astype(jnp.int32), sent,
              alive_peers(alive, axis_name) & events)


def sparse_all_gather_mean(
    compressor: compress.Compressor | None = None, *, divide: str = 'contributors',
    transport: str = 'auto', axis_name: str = WORKERS) -> optax.GradientTransformationExtraArgs:
  """All-gathers every worker's compressed message and averages the decoded values.

  The average is taken in the codec's code domain, where the payloads live, and
  decoded once after the sum (`Compressor.decode`: the identity for codecs in the
  updates' space, the inverse DCT for DeMo's).

  Each alive worker encodes its updates with `compressor` and sends its message
  (indices, values, scales, codebooks) to every other worker; each worker decodes all
  messages and averages them per coordinate, in float32:
    - divide='contributors' (default): `sum_j decoded_j / max(1, #workers that sent
      this coordinate)`, the SparseLoCo reference code's scatter-reduce "mean";
    - divide='workers': `sum_j decoded_j / #alive workers`, the write-ups'
      `(1/R) sum_r Q(TopK(e_r))`.
  The two agree when every worker sends every coordinate (dense codecs). The default
  follows the reference code, which produced the paper's results (REFERENCES §6.1):
  at 1-3% density the workers' selections overlap little, so dividing by all workers
  would shrink most coordinates' step by up to M while error feedback has already
  removed them from the senders' residuals; dividing by the contributors applies each
  sent value at full size, like a dense mean of workers that agree.

  Workers not alive this tick send nothing and are left out of the average, but adopt
  its result. Bytes (DESIGN §5): an all-gather sends this worker's payload
  `S_i = bits_i / 8` and receives `sum_{j != i} S_j` (alive j only); an absent worker
  receives the alive workers' messages (to decode the result) and sends nothing.

  Args:
    compressor: the compressor each worker applies (None: dense, at the updates'
      dtype).
    divide: 'contributors' or 'workers', the per-coordinate denominator.
    transport: how the simulation moves sparsified tensors (same numbers): 'gather'
      their (index, value) pairs, 'dense' a psum of the decoded tensors, or 'auto'
      (gather on a mesh, where it is the traffic; dense on one device, where it is
      faster: 541 vs 763 ms per tiny 8-worker sync step on a 2-core CPU).
    axis_name: the worker axis name.

  Returns:
    An optax transformation whose state is a `CompressedState`.

  References:
    SparseLoCo, arXiv 2508.15706; DeMo, arXiv 2411.19870 (all-gather of top-k).
  """
  if divide not in DIVIDE:
    raise ConfigError(f'algorithm.aggregation must be one of {DIVIDE}, got {divide!r}.')
  if transport not in TRANSPORTS:
    raise ConfigError(f'transport must be one of {TRANSPORTS}, got {transport!r}.')
  compressor = _compressor_or_identity(compressor)

  def update(updates, state, params=None, *, context: WorkerContext | None = None, **extra):
    del params, extra
    alive = alive_of(context)
    weight = alive.astype(jnp.float32)
    message, inner = compressor.encode(updates, state.compressor, context=context)
    alive_count = comm_axis.psum(weight, axis_name)
    leaves, treedef = jax.tree.flatten(updates)
    decoded = treedef.flatten_up_to(message.decoded)
    masks = [None] * len(leaves) if message.mask is None else treedef.flatten_up_to(message.mask)
    gather = transport == 'gather' or (transport == 'auto' and comm_axis.on_mesh())
    capacity = message.capacity if gather and message.capacity else (None,) * len(leaves)
    means = []
    for x, d, m, k in zip(leaves, decoded, masks, capacity):
      if m is not None and k is not None and 2 * k < m.size:   # gather only what was sent
        summed, count = _gathered_sum(d, m, k, weight, axis_name)
      else:                                                   # sent whole: a dense sum
        summed = comm_axis.psum(_weighted(d, weight), axis_name)
        count = None if m is None else comm_axis.psum(_weighted(m, weight), axis_name)
      if divide == 'workers' or m is None:
        count = alive_count
      means.append((summed / jnp.maximum(count, 1.0)).astype(x.dtype))
    # A basis-change codec's payloads were summed as coefficients: decode once, after.
    mean = optax.tree.cast_like(compressor.decode(jax.tree.unflatten(treedef, means)), updates)
    # An absent worker downloads every message unless it keeps its own state.
    return mean, CompressedState(gather_wire(message.bits, alive, context, axis_name), inner)

  return optax.GradientTransformationExtraArgs(compressed_init(compressor, axis_name),
                                              update)


def compressed_all_reduce_mean(
    compressor: compress.Compressor, *, requantize: bool = True,
    axis_name: str = WORKERS) -> optax.GradientTransformationExtraArgs:
  """An all-reduce mean whose values travel compressed and are reduced in float32.

  As low-bit all-reduces are built (torchft's quantized all-reduce): each worker
  encodes its updates, the shards go to their owners (a reduce-scatter done as an
  all-to-all), the owners decode and sum in float32, re-encode the mean with the same
  codec, and all-gather it. The numbers: `mean_j decoded_j` over alive workers, then,
  with `requantize`, the decoded re-encoding of that mean (a fresh compressor state,
  so error feedback does not apply to the second pass). Bytes: a ring-like
  reduce-scatter + all-gather of a payload of S bytes sends and receives
  `2 (m - 1) / m * S` per worker, S this worker's encoded size (one scale per
  tensor: per-shard scales would add a few bytes per worker).

  For dense codecs (quantizers); sparse messages need `sparse_all_gather_mean`.

  Args:
    compressor: a dense codec (kind 'quantizer'), optionally inside error_feedback.
    requantize: re-encode the reduced mean for the all-gather phase (True), or send
      it at full precision (False; the bytes are counted compressed either way).
    axis_name: the worker axis name.

  Returns:
    An optax transformation whose state is a `CompressedState`.

  References:
    Streaming DiLoCo, arXiv 2501.18512 (quantized outer gradients, FP32 reduction).
  """
  compressor = _compressor_or_identity(compressor)
  sparse_error = ConfigError('compressed_all_reduce_mean takes dense codecs; use '
                             'sparse_all_gather_mean for sparsifiers.')
  if compressor.kind == 'sparsifier':
    raise sparse_error

  def update(updates, state, params=None, *, context: WorkerContext | None = None, **extra):
    del params, extra
    alive = alive_of(context)
    message, inner = compressor.encode(updates, state.compressor, context=context)
    if message.mask is not None:   # e.g. error feedback around a sparsifier
      raise sparse_error
    mean = compressor.decode(worker_mean(message.decoded, alive.astype(jnp.float32), axis_name))
    if requantize:
      # The shard owners re-encode the mean; every worker receives it, alive or not.
      shared = None if context is None else context._replace(alive=None)
      second, _ = compressor.encode(mean, compressor.init(mean), context=shared)
      mean = compressor.decode(second.decoded)
    mean = optax.tree.cast_like(mean, updates)
    size = jnp.asarray(message.bits, jnp.float32) / 8.0
    return mean, CompressedState(
        ring_all_reduce_state(alive, size, axis_name, adopt=adopts(context)), inner)

  return optax.GradientTransformationExtraArgs(compressed_init(compressor, axis_name),
                                              update)
