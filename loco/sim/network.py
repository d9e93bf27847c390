"""The network as data, and the clock that turns a run's communication into seconds.

A `Network` is three arrays (DESIGN §5): each worker's seconds per inner step, and the
per-link bandwidth (bytes/s) and latency (s) matrices, which a named profile builds from
a few parameters (`NetworkConfig`; the profiles are tabled in WORKSPACE.md). A measured
calibration, `network.link_efficiency` (off by default: 1), scales every link's bandwidth
to what a collective's payload reaches on a real link (`python -m loco.calibrate`,
docs/calibration.md).

Time of one communication, from the bytes a step's `StepInfo.wire` reports (a
`loco.wire.Wire`, as host arrays):

- ring all-reduce over m participants (the ring follows worker order, as a collective
  library's ring over ranks): 2 (m - 1) phases; in each every ring link carries one
  chunk concurrently, so a phase takes its slowest link's latency + chunk / bandwidth
  (the ring is bound by its slowest link, and latency adds per hop);
- ring all-gather: m - 1 phases, each link carrying one worker's payload;
- gossip: each worker exchanges with each peer at once over its own link (full
  duplex); an exchange starts when both ends are there and takes latency + bytes /
  bandwidth; a worker goes on when its last exchange is done.

`Clock` replays a synchronous run: compute advances each active worker by its step
time, a blocking collective starts when its last participant arrives and every
participant leaves at its end, a worker that dropped out of it but adopts its result
downloads the result after it over its fastest link from a participant, and an
overlapped collective (Streaming DiLoCo's tau) only stalls the workers that reach its
deadline before it is done.

The clock's overlap model (`network.overlap`): 'none' starts a blocking collective after
the step's compute; 'backward' overlaps it with the step's backward pass as
`loco.overlap_model` models it (arXiv 2501.18512 section 3.1): the collective is cut into
`network.overlap_buckets` pieces (`overlap_model.BUCKETS` = 128 by default) released evenly
through every participant's backward pass, each a ring of its own (so each pays the ring's
latency: with 1 piece the model is 'none' again), and the collective ends
when the last piece does (`overlap_model.backward_overlap_end`, the one formula both
call). An overlapped collective (tau > 0) is timed as with 'none'.
"""

import dataclasses
from typing import Any, Sequence

import numpy as np

from loco import ranges
from loco import overlap_model
from loco.errors import ConfigError
from loco.wire import ALL_GATHER, ALL_REDUCE, GOSSIP, Wire

PROFILES = ('homogeneous', 'multi_region', 'lognormal', 'slow_links', 'stragglers',
            'churn', 'custom')
MODES = ('sync', 'async')
LOCAL_WORK = ('steps', 'time', 'auto')
PEER_CHOICES = ('ready', 'sampled', 'rotation')
DROPOUT_MODES = ('keep_local', 'offline', 'discard')   # loco.sim.schedule.SyncSchedule documents them
# What communication overlaps, per mode (the first is the mode's default).
OVERLAPS = {'sync': ('none', 'backward'), 'async': ('compute', 'none')}

GBIT = 1e9 / 8   # bytes/s in one Gbit/s

# The parameters each link profile reads (beyond `bandwidth` and `latency`), and the
# defaults a profile gives the common parameters (over `NetworkConfig`'s).
_LINK_KEYS = {
    'homogeneous': (),
    'multi_region': ('regions', 'inter_bandwidth', 'inter_latency'),
    'lognormal': ('sigma',),
    'slow_links': ('slow_workers', 'slow_factor'),
    'stragglers': (),
    'churn': (),
    'custom': ('bandwidth_matrix', 'latency_matrix'),
}
_PROFILE_DEFAULTS = {
    'stragglers': dict(straggler_fraction=0.25, straggler_factor=3.0),
}


def profile_default(profile: str | None, key: str) -> Any:
  """The default `profile` gives network.KEY over NetworkConfig's (None: none)."""
  return _PROFILE_DEFAULTS.get(profile, {}).get(key)


# Each numeric key's range (a `loco.ranges` rule), declared once: the config boundary
# (`loco.configs.CONSTRAINTS`) and NetworkConfig (a re-timing's overrides) both read it.
RANGES = {
    'step_seconds': 'positive',
    'device_flops': 'positive',
    'mfu': 'in (0, 1]',
    'bandwidth': 'positive',
    'latency': '>= 0',
    'link_efficiency': 'in (0, 1]',
    'regions': '>= 1',
    'inter_bandwidth': 'positive',
    'inter_latency': '>= 0',
    'sigma': '>= 0',
    'slow_workers': '>= 0',
    'slow_factor': 'positive',
    'straggler_fraction': 'in [0, 1]',
    'straggler_factor': 'positive',
    'dropout': 'in [0, 1)',
    'seed': 'in [0, 2**32)',
    'overlap_buckets': '>= 1',
}


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
  """The `network` config section, typed: each key is documented where it is defined,
  in loco/configs/default.py (a None there is the default here, or the profile's).

  The asynchronous mode's keys (`loco.sim.schedule.simulate_async`): `local_work` (H_i:
  'steps', 'time' or 'auto'), `peer_choice` ('ready', 'sampled', 'rotation') and
  `overlap`: 'compute' (a worker keeps computing while its exchange is in flight and
  merges its partner's model, stale, on arrival: the GASLoC paper's asynchronous
  setting, arXiv 2606.11081) or 'none' (it waits for the exchange: the blocking
  replay of runs made before this key existed). None: 'compute' in the asynchronous
  mode (`async_overlap`). In the synchronous mode `overlap` is the clock's model:
  'none' (default) or 'backward' (`clock_overlap`).
  """
  profile: str
  mode: str = 'sync'
  local_work: str = 'steps'
  peer_choice: str = 'ready'
  overlap: str | None = None
  step_seconds: float | None = None
  device_flops: float = 100e12
  mfu: float = 0.4
  speeds: tuple[float, ...] | None = None
  bandwidth: float = 100 * GBIT
  latency: float = 1e-4
  link_efficiency: float = 1.0
  regions: int = 2
  inter_bandwidth: float = 1 * GBIT
  inter_latency: float = 0.05
  sigma: float = 1.0
  slow_workers: int = 2
  slow_factor: float = 30.0
  bandwidth_matrix: Any = None
  latency_matrix: Any = None
  straggler_fraction: float = 0.0
  straggler_factor: float = 1.0
  churn: tuple[tuple[int, int, int], ...] = ()
  dropout: float = 0.0
  dropout_mode: str = 'keep_local'
  seed: int = 0
  overlap_buckets: int = overlap_model.BUCKETS

  def __post_init__(self):
    for key, allowed in (('mode', MODES), ('peer_choice', PEER_CHOICES),
                         ('local_work', LOCAL_WORK), ('dropout_mode', DROPOUT_MODES)):
      if getattr(self, key) not in allowed:
        raise ConfigError(f'network.{key} must be one of {allowed}, got {getattr(self, key)!r}.')
    if self.overlap is not None and self.overlap not in OVERLAPS[self.mode]:
      raise ConfigError(f"network.overlap must be one of {OVERLAPS[self.mode]} with "
                        f"network.mode={self.mode!r}, got {self.overlap!r}.")
    for key, rule in RANGES.items():
      ranges.check(f'network.{key}', rule, getattr(self, key))

  @property
  def async_overlap(self) -> str:
    """The asynchronous replay's overlap: `overlap`, or 'compute' when unset."""
    return OVERLAPS['async'][0] if self.overlap is None else self.overlap

  @property
  def clock_overlap(self) -> str:
    """The synchronous clock's overlap model: `overlap`, or 'none' when unset."""
    return OVERLAPS['sync'][0] if self.overlap is None else self.overlap


def parse_network(section: dict[str, Any] | None) -> NetworkConfig | None:
  """`NetworkConfig` from the config's `network` section (None fields: the profile's).

  Returns None when `profile` is unset (no clock). A key set that the profile does not
  read is an error, so that a typo or a leftover never silently does nothing.
  """
  section = {k: v for k, v in (section or {}).items() if v is not None}
  profile = section.pop('profile', None)
  if profile is None:
    if section:
      raise ConfigError(f'network.{sorted(section)[0]} is set but network.profile is not; '
                        f'set network.profile to one of {", ".join(PROFILES)}.')
    return None
  if profile not in PROFILES:
    raise ConfigError(f'network.profile must be one of {", ".join(PROFILES)}, got {profile!r}.')
  link_keys = {k for keys in _LINK_KEYS.values() for k in keys}
  for key in section:
    if key in link_keys and key not in _LINK_KEYS[profile]:
      raise ConfigError(f'network.{key} is not read by network.profile={profile!r} '
                        f'(it reads: {", ".join(_LINK_KEYS[profile]) or "no extra keys"}).')
  values = {**_PROFILE_DEFAULTS.get(profile, {}), **section}
  if 'speeds' in values:
    values['speeds'] = tuple(float(s) for s in values['speeds'])
  try:
    values['churn'] = tuple(tuple(int(v) for v in c) for c in values.get('churn', ()))
    assert all(len(c) == 3 for c in values['churn'])
  except (TypeError, ValueError, AssertionError):
    raise ConfigError('network.churn must be a list of [worker, leave_step, rejoin_step], '
                      f'got {section.get("churn")!r}.') from None
  if profile == 'churn' and not values['churn']:
    raise ConfigError("network.profile='churn' needs network.churn: a list of "
                      '(worker, leave_step, rejoin_step).')
  if 'overlap_buckets' in values and values.get('overlap') != 'backward':
    raise ConfigError("network.overlap_buckets is read only with network.overlap='backward'.")
  if profile == 'custom' and 'bandwidth_matrix' not in values:
    raise ConfigError("network.profile='custom' needs network.bandwidth_matrix.")
  return NetworkConfig(profile=profile, **values)


@dataclasses.dataclass(frozen=True)
class Network:
  """Per-worker step times and per-link bandwidth / latency.

  Attributes:
    step_seconds: [M] seconds per inner step of each worker.
    bandwidth: [M, M] bytes/s of the link i -> j (diagonal unused).
    latency: [M, M] seconds of the link i -> j (diagonal unused).
  """
  step_seconds: np.ndarray
  bandwidth: np.ndarray
  latency: np.ndarray

  def __post_init__(self):
    m = np.shape(self.step_seconds)
    if len(m) != 1 or m[0] < 1:
      raise ConfigError(f'step_seconds must be a vector of M > 0 workers, got shape {m}.')
    m = m[0]
    for name in ('bandwidth', 'latency'):
      shape = np.shape(getattr(self, name))
      if shape != (m, m):
        raise ConfigError(f'the {name} matrix must be {m} x {m} (num_workers), got '
                          f'shape {shape}.')
    off = ~np.eye(m, dtype=bool)
    if not np.all(np.asarray(self.step_seconds) > 0):
      raise ConfigError('every worker\'s step_seconds must be > 0.')
    bw = np.asarray(self.bandwidth, float)[off]
    bad = ~(np.isfinite(bw) & (bw > 0))
    if bad.any():
      raise ConfigError(f'every link bandwidth must be finite and > 0 bytes/s, got {bw[bad][0]}.')
    lat = np.asarray(self.latency, float)[off]
    if not np.all(np.isfinite(lat) & (lat >= 0)):
      raise ConfigError('every link latency must be finite and >= 0 seconds.')

  @property
  def num_workers(self) -> int:
    return len(self.step_seconds)

  def link_seconds(self, i: int, j: int, nbytes: float) -> float:
    """Seconds to move `nbytes` over the link i -> j."""
    return float(self.latency[i, j] + nbytes / self.bandwidth[i, j])


def nominal_step_seconds(cfg: NetworkConfig, flops_per_token: float,
                         tokens_per_step: int) -> float:
  """A worker's seconds per inner step at speed 1: configured, or FLOPs / (peak x MFU)."""
  if cfg.step_seconds is not None:
    return float(cfg.step_seconds)
  return flops_per_token * tokens_per_step / (cfg.device_flops * cfg.mfu)


def make_network(cfg: NetworkConfig, num_workers: int, step_seconds: float) -> Network:
  """Builds the profile's `Network` for `num_workers` workers at `step_seconds` each."""
  m = num_workers
  rng = np.random.default_rng(cfg.seed)
  bandwidth = np.full((m, m), cfg.bandwidth, float)
  latency = np.full((m, m), cfg.latency, float)
  if cfg.profile == 'multi_region':
    if cfg.regions > m:
      raise ConfigError(f'network.regions={cfg.regions} is more than num_workers={m}.')
    region = np.arange(m) * cfg.regions // m          # contiguous blocks of workers
    across = region[:, None] != region[None, :]
    bandwidth[across] = cfg.inter_bandwidth
    latency[across] = cfg.inter_latency
  elif cfg.profile == 'lognormal':
    noise = rng.normal(0.0, cfg.sigma, (m, m))
    noise = np.triu(noise, 1) + np.triu(noise, 1).T      # symmetric links
    bandwidth = bandwidth * np.exp(noise)
  elif cfg.profile == 'slow_links':
    if not 0 <= cfg.slow_workers <= m:
      raise ConfigError(f'network.slow_workers must be in [0, {m}], got {cfg.slow_workers}.')
    slow = rng.choice(m, cfg.slow_workers, replace=False)
    touched = np.zeros((m, m), bool)
    touched[slow, :] = touched[:, slow] = True
    bandwidth[touched] /= cfg.slow_factor
  elif cfg.profile == 'custom':
    bandwidth = np.asarray(cfg.bandwidth_matrix, float)
    if cfg.latency_matrix is not None:
      latency = np.asarray(cfg.latency_matrix, float)
  if cfg.link_efficiency != 1.0:    # the calibration term, off (1) by default
    bandwidth = bandwidth * cfg.link_efficiency
  speeds = np.ones(m) if cfg.speeds is None else np.asarray(cfg.speeds, float)
  if speeds.shape != (m,):
    raise ConfigError(f'network.speeds must have num_workers={m} entries, got '
                      f'{speeds.shape[0] if speeds.ndim else speeds}.')
  if not np.all(speeds > 0):
    raise ConfigError('network.speeds must all be > 0.')
  seconds = step_seconds / speeds
  stragglers = int(round(cfg.straggler_fraction * m))
  if stragglers:
    seconds[rng.choice(m, stragglers, replace=False)] *= cfg.straggler_factor
  for worker, leave, rejoin in cfg.churn:
    if not 0 <= worker < m or not 0 <= leave < rejoin:
      raise ConfigError(f'network.churn entry ({worker}, {leave}, {rejoin}) must be '
                        f'(worker in [0, {m}), leave_step < rejoin_step).')
  # A step with no worker present has no one to train or sync (an outer step with no
  # senders would move the anchors by momentum alone): refused, as random dropout
  # always keeps one worker.
  for step in sorted({leave for _, leave, _ in cfg.churn}):
    gone = {w for w, leave, rejoin in cfg.churn if leave <= step < rejoin}
    if len(gone) == m:
      raise ConfigError(f'network.churn leaves no worker present at step {step}; at least '
                        'one worker must stay.')
  return Network(step_seconds=seconds, bandwidth=bandwidth, latency=latency)


# ---------------------------------------------------------------------------
# Time of one communication.


def ring_all_reduce_seconds(net: Network, members: Sequence[int], size: float) -> float:
  """A ring all-reduce of a `size`-byte tree among `members` (in ring order): 2 (m - 1)
  phases of one `size / m` chunk over every ring link at once (the module docstring)."""
  phases = 2 * (len(members) - 1)
  if phases <= 0:
    return 0.0
  return phases * _slowest_ring_hop(net, members, size / len(members))


def ring_all_gather_seconds(net: Network, members: Sequence[int], payload: float) -> float:
  """A ring all-gather among `members` of one `payload`-byte message per worker."""
  if len(members) < 2:
    return 0.0
  return (len(members) - 1) * _slowest_ring_hop(net, members, payload)


def _slowest_ring_hop(net: Network, members: Sequence[int], nbytes: float) -> float:
  return max(net.link_seconds(a, b, nbytes) for a, b in zip(members, np.roll(members, -1)))


def gossip_finish(net: Network, start: np.ndarray, edges: np.ndarray,
                  nbytes: np.ndarray) -> np.ndarray:
  """Per-worker end times of one synchronous gossip round.

  Args:
    start: [M] time each worker reaches the exchange.
    edges: [M, M] bool, i exchanges with j (symmetric).
    nbytes: [M] bytes each worker sends over each of its edges.

  Returns:
    [M] times: a worker leaves when its slowest exchange is done; an exchange starts
    when both of its ends are there. Workers without edges leave at `start`.
  """
  end = np.array(start, float)
  for i, j in zip(*np.nonzero(np.triu(edges, 1))):
    begin = max(start[i], start[j])
    done = begin + max(net.link_seconds(i, j, nbytes[i]), net.link_seconds(j, i, nbytes[j]))
    end[i], end[j] = max(end[i], done), max(end[j], done)
  return end


# ---------------------------------------------------------------------------
# The clock of a synchronous run.


@dataclasses.dataclass
class Clock:
  """Simulated time of a synchronous run, advanced step by step from what each step
  put on the wire (a host `loco.wire.Wire`): never from an algorithm's name or config, so any
  algorithm is timed and a finished run can be re-timed on another network.

  Attributes:
    net: the network.
    now: [M] each worker's clock.
    compute: [M] each worker's seconds spent computing.
    pending: overlapped collectives in flight: [steps_left, arrival, members].
    overlap: the overlap model, one of OVERLAPS['sync'] (the module docstring).
    buckets: pieces a collective is cut into with overlap='backward'.
  """
  net: Network
  now: np.ndarray | None = None
  compute: np.ndarray | None = None
  pending: list = dataclasses.field(default_factory=list)
  overlap: str = 'none'
  buckets: int = overlap_model.BUCKETS
  # The step being timed: when each worker started it and its compute seconds.
  _began: np.ndarray | None = dataclasses.field(default=None, repr=False)
  _work: np.ndarray | None = dataclasses.field(default=None, repr=False)

  def __post_init__(self):
    if self.overlap not in OVERLAPS['sync']:
      raise ConfigError(f"network.overlap must be one of {OVERLAPS['sync']}, got "
                        f"{self.overlap!r}.")
    if self.buckets < 1:
      raise ConfigError(f'network.overlap_buckets must be >= 1, got {self.buckets}.')
    m = self.net.num_workers
    self.now = np.zeros(m) if self.now is None else np.asarray(self.now, float)
    self.compute = np.zeros(m) if self.compute is None else np.asarray(self.compute, float)

  @property
  def seconds(self) -> float:
    """Elapsed simulated time: the slowest worker's clock."""
    return float(self.now.max())

  def step(self, wire: Wire, active: np.ndarray) -> None:
    """Advances the clock by one step: compute, then what each worker communicated (a
    collective in worker order, due tau = `wire.overlap` steps later if tau > 0; gossip
    over the edges in `peers`, `payload` bytes each way).

    Args:
      wire: the step's record as host arrays, [M] (peers [M, M]); `received` is read
        for what a collective's member receives beyond its ring share (a worker catching
        up after offline dropout), None: nothing beyond; `overlap` None: 0.
      active: [M] bool, the workers that computed this step.
    """
    work = np.where(np.asarray(active, bool), self.net.step_seconds, 0.0)
    self._began, self._work = self.now, work
    self.now = self.now + work
    self.compute = self.compute + work
    self._deliver()          # what was started tau steps ago is needed now
    kind = np.asarray(wire.kind)
    sent = np.asarray(wire.sent, float)
    payload = np.asarray(wire.payload, float)
    tau = 0 if wire.overlap is None else int(np.max(wire.overlap))
    for collective in (ALL_REDUCE, ALL_GATHER):
      # The ring is the workers that sent; an absent one only downloads the result.
      involved = kind == collective
      members = np.flatnonzero(involved & (sent > 0))
      if members.size:
        self._collective(collective, members, np.flatnonzero(involved & (sent == 0)), payload,
                         tau, wire.received)
    gossiping = kind == GOSSIP
    if gossiping.any():
      peers = np.asarray(wire.peers, bool)
      edges = (peers | peers.T) & gossiping[:, None] & gossiping[None, :]
      self.now = gossip_finish(self.net, self.now, edges, payload)

  def _collective(self, collective, members, absent, payload, tau: int,
                  received=None) -> None:
    """Times one collective: the ring of `members` starts when its last member arrives;
    each `absent` worker downloads the result (the reduced tree, or every member's
    message) once it exists, over its fastest link from a member; a member that
    received more than its ring share (`received`: a worker catching up after
    offline dropout) downloads the excess after the ring, over its fastest link
    from another member."""
    start = self.now[members].max()
    m = len(members)
    if collective == ALL_REDUCE:
      size = payload[members].max()
      duration, download = ring_all_reduce_seconds(self.net, members, size), size
      share = np.full(len(payload), 2.0 * (m - 1) / m * size)
    else:
      duration = ring_all_gather_seconds(self.net, members, payload[members].max())
      download = payload[members].sum()
      share = download - payload           # every other member's message
    end = self._overlap_end(collective, members, payload, tau, start + duration)
    arrivals = [(members, end)] + [
        (np.array([a]), max(self.now[a], end) +
         min(self.net.link_seconds(j, a, download) for j in members)) for a in absent]
    if received is not None and m > 1:
      for a in members:
        extra = float(received[a] - share[a])
        if extra > 0.5:
          arrivals.append((np.array([a]), end + min(
              self.net.link_seconds(j, a, extra) for j in members if j != a)))
    for who, arrival in arrivals:
      if tau > 0:
        self.pending.append([tau, arrival, who])
      else:
        self.now[who] = np.maximum(self.now[who], arrival)

  def _overlap_end(self, collective, members, payload, tau: int, end: float) -> float:
    """When a collective of `members` ends under the overlap model: `end` (started
    after the step) with 'none' or tau > 0; with 'backward', its `buckets` pieces, each
    a ring of its own, released through the members' backward pass of this step."""
    if self.overlap == 'none' or tau > 0:
      return end
    buckets = self.buckets
    if collective == ALL_REDUCE:
      piece = ring_all_reduce_seconds(self.net, members, payload[members].max() / buckets)
    else:
      piece = ring_all_gather_seconds(self.net, members, payload[members].max() / buckets)
    return overlap_model.backward_overlap_end(self._began[members], self._work[members],
                                                piece, buckets)

  def _deliver(self) -> None:
    for item in self.pending:
      item[0] -= 1
      if item[0] <= 0:
        self.now[item[2]] = np.maximum(self.now[item[2]], item[1])
    self.pending = [item for item in self.pending if item[0] > 0]

  def state_dict(self) -> dict:
    return dict(now=self.now.tolist(), compute=self.compute.tolist(),
                pending=[[int(t), float(a), [int(i) for i in mem]] for t, a, mem in self.pending])

  def load_state_dict(self, d: dict) -> None:
    self.now = np.asarray(d['now'], float)
    self.compute = np.asarray(d['compute'], float)
    self.pending = [[t, a, np.asarray(mem, int)] for t, a, mem in d['pending']]


def utilization(compute: np.ndarray, elapsed: float) -> float:
  """Compute utilization: compute time over elapsed time, averaged over workers."""
  return float(np.mean(compute) / elapsed) if elapsed > 0 else 1.0

