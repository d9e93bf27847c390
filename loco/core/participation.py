"""Who takes part in a sync, and how: the participation policy around a fragment's sync.

The engine (`loco.core.engine.local_updates`) runs a fragment's outer step for every worker
under one `lax.cond`; a tick's `Participation`, which the simulated network writes into
its `StepContext` (dropout, the asynchronous replay), decides who takes an outer step
and what each worker keeps of it, applied around the sync in one place (`Policy.sync`):

  all        every worker merges the sync (no Participation: the default; workers that
             are not `StepContext.alive` are left out of the averages and adopt the
             result)
  sync       whether the sync happens this tick, or which workers take an outer step
             (the asynchronous replay: the workers of this tick's exchanges; the
             others keep their state)
  keep       absent workers keep their own params (keep-local dropout)
  isolate    ... and their anchor, outer and merge state too (offline dropout): stale
             until they `rejoin`, when they copy an up-to-date worker's
             (`loco.comm.catch_up`)
  send       the overlapped asynchronous replay: the senders store a snapshot of what
             they send, after the tick's merges (`Policy.snapshots`)
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from loco.comm import axis
from loco import comm
from loco import wire as wire_lib
from loco.errors import ConfigError
from loco.wire import Wire

PyTree = Any


class Participation(NamedTuple):
  """Who takes part in this tick's sync and how, beyond `StepContext.alive`; None
  fields mean 'as every other worker', None for the whole value: every worker.

  Attributes:
    sync: bool scalar, whether the outer step happens this tick (overrides the sync
      plan of an algorithm with one fragment and no delay), or [M] bool, which workers
      take an outer step this tick (the asynchronous replay: only the workers of this
      tick's exchanges; the others keep their state and send nothing); see
      `sync_plan.Schedule.syncing`.
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
      them, the rejoining worker receives them (`loco.comm.catch_up`). Read by
      algorithms whose anchors are shared (`local_updates(..., shared_anchor=True)`).
    send: [M] bool, the overlapped asynchronous replay (`network.overlap='compute'`):
      workers that send their model at the end of this tick (after the tick's merges):
      their gossip stores the value it mixes as their snapshot, and this tick's `sync`
      workers merge their partners' snapshots (stale models) instead of their current
      values. None: exchanges read current values. Needs an algorithm built with
      snapshots (`AsyncReplay.overlapped`).
  """
  sync: jax.Array | None = None
  keep: jax.Array | None = None
  isolate: jax.Array | None = None
  rejoin: jax.Array | None = None
  send: jax.Array | None = None


# One worker's sync of a fragment: `sync(params, anchor, outer_state, merge_state, active,
# alive, adopt, phase=...) -> ((params, anchor, outer_state, merge_state), wire)`.
SyncFn = Callable[..., tuple[Any, Wire]]


@dataclasses.dataclass(frozen=True)
class Policy:
  """A tick's participation as [M] masks, applied around each fragment's sync inside
  the step (built by `policy`).

  Attributes:
    active: workers that take an inner step this tick.
    alive: workers that take part in communication.
    who: workers whose sync result is kept (the others keep their state), or None: all.
    adopt: workers that adopt the synced result (False: isolated, cut off).
    keep_params: absent workers that go on from their own params, or None.
    rejoin: workers that copy an up-to-date worker's state after the sync, or None.
    send: workers that store a snapshot of what they send, or None.
    vmap: the engine's worker map (`loco.comm.axis.vmap` over its mesh).
  """
  active: jax.Array
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

  @property
  def taking_part(self) -> jax.Array:
    """[M] bool: the workers taking part in the sync (alive, and syncing)."""
    return self.alive if self.who is None else self.alive & self.who

  def sync(self, sync: SyncFn, operands, arrive: Callable | None = None) -> tuple[Any, Wire]:
    """A fragment's sync for every worker with this tick's participation around it.

    Args:
      sync: one worker's sync of the fragment (`SyncFn`), mapped over the workers.
      operands: every worker's (params, anchor, outer state, merge state) of the
        fragment, before the sync.
      arrive: `arrive(new) -> new`, the merge reaching the params at the sync itself
        (after rejoining workers caught up), or None.

    Returns:
      (new, wire): what each worker keeps of the sync, and what it put on the wire.
    """
    new, wire = self._map(sync, operands, self.phase)
    if self.rejoin is not None:    # rejoining workers copy an up-to-date one's state
      num_workers = self.alive.shape[0]
      silent = axis.replicate(wire_lib.empty(num_workers), num_workers)
      new, caught = jax.lax.cond(jnp.any(self.rejoin & self.alive), self._catch_up,
                                 lambda n: (n, silent), new)
      wire = wire.merge(caught)
    if arrive is not None:
      new = arrive(new)
    if self.who is not None:     # workers that sit this sync out keep their state
      new, wire = self.vmap(lambda w, n, o, x: (optax.tree.where(w, n, o), x.where(w)), 0)(
          self.who, new, operands, wire)
    if self.keep_params is not None:   # absent workers go on from their own params
      new = (self.vmap(lambda k, n, o: optax.tree.where(k, o, n), 0)(
          self.keep_params, new[0], operands[0]), *new[1:])
    return new, wire

  def snapshots(self, sync: SyncFn, operands) -> PyTree:
    """The fragment's outer state after the senders store a snapshot of what they send
    (after the tick's merges; `operands` as in `sync`); unchanged without senders."""
    if self.send is None:
      return operands[2]

    def store(ops):
      snapshot = self._map(sync, ops, 'send')[0][2]
      return self.vmap(lambda w, n, o: optax.tree.where(w, n, o), 0)(
          self.send, snapshot, ops[2])
    return jax.lax.cond(jnp.any(self.send), store, lambda ops: ops[2], operands)

  def _map(self, sync: SyncFn, operands, phase: str | None) -> tuple[Any, Wire]:
    return self.vmap(functools.partial(sync, phase=phase), 0)(
        *operands, self.active, self.alive, self.adopt)

  def _catch_up(self, new) -> tuple[Any, Wire]:
    params, *held = new
    held, wire = self.vmap(comm.catch_up, 0)(tuple(held), self.alive, self.rejoin)
    return (params, *held), wire


def policy(participation: Participation | None, schedule, step: jax.Array,
           active: jax.Array, alive: jax.Array, *, shared_anchor: bool,
           vmap: Callable) -> tuple[jax.Array, Policy]:
  """The fragment that syncs at `step` and the tick's `Policy`.

  Args:
    participation: the tick's `Participation`, or None: every worker.
    schedule: the `sync_plan.Schedule` of the params (its `syncing` and `delay`).
    step: the step counter after this step's inner update.
    active: [M] bool, workers that take an inner step.
    alive: [M] bool, workers that take part in communication.
    shared_anchor: whether the workers' anchors are one value, so that rejoining
      workers can copy an up-to-date worker's (False: `rejoin` is ignored).
    vmap: the engine's worker map.

  Returns:
    (syncing, policy): the fragment that syncs (-1: none) and the tick's policy.
  """
  p = participation or Participation()
  syncing, who = schedule.syncing(step, p.sync)
  adopt = jnp.ones(alive.shape, bool)
  keep_params = None
  if p.keep is not None:      # keep-local dropout: absent workers keep their params
    if schedule.delay:
      raise ConfigError('keep-local dropout needs a merge at the sync itself '
                        '(overlap_steps=0); use dropout_mode discard.')
    keep_params = ~alive & jnp.asarray(p.keep, bool)
    if p.isolate is not None:   # ... and, cut off, their whole state
      adopt = ~jnp.asarray(p.isolate, bool)
      kept = alive | adopt
      who = kept if who is None else who & kept
  rejoin = None if p.rejoin is None or not shared_anchor else jnp.asarray(p.rejoin, bool)
  send = None if p.send is None else jnp.asarray(p.send, bool)
  return syncing, Policy(active=active, alive=alive, who=who, adopt=adopt,
                         keep_params=keep_params, rejoin=rejoin, send=send, vmap=vmap)
