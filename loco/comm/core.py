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


# How a transform talked, for the network clock (loco/network.py reads only this).
KINDS = ('none', 'all_reduce', 'all_gather', 'gossip')
NO_COMM, ALL_REDUCE, ALL_GATHER, GOSSIP = range(len(KINDS))


class CommState(NamedTuple):
  """What a communication transform's last update put on the wire for this worker.

  Attributes:
    bytes_sent: float32 scalar.
    bytes_received: float32 scalar.
    events: int32 scalar, 1 if this worker communicated, else 0.
    kind: int32 scalar, the collective (an index of `KINDS`).
    payload: float32 scalar, bytes of one message: the all-reduced tree (at its wire
      size), this worker's all-gathered message, or what crossed one gossip edge.
    peers: [M] bool, the workers this one exchanged with (the edges actually used, or
      the other participants of a collective).
  """
  bytes_sent: jax.Array
  bytes_received: jax.Array
  events: jax.Array
  kind: jax.Array
  payload: jax.Array
  peers: jax.Array


def empty_comm_state(num_workers: int | None = None, axis_name: str = WORKERS) -> CommState:
  """No communication; M is the worker axis's size (inside the per-worker map)."""
  m = num_workers if num_workers is not None else jax.lax.axis_size(axis_name)
  return CommState(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
                   jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
                   jnp.zeros((), jnp.float32), jnp.zeros((m,), bool))


def _is_comm_state(x) -> bool:
  return isinstance(x, CommState)


class Wire(NamedTuple):
  """Everything a step put on the wire for one worker: the CommStates of its chains
  merged (bytes and events added, the widest kind and payload, the union of peers)."""
  sent: jax.Array
  received: jax.Array
  events: jax.Array
  kind: jax.Array
  payload: jax.Array
  peers: jax.Array

  def merge(self, other: 'Wire') -> 'Wire':
    return Wire(self.sent + other.sent, self.received + other.received,
                self.events + other.events, jnp.maximum(self.kind, other.kind),
                jnp.maximum(self.payload, other.payload), self.peers | other.peers)

  def where(self, pred: jax.Array) -> 'Wire':
    """This wire where `pred`, else nothing (a worker that sat the step out)."""
    return jax.tree.map(lambda x: jnp.where(pred, x, jnp.zeros_like(x)), self)


def no_wire(num_workers: int | None = None, axis_name: str = WORKERS) -> Wire:
  return Wire(*empty_comm_state(num_workers, axis_name))


def wire_bytes(state: PyTree, axis_name: str = WORKERS) -> Wire:
  """The `Wire` of the CommStates inside `state` (a chain's state after an update)."""
  wire = no_wire(axis_name=axis_name)
  for leaf in jax.tree.leaves(state, is_leaf=_is_comm_state):
    if isinstance(leaf, CommState):
      wire = wire.merge(Wire(*leaf))
  return wire


def other_participants(alive: jax.Array, axis_name: str = WORKERS) -> jax.Array:
  """[M] bool: the alive workers other than this one (if this one is alive)."""
  everyone = jax.lax.all_gather(alive, axis_name)
  me = jax.lax.axis_index(axis_name)
  return everyone & alive & (jnp.arange(everyone.shape[0]) != me)


def ring_all_reduce_state(alive: jax.Array, size, axis_name: str = WORKERS) -> CommState:
  """The wire of a ring all-reduce of `size` bytes among the alive workers.

  Each of m participants sends and receives 2 (m - 1) / m * size bytes; workers that
  are not alive send and receive nothing.

  References:
    Patarasuk & Yuan 2009 (ring all-reduce bandwidth).
  """
  participants = jax.lax.psum(alive.astype(jnp.float32), axis_name)
  per_worker = 2.0 * (participants - 1.0) / jnp.maximum(participants, 1.0) * size
  per_worker = jnp.where(alive, per_worker, 0.0).astype(jnp.float32)
  events = (alive & (participants > 1)).astype(jnp.int32)
  return CommState(per_worker, per_worker, events,
                   jnp.where(events > 0, ALL_REDUCE, NO_COMM).astype(jnp.int32),
                   jnp.where(alive, jnp.asarray(size, jnp.float32), 0.0),
                   other_participants(alive, axis_name))


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
  2 (m - 1) / m * S per worker (`ring_all_reduce_state`).

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
    return empty_comm_state(axis_name=axis_name)

  def update(updates, state, params=None, *, context: WorkerContext | None = None,
             **extra):
    del state, params, extra
    alive = _alive(context)
    on_wire = jax.tree.map(lambda x: x.astype(wire), updates)
    mean = worker_mean(on_wire, alive.astype(jnp.float32), axis_name)
    mean = jax.tree.map(lambda m, x: m.astype(x.dtype), mean, updates)
    return mean, ring_all_reduce_state(alive, tree_bytes(updates, wire), axis_name)

  return optax.GradientTransformationExtraArgs(init, update)
