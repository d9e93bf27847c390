"""Who steps and who talks at each tick: the host-side schedules a run replays.

The timing of events depends only on the network, never on parameter values (DESIGN
§5), so it is simulated on the host first and replayed by the jitted engine as ticks
of `StepContext` arrays:

- `SyncSchedule`: synchronous runs with workers that drop out of rounds at random
  or leave and rejoin (churn: absent workers neither step nor take part). At a sync an
  absent worker keeps its own params and receives the new anchor ('keep_local', the
  DiLoCo paper's dropped outer gradients), is cut off and catches up at its next sync
  ('offline'), or adopts what the others agreed on, losing its round's work
  ('discard').
- `simulate_async`: asynchronous pairwise gossip (GASLoC-style rounds). Each worker
  computes its local steps at its own speed; when it is done it exchanges with a
  ready peer (a neighbour in the topology, sampled at random), or waits for one; the
  exchange takes the link's time, then both go on. The event list is turned into
  ticks: at each tick every worker with local work left takes one step (`active`), and
  every exchange whose two workers have done all the work that precedes it happens
  (`sync` for the pair, a pairwise-averaging `mixing` matrix). Each exchange only
  depends on its two workers' states, so this order computes exactly what the
  timed execution would.

  With `overlap='compute'` (the GASLoC paper's setting, arXiv 2606.11081) a worker
  does not wait for its exchange: it sends its model when the exchange starts and
  computes on; each side merges the other's model, as it was when sent, at its first
  step boundary after the transfer (`send` ticks store the snapshot, `sync` ticks
  merge it; the steps taken meanwhile are the exchange's `staleness`).

  One event loop (`_EventLoop`: the clock, the peer rule, the exchanges) runs both,
  with what a worker does around its exchange as a policy passed to it: `_Blocking`
  (it waits) or `_Overlapped` (it computes on).

`local_steps_per_round` gives each worker's H_i ('steps', 'time', 'auto'); `rotation`
gives the matchings of the 'rotation' peer rule.
"""

import dataclasses
import heapq

import numpy as np

from loco.sim.network import DROPOUT_MODES, Network


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
      8, as its simulation computes them): its pseudo-gradient is not sent and the
      outer step averages the senders; it receives the new anchor and outer state but
      keeps its own params and goes on training from them, so its next pseudo-gradient
      is taken against the current anchor. 'offline' (a worker cut off for the round):
      it sends and receives nothing and keeps its whole state; at its next sync it sends
      its pseudo-gradient against its own (stale) anchor and then copies an up-to-date
      worker's anchor and outer state (`StepContext.rejoin`; when no alive worker is up
      to date, the lowest-index alive worker's, so that the alive workers leave every
      sync with one anchor). 'discard': it downloads
      what the others agreed on and adopts it, so its round's local steps are lost.
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

  def dropout_masks(self, start: int, count: int
                    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None:
    """(keep, isolate, rejoin) of `StepContext`, each [count, M] bool or None, for steps
    start .. start + count - 1 under `dropout_mode`; None with 'discard'.

    'offline': a worker is stale after a round whose sync (the round's last step) it
    missed, and until the end of a round whose sync it is alive for; `rejoin` is alive
    and stale.
    """
    if self.dropout_mode == 'discard':
      return None
    _, alive = self.masks(start, count)
    keep = np.ones_like(alive)
    if self.dropout_mode == 'keep_local':
      return keep, None, None
    h = self.round_steps
    stale = np.zeros(self.num_workers, bool)
    for end in range(h - 1, start, h):            # the syncs before `start`
      stale = ~self.masks(end, 1)[1][0]
    rejoin = np.zeros_like(alive)
    for t in range(count):
      rejoin[t] = alive[t] & stale
      if (start + t + 1) % h == 0:
        stale = ~alive[t]
    return keep, keep, rejoin

  def _round_alive(self, round_index: int) -> np.ndarray:
    rng = np.random.default_rng([self.seed, int(round_index)])
    keep = rng.random(self.num_workers) >= self.dropout
    if not keep.any():
      keep[rng.integers(self.num_workers)] = True
    return keep


@dataclasses.dataclass(frozen=True)
class AsyncSchedule:
  """The replay of an asynchronous run, one row per tick.

  Within a tick the engine runs, per worker: its inner step (`active`), then its merge
  (`sync`: the gossip and outer step of an exchange, with `mixing`), then its send
  (`send`: it stores the value its gossip mixes, the snapshot its partner will merge).

  Attributes:
    active: [T, M] bool, workers taking an inner step at each tick.
    sync: [T, M] bool, workers merging an exchange at the end of the tick.
    mixing: [T, M, M] float32, each tick's mixing matrix (identity outside exchanges;
      with overlap only the merging workers' rows, as each side merges on its own tick).
    seconds: [T] simulated time by which every event of ticks <= t is done.
    worker_seconds: [T, M] each worker's own clock after tick t (its last event's end).
    compute: [T, M] each worker's cumulative compute seconds after tick t (a waiting
      worker is idle: its clock moves, its compute does not).
    exchanges: (i, j, start, end) of every exchange, in time order.
    send: [T, M] bool, workers that send their snapshot at the end of the tick (None
      without overlap: the exchange reads both current models at once).
    staleness: [E, 2] int, per exchange, the inner steps i and j took between sending
      their model (the exchange's start) and merging the partner's (0 without overlap).
  """
  active: np.ndarray
  sync: np.ndarray
  mixing: np.ndarray
  seconds: np.ndarray
  worker_seconds: np.ndarray
  compute: np.ndarray
  exchanges: list
  send: np.ndarray | None = None
  staleness: np.ndarray | None = None

  @property
  def num_ticks(self) -> int:
    return len(self.seconds)


def exchange_seconds(net: Network, peers: np.ndarray, exchange_bytes: float) -> np.ndarray:
  """x_i: worker i's exchange time (both ways, the slower) over its median neighbour link."""
  m = net.num_workers
  out = np.zeros(m)
  for i in range(m):
    times = [max(net.link_seconds(i, j, exchange_bytes), net.link_seconds(j, i, exchange_bytes))
             for j in range(m) if peers[i, j]]
    out[i] = float(np.median(times)) if times else 0.0
  return out


def local_steps_per_round(net: Network, sync_every: int, local_work: str, *,
                          peers: np.ndarray | None = None,
                          exchange_bytes: float = 0.0) -> np.ndarray:
  """H_i, the local steps of each worker's rounds.

  - 'steps': H for every worker.
  - 'time': the steps that fit in H mean step times, `floor(H mean(c) / c_i)`.
  - 'auto': from each worker's step time c_i AND its link, so that no worker waits: with
    x_i its exchange time over its median neighbour link (`exchange_seconds`),
    `H_i = max(floor(H min_j c_j / c_i), ceil(x_i / c_i), 1)`. A round lasts about the
    fastest worker's H steps for every worker whose exchange fits in that (a slower
    worker takes fewer steps), and a worker whose exchange takes longer fills its own
    longer round with steps, so the exchange, in flight while it computes
    (`overlap='compute'`), hides behind them: workers behind slow links exchange less
    often instead of waiting (GASLoC's per-worker H_i, arXiv 2606.11081). Every worker
    still takes all its steps.

  Args:
    net: the network.
    sync_every: H.
    local_work: 'steps', 'time' or 'auto'.
    peers: [M, M] bool, the graph ('auto' only).
    exchange_bytes: bytes each side sends in one exchange ('auto' only).

  Returns:
    [M] int array of H_i.
  """
  c = np.asarray(net.step_seconds, float)
  if local_work == 'steps':
    return np.full(net.num_workers, sync_every)
  if local_work == 'time':
    budget = sync_every * float(np.mean(c))
    return np.maximum(1, np.floor(budget / c + 1e-9)).astype(int)
  peers = ~np.eye(net.num_workers, dtype=bool) if peers is None else np.asarray(peers, bool)
  x = exchange_seconds(net, peers, exchange_bytes)
  fit = np.floor(sync_every * c.min() / c + 1e-9)       # equal wall time, H at the fastest
  hide = np.ceil(x / c - 1e-9)                          # long enough to hide the exchange
  return np.maximum(np.maximum(fit, hide), 1).astype(int)


def rotation(peers: np.ndarray, seed: int = 0) -> np.ndarray:
  """The matchings the 'rotation' peer rule cycles through: an edge colouring.

  On the complete graph with M even, the circle method's M - 1 perfect matchings (a
  1-factorization); otherwise a greedy colouring (each edge takes the first colour
  free at both ends: at most 2 deg - 1 colours). The seed permutes the colours' order.

  Returns:
    [k, M] int: partner[c, i], worker i's partner in matching c, or -1.
  """
  peers = np.asarray(peers, bool)
  m = len(peers)
  if m > 1 and m % 2 == 0 and peers.sum() == m * (m - 1):
    partner = np.full((m - 1, m), -1)
    ring = list(range(1, m))
    for c in range(m - 1):
      order = [0] + ring[c:] + ring[:c]
      for a, b in zip(order[:m // 2], order[::-1][:m // 2]):
        partner[c, a], partner[c, b] = b, a
  else:
    colours: list[dict[int, int]] = []
    for i in range(m):
      for j in range(i + 1, m):
        if peers[i, j]:
          c = next((c for c, mt in enumerate(colours) if i not in mt and j not in mt),
                   len(colours))
          if c == len(colours):
            colours.append({})
          colours[c][i], colours[c][j] = j, i
    partner = np.full((max(1, len(colours)), m), -1)
    for c, mt in enumerate(colours):
      for i, j in mt.items():
        partner[c, i] = j
  return partner[np.random.default_rng(seed).permutation(len(partner))]


def simulate_async(net: Network, *, steps: int, sync_every: int, peers: np.ndarray,
                   exchange_bytes: float, local_work: str = 'steps',
                   peer_choice: str = 'ready', overlap: str = 'none',
                   seed: int = 0) -> AsyncSchedule:
  """Simulates asynchronous pairwise gossip rounds and returns their replay.

  Args:
    net: the network (step times, links).
    steps: inner steps each worker takes in all (equal tokens per worker).
    sync_every: H, local steps between a worker's exchanges (see `local_work`).
    peers: [M, M] bool, who may exchange with whom (the topology's graph).
    exchange_bytes: bytes each side sends in one exchange.
    local_work: 'steps', 'time' or 'auto' (per-worker H_i: `local_steps_per_round`).
    peer_choice: 'ready': exchange with a random neighbour that is waiting, else wait
      for the next one to become ready; 'sampled': pick a random neighbour and wait for
      that one (a worker that becomes ready first serves whoever waits for it);
      'rotation': a worker's r-th exchange is with its partner in matching r mod k of
      an edge colouring of the graph (`rotation`), waited for. With 'ready', workers
      that finish together pair together, which can split the mixing graph into
      cohorts on heterogeneous networks; 'sampled' mixes across them at the price of
      waiting; 'rotation' bounds it: every worker exchanges with each of its
      neighbours exactly once in every k consecutive rounds of its own (k the number
      of matchings, M - 1 on the complete graph with M even; a neighbour that has
      finished all its work is skipped), so the union of any k consecutive rounds'
      exchanges is the whole graph.
    overlap: 'none': a worker waits for its exchange to end before it computes on;
      'compute': it sends its model at the exchange's start and keeps computing; the
      partner's model arrives after the transfer time and is merged at its first step
      boundary after that (stale by the steps taken meanwhile, `staleness`). One
      exchange is in flight per worker: a worker that ends a round before its previous
      exchange is merged waits for it (idle).
    seed: seeds the tie-breaks and the choice of peers.

  Returns:
    The `AsyncSchedule`. A worker whose neighbours have all finished skips its
    exchange and goes on with its local steps, so every worker takes `steps` steps.
  """
  peers = np.asarray(peers, bool)
  per_round = local_steps_per_round(net, sync_every, local_work, peers=peers,
                                    exchange_bytes=exchange_bytes)
  policy = _Overlapped if overlap == 'compute' else _Blocking
  loop = _EventLoop(net, steps, per_round, peers, exchange_bytes, peer_choice, seed)
  return loop.run(policy)


# Event kinds, in the order they run at equal times: an arrival is merged before a
# round that ends at the same step boundary goes on (only the overlapped policy merges).
_MERGE, _ROUND_END = 0, 1


class _EventLoop:
  """The discrete-event simulation of `simulate_async`, one for both overlap policies.

  The loop owns what the policies share: the event heap (time, kind, a random
  tie-break, worker, exchange), the peer rule (`post`: whom a worker meets when its
  round ends, or that it waits), the exchanges and their link times, and the release
  of waiters whose neighbours have finished. A policy (`_Blocking`, `_Overlapped`)
  owns each worker's progress and answers the loop's calls: `start_round(i, t)`,
  `round_end(i, t)`, `merge(i, e, t)` (the events it scheduled), `exchange(i, j, e,
  start, end)`, `wait(i)` (i waits for a partner), `skip(i, t)` (the rule gives i no
  partner this round), `release(i, t)` (a waiter has no one left to meet),
  `may_meet(w, j)` (w, whose chosen peer has finished, meets its new pick j at once)
  and `replay()` (the `AsyncSchedule`).
  """

  def __init__(self, net: Network, steps: int, per_round: np.ndarray, peers: np.ndarray,
               exchange_bytes: float, peer_choice: str, seed: int):
    self.net, self.steps, self.per_round = net, steps, per_round
    self.peers, self.exchange_bytes, self.peer_choice = peers, exchange_bytes, peer_choice
    self.m = net.num_workers
    self.c = np.asarray(net.step_seconds, float)
    self.rng = np.random.default_rng(seed)
    self.partners = rotation(peers, seed)
    self.rounds = np.zeros(self.m, int)      # exchanges each worker has come to ('rotation')
    self.finished = np.zeros(self.m, bool)   # no local work left and nothing pending
    self.exchanges: list[tuple[int, int, float, float]] = []
    self.waiting: dict[int, int | None] = {}   # waiting worker -> the neighbour it waits for
    self.heap: list[tuple[float, int, float, int, int]] = []
    self.policy = None

  def run(self, policy_type) -> AsyncSchedule:
    """Runs the events to the end under `policy_type` and returns its replay."""
    self.policy = policy = policy_type(self)
    for i in range(self.m):
      policy.start_round(i, 0.0)
    while self.heap:
      t, kind, _, k, e = heapq.heappop(self.heap)
      if kind == _ROUND_END:
        policy.round_end(k, t)
      else:
        policy.merge(k, e, t)
      self.release_stranded(t)
    return policy.replay()

  def push(self, t: float, kind: int, k: int, e: int = -1) -> None:
    heapq.heappush(self.heap, (t, kind, self.rng.random(), k, e))

  def live(self, i: int) -> list[int]:
    return [j for j in range(self.m) if self.peers[i, j] and not self.finished[j]]

  def post(self, i: int, t: float) -> None:
    """Worker i is ready for its round's exchange: the peer rule pairs it, or it waits."""
    waiting, rule = self.waiting, self.peer_choice
    if rule == 'ready':
      ready = sorted(j for j in waiting if self.peers[i, j])
      if ready:
        return self.exchange(i, int(self.rng.choice(ready)), t)
      waiting[i] = None
    elif rule == 'rotation':
      j = int(self.partners[self.rounds[i] % len(self.partners), i])
      self.rounds[i] += 1
      if j < 0 or self.finished[j]:
        return self.policy.skip(i, t)
      if waiting.get(j, -1) == i:
        return self.exchange(i, j, t)
      waiting[i] = j
    else:
      askers = [w for w, target in waiting.items() if target == i]   # in arrival order
      if askers:
        return self.exchange(i, askers[0], t)
      options = self.live(i)
      j = int(self.rng.choice(options)) if options else None
      if j is not None and j in waiting:
        return self.exchange(i, j, t)
      waiting[i] = j
    self.policy.wait(i)

  def exchange(self, i: int, j: int, t: float) -> None:
    for k in (i, j):
      self.waiting.pop(k, None)
    link = self.net.link_seconds
    end = t + max(link(i, j, self.exchange_bytes), link(j, i, self.exchange_bytes))
    self.exchanges.append((min(i, j), max(i, j), t, end))
    self.policy.exchange(i, j, len(self.exchanges) - 1, t, end)

  def release_stranded(self, t: float) -> None:
    """Frees a waiter with no neighbour left to meet, or whose chosen one has finished."""
    waiting = self.waiting
    for w in sorted(waiting):
      if w not in waiting:
        continue
      target = waiting[w]
      options = self.live(w)
      if not options or (self.peer_choice == 'rotation' and self.finished[target]):
        del waiting[w]
        self.policy.release(w, t)
      elif target is not None and self.finished[target]:
        j = int(self.rng.choice(options))
        if self.policy.may_meet(w, j):
          self.exchange(w, j, t)
        else:
          waiting[w] = j


class _Blocking:
  """overlap='none': a worker waits for its exchange to end before it computes on."""

  def __init__(self, loop: _EventLoop):
    self.loop = loop
    self.done = np.zeros(loop.m, int)
    # Per worker: a list of ('local', n, start) and ('x', exchange index) items.
    self.items: list[list[tuple]] = [[] for _ in range(loop.m)]

  def start_round(self, i: int, t: float) -> None:
    loop = self.loop
    n = int(min(loop.per_round[i], loop.steps - self.done[i]))
    if n > 0:
      self.done[i] += n
      self.items[i].append(('local', n, t))
      loop.push(t + n * loop.c[i], _ROUND_END, i)
    else:
      loop.finished[i] = True

  def round_end(self, i: int, t: float) -> None:
    self.loop.post(i, t)

  def exchange(self, i: int, j: int, e: int, start: float, end: float) -> None:
    for k in (i, j):
      self.items[k].append(('x', e))
      self.start_round(k, end)

  def wait(self, i: int) -> None:
    pass

  # Without a partner a worker goes on with its next round at once.
  skip = release = start_round

  def may_meet(self, w: int, j: int) -> bool:
    return j in self.loop.waiting         # j waits, whomever for

  def replay(self) -> AsyncSchedule:
    loop = self.loop
    sched = _replay(self.items, loop.exchanges, loop.c, loop.m)
    return dataclasses.replace(sched, staleness=np.zeros((len(loop.exchanges), 2), int))


class _Overlapped:
  """overlap='compute': per worker, rounds of H_i steps back to back; at a round's end
  it posts (the peer rule pairs it, or it waits for a partner while it computes on); a
  pair's exchange starts when the second of the two posts, each sends its model as it
  is then, and each merges the other's at its first step boundary at or after the
  exchange's end (at the end itself if it is not computing then)."""

  def __init__(self, loop: _EventLoop):
    m = loop.m
    self.loop = loop
    self.seg = np.zeros((m, 2))              # the current round: (start time, steps)
    self.started = np.zeros(m, int)          # steps started (the current round's included)
    self.pending: list = [None] * m          # None | 'posted' | exchange index (in flight)
    self.owed = np.zeros(m, bool)            # a round ended whose exchange is not posted yet
    self.computing = np.zeros(m, bool)
    self.events: list[list[tuple]] = [[] for _ in range(m)]   # (steps before, kind, e, t)
    self.step_ends: list[list[float]] = [[] for _ in range(m)]
    self.sent_after = {}                      # (exchange, worker) -> steps done when it sent
    self.staleness: list[list[int]] = []

  def steps_by(self, k: int, t: float) -> int:
    """Steps worker k has finished by time t."""
    if not self.computing[k]:
      return int(self.started[k])
    start, n = self.seg[k]
    c = self.loop.c[k]
    return int(self.started[k] - n + min(n, np.floor((t - start) / c + 1e-9)))

  def start_round(self, k: int, t: float) -> None:
    loop = self.loop
    n = int(min(loop.per_round[k], loop.steps - self.started[k]))
    self.computing[k] = n > 0
    if n > 0:
      self.seg[k] = t, n
      self.started[k] += n
      self.step_ends[k].extend(t + (q + 1) * loop.c[k] for q in range(n))
      loop.push(t + n * loop.c[k], _ROUND_END, k)

  def round_end(self, k: int, t: float) -> None:
    self.computing[k] = False
    if self.pending[k] is not None:
      self.owed[k] = True          # idle until its exchange is merged
    else:
      self.start_round(k, t)
      self.loop.post(k, t)
      self.settle(k)

  def exchange(self, i: int, j: int, e: int, s: float, end: float) -> None:
    c = self.loop.c
    self.staleness.append([0, 0])
    for k in (i, j):
      self.pending[k] = e
      self.sent_after[e, k] = self.steps_by(k, s)
      self.events[k].append((self.sent_after[e, k], 'send', e, s))
      start, n = self.seg[k]
      if self.computing[k] and start + n * c[k] >= end:   # merged at a step boundary
        q = max(0, int(np.ceil((end - start) / c[k] - 1e-9)))
        arrive = start + q * c[k]
      else:
        arrive = end
      self.loop.push(arrive, _MERGE, k, e)

  def merge(self, k: int, e: int, t: float) -> None:
    done = self.steps_by(k, t)
    self.events[k].append((done, 'merge', e, t))
    self.staleness[e][self.loop.exchanges[e].index(k)] = done - self.sent_after[e, k]
    self.pending[k] = None
    self.go_on(k, t)

  def wait(self, i: int) -> None:
    self.pending[i] = 'posted'

  def skip(self, i: int, t: float) -> None:
    pass                           # its next round is under way already

  def release(self, k: int, t: float) -> None:
    self.pending[k] = None
    self.go_on(k, t)

  def may_meet(self, w: int, j: int) -> bool:
    # Stricter than `_Blocking` and than `post` ('sampled' takes a waiter whomever it
    # waits for): j must wait for no one in particular, or for w.
    return self.loop.waiting.get(j, -1) in (None, w)

  def go_on(self, k: int, t: float) -> None:
    """Worker k is free to go on at t (no exchange pending): post an owed round."""
    if self.owed[k]:
      self.owed[k] = False
      self.start_round(k, t)
      self.loop.post(k, t)
    self.settle(k)

  def settle(self, k: int) -> None:
    if not self.computing[k] and self.pending[k] is None and not self.owed[k]:
      self.loop.finished[k] = True

  def replay(self) -> AsyncSchedule:
    loop = self.loop
    sched = _replay_overlapped(self.events, self.step_ends, loop.exchanges, loop.c, loop.m)
    return dataclasses.replace(sched,
                               staleness=np.array(self.staleness, int).reshape(-1, 2))


def _replay_overlapped(events, step_ends, exchanges, c, m) -> AsyncSchedule:
  """Ticks of an overlapped schedule: per tick and worker, at most one inner step,
  then a merge (once the partner's send is in an earlier tick), then a send (once
  the previous partner has merged this worker's last snapshot, which it overwrites)."""
  items = []
  for k in range(m):
    mine, done = [], 0
    for after, kind, e, t in events[k]:
      if after > done:
        mine.append(('local', after - done, None))
        done = after
      mine.append((kind, e, t))
    if len(step_ends[k]) > done:
      mine.append(('local', len(step_ends[k]) - done, None))
    items.append(mine)
  pos, step_in, done = [0] * m, [0] * m, np.zeros(m, int)
  sent_tick, merged = {}, set()
  last_sent = [None] * m               # the exchange whose snapshot each worker holds
  clock, compute = np.zeros(m), np.zeros(m)
  rows = {k: [] for k in ('active', 'sync', 'send', 'mixing', 'seconds', 'clock', 'compute')}

  def current(i):
    return items[i][pos[i]] if pos[i] < len(items[i]) else ('done', None, None)

  tick = 0
  while any(p < len(it) for p, it in zip(pos, items)):
    active = np.zeros(m, bool)
    sync = np.zeros(m, bool)
    send = np.zeros(m, bool)
    mixing = np.eye(m, dtype=np.float32)
    for i in range(m):
      if current(i)[0] == 'local':
        active[i] = True
        step_in[i] += 1
        done[i] += 1
        clock[i] = max(clock[i], step_ends[i][done[i] - 1])
        compute[i] += c[i]
        if step_in[i] == current(i)[1]:
          pos[i], step_in[i] = pos[i] + 1, 0
    for i in range(m):
      kind, e, t = current(i)
      if kind != 'merge':
        continue
      a, b, _, _ = exchanges[e]
      j = b if i == a else a
      if sent_tick.get((e, j), tick) < tick:
        sync[i] = True
        mixing[i, i] = mixing[i, j] = 0.5
        merged.add((e, i))
        clock[i] = max(clock[i], t)
        pos[i] += 1
    for i in range(m):
      kind, e, t = current(i)
      if kind != 'send':
        continue
      prev = last_sent[i]
      if prev is not None:
        a, b, _, _ = exchanges[prev]
        if (prev, b if i == a else a) not in merged:
          continue
      send[i] = True
      sent_tick[e, i] = tick
      last_sent[i] = e
      clock[i] = max(clock[i], t)
      pos[i] += 1
    if not (active.any() or sync.any() or send.any()):
      raise RuntimeError('the asynchronous replay made no progress (a schedule bug).')
    rows['active'].append(active)
    rows['sync'].append(sync)
    rows['send'].append(send)
    rows['mixing'].append(mixing)
    rows['compute'].append(compute.copy())
    rows['clock'].append(clock.copy())
    rows['seconds'].append(max(clock.max(), rows['seconds'][-1] if rows['seconds'] else 0.0))
    tick += 1
  return AsyncSchedule(active=np.array(rows['active']), sync=np.array(rows['sync']),
                       mixing=np.array(rows['mixing']), seconds=np.array(rows['seconds']),
                       worker_seconds=np.array(rows['clock']),
                       compute=np.array(rows['compute']), exchanges=exchanges,
                       send=np.array(rows['send']))


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
