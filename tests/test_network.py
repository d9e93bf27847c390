"""The network clock: timing formulas, profiles, schedules, and the asynchronous replay."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import comm
from loco.sim import network as net_lib
from loco.sim import schedule as schedule_lib
from loco.run import train
from loco.core.engine import StepContext
from loco.core.participation import Participation
from loco.errors import ConfigError
from loco.files.metrics import TIMING_KEYS, read_metrics
from loco.wire import Wire


def _net(step_seconds, bandwidth, latency):
  return net_lib.Network(np.asarray(step_seconds, float), np.asarray(bandwidth, float),
                         np.asarray(latency, float))


# Three workers; the link 1 -> 2 is 10x slower than the others.
BW = np.array([[0, 100, 100], [100, 0, 10], [100, 100, 0]], float)
LAT = np.array([[0, 1, 1], [1, 0, 2], [1, 1, 0]], float)


def test_ring_all_reduce_is_bound_by_its_slowest_link_and_pays_latency_per_hop():
  net = _net([1, 1, 1], BW, LAT)
  # A 600-byte tree: 4 phases of 200-byte chunks; ring 0->1->2->0: hops 1+2, 2+20, 1+2 s.
  assert net_lib.ring_all_reduce_seconds(net, [0, 1, 2], 600.0) == pytest.approx(4 * 22.0)
  # Without the slow link (ring 0 -> 2 -> 1 -> 0: hops 1+2, 1+2, 1+2).
  assert net_lib.ring_all_reduce_seconds(net, [0, 2, 1], 600.0) == pytest.approx(4 * 3.0)
  # Two members: 2 phases of S/2, over the link 0 -> 2 and back.
  assert net_lib.ring_all_reduce_seconds(net, [0, 2], 300.0) == pytest.approx(2 * (1 + 1.5))
  assert net_lib.ring_all_reduce_seconds(net, [1], 300.0) == 0.0


@pytest.mark.parametrize('slow', range(4))
def test_a_ring_all_reduce_is_as_slow_as_its_slow_link_wherever_it_sits(slow):
  """Four workers, one slow link (slow -> slow + 1, both ways), the wrap-around 3 -> 0
  included: a 4000-byte tree is 6 phases of 1000-byte chunks, each bound by the slow
  hop: 6 x (0.01 + 1000 / 1e5) = 0.12 s past the step, whichever rotation it is in."""
  bandwidth = np.full((4, 4), 1e6)
  nxt = (slow + 1) % 4
  bandwidth[slow, nxt] = bandwidth[nxt, slow] = 1e5
  net = _net([1.0] * 4, bandwidth, np.full((4, 4), 0.01))
  clock = net_lib.Clock(net)
  _step(clock, _wire(1, sent=2 * 3 / 4 * 4000.0, payload=4000.0, m=4))
  np.testing.assert_allclose(clock.now, 1.0 + 6 * (0.01 + 1000 / 1e5))
  fast = net_lib.Clock(_net([1.0] * 4, np.full((4, 4), 1e6), np.full((4, 4), 0.01)))
  _step(fast, _wire(1, sent=2 * 3 / 4 * 4000.0, payload=4000.0, m=4))
  np.testing.assert_allclose(fast.now, 1.0 + 6 * (0.01 + 1000 / 1e6))


def test_a_dropped_worker_behind_the_slowest_link_downloads_the_result_after_the_ring():
  """Worker 3 sits behind 1e4 B/s links and drops out of the round: the ring of 0, 1, 2
  (fast links) reduces a 3000-byte tree in 4 phases of 1000 B, 4 x (0.01 + 1e-3) s after
  the step; worker 3 then downloads the 3000-byte result over its fastest link, 0.01 +
  0.3 s more. The others do not wait for it; every byte it receives was sent."""
  bandwidth = np.full((4, 4), 1e6)
  bandwidth[3, :] = bandwidth[:, 3] = 1e4
  net = _net([1.0] * 4, bandwidth, np.full((4, 4), 0.01))
  alive = jnp.array([True, True, True, False])
  state = jax.vmap(lambda a: comm.ring_all_reduce_state(a, 3000.0),
                   axis_name=comm.WORKERS)(alive)
  sent, received = np.asarray(state.sent), np.asarray(state.received)
  assert received[3] == 3000.0 and sent[3] == 0.0
  assert sent.sum() == pytest.approx(received.sum())       # 3 x (2000 + 1000) = 3 x 2000 + 3000
  clock = net_lib.Clock(net)
  clock.step(jax.tree.map(np.asarray, state), np.ones(4, bool))
  ring = 1.0 + 4 * (0.01 + 1000 / 1e6)
  np.testing.assert_allclose(clock.now, [ring, ring, ring, ring + 0.01 + 3000 / 1e4])


def test_all_gather_and_gossip_times_by_hand():
  net = _net([1, 1, 1], BW, LAT)
  # m - 1 = 2 phases, each hop moving a 50-byte payload; slowest hop 1 -> 2: 2 + 5.
  assert net_lib.ring_all_gather_seconds(net, [0, 1, 2], 50.0) == pytest.approx(2 * 7.0)
  edges = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], bool)    # a path 0 - 1 - 2
  start = np.array([0.0, 5.0, 1.0])
  end = net_lib.gossip_finish(net, start, edges, np.array([100.0, 100.0, 100.0]))
  # (0, 1) starts at 5, takes max(1 + 1, 1 + 1) = 2; (1, 2) starts at 5, takes
  # max(2 + 10, 1 + 1) = 12.
  np.testing.assert_allclose(end, [7.0, 17.0, 17.0])


def _wire(kind, sent=0.0, payload=0.0, peers=None, overlap=None, m=3):
  """A host Wire, all workers of the same kind (0 none, 1 all-reduce)."""
  peers = ~np.eye(m, dtype=bool) if peers is None else np.asarray(peers, bool)
  return Wire(sent=np.full(m, float(sent)), received=np.full(m, float(sent)),
              events=np.full(m, int(kind > 0)), kind=np.full(m, kind),
              payload=np.full(m, float(payload)),
              peers=peers if kind else np.zeros((m, m), bool),
              overlap=None if overlap is None else np.full(m, overlap))


def _step(clock, wire):
  """One step of `clock` in which every worker computed."""
  clock.step(wire, np.ones(len(wire.sent), bool))


def test_clock_waits_for_the_slowest_worker_and_overlap_stalls_only_when_late():
  net = _net([1.0, 3.0, 1.0], np.full((3, 3), 100.0), np.zeros((3, 3)))
  clock = net_lib.Clock(net)
  sent = 2 * 2 / 3 * 300.0          # 300-byte payload: 4 phases of 100 B
  _step(clock, _wire(0))
  np.testing.assert_allclose(clock.now, [1, 3, 1])
  _step(clock, _wire(1, sent, 300.0))
  np.testing.assert_allclose(clock.now, [10, 10, 10])      # start 6 (slowest) + 4 x 1 s
  np.testing.assert_allclose(clock.compute, [2, 6, 2])
  assert net_lib.utilization(clock.compute, clock.seconds) == pytest.approx(10 / 30)
  # Overlapped with tau = 2: started at 13 (worker 1), arrives at 17; worker 0 needs it
  # at the end of step +2 (its clock 12 -> stalls to 17), worker 1 at 19 (no stall).
  clock = net_lib.Clock(net, now=np.array([10.0, 10.0, 10.0]))
  _step(clock, _wire(1, sent, 300.0, overlap=2))
  np.testing.assert_allclose(clock.now, [11, 13, 11])
  _step(clock, _wire(0))
  np.testing.assert_allclose(clock.now, [12, 16, 12])
  _step(clock, _wire(0))
  np.testing.assert_allclose(clock.now, [17, 19, 17])
  restored = net_lib.Clock(net)
  restored.load_state_dict(clock.state_dict())
  np.testing.assert_array_equal(restored.now, clock.now)


@pytest.mark.parametrize('name', ['gasloc', 'adpsgd',   # the other two: pytest -m slow
                                  *(pytest.param(n, marks=pytest.mark.slow) for n in ('a2cid2', 'noloco'))])
def test_the_clock_times_the_matchings_the_engine_used(nano_config, tmp_path, name):
  """Random matchings on unequal links: the clock times exactly the edges each step
  used, read from the steps' StepInfo (it used to draw its own matchings)."""
  from loco.sim import commlog
  m = 4
  nano_config.num_workers = m
  nano_config.steps = 12
  nano_config.log_every = 4
  nano_config.eval.every = 12
  nano_config.checkpoint.every = 12
  nano_config.algorithm.name = name
  if name == 'gasloc':
    nano_config.algorithm.topology = 'matching'
  if name in ('gasloc', 'noloco'):
    nano_config.algorithm.sync_every = 2
  bandwidth = [[1e12 if i == j else 1e6 * (1 + 3 * i + 7 * j + 5 * i * j) for j in range(m)]
               for i in range(m)]
  nano_config.network.profile = 'custom'
  nano_config.network.bandwidth_matrix = bandwidth
  nano_config.network.latency = 0.0
  nano_config.network.step_seconds = 0.5
  workdir = str(tmp_path / name)
  record = train.run(nano_config, workdir)
  _, log = commlog.read(workdir)
  net = net_lib.Network(np.full(m, 0.5), np.asarray(bandwidth, float), np.zeros((m, m)))
  now, pairs = np.zeros(m), set()
  for step in range(1, 13):
    now = now + 0.5
    if step not in log:
      continue
    _, wire = log[step]
    edges = wire.peers | wire.peers.T
    assert (edges.sum(1) <= 1).all(), 'a matching: one partner per worker'
    pairs |= {tuple(sorted(p)) for p in zip(*np.nonzero(np.triu(edges, 1)))}
    end = now.copy()
    for i, j in zip(*np.nonzero(np.triu(edges, 1))):    # by hand: both ends, slower way
      done = max(now[i], now[j]) + max(wire.payload[i] / bandwidth[i][j],
                                       wire.payload[j] / bandwidth[j][i])
      end[i], end[j] = done, done
    now = end
  assert len(pairs) > 1, 'different matchings over the run'
  assert record['sim_seconds'] == pytest.approx(now.max(), rel=1e-9)


def test_profiles_build_the_matrices_they_describe():
  cfg = net_lib.parse_network(dict(profile='multi_region', regions=2, bandwidth=100.0,
                                   inter_bandwidth=1.0, inter_latency=0.5, latency=0.0))
  net = net_lib.make_network(cfg, 4, 2.0)
  assert net.bandwidth[0, 1] == 100.0 and net.bandwidth[2, 3] == 100.0
  assert net.bandwidth[1, 2] == 1.0 and net.latency[0, 3] == 0.5
  np.testing.assert_array_equal(net.step_seconds, 2.0)
  cfg = net_lib.parse_network(dict(profile='slow_links', slow_workers=1, slow_factor=10.0,
                                   bandwidth=100.0))
  net = net_lib.make_network(cfg, 4, 1.0)
  off = ~np.eye(4, dtype=bool)
  assert sorted(np.unique(net.bandwidth[off])) == [10.0, 100.0]
  assert (net.bandwidth[off] == 10.0).sum() == 2 * 3           # one worker's 3 links, both ways
  net = net_lib.make_network(net_lib.parse_network(dict(profile='stragglers')), 8, 1.0)
  assert sorted(net.step_seconds) == [1.0] * 6 + [3.0] * 2      # 25% are 3x slower
  net = net_lib.make_network(net_lib.parse_network(dict(profile='lognormal', sigma=1.0)), 6, 1.0)
  np.testing.assert_array_equal(net.bandwidth, net.bandwidth.T)
  assert net.bandwidth[~np.eye(6, dtype=bool)].std() > 0
  flops = net_lib.nominal_step_seconds(net_lib.parse_network(dict(profile='homogeneous')),
                                       flops_per_token=1e6, tokens_per_step=4e6)
  assert flops == pytest.approx(4e12 / (100e12 * 0.4))


@pytest.mark.parametrize('section, match', [
    (dict(profile='nowhere'), 'network.profile must be one of'),
    (dict(sigma=1.0), 'network.profile is not'),
    (dict(profile='homogeneous', sigma=1.0), 'network.sigma is not read'),
    (dict(profile='homogeneous', bandwidth=0.0),
     r'^network.bandwidth must be positive, got 0.0\.$'),
    (dict(profile='homogeneous', bandwidth=-5.0), 'bandwidth must be positive'),
    # One range per key, declared once (network.RANGES): the config boundary's rule.
    (dict(profile='homogeneous', mfu=1.5), r'^network.mfu must be in \(0, 1\], got 1.5\.$'),
    (dict(profile='homogeneous', seed=-1), 'network.seed must be in'),
    (dict(profile='homogeneous', dropout=1.0), 'dropout'),
    (dict(profile='homogeneous', mode='later'), 'network.mode'),
    (dict(profile='churn'), 'needs network.churn'),
    (dict(profile='custom'), 'needs network.bandwidth_matrix'),
    (dict(profile='churn', churn=[1, 5, 9]), 'network.churn must be a list of'),
])
def test_bad_network_config(section, match):
  with pytest.raises(ConfigError, match=match):
    net_lib.parse_network(section)


def test_the_config_boundary_reads_the_networks_own_ranges():
  from loco import configs
  network_keys = {k: v for k, v in configs.CONSTRAINTS.items() if k.startswith('network.')}
  assert network_keys == {f'network.{k}': v for k, v in net_lib.RANGES.items()}


def test_bad_matrices_and_speeds():
  with pytest.raises(ConfigError, match='3 x 3'):
    _net([1, 1, 1], np.ones((2, 2)), np.zeros((3, 3)))
  with pytest.raises(ConfigError, match='bandwidth must be finite and > 0'):
    _net([1, 1], [[0, -1], [1, 0]], np.zeros((2, 2)))
  with pytest.raises(ConfigError, match='latency'):
    _net([1, 1], np.ones((2, 2)), [[0, -1], [0, 0]])
  cfg = net_lib.parse_network(dict(profile='custom', bandwidth_matrix=[[0, 1], [1, 0]]))
  with pytest.raises(ConfigError, match='must be 3 x 3'):
    net_lib.make_network(cfg, 3, 1.0)
  cfg = net_lib.parse_network(dict(profile='homogeneous', speeds=[1.0, 2.0]))
  with pytest.raises(ConfigError, match='speeds must have num_workers=3'):
    net_lib.make_network(cfg, 3, 1.0)
  cfg = net_lib.parse_network(dict(profile='churn', churn=[[5, 1, 3]]))
  with pytest.raises(ConfigError, match='churn entry'):
    net_lib.make_network(cfg, 3, 1.0)


# ---------------------------------------------------------------------------
# Schedules.


def test_sync_schedule_dropout_and_churn():
  sched = schedule_lib.SyncSchedule(8, round_steps=5, dropout=0.5, churn=((2, 3, 12),),
                                    seed=1)
  active, alive = sched.masks(0, 400)
  assert not active[3:12, 2].any() and active[:3, 2].all() and active[12:, 2].all()
  assert not alive[3:12, 2].any()
  # One draw per round, at least one survivor, about half out.
  rounds = alive.reshape(80, 5, 8)
  assert (rounds == rounds[:, :1]).all()
  assert alive.any(axis=1).all()
  assert 0.4 < 1 - alive[12:].mean() < 0.6
  # Deterministic and resumable: a window equals the same rows of the whole.
  np.testing.assert_array_equal(sched.masks(37, 20)[1], alive[37:57])
  assert schedule_lib.SyncSchedule(8).trivial


def _async(speeds, bandwidth, *, steps=30, sync_every=5, peers=None, seed=0,
           local_work='steps'):
  m = len(speeds)
  net = _net(1.0 / np.asarray(speeds, float), bandwidth, np.full((m, m), 0.1))
  peers = ~np.eye(m, dtype=bool) if peers is None else peers
  return net, schedule_lib.simulate_async(net, steps=steps, sync_every=sync_every,
                                          peers=peers, exchange_bytes=100.0, seed=seed,
                                          local_work=local_work)


def test_async_schedule_invariants():
  rng = np.random.default_rng(0)
  bandwidth = rng.uniform(10, 1000, (6, 6))
  net, sched = _async([1, 1, 2, 0.5, 1.5, 1], bandwidth)
  # Every worker takes exactly `steps` steps, and never two exchanges at once.
  np.testing.assert_array_equal(sched.active.sum(0), 30)
  for w in range(6):
    spans = sorted((s, e) for i, j, s, e in sched.exchanges if w in (i, j))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
  # Each exchange is replayed once, as a pair that averages.
  assert sched.sync.sum() == 2 * len(sched.exchanges)
  for t in np.flatnonzero(sched.sync.any(1)):
    w = sched.mixing[t]
    np.testing.assert_allclose(w.sum(1), 1.0)
    np.testing.assert_allclose(w, w.T)
    assert set(np.unique(w)) <= {0.0, 0.5, 1.0}
    np.testing.assert_array_equal(np.diag(w) == 0.5, sched.sync[t])
  # Clocks are monotone; compute is steps x step time.
  assert (np.diff(sched.seconds) >= 0).all()
  assert (np.diff(sched.worker_seconds, axis=0) >= 0).all()
  np.testing.assert_allclose(sched.seconds, sched.worker_seconds.max(1))
  assert (np.diff(sched.compute, axis=0) >= 0).all()
  np.testing.assert_allclose(sched.compute[-1], 30 * net.step_seconds)
  # An exchange's time is its link's: latency + bytes / bandwidth, the slower way.
  i, j, s, e = sched.exchanges[0]
  assert e - s == pytest.approx(0.1 + 100.0 / min(bandwidth[i, j], bandwidth[j, i]))
  # Deterministic for a seed; another seed pairs differently.
  _, again = _async([1, 1, 2, 0.5, 1.5, 1], bandwidth)
  np.testing.assert_array_equal(again.mixing, sched.mixing)
  _, other = _async([1, 1, 2, 0.5, 1.5, 1], bandwidth, seed=1)
  assert [x[:2] for x in other.exchanges] != [x[:2] for x in sched.exchanges]


def test_async_exchanges_respect_the_peer_graph_and_time_based_work():
  ring = np.roll(np.eye(6, dtype=bool), 1, 1) | np.roll(np.eye(6, dtype=bool), -1, 1)
  _, sched = _async([1, 2, 1, 2, 1, 2], np.full((6, 6), 100.0), peers=ring)
  assert all(ring[i, j] for i, j, _, _ in sched.exchanges)
  net = _net([1.0, 0.5, 0.25], np.full((3, 3), 100.0), np.zeros((3, 3)))
  np.testing.assert_array_equal(
      schedule_lib.local_steps_per_round(net, 7, 'time'), [4, 8, 16])   # 7 x 0.583 s


def _toy_gasloc(num_workers=4):
  alg = algorithms.make('gasloc', optax.adam(0.05), sync_every=3, topology='matching',
                        outer_lr=0.7, outer_momentum=0.5)
  target = jnp.arange(num_workers * 5, dtype=jnp.float32).reshape(num_workers, 5)

  def grads(params):       # each worker pulls toward its own target
    return {'w': params['w'] - target}

  state = alg.init({'w': jnp.zeros((5,))}, num_workers, jax.random.PRNGKey(0))
  return alg, state, grads


def test_async_replay_with_equal_speeds_equals_the_synchronous_run():
  _, sched = _async([1, 1, 1, 1], np.full((4, 4), 100.0), steps=12, sync_every=3)
  assert sched.num_ticks == 12
  assert (sched.active.all()) and (sched.sync.any(1) == [(t + 1) % 3 == 0
                                                          for t in range(12)]).all()
  alg, sync_state, grads = _toy_gasloc()
  async_state = sync_state
  step = jax.jit(alg.step)
  for t in range(12):
    mixing = jnp.asarray(sched.mixing[t])
    # Synchronous GASLoC on the same matchings: its own every-H schedule.
    sync_state, _ = step(sync_state, grads(sync_state.params), StepContext(mixing=mixing))
    async_state, info = step(async_state, grads(async_state.params), StepContext(
        active=jnp.asarray(sched.active[t]), mixing=mixing,
        participation=Participation(sync=jnp.asarray(sched.sync[t]))))
  np.testing.assert_allclose(async_state.params['w'], sync_state.params['w'], rtol=1e-6)
  np.testing.assert_allclose(async_state.anchor['w'], sync_state.anchor['w'], rtol=1e-6)
  # The workers did mix (they pull to different targets yet moved toward each other).
  assert float(jnp.std(sync_state.params['w'][:, 0])) > 0


def test_replay_with_unequal_speeds_runs_only_the_scheduled_outer_steps():
  net, sched = _async([1, 3, 1, 3], np.full((4, 4), 100.0), steps=12, sync_every=3,
                      local_work='time')     # H_i = 2, 6, 2, 6 steps per round
  # Exchanges happen after different step counts: some ticks sync only some workers.
  partial = sched.sync.any(1) & ~sched.sync.all(1)
  assert partial.any()
  alg, state, grads = _toy_gasloc()
  step = jax.jit(alg.step)
  for t in range(sched.num_ticks):
    before = state
    state, info = step(state, grads(state.params), StepContext(
        active=jnp.asarray(sched.active[t]), mixing=jnp.asarray(sched.mixing[t]),
        participation=Participation(sync=jnp.asarray(sched.sync[t]))))
    off = ~sched.sync[t]
    # Workers outside this tick's exchanges keep their anchors and send nothing.
    np.testing.assert_array_equal(np.asarray(state.anchor['w'])[off],
                                  np.asarray(before.anchor['w'])[off])
    assert (np.asarray(info.wire.sent)[off] == 0).all()
    assert (np.asarray(info.wire.sent)[sched.sync[t]] == 20).all()   # 5 floats, 1 peer


# ---------------------------------------------------------------------------
# Through the train loop.


@pytest.mark.slow
def test_runs_report_simulated_time_and_resume_exactly(nano_config, tmp_path):
  nano_config.num_workers = 4
  nano_config.algorithm.name = 'diloco'
  nano_config.algorithm.sync_every = 5
  nano_config.network.profile = 'stragglers'
  nano_config.network.dropout = 0.25
  nano_config.network.step_seconds = 1.0
  nano_config.network.bandwidth = 1e5
  full = str(tmp_path / 'full')
  record = train.run(nano_config, full)
  # 20 steps at 1 s (the stragglers: 3 s, and every sync waits for them) + 4 syncs.
  assert record['sim_seconds'] > 60.0
  assert 0.0 < record['utilization'] < 1.0
  assert len(record['idle_seconds']) == 4 and min(record['idle_seconds']) >= 0
  records = read_metrics(full)
  assert all(a['sim_seconds'] < b['sim_seconds'] for a, b in zip(records, records[1:]))
  resumed = str(tmp_path / 'resumed')
  import shutil
  shutil.copytree(full, resumed)
  shutil.rmtree(str(tmp_path / 'resumed' / 'checkpoints' / '20'))
  train.run(nano_config, resumed)
  drop = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rs]
  assert drop(read_metrics(resumed)) == drop(records)


@pytest.mark.slow
def test_async_gasloc_through_the_loop(nano_config, tmp_path):
  nano_config.num_workers = 4
  nano_config.algorithm.name = 'gasloc'
  nano_config.algorithm.sync_every = 5
  nano_config.algorithm.topology = 'ring'
  nano_config.network.profile = 'homogeneous'
  nano_config.network.mode = 'async'
  nano_config.network.speeds = [1.0, 1.0, 1.0, 0.5]
  nano_config.network.step_seconds = 1.0
  record = train.run(nano_config, str(tmp_path / 'run'))
  # Every worker took its 20 steps (tokens).
  assert record['tokens'] == 20 * 4 * 2 * 32
  assert record['step'] >= 20
  assert record['sim_seconds'] == pytest.approx(40.0, rel=0.05)   # the slow worker's 20 x 2 s
  assert np.isfinite(record['eval_loss'])


def test_async_needs_an_outer_gossip_algorithm(nano_config, tmp_path):
  nano_config.algorithm.name = 'diloco'
  nano_config.network.profile = 'homogeneous'
  nano_config.network.mode = 'async'
  with pytest.raises(ConfigError, match="network.mode='async'"):
    train.run(nano_config, str(tmp_path / 'run'))


def test_sampled_peers_mix_across_cohorts_and_stranded_workers_go_on():
  # Workers 0 and 1 sit behind slow links: with 'ready' they pair with each other.
  m = 8
  bandwidth = np.full((m, m), 1000.0)
  bandwidth[:2, :] = bandwidth[:, :2] = 10.0
  pairs = {}
  for choice in ('ready', 'sampled'):
    net = _net(np.ones(m), bandwidth, np.zeros((m, m)))
    sched = schedule_lib.simulate_async(net, steps=60, sync_every=5,
                                        peers=~np.eye(m, dtype=bool), exchange_bytes=100.0,
                                        peer_choice=choice, seed=0)
    np.testing.assert_array_equal(sched.active.sum(0), 60)
    for w in range(m):
      spans = sorted((s, e) for i, j, s, e in sched.exchanges if w in (i, j))
      assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    pairs[choice] = {(i, j) for i, j, _, _ in sched.exchanges}
  assert len(pairs['sampled']) > len(pairs['ready'])
  # Time-based local work: the fast worker runs out of partners; everyone still
  # takes all of its steps.
  net = _net([0.25, 1.0, 1.0], np.full((3, 3), 100.0), np.zeros((3, 3)))
  for choice in ('ready', 'sampled'):
    sched = schedule_lib.simulate_async(net, steps=20, sync_every=3,
                                        peers=~np.eye(3, dtype=bool), exchange_bytes=10.0,
                                        local_work='time', peer_choice=choice)
    np.testing.assert_array_equal(sched.active.sum(0), 20)
  with pytest.raises(ConfigError, match='peer_choice'):
    net_lib.parse_network(dict(profile='homogeneous', peer_choice='nearest'))


def test_churn_that_leaves_no_worker_present_is_refused():
  """Two workers both away over steps [5, 8): nobody would train or sync there (an outer
  step with no senders moves the anchors by momentum alone). One staying is fine."""
  cfg = net_lib.parse_network(dict(profile='churn', churn=[[0, 2, 8], [1, 5, 9]]))
  with pytest.raises(ConfigError, match=r'^network.churn leaves no worker present at step '
                                        r'5; at least one worker must stay.$'):
    net_lib.make_network(cfg, num_workers=2, step_seconds=1.0)
  net_lib.make_network(cfg, num_workers=3, step_seconds=1.0)
  apart = net_lib.parse_network(dict(profile='churn', churn=[[0, 2, 5], [1, 5, 9]]))
  net_lib.make_network(apart, num_workers=2, step_seconds=1.0)
