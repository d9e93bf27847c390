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

`local_steps_per_round` gives each worker's H_i ('steps', 'time', 'auto'); `rotation`
gives the matchings of the 'rotation' peer rule.
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
  if overlap == 'compute':
    return _simulate_overlapped(net, steps, per_round, peers, exchange_bytes, peer_choice, seed)
  m = net.num_workers
  rng = np.random.default_rng(seed)
  partners = rotation(peers, seed)
  c = np.asarray(net.step_seconds, float)
  done = np.zeros(m, int)
  rounds = np.zeros(m, int)          # exchanges each worker has come to ('rotation')
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
      if not options or (peer_choice == 'rotation' and finished[waiting[w]]):
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
    elif peer_choice == 'rotation':
      j = int(partners[rounds[i] % len(partners), i])
      rounds[i] += 1
      if j < 0 or finished[j]:
        start_local(i, t)
      elif waiting.get(j, -1) == i:
        exchange(i, j, t)
      else:
        waiting[i] = j
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
  sched = _replay(items, exchanges, c, m)
  return dataclasses.replace(sched, staleness=np.zeros((len(exchanges), 2), int))


# Event kinds of the overlapped simulation, in the order they run at equal times: an
# arrival is merged before a round that ends at the same step boundary goes on.
_MERGE, _ROUND_END = 0, 1


def _simulate_overlapped(net: Network, steps: int, per_round: np.ndarray,
                         peers: np.ndarray, exchange_bytes: float, peer_choice: str,
                         seed: int) -> AsyncSchedule:
  """`simulate_async` with `overlap='compute'` (see there): per worker, rounds of H_i
  steps back to back; at a round's end it posts (the peer rule pairs it, or it waits
  for a partner while it computes on); a pair's exchange starts when the second of the
  two posts, each sends its model as it is then, and each merges the other's at its
  first step boundary at or after the exchange's end (at the end itself if it is not
  computing then)."""
  m = net.num_workers
  rng = np.random.default_rng(seed)
  partners = rotation(peers, seed)
  c = np.asarray(net.step_seconds, float)
  seg = np.zeros((m, 2))              # the current round: (start time, steps)
  started = np.zeros(m, int)          # steps started (the current round's included)
  pending: list = [None] * m          # None | 'posted' | exchange index (in flight)
  owed = np.zeros(m, bool)            # a round ended whose exchange is not posted yet
  computing = np.zeros(m, bool)
  finished = np.zeros(m, bool)
  rounds = np.zeros(m, int)
  events: list[list[tuple]] = [[] for _ in range(m)]   # (steps before, kind, exchange, t)
  step_ends: list[list[float]] = [[] for _ in range(m)]
  exchanges: list[tuple[int, int, float, float]] = []
  sent_after = {}                      # (exchange, worker) -> steps done when it sent
  staleness: list[list[int]] = []
  heap: list[tuple[float, int, float, int, int]] = []
  waiting: dict[int, int | None] = {}

  def steps_by(k: int, t: float) -> int:
    """Steps worker k has finished by time t."""
    if not computing[k]:
      return int(started[k])
    start, n = seg[k]
    return int(started[k] - n + min(n, np.floor((t - start) / c[k] + 1e-9)))

  def start_round(k: int, t: float) -> None:
    n = int(min(per_round[k], steps - started[k]))
    computing[k] = n > 0
    if n > 0:
      seg[k] = t, n
      started[k] += n
      step_ends[k].extend(t + (q + 1) * c[k] for q in range(n))
      heapq.heappush(heap, (t + n * c[k], _ROUND_END, rng.random(), k, -1))

  def settle(k: int) -> None:
    if not computing[k] and pending[k] is None and not owed[k]:
      finished[k] = True

  def exchange(i: int, j: int, s: float) -> None:
    end = s + max(net.link_seconds(i, j, exchange_bytes), net.link_seconds(j, i, exchange_bytes))
    e = len(exchanges)
    exchanges.append((min(i, j), max(i, j), s, end))
    staleness.append([0, 0])
    for k in (i, j):
      waiting.pop(k, None)
      pending[k] = e
      sent_after[e, k] = steps_by(k, s)
      events[k].append((sent_after[e, k], 'send', e, s))
      start, n = seg[k]
      if computing[k] and start + n * c[k] >= end:   # merged at a step boundary
        q = max(0, int(np.ceil((end - start) / c[k] - 1e-9)))
        arrive = start + q * c[k]
      else:
        arrive = end
      heapq.heappush(heap, (arrive, _MERGE, rng.random(), k, e))

  def live(i: int) -> list[int]:
    return [j for j in range(m) if peers[i, j] and not finished[j]]

  def post(i: int, t: float) -> None:
    if peer_choice == 'ready':
      ready = sorted(j for j in waiting if peers[i, j])
      if ready:
        return exchange(i, int(rng.choice(ready)), t)
      waiting[i] = None
    elif peer_choice == 'rotation':
      j = int(partners[rounds[i] % len(partners), i])
      rounds[i] += 1
      if j < 0 or finished[j]:
        return
      if waiting.get(j, -1) == i:
        return exchange(i, j, t)
      waiting[i] = j
    else:
      askers = [w for w, target in waiting.items() if target == i]
      if askers:
        return exchange(i, askers[0], t)
      options = live(i)
      j = int(rng.choice(options)) if options else None
      if j is not None and j in waiting:
        return exchange(i, j, t)
      waiting[i] = j
    pending[i] = 'posted'

  def go_on(k: int, t: float) -> None:
    """Worker k is free to go on at t (no exchange pending): post an owed round."""
    if owed[k]:
      owed[k] = False
      start_round(k, t)
      post(k, t)
    settle(k)

  def release_stranded(t: float) -> None:
    for w in sorted(waiting):
      if w not in waiting:
        continue
      target = waiting[w]
      options = live(w)
      if not options or (target is not None and finished[target] and peer_choice == 'rotation'):
        del waiting[w]
        pending[w] = None
        go_on(w, t)
      elif target is not None and finished[target]:
        j = int(rng.choice(options))
        if waiting.get(j, -1) in (None, w):
          exchange(w, j, t)
        else:
          waiting[w] = j

  for i in range(m):
    start_round(i, 0.0)
  while heap:
    t, kind, _, k, e = heapq.heappop(heap)
    if kind == _ROUND_END:
      computing[k] = False
      if pending[k] is not None:
        owed[k] = True          # idle until its exchange is merged
      else:
        start_round(k, t)
        post(k, t)
        settle(k)
    else:
      done = steps_by(k, t)
      events[k].append((done, 'merge', e, t))
      staleness[e][exchanges[e].index(k)] = done - sent_after[e, k]
      pending[k] = None
      go_on(k, t)
    release_stranded(t)
  sched = _replay_overlapped(events, step_ends, exchanges, c, m)
  return dataclasses.replace(sched, staleness=np.array(staleness, int).reshape(-1, 2))


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
