"""A run's timeline: the StepContexts its ticks replay and the simulated time they take.

The train loop asks a `Timeline` for the contexts of each chunk of ticks (None when
nothing is special: every worker steps, the algorithm's own sync schedule), and gives
it back the chunk's `StepInfo` to advance the clock (DESIGN §5):

- synchronous mode: `schedule.SyncSchedule` (dropout, churn) and `network.Clock`, which
  reads only what each step reported it put on the wire (`wires`);
- asynchronous mode (an algorithm with `Algorithm.replay`: GASLoC, NoLoCo):
  `schedule.simulate_async` gives the ticks and their times up front.
"""

from typing import Any

import numpy as np

from loco.sim import network as network_lib
from loco.sim import schedule as schedule_lib
from loco.core.engine import Algorithm, StepContext
from loco.core.participation import Participation
from loco.errors import ConfigError
from loco.wire import Wire

_ITEMSIZE = {'float32': 4, 'bfloat16': 2, 'float16': 2}


def wires(active_KxM: np.ndarray, info) -> list[tuple[np.ndarray, Wire]]:
  """(active, Wire) of each step of a chunk's StepInfo ([K, ...] host arrays): what
  `network.Clock.step` and the communication log read."""
  return [(np.asarray(active_KxM[k], bool),
           Wire(*(None if x is None else np.asarray(x)[k] for x in info.wire)))
          for k in range(len(active_KxM))]


class Timeline:
  """Contexts for a run's ticks and the simulated seconds they take.

  Args:
    cfg: the network config.
    net: the network built from it.
    num_workers: M.
    steps: inner steps per worker.
    round_steps: steps per round, for dropout (a worker drops out of whole rounds):
      the algorithm's own `Algorithm.round_steps`.
    algorithm: the algorithm (its `replay`, for the asynchronous mode).
    name: the algorithm's name, for messages.
    model_bytes: bytes of one model at float32 (the asynchronous exchanges' size when
      `params` is not given or the algorithm cannot measure its exchange).
    params: one model's params or their shapes: the asynchronous exchanges' bytes are
      measured from the algorithm's own outer chain (`AsyncReplay.exchange_bytes`).
  """

  def __init__(self, cfg: network_lib.NetworkConfig, net: network_lib.Network, *,
               num_workers: int, steps: int, round_steps: int, algorithm: Algorithm,
               name: str, model_bytes: int, params: Any = None):
    self.num_workers = num_workers
    self.schedule = None
    if cfg.mode == 'async':
      replay = algorithm.replay
      if replay is None:
        raise ConfigError(f"network.mode='async' replays pairwise exchanges in the outer "
                          f"chain; algorithm {name!r} has none (gasloc and noloco do).")
      if cfg.dropout or cfg.churn:
        raise ConfigError("network.dropout and network.churn apply to network.mode='sync'.")
      if algorithm.local_steps is not None:
        raise ConfigError("algorithm.local_steps applies to network.mode='sync'; the "
                          "asynchronous replay takes each worker's H_i from "
                          "network.local_work.")
      overlap = cfg.async_overlap
      if overlap == 'compute' and not replay.snapshots:
        raise ConfigError(f"network.overlap='compute' needs algorithm {name!r} built with "
                          "gossip snapshots (its AsyncReplay.overlapped()); or set "
                          "network.overlap='none'.")
      self.exchange_bytes = (model_bytes * _ITEMSIZE[replay.wire_dtype] / 4
                             if params is None or replay.exchange_bytes is None
                             else replay.exchange_bytes(params, num_workers))
      self.schedule = schedule_lib.simulate_async(
          net, steps=steps, sync_every=replay.sync_every, peers=replay.peers(num_workers),
          exchange_bytes=self.exchange_bytes, local_work=cfg.local_work,
          peer_choice=cfg.peer_choice, overlap=overlap, seed=cfg.seed)
      self.num_ticks = self.schedule.num_ticks
      return
    if cfg.peer_choice != 'ready':
      raise ConfigError("network.peer_choice applies to network.mode='async'.")
    self.num_ticks = steps
    if (cfg.dropout or cfg.churn) and cfg.dropout_mode != 'discard' and not (
        algorithm.keeps_local):
      raise ConfigError(f"network.dropout_mode={cfg.dropout_mode!r} leaves an absent "
                        f"worker with its own params, but algorithm {name!r} merges the "
                        f"outer step tau > 0 steps after its sync; set network.dropout_mode="
                        f"'discard' (or algorithm.overlap_steps=0).")
    self.local_steps = (None if algorithm.local_steps is None
                        else np.asarray(algorithm.local_steps))
    if cfg.local_work != 'steps':     # H_i from the network, within each round of H
      if self.local_steps is not None or round_steps <= 1:
        raise ConfigError(f"network.local_work={cfg.local_work!r} derives each worker's "
                          "local steps in rounds of several steps; it needs an algorithm "
                          "with rounds and no algorithm.local_steps.")
      self.local_steps = np.minimum(schedule_lib.local_steps_per_round(
          net, round_steps, cfg.local_work), round_steps)
    self.sync = schedule_lib.SyncSchedule(
        num_workers, round_steps=round_steps, dropout=cfg.dropout, churn=cfg.churn,
        seed=cfg.seed, dropout_mode=cfg.dropout_mode)
    self.clock = network_lib.Clock(net, overlap=cfg.clock_overlap,
                                   buckets=cfg.overlap_buckets)

  def contexts(self, start: int, count: int) -> StepContext | None:
    """The StepContext arrays ([count, ...]) of ticks start .. start + count - 1."""
    if self.schedule is not None:
      s, e = start, start + count
      send = None if self.schedule.send is None else self.schedule.send[s:e]
      return StepContext(active=self.schedule.active[s:e], mixing=self.schedule.mixing[s:e],
                         participation=Participation(sync=self.schedule.sync[s:e], send=send))
    if self.sync.trivial and self.local_steps is None:
      return None
    active, alive = self.sync.masks(start, count)
    if self.local_steps is not None:     # worker i steps in the first H_i of a round
      within = np.arange(start, start + count)[:, None] % self.sync.round_steps
      active = active & (within < self.local_steps[None, :])
    keep, isolate, rejoin = ((None, None, None) if self.sync.trivial
                             else self.sync.dropout_masks(start, count) or (None,) * 3)
    participation = (None if keep is isolate is rejoin is None
                     else Participation(keep=keep, isolate=isolate, rejoin=rejoin))
    return StepContext(active=active, alive=alive, participation=participation)

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
    for active, wire in wires(self.active(start, len(info.wire.sent)), info):
      self.clock.step(wire, active)

  def metrics(self, end: int) -> dict[str, Any]:
    """sim_seconds, utilization (mean compute / elapsed) and idle seconds per worker;
    asynchronous: also the staleness of the exchanges merged so far (mean and max
    inner steps a worker took between sending its model and merging its partner's)."""
    if self.schedule is not None:
      s = self.schedule
      out = clock_metrics(float(s.seconds[end - 1]), s.worker_seconds[end - 1],
                          s.compute[end - 1])
      merged = np.array([x[3] <= s.seconds[end - 1] for x in s.exchanges], bool)
      stale = s.staleness[merged] if merged.any() else np.zeros((1, 2), int)
      return dict(out, stale_steps_mean=round(float(stale.mean()), 6),
                  stale_steps_max=int(stale.max()))
    return clock_metrics(self.clock.seconds, self.clock.now, self.clock.compute)

  def state_dict(self) -> dict:
    return {} if self.schedule is not None else self.clock.state_dict()

  def load_state_dict(self, d: dict) -> None:
    if self.schedule is None and d:
      self.clock.load_state_dict(d)


def clock_metrics(seconds: float, own: np.ndarray, compute: np.ndarray) -> dict[str, Any]:
  """The metrics of a clock; idle: each worker's own elapsed time minus its compute."""
  return dict(sim_seconds=seconds, utilization=network_lib.utilization(compute, seconds),
              idle_seconds=[round(float(t - c), 6) for t, c in zip(own, compute)])


def make_timeline(cfg, *, num_workers: int, steps: int, algorithm: Algorithm, name: str,
                  flops_per_token: float, tokens_per_step: int, model_bytes: int,
                  params: Any = None) -> Timeline | None:
  """The run's Timeline, or None without a network config; rounds are the algorithm's
  declared `round_steps`."""
  if cfg is None:
    return None
  seconds = network_lib.nominal_step_seconds(cfg, flops_per_token, tokens_per_step)
  net = network_lib.make_network(cfg, num_workers, seconds)
  return Timeline(cfg, net, num_workers=num_workers, steps=steps,
                  round_steps=algorithm.round_steps, algorithm=algorithm, name=name,
                  model_bytes=model_bytes, params=params)
