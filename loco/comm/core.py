"""Core communication: byte accounting, the worker context, and the all-reduce mean.

Each transform here runs inside the engine's per-worker map (`jax.vmap` or a mesh with a
`"workers"` axis) and talks to the other workers only through named-axis collectives
(`lax.psum`, `lax.ppermute`), which mean the same under vmap on one device and on a
mesh. This is the only module that looks across workers.

Every transform keeps a `loco.wire.Wire` in its state, recording what its last update put
on the wire (DESIGN §5): values at their transport dtype, sparse indices at their bit
width, scales and codebooks. The engine merges the `Wire`s it finds in the inner and
outer chain states into `StepInfo.wire` (`loco.wire.collect`).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco.comm import axis as comm_axis
from loco import wire as wire_lib
from loco.comm.axis import WORKERS
from loco.errors import ConfigError
from loco.wire import ALL_GATHER, ALL_REDUCE, GOSSIP, KINDS, NO_COMM, Wire

PyTree = Any

TRANSPORT_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


class WorkerContext(NamedTuple):
  """One worker's view of a `StepContext`, passed to transforms as `context=`."""
  active: jax.Array | None = None   # bool scalar: this worker steps this tick
  alive: jax.Array | None = None    # bool scalar: this worker communicates this tick
  mixing: jax.Array | None = None   # [M, M] mixing matrix of this tick (shared)
  key: jax.Array | None = None      # PRNG key of this tick (shared by all workers)
  adopt: jax.Array | None = None    # bool scalar: if absent, this worker downloads and
                                    # adopts the result (False: offline dropout)
  # The overlapped asynchronous replay (static): None (mix current values), 'send'
  # (store the value to mix as this worker's snapshot; nothing moves) or 'merge' (mix
  # this worker's current value with its partners' snapshots).
  snapshot: str | None = None


def empty_wire(axis_name: str = WORKERS) -> Wire:
  """No communication, for a transform's init (inside the per-worker map)."""
  return wire_lib.empty(comm_axis.axis_size(axis_name))


def alive_of(context: WorkerContext | None) -> jax.Array:
  """This worker's bool `alive` for the tick (True when the context does not say)."""
  if context is None or context.alive is None:
    return jnp.ones((), bool)
  return jnp.asarray(context.alive, bool)


def adopts(context: WorkerContext | None) -> jax.Array:
  """Whether this worker, when absent, downloads the result (True unless the context
  says it keeps its own state: offline dropout)."""
  if context is None or context.adopt is None:
    return jnp.ones((), bool)
  return jnp.asarray(context.adopt, bool)


def static_num_workers(axis_name: str = WORKERS) -> int | None:
  """The static number of workers M inside the per-worker map; None outside it."""
  try:
    return comm_axis.axis_size(axis_name)
  except NameError:
    return None


def alive_peers(alive: jax.Array, axis_name: str = WORKERS) -> jax.Array:
  """[M] bool: the alive workers other than this one."""
  everyone = comm_axis.all_gather(alive, axis_name)
  return everyone & (jnp.arange(everyone.shape[0]) != comm_axis.axis_index(axis_name))


def ring_all_reduce_state(alive: jax.Array, size, axis_name: str = WORKERS, *,
                          absent_receive: bool = True, adopt=True) -> Wire:
  """The wire of a ring all-reduce of `size` bytes among the alive workers.

  Each of m participants sends and receives 2 (m - 1) / m * size bytes. A worker that
  is not alive sends nothing; with `absent_receive` (the all-reduces, whose absent
  workers adopt the result) it downloads the result, `size` bytes, which is one event
  of the collective, and the participants upload it: each sends `size * a / m` more
  for a absent workers, so every byte received is a byte sent. Without
  `absent_receive` an absent worker takes no part, nor with `adopt` False (this worker
  keeps its own state when absent: offline dropout).

  References:
    Patarasuk & Yuan 2009 (ring all-reduce bandwidth).
  """
  size = jnp.asarray(size, jnp.float32)
  participants = comm_axis.psum(alive.astype(jnp.float32), axis_name)
  ring = 2.0 * (participants - 1.0) / jnp.maximum(participants, 1.0) * size
  download = (~alive & jnp.asarray(adopt, bool) & (participants > 0) if absent_receive
              else jnp.zeros((), bool))
  downloads = comm_axis.psum(download.astype(jnp.float32), axis_name)
  upload = size * downloads / jnp.maximum(participants, 1.0)
  events = (alive & ((participants > 1) | (downloads > 0))) | download
  return Wire(jnp.where(alive, ring + upload, 0.0),
              jnp.where(alive, ring, size * download),
              events.astype(jnp.int32),
              jnp.where(events, ALL_REDUCE, NO_COMM).astype(jnp.int32),
              jnp.where(events, size, 0.0), alive_peers(alive, axis_name) & events)


def tree_bytes(tree: PyTree, dtype=None) -> int:
  """Bytes of `tree` on the wire, each leaf at `dtype` (or its own dtype)."""
  return sum(int(np.prod(x.shape)) * jnp.dtype(dtype or x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def transport_dtype(name: str):
  if name not in TRANSPORT_DTYPES:
    raise ConfigError(f'transport dtype must be one of {sorted(TRANSPORT_DTYPES)}, got {name!r}.')
  return TRANSPORT_DTYPES[name]


def worker_mean(tree: PyTree, weight: jax.Array, axis_name: str = WORKERS) -> PyTree:
  """Weighted mean over workers of `tree` (weight: this worker's scalar weight)."""
  total = comm_axis.psum(weight.astype(jnp.float32), axis_name)
  summed = comm_axis.psum(optax.tree.scale(weight, optax.tree.cast(tree, jnp.float32)), axis_name)
  return jax.tree.map(lambda s: s / jnp.maximum(total, 1.0), summed)


def all_reduce_mean(dtype: str = 'float32',
                    axis_name: str = WORKERS) -> optax.GradientTransformationExtraArgs:
  """Replaces each worker's updates by their mean over the (alive) workers.

  Values travel at `dtype` (rounded before the reduction, which runs in float32) and
  come back in the updates' own dtype. Workers that are not alive this tick
  (`context.alive` False) contribute nothing and send nothing, but receive the mean
  (a rejoining worker adopts what the others agreed on).

  Bytes: a ring all-reduce of S bytes over m participants sends and receives
  2 (m - 1) / m * S per worker; an absent worker receives the S bytes of the result
  (`ring_all_reduce_state`).

  Args:
    dtype: transport dtype, 'float32', 'bfloat16' or 'float16'.
    axis_name: the worker axis name.

  Returns:
    An optax transformation whose state is a `Wire`.

  References:
    Patarasuk & Yuan 2009 (ring all-reduce bandwidth).
  """
  wire = transport_dtype(dtype)

  def init(params):
    del params
    return empty_wire(axis_name)

  def update(updates, state, params=None, *, context: WorkerContext | None = None, **extra):
    del state, params, extra
    alive = alive_of(context)
    mean = worker_mean(optax.tree.cast(updates, wire), alive.astype(jnp.float32), axis_name)
    wire_state = ring_all_reduce_state(alive, tree_bytes(updates, wire), axis_name,
                                       adopt=adopts(context))
    return optax.tree.cast_like(mean, updates), wire_state

  return optax.GradientTransformationExtraArgs(init, update)
