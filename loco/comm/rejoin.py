"""A rejoining worker's catch-up: the copy of an up-to-date worker's state (offline
dropout, `loco.core.participation`).

A worker cut off at earlier syncs holds a stale anchor and outer state. At its next
sync it copies them from one up-to-date worker: a broadcast from that donor, which
sends its state once per rejoining worker (a real system would send it point to point)
and whose bytes are counted on both ends.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax

from loco.comm import axis as comm_axis
from loco.comm.core import ALL_REDUCE, NO_COMM, WORKERS, Wire, tree_bytes
from loco.comm.gossip import GossipState
from loco.comm.sparse import CompressedState
from loco.comm.sparta import SpartaState

PyTree = Any

# The states of communication links: each worker's own (its wire record, error-feedback
# residual, random key), never copied from another worker (a catch-up copies the rest
# of the outer state).
LINK_STATES = (Wire, CompressedState, GossipState, SpartaState)


def catch_up(held: PyTree, alive: jax.Array, rejoin: jax.Array,
             axis_name: str = WORKERS) -> tuple[PyTree, Wire]:
  """Rejoining workers copy the state `held` of the lowest-index up-to-date alive worker.

  Runs inside the per-worker map. `held` is this worker's state to catch up (the
  engine's anchor, outer state and merge state after the sync); the states of
  communication links inside it (`LINK_STATES`) stay each worker's own. When every
  alive worker is rejoining (none is up to date), the lowest-index alive worker's
  history wins: it keeps its own state and the others copy it, so that the alive workers
  leave with one state.

  Bytes: the donor sends the floating-point arrays of `held` (the anchor and the
  optimizer's buffers) to each alive rejoining worker, which receives them once; both
  count one all-reduce-kind event, and `Wire.peers` names the other end.

  Args:
    held: this worker's state (a pytree).
    alive: bool scalar, this worker takes part in communication this tick.
    rejoin: bool scalar, this worker's `held` is stale and it copies the donor's.
    axis_name: the worker axis name.

  Returns:
    (held, wire): this worker's state after the catch-up, and what it put on the wire.
  """
  fresh = comm_axis.all_gather(alive & ~rejoin, axis_name)
  donors = jnp.where(jnp.any(fresh), fresh, comm_axis.all_gather(alive, axis_name))
  source = jnp.argmax(donors)
  me = comm_axis.axis_index(axis_name)
  take = rejoin & alive & (me != source)
  own = lambda x: isinstance(x, LINK_STATES)   # each worker keeps its link's state
  copied = jax.tree.map(lambda x: x if own(x) else broadcast(x, me == source, axis_name),
                        held, is_leaf=own)
  held = optax.tree.where(take, copied, held)
  nbytes = jnp.float32(tree_bytes([
      x for x in jax.tree.leaves(jax.tree.map(lambda x: None if own(x) else x, held,
                                              is_leaf=own))
      if jnp.issubdtype(x.dtype, jnp.floating)]))
  takers = comm_axis.psum(take.astype(jnp.float32), axis_name)
  serves = (me == source) & (takers > 0)
  wire = Wire(sent=jnp.where(serves, nbytes * takers, 0.0),
              received=jnp.where(take, nbytes, 0.0),
              events=(serves | take).astype(jnp.int32),
              kind=jnp.where(serves | take, ALL_REDUCE, NO_COMM).astype(jnp.int32),
              payload=jnp.zeros((), jnp.float32),
              peers=jnp.where(serves, comm_axis.all_gather(take, axis_name), jax.nn.one_hot(
                  source, comm_axis.axis_size(axis_name), dtype=bool) & take))
  return held, wire


def broadcast(x: jax.Array, mine: jax.Array, axis_name: str = WORKERS) -> jax.Array:
  """Inside the worker map: the value of `x` on the one worker where `mine` is True, on
  every worker (a sum with zeros elsewhere, exact; booleans travel as integers)."""
  if x.dtype == jnp.bool_:
    return comm_axis.psum(jnp.where(mine, x, False).astype(jnp.int32), axis_name) > 0
  return comm_axis.psum(jnp.where(mine, x, jnp.zeros_like(x)), axis_name)
