"""A run's timeline: the StepContexts its ticks replay and the simulated time they take.

The train loop asks a `Timeline` for the contexts of each chunk of ticks (None when
nothing is special: every worker steps, the algorithm's own sync schedule), and gives
it back the chunk's `StepInfo` to advance the clock (DESIGN §5):

- synchronous mode: `schedule.SyncSchedule` (dropout, churn) and `network.Clock`
  (compute, then the algorithm's collective timed from the bytes it sent);
- asynchronous mode (GASLoC, NoLoCo): `schedule.simulate_async` gives the ticks and
  their times up front.
"""

from typing import Any

import jax.numpy as jnp
import numpy as np

from loco import algorithms
from loco import comm
from loco import network as network_lib
from loco import schedule as schedule_lib
from loco.engine import StepContext
from loco.errors import ConfigError


def _gossip_topology(name: str, settings: dict[str, Any], num_workers: int):
  return comm.resolve_topology(settings['topology'], num_workers,
                               weights=settings.get('weights', 'metropolis'),
                               seed=settings.get('seed', 0),
                               pairwise=name in algorithms.PAIRWISE)


def _edges(weights: np.ndarray) -> np.ndarray:
  return (np.asarray(weights) > 0) & ~np.eye(len(weights), dtype=bool)


class Timeline:
  """Contexts for a run's ticks and the simulated seconds they take.

  Args:
    cfg: the network config.
    net: the network built from it.
    num_workers: M.
    steps: inner steps per worker.
    algorithm: the registry name.
    settings: the algorithm's keys (`algorithms.settings_of`).
    model_bytes: bytes of one model at float32 (for the asynchronous exchanges).
  """

  def __init__(self, cfg: network_lib.NetworkConfig, net: network_lib.Network, *,
               num_workers: int, steps: int, algorithm: str, settings: dict[str, Any],
               model_bytes: int):
    self.cfg, self.net, self.num_workers = cfg, net, num_workers
    if algorithm not in algorithms.COLLECTIVES:
      raise ConfigError(f'algorithm {algorithm!r} does not say how it communicates; '
                        'register it with loco.algorithms.register(name, factory, '
                        'collective=...) to time it on a network.')
    collective = algorithms.COLLECTIVES[algorithm]
    topo = None
    if collective == 'gossip':
      topo = _gossip_topology(algorithm, settings, num_workers)
      if comm.is_all_reduce(topo):
        collective = 'all_reduce'
    self.schedule = None
    if cfg.mode == 'async':
      if algorithm not in algorithms.ASYNC:
        raise ConfigError(f"network.mode='async' replays outer-gossip rounds; it needs "
                          f"algorithm.name in {algorithms.ASYNC}, got {algorithm!r}.")
      if cfg.dropout or cfg.churn:
        raise ConfigError("network.dropout and network.churn apply to network.mode='sync'.")
      wire = jnp.dtype(comm.transport_dtype(settings.get('transport_dtype', 'float32')))
      self.schedule = schedule_lib.simulate_async(
          net, steps=steps, sync_every=settings['sync_every'], peers=topo.adjacency,
          exchange_bytes=model_bytes * wire.itemsize / 4, local_work=cfg.local_work,
          peer_choice=cfg.peer_choice, seed=cfg.seed)
      self.num_ticks = self.schedule.num_ticks
      return
    if cfg.local_work != 'steps' or cfg.peer_choice != 'ready':
      raise ConfigError("network.local_work and network.peer_choice apply to "
                        "network.mode='async'.")
    self.num_ticks = steps
    self.sync = schedule_lib.SyncSchedule(
        num_workers, round_steps=settings.get('sync_every', 1) or 1, dropout=cfg.dropout,
        churn=cfg.churn, seed=cfg.seed)
    edges_fn = None
    if collective == 'gossip':
      if topo.is_random:
        seed = settings.get('seed', 0)
        edges_fn = lambda r: _edges(topo.weights_for(
            int(topo.sample_choice_jax(comm.round_key(None, seed, r)))))
      else:
        edges_fn = lambda r: topo.adjacency
    self.clock = network_lib.Clock(net, collective, edges_fn)

  def contexts(self, start: int, count: int) -> StepContext | None:
    """The StepContext arrays ([count, ...]) of ticks start .. start + count - 1."""
    if self.schedule is not None:
      s, e = start, start + count
      return StepContext(active=self.schedule.active[s:e], sync=self.schedule.sync[s:e],
                         mixing=self.schedule.mixing[s:e])
    if self.sync.trivial:
      return None
    active, alive = self.sync.masks(start, count)
    return StepContext(active=active, alive=alive)

  def active(self, start: int, count: int) -> np.ndarray:
    """[count, M] bool: workers that step at these ticks."""
    ctx = self.contexts(start, count)
    if ctx is None:
      return np.ones((count, self.num_workers), bool)
    return np.asarray(ctx.active, bool)

  def advance(self, start: int, info) -> None:
    """Advances the clock over a chunk of ticks from their StepInfo ([K, M] arrays)."""
    if self.schedule is not None:
      return
    sent = np.asarray(info.bytes_sent)
    comms = np.asarray(info.comms)
    overlap = None if info.overlap_steps is None else np.asarray(info.overlap_steps)
    active = self.active(start, len(sent))
    for k in range(len(sent)):
      self.clock.step(active[k], sent[k], comms[k],
                      None if overlap is None else int(overlap[k]))

  def metrics(self, end: int) -> dict[str, Any]:
    """sim_seconds, utilization (mean compute / elapsed) and idle seconds per worker."""
    if self.schedule is not None:
      seconds = float(self.schedule.seconds[end - 1])
      own = self.schedule.worker_seconds[end - 1]
      compute = self.schedule.compute[end - 1]
    else:
      seconds, own, compute = self.clock.seconds, self.clock.now, self.clock.compute
    # Idle: each worker's own elapsed time (its clock) minus its compute time.
    return dict(sim_seconds=seconds,
                utilization=network_lib.utilization(compute, seconds),
                idle_seconds=[round(float(t - c), 6) for t, c in zip(own, compute)])

  def state_dict(self) -> dict:
    return {} if self.schedule is not None else self.clock.state_dict()

  def load_state_dict(self, d: dict) -> None:
    if self.schedule is None and d:
      self.clock.load_state_dict(d)


def make_timeline(cfg, *, num_workers: int, steps: int, algorithm: str,
                  algorithm_kwargs: dict[str, Any], flops_per_token: float,
                  tokens_per_step: int, model_bytes: int) -> Timeline | None:
  """The run's Timeline, or None without a network config."""
  if cfg is None:
    return None
  seconds = network_lib.nominal_step_seconds(cfg, flops_per_token, tokens_per_step)
  net = network_lib.make_network(cfg, num_workers, seconds)
  settings = algorithms.settings_of(algorithm, algorithm_kwargs)
  return Timeline(cfg, net, num_workers=num_workers, steps=steps, algorithm=algorithm,
                  settings=settings, model_bytes=model_bytes)
