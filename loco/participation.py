"""Who takes part in a sync, and how: the participation policy around a fragment's sync.

The engine (`loco.engine.local_updates`) runs a fragment's outer step for every worker
under one `lax.cond`; a tick's `Participation`, which the simulated network writes into
its `StepContext` (dropout, the asynchronous replay), decides what each worker keeps of
that step, applied around it in one place (`Policy`):

  all        every worker merges the sync (no Participation: the default; workers that
             are not `alive` are left out of the averages and adopt the result)
  keep       absent workers keep their own params (keep-local dropout)
  isolate    ... and their anchor, outer and merge state too (offline dropout): stale
             until they `rejoin`, when they copy an up-to-date worker's
  send       the overlapped asynchronous replay: the senders store a snapshot of what
             they send, after the tick's merges

The schedule's own [M] `sync` mask (the asynchronous replay: only this tick's
exchanging workers take an outer step) is applied here too (`Policy.who`).
"""

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from loco import axis
from loco import comm
from loco import wire as wire_lib
from loco.errors import ConfigError
from loco.wire import Wire

PyTree = Any


class Participation(NamedTuple):
  """How the workers take part in this tick's sync, beyond `StepContext.alive`; None
  fields mean 'as every other worker'.

  Attributes:
    keep: [M] bool, absent workers that keep their own params at a sync (keep-local
      dropout, `network.dropout_mode='keep_local'` or `'offline'`): an absent worker
      with `keep` does not merge the outer step into its params and goes on from its
      own; without it (None, or False) it adopts what the others agreed on
      (`'discard'`).
    isolate: [M] bool, absent workers that are cut off at a sync (`'offline'`): they
      neither send nor receive and keep their anchor, outer state and merge state too
      (stale until `rejoin`); without it an absent worker downloads the result.
    rejoin: [M] bool, workers whose anchor and outer state are stale because they were
      isolated at an earlier sync: at this tick's sync such a worker, if alive, sends
      its pseudo-gradient against its own anchor like the others, then copies the
      anchor, outer state and merge state of an up-to-date worker (the lowest-index
      alive worker that is not rejoining), whose bytes are counted: the sender sends
      them, the rejoining worker receives them. Read by algorithms whose anchors are
      shared (`local_updates(..., shared_anchor=True)`).
    send: [M] bool, the overlapped asynchronous replay (`network.overlap='compute'`):
      workers that send their model at the end of this tick (after the tick's merges):
      their gossip stores the value it mixes as their snapshot, and this tick's `sync`
      workers merge their partners' snapshots (stale models) instead of their current
      values. None: exchanges read current values. Needs an algorithm built with
      snapshots (`AsyncReplay.overlapped`).
  """
  keep: jax.Array | None = None
  isolate: jax.Array | None = None
  rejoin: jax.Array | None = None
  send: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Policy:
  """A tick's participation as [M] masks, applied around each fragment's sync inside
  the step (`policy`); the worker map `vmap` is the engine's.

  Attributes:
    alive: workers that take part in communication.
    who: workers whose sync result is kept (the others keep their state), or None: all.
    adopt: workers that adopt the synced result (False: isolated, cut off).
    keep_params: absent workers that go on from their own params, or None.
    rejoin: workers that copy an up-to-date worker's state after the sync, or None.
    send: workers that store a snapshot of what they send, or None.
  """
  alive: jax.Array
  who: jax.Array | None
  adopt: jax.Array
  keep_params: jax.Array | None
  rejoin: jax.Array | None
  send: jax.Array | None
  vmap: Callable

  @property
  def phase(self) -> str | None:
    """The sync's phase for the communication links: 'merge' while senders keep
    snapshots (partners' stale models are merged), else None."""
    return None if self.send is None else 'merge'

  def after_sync(self, new, wire: Wire) -> tuple[Any, Wire]:
    """After the workers' outer step (before the merge reaches the params): rejoining
    workers catch up with an up-to-date one."""
    if self.rejoin is None:
      return new, wire
    num_workers = self.alive.shape[0]
    silent = axis.replicate(wire_lib.empty(num_workers), num_workers)
    new, caught = jax.lax.cond(
        jnp.any(self.rejoin & self.alive),
        lambda n: self.vmap(_catch_up, 0)(n, self.alive, self.rejoin),
        lambda n: (n, silent), new)
    return new, wire.merge(caught)

  def select(self, new, wire: Wire, old) -> tuple[Any, Wire]:
    """What each worker keeps of the sync (`new`, its `wire`) against its state before
    it (`old`, both (params, anchor, outer state, merge state) lists of leaves)."""
    if self.who is not None:     # workers that sit this sync out keep their state
      new, wire = self.vmap(lambda w, n, o, x: (optax.tree.where(w, n, o), x.where(w)), 0)(
          self.who, new, old, wire)
    if self.keep_params is not None:   # absent workers go on from their own params
      new = (self.vmap(lambda k, n, o: optax.tree.where(k, o, n), 0)(
          self.keep_params, new[0], old[0]), *new[1:])
    return new, wire

  def store_snapshots(self, snapshot: Callable[[Any], Any], operands) -> PyTree:
    """The outer state after the senders store their snapshots (`snapshot(operands)`:
    every worker's outer state with its snapshot of what it sends)."""
    def store(ops):
      return self.vmap(lambda w, n, o: optax.tree.where(w, n, o), 0)(
          self.send, snapshot(ops), ops[2])
    return jax.lax.cond(jnp.any(self.send), store, lambda ops: ops[2], operands)


def policy(participation: Participation | None, alive: jax.Array, who: jax.Array | None,
           *, shared_anchor: bool, delay: int, vmap: Callable) -> Policy:
  """The tick's `Policy`: `alive` [M], `who` the schedule's [M] mask of the workers
  that sync (or None), `shared_anchor` whether rejoining workers can copy an anchor,
  `delay` the merge's tau."""
  p = participation or Participation()
  adopt = jnp.ones(alive.shape, bool)
  keep_params = None
  if p.keep is not None:      # keep-local dropout: absent workers keep their params
    if delay:
      raise ConfigError('keep-local dropout needs a merge at the sync itself '
                        '(overlap_steps=0); use dropout_mode discard.')
    keep_params = ~alive & jnp.asarray(p.keep, bool)
    if p.isolate is not None:   # ... and, cut off, their whole state
      adopt = ~jnp.asarray(p.isolate, bool)
      kept = alive | adopt
      who = kept if who is None else who & kept
  rejoin = None if p.rejoin is None or not shared_anchor else jnp.asarray(p.rejoin, bool)
  send = None if p.send is None else jnp.asarray(p.send, bool)
  return Policy(alive=alive, who=who, adopt=adopt, keep_params=keep_params, rejoin=rejoin,
                send=send, vmap=vmap)


def _catch_up(new, alive, rejoin):
  """A rejoining worker copies the anchor, outer state (but its links' own state:
  `comm.LINK_STATES`) and merge state that the lowest-index up-to-date alive worker
  holds after the sync (inside the worker map). When every alive worker is rejoining
  (none is up to date), the lowest-index alive worker's history wins: it keeps the
  outer step it took on its own anchor and the others copy it, so that the alive
  workers leave the sync with one anchor (the schedule then counts them up to date
  and the absent ones stale)."""
  params, *held = new
  fresh = axis.all_gather(alive & ~rejoin)
  donors = jnp.where(jnp.any(fresh), fresh, axis.all_gather(alive))
  source = jnp.argmax(donors)
  me = axis.axis_index()
  take = rejoin & alive & (me != source)
  own = lambda x: isinstance(x, comm.LINK_STATES)   # each worker keeps its link's state
  copied = jax.tree.map(lambda x: x if own(x) else _from_worker(x, me == source), held,
                        is_leaf=own)
  held = optax.tree.where(take, copied, held)
  # What a real worker sends: the anchor and the optimizer's float arrays.
  nbytes = jnp.float32(comm.tree_bytes([
      x for x in jax.tree.leaves(jax.tree.map(lambda x: None if own(x) else x, held,
                                              is_leaf=own))
      if jnp.issubdtype(x.dtype, jnp.floating)]))
  takers = axis.psum(take.astype(jnp.float32))
  serves = (me == source) & (takers > 0)
  wire = Wire(sent=jnp.where(serves, nbytes * takers, 0.0),
              received=jnp.where(take, nbytes, 0.0),
              events=(serves | take).astype(jnp.int32),
              kind=jnp.where(serves | take, comm.ALL_REDUCE, comm.NO_COMM).astype(jnp.int32),
              payload=jnp.zeros((), jnp.float32),
              peers=jnp.where(serves, axis.all_gather(take), jax.nn.one_hot(
                  source, axis.axis_size(), dtype=bool) & take))
  return (params, *held), wire


def _from_worker(x: jax.Array, mine: jax.Array) -> jax.Array:
  """Inside the worker map: the value of `x` on the one worker where `mine` is True
  (a sum with zeros elsewhere, exact; booleans travel as integers)."""
  if x.dtype == jnp.bool_:
    return axis.psum(jnp.where(mine, x, False).astype(jnp.int32)) > 0
  return axis.psum(jnp.where(mine, x, jnp.zeros_like(x)))
