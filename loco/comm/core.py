"""Core communication: byte accounting, the worker context, and the all-reduce mean.

Each transform here runs inside the engine's per-worker map (`jax.vmap` or a mesh with a
`"workers"` axis) and talks to the other workers only through named-axis collectives
(`lax.psum`, `lax.ppermute`), which mean the same under vmap on one device and on a
mesh. This is the only module that looks across workers.

Every transform keeps a `CommState` recording what its last update put on the wire
(DESIGN §5): values at their transport dtype, sparse indices at their bit width,
scales and codebooks. The engine sums the `CommState`s it finds in the inner and outer
chain states into `StepInfo`.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any
WORKERS = 'workers'

TRANSPORT_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16,
                    'float16': jnp.float16}


class WorkerContext(NamedTuple):
  """One worker's view of a `StepContext`, passed to transforms as `context=`."""
  active: jax.Array | None = None   # bool scalar: this worker steps this tick
  alive: jax.Array | None = None    # bool scalar: this worker communicates this tick
  mixing: jax.Array | None = None   # [M, M] mixing matrix of this tick (shared)
  key: jax.Array | None = None      # PRNG key of this tick (shared by all workers)


class CommState(NamedTuple):
  """What a communication transform's last update put on the wire for this worker."""
  bytes_sent: jax.Array       # float32 scalar
  bytes_received: jax.Array   # float32 scalar
  events: jax.Array           # int32 scalar: 1 if this worker communicated, else 0


def empty_comm_state() -> CommState:
  return CommState(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
                   jnp.zeros((), jnp.int32))


def _is_comm_state(x) -> bool:
  return isinstance(x, CommState)


def wire_bytes(state: PyTree) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Sums (bytes_sent, bytes_received, events) over the CommStates inside `state`."""
  sent = jnp.zeros((), jnp.float32)
  received = jnp.zeros((), jnp.float32)
  events = jnp.zeros((), jnp.int32)
  for leaf in jax.tree.leaves(state, is_leaf=_is_comm_state):
    if isinstance(leaf, CommState):
      sent, received = sent + leaf.bytes_sent, received + leaf.bytes_received
      events = events + leaf.events
  return sent, received, events


def tree_bytes(tree: PyTree, dtype=None) -> int:
  """Bytes of `tree` on the wire, each leaf at `dtype` (or its own dtype)."""
  return sum(int(np.prod(x.shape)) * jnp.dtype(dtype or x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def num_workers(axis_name: str = WORKERS) -> jax.Array:
  """Size of the worker axis, from inside the per-worker map."""
  return jax.lax.psum(1, axis_name)


def _alive(context: WorkerContext | None) -> jax.Array:
  if context is None or context.alive is None:
    return jnp.ones((), bool)
  return jnp.asarray(context.alive, bool)


def transport_dtype(name: str):
  if name not in TRANSPORT_DTYPES:
    from loco.errors import ConfigError
    raise ConfigError(f'transport dtype must be one of {sorted(TRANSPORT_DTYPES)}, '
                      f'got {name!r}.')
  return TRANSPORT_DTYPES[name]


def worker_mean(tree: PyTree, weight: jax.Array, axis_name: str = WORKERS) -> PyTree:
  """Weighted mean over workers of `tree` (weight: this worker's scalar weight)."""
  total = jax.lax.psum(weight.astype(jnp.float32), axis_name)
  summed = jax.lax.psum(
      jax.tree.map(lambda x: x.astype(jnp.float32) * weight, tree), axis_name)
  return jax.tree.map(lambda s: s / jnp.maximum(total, 1.0), summed)


def all_reduce_mean(dtype: str = 'float32',
                    axis_name: str = WORKERS) -> optax.GradientTransformationExtraArgs:
  """Replaces each worker's updates by their mean over the (alive) workers.

  Values travel at `dtype` (rounded before the reduction, which runs in float32) and
  come back in the updates' own dtype. Workers that are not alive this tick
  (`context.alive` False) contribute nothing and send nothing, but receive the mean
  (a rejoining worker adopts what the others agreed on).

  Bytes: a ring all-reduce of S bytes over m participants sends and receives
  2 (m - 1) / m * S per worker.

  Args:
    dtype: transport dtype, 'float32', 'bfloat16' or 'float16'.
    axis_name: the worker axis name.

  Returns:
    An optax transformation whose state is a `CommState`.

  References:
    Patarasuk & Yuan 2009 (ring all-reduce bandwidth).
  """
  wire = transport_dtype(dtype)

  def init(params):
    del params
    return empty_comm_state()

  def update(updates, state, params=None, *, context: WorkerContext | None = None,
             **extra):
    del state, params, extra
    alive = _alive(context)
    on_wire = jax.tree.map(lambda x: x.astype(wire), updates)
    mean = worker_mean(on_wire, alive.astype(jnp.float32), axis_name)
    mean = jax.tree.map(lambda m, x: m.astype(x.dtype), mean, updates)
    participants = jax.lax.psum(alive.astype(jnp.float32), axis_name)
    size = tree_bytes(updates, wire)
    per_worker = 2.0 * (participants - 1.0) / jnp.maximum(participants, 1.0) * size
    per_worker = jnp.where(alive, per_worker, 0.0).astype(jnp.float32)
    events = (alive & (participants > 1)).astype(jnp.int32)
    return mean, CommState(per_worker, per_worker, events)

  return optax.GradientTransformationExtraArgs(init, update)
