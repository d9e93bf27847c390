"""Who steps and who talks at each tick: the host-side schedules a run replays.

The timing of events depends only on the network, never on parameter values (DESIGN
§5), so it is simulated on the host first and replayed by the jitted engine as ticks
of `StepContext` arrays:

- `SyncSchedule`: synchronous runs with workers that drop out of rounds at random
  or leave and rejoin (churn: absent workers neither step nor take part). At a sync an
  absent worker either keeps its own state and catches up at its next sync
  ('keep_local', the DiLoCo paper's dropped outer gradients) or adopts what the others
  agreed on, losing its round's work ('discard').
- `simulate_async`: asynchronous pairwise gossip (GASLoC-style rounds). Each worker
  computes its local steps at its own speed; when it is done it exchanges with a
  ready peer (a neighbour in the topology, sampled at random), or waits for one; the
  exchange takes the link's time, then both go on. The event list is turned into
  ticks: at each tick every worker with local work left takes one step (`active`), and
  every exchange whose two workers have done all the work that precedes it happens
  (`sync` for the pair, a pairwise-averaging `mixing` matrix). Each exchange only
  depends on its two workers' states, so this order computes exactly what the
  timed execution would.
"""

import dataclasses
import heapq

import numpy as np

from loco.network import DROPOUT_MODES, Network


@dataclasses.dataclass(frozen=True)
class SyncSchedule:
  """Active / alive masks of a synchronous run with dropout and churn.

  Attributes:
    num_workers: M.
    round_steps: steps per round (the algorithm's H; 1 for DDP and per-step gossip):
      a dropped-out worker is out for one whole round, whose sync is its last step.
    dropout: probability that a worker drops out of a round (at least one stays).
    churn: (worker, leave_step, rejoin_step): absent for steps in [leave, rejoin).
    seed: seeds the dropout draws (one generator per round: resuming is exact).
    dropout_mode: what an absent worker does at a sync (`DROPOUT_MODES`):
      'keep_local' (the DiLoCo paper's dropped outer gradients, arXiv 2311.08105 Fig.
      8): it sends nothing, receives nothing and keeps its params, inner state, anchor
      and outer state; at its next sync it sends its pseudo-gradient against its own
      (stale) anchor and then copies an up-to-date worker's anchor and outer state
      (`StepContext.rejoin`). 'discard': it downloads what the others agreed on and
      adopts it, so its round's local steps are lost.
  """
  num_workers: int
  round_steps: int = 1
  dropout: float = 0.0
  churn: tuple[tuple[int, int, int], ...] = ()
  seed: int = 0
  dropout_mode: str = 'keep_local'

  @property
  def trivial(self) -> bool:
    return self.dropout == 0.0 and not self.churn

  def masks(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(active, alive), each [count, M] bool, for steps start .. start + count - 1."""
    m = self.num_workers
    steps = np.arange(start, start + count)
    present = np.ones((count, m), bool)
    for worker, leave, rejoin in self.churn:
      present[(steps >= leave) & (steps < rejoin), worker] = False
    alive = present.copy()
    if self.dropout > 0:
      for t, step in enumerate(steps):
        alive[t] &= self._round_alive(step // self.round_steps)
    return present, alive

  def keep_rejoin(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """With 'keep_local': (keep, rejoin), each [count, M] bool (`StepContext`), for
    steps start .. start + count - 1; None with 'discard'.

    A worker is stale after a round whose sync (the round's last step) it missed, and
    until the end of a round whose sync it is alive for; `rejoin` is alive and stale.
    """
    if self.dropout_mode == 'discard':
      return None
    h = self.round_steps
    stale = np.zeros(self.num_workers, bool)
    for end in range(h - 1, start, h):            # the syncs before `start`
      stale = ~self.masks(end, 1)[1][0]
    _, alive = self.masks(start, count)
    rejoin = np.zeros_like(alive)
    for t in range(count):
      rejoin[t] = alive[t] & stale
      if (start + t + 1) % h == 0:
        stale = ~alive[t]
    return np.ones_like(alive), rejoin

  def _round_alive(self, round_index: int) -> np.ndarray:
    rng = np.random.default_rng([self.seed, int(round_index)])
    keep = rng.random(self.num_workers) >= self.dropout
    if not keep.any():
      keep[rng.integers(self.num_workers)] = True
    return keep


@dataclasses.dataclass(frozen=True)
class AsyncSchedule:
  """The replay of an asynchronous run, one row per tick.

  Attributes:
    active: [T, M] bool, workers taking an inner step at each tick.
    sync: [T, M] bool, workers taking part in an exchange at the end of the tick.
    mixing: [T, M, M] float32, each tick's mixing matrix (identity outside exchanges).
    seconds: [T] simulated time by which every event of ticks <= t is done.
    worker_seconds: [T, M] each worker's own clock after tick t (its last event's end).
    compute: [T, M] each worker's cumulative compute seconds after tick t.
    exchanges: (i, j, start, end) of every exchange, in time order.
  """
  active: np.ndarray
  sync: np.ndarray
  mixing: np.ndarray
  seconds: np.ndarray
  worker_seconds: np.ndarray
  compute: np.ndarray
  exchanges: list

  @property
  def num_ticks(self) -> int:
    return len(self.seconds)


def local_steps_per_round(net: Network, sync_every: int, local_work: str) -> np.ndarray:
  """H_i per worker: H ('steps'), or the steps that fit in H mean step times ('time')."""
  if local_work == 'steps':
    return np.full(net.num_workers, sync_every)
  budget = sync_every * float(np.mean(net.step_seconds))
  return np.maximum(1, np.floor(budget / net.step_seconds + 1e-9)).astype(int)


def simulate_async(net: Network, *, steps: int, sync_every: int, peers: np.ndarray,
                   exchange_bytes: float, local_work: str = 'steps',
                   peer_choice: str = 'ready', seed: int = 0) -> AsyncSchedule:
  """Simulates asynchronous pairwise gossip rounds and returns their replay.

  Args:
    net: the network (step times, links).
    steps: inner steps each worker takes in all (equal tokens per worker).
    sync_every: H, local steps between a worker's exchanges (see `local_work`).
    peers: [M, M] bool, who may exchange with whom (the topology's graph).
    exchange_bytes: bytes each side sends in one exchange.
    local_work: 'steps' or 'time' (per-worker H_i from its speed).
    peer_choice: 'ready': exchange with a random neighbour that is waiting, else wait
      for the next one to become ready; 'sampled': pick a random neighbour and wait for
      that one (a worker that becomes ready first serves whoever waits for it). With
      'ready', workers that finish together pair together, which can split the mixing
      graph into cohorts on heterogeneous networks; 'sampled' mixes across them at the
      price of waiting.
    seed: seeds the tie-breaks and the choice of peers.

  Returns:
    The `AsyncSchedule`. A worker whose neighbours have all finished skips its
    exchange and goes on with its local steps, so every worker takes `steps` steps.
  """
  m = net.num_workers
  peers = np.asarray(peers, bool)
  rng = np.random.default_rng(seed)
  c = np.asarray(net.step_seconds, float)
  per_round = local_steps_per_round(net, sync_every, local_work)
  done = np.zeros(m, int)
  finished = np.zeros(m, bool)       # no local work left and not waiting
  # Per worker: a list of ('local', n, start) and ('x', exchange index) items.
  items: list[list[tuple]] = [[] for _ in range(m)]
  exchanges: list[tuple[int, int, float, float]] = []
  heap: list[tuple[float, float, int]] = []
  waiting: dict[int, int | None] = {}   # waiting worker -> the neighbour it waits for

  def start_local(i: int, t: float) -> None:
    n = int(min(per_round[i], steps - done[i]))
    if n > 0:
      done[i] += n
      items[i].append(('local', n, t))
      heapq.heappush(heap, (t + n * c[i], rng.random(), i))
    else:
      finished[i] = True

  def exchange(i: int, j: int, t: float) -> None:
    waiting.pop(j, None)
    end = t + max(net.link_seconds(i, j, exchange_bytes), net.link_seconds(j, i, exchange_bytes))
    exchanges.append((min(i, j), max(i, j), t, end))
    for k in (i, j):
      items[k].append(('x', len(exchanges) - 1))
      start_local(k, end)

  def live_neighbours(i: int) -> list[int]:
    return [j for j in range(m) if peers[i, j] and not finished[j]]

  def release_stranded(t: float) -> None:
    # A waiter with no neighbour left to meet, or whose chosen one has finished.
    for w in sorted(waiting):
      if w not in waiting:
        continue
      options = live_neighbours(w)
      if not options:
        del waiting[w]
        start_local(w, t)
      elif waiting[w] is not None and finished[waiting[w]]:
        j = int(rng.choice(options))
        if j in waiting:
          del waiting[w]
          exchange(w, j, t)
        else:
          waiting[w] = j

  for i in range(m):
    start_local(i, 0.0)
  while heap:
    t, _, i = heapq.heappop(heap)
    if peer_choice == 'ready':
      ready = sorted(j for j in waiting if peers[i, j])
      if ready:
        exchange(i, int(rng.choice(ready)), t)
      else:
        waiting[i] = None
    else:
      askers = [w for w, target in waiting.items() if target == i]   # in arrival order
      if askers:
        exchange(i, askers[0], t)
      else:
        options = live_neighbours(i)
        j = int(rng.choice(options)) if options else None
        if j is not None and j in waiting:
          exchange(i, j, t)
        else:
          waiting[i] = j
    release_stranded(t)
  return _replay(items, exchanges, c, m)


def _replay(items, exchanges, c, m) -> AsyncSchedule:
  """Turns per-worker event lists into ticks (see the module docstring)."""
  pos = [0] * m                  # index of each worker's current item
  step_in = [0] * m              # steps of the current item already replayed
  actives, syncs, mixings, seconds, clocks, computes = [], [], [], [], [], []
  progress = np.zeros(m)         # time by which each worker's replayed work is done
  compute = np.zeros(m)

  def current(i):
    return items[i][pos[i]] if pos[i] < len(items[i]) else ('done',)

  def next_exchange(i):
    return current(i)[1] if current(i)[0] == 'x' else None

  while any(p < len(it) for p, it in zip(pos, items)):
    active = np.array([current(i)[0] == 'local' for i in range(m)])
    for i in np.flatnonzero(active):
      _, n, start = items[i][pos[i]]
      step_in[i] += 1
      progress[i] = start + step_in[i] * c[i]
      compute[i] += c[i]
      if step_in[i] == n:
        pos[i], step_in[i] = pos[i] + 1, 0
    sync = np.zeros(m, bool)
    mixing = np.eye(m, dtype=np.float32)
    for i in range(m):
      e = next_exchange(i)
      if e is None or sync[i]:
        continue
      a, b, _, end = exchanges[e]
      j = b if i == a else a
      if next_exchange(j) == e:
        sync[[a, b]] = True
        mixing[a, a] = mixing[b, b] = mixing[a, b] = mixing[b, a] = 0.5
        progress[[a, b]] = end
    for i in np.flatnonzero(sync):
      pos[i] += 1
    if not active.any() and not sync.any():
      raise RuntimeError('the asynchronous replay made no progress (a schedule bug).')
    actives.append(active)
    syncs.append(sync)
    mixings.append(mixing)
    seconds.append(progress.max() if not seconds else max(seconds[-1], progress.max()))
    clocks.append(progress.copy())
    computes.append(compute.copy())
  return AsyncSchedule(active=np.array(actives), sync=np.array(syncs),
                       mixing=np.array(mixings), seconds=np.array(seconds),
                       worker_seconds=np.array(clocks), compute=np.array(computes),
                       exchanges=exchanges)
