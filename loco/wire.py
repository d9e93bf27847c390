"""The one wire record: what a step put on the wire, per worker (DESIGN §5).

Every communication transform keeps a `Wire` in its state (what its last update sent);
the engine `collect`s them into `StepInfo.wire`; the network clock reads a host copy
(`network.Clock.step`); `comms.jsonl` stores it (`loco.sim.commlog`) and `loco.retime`
reads it back. One record under one set of names, from the collective to the clock.

This module sits at the bottom of the import graph: it imports no other loco module,
and jax only inside the functions that compute on records, so that the host readers
(`loco.sim.network`, `loco.sim.commlog`, `loco.files.runs`, and through them the report and sweep
commands) stay free of jax.
"""

from typing import Any, NamedTuple

# How a worker talked: `Wire.kind` indexes this (the clock reads only the index).
KINDS = ('none', 'all_reduce', 'all_gather', 'gossip')
NO_COMM, ALL_REDUCE, ALL_GATHER, GOSSIP = range(len(KINDS))


class Wire(NamedTuple):
  """What one worker put on the wire: in a transform's state (its last update), per
  step (`StepInfo.wire`, the merge of a step's transforms) and in the clock.

  Leaves are jax or numpy arrays: scalars per worker inside the worker map, [M] stacked
  per step (peers [M, M]), [K, M] per chunk of K steps.

  Attributes:
    sent: float32, bytes this worker sent.
    received: float32, bytes this worker received (None in a host record read from a
      log that did not store it: nothing beyond a collective's share).
    events: int32, communication events this worker took part in.
    kind: int32, this worker's collective (an index of `KINDS`).
    payload: float32, bytes of one message: the all-reduced tree (at its wire size),
      this worker's all-gathered message, or what crossed one gossip edge.
    peers: [M] bool, the workers this one exchanged with (the edges actually used, or
      the other participants of a collective).
    fragment: int32, the parameter fragment whose sync started this step (-1: none),
      or None: the whole model syncs (no fragments).
    overlap: int32, inner steps the communication started this step may run behind
      before its result is needed (Streaming DiLoCo's tau), or None (or 0): it blocks
      the step.
  """
  sent: Any
  received: Any
  events: Any
  kind: Any
  payload: Any
  peers: Any
  fragment: Any = None
  overlap: Any = None

  def merge(self, other: 'Wire') -> 'Wire':
    """Both records: bytes and events added, the widest kind and payload, the union of
    peers; fragment and overlap from whichever is set (this one first)."""
    import jax.numpy as jnp
    either = lambda a, b: a if a is not None else b
    return Wire(self.sent + other.sent, self.received + other.received,
                self.events + other.events, jnp.maximum(self.kind, other.kind),
                jnp.maximum(self.payload, other.payload), self.peers | other.peers,
                either(self.fragment, other.fragment), either(self.overlap, other.overlap))

  def where(self, pred) -> 'Wire':
    """This record where `pred`, else nothing (a worker that sat the step out); the
    fragment and overlap, which describe the step, are kept."""
    import jax
    import jax.numpy as jnp
    off = lambda x: jnp.where(pred, x, jnp.zeros_like(x))
    return self._replace(**{f: jax.tree.map(off, getattr(self, f))
                            for f in ('sent', 'received', 'events', 'kind', 'payload',
                                      'peers')})


def empty(num_workers: int) -> Wire:
  """One worker's record of no communication among `num_workers` workers."""
  import jax.numpy as jnp
  return Wire(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
              jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
              jnp.zeros((), jnp.float32), jnp.zeros((num_workers,), bool))


def collect(state: Any, num_workers: int | None = None) -> Wire:
  """The merge of every `Wire` in `state` (a chain's state after an update).

  Args:
    state: a pytree (an optax chain state).
    num_workers: M, for the empty record of a state that holds no `Wire` (inside the
      worker map); not needed when it holds one.

  Returns:
    One worker's `Wire`.
  """
  import jax
  found = [leaf for leaf in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, Wire))
           if isinstance(leaf, Wire)]
  if not found:
    if num_workers is None:
      raise ValueError('collect: the state holds no Wire; pass num_workers.')
    return empty(num_workers)
  wire = found[0]
  for other in found[1:]:
    wire = wire.merge(other)
  return wire

