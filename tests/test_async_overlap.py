"""The overlapped asynchronous replay (network.overlap='compute'), per-worker H_i
('auto'), the 'rotation' peer rule, and the exchange bytes measured from the transform.

GASLoC, arXiv 2606.11081: workers keep computing while their models are in flight.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import comm
from loco.sim import network as net_lib
from loco.sim import schedule as schedule_lib
from loco.sim import timeline as timeline_lib
from loco.core.engine import StepContext
from loco.core.participation import Participation
from loco.errors import ConfigError

RING4 = np.roll(np.eye(4, dtype=bool), 1, 1) | np.roll(np.eye(4, dtype=bool), -1, 1)
COMPLETE4 = ~np.eye(4, dtype=bool)


def _net(step_seconds, bandwidth, latency=None):
  m = len(step_seconds)
  latency = np.zeros((m, m)) if latency is None else latency
  return net_lib.Network(np.asarray(step_seconds, float), np.asarray(bandwidth, float),
                         np.asarray(latency, float))


def _steps_at(sched, mask):
  """Per worker: its inner steps done at each tick where `mask` ([T, M]) is set."""
  done = np.cumsum(sched.active, 0)
  return [done[mask[:, w], w].tolist() for w in range(mask.shape[1])]


# ---------------------------------------------------------------------------
# The schedule.


def test_hand_built_overlapped_trace():
  """4 workers on a ring, worker 3 computes at 2 s a step, the others at 1 s; links
  0-3 and 1-2 take 10 s, 0-1 and 2-3 take 1 s (100 bytes at 10 or 100 B/s); H = 2,
  6 steps each; 'rotation' alternates the matchings {0-1, 2-3} and {0-3, 1-2}.

  By hand: at t=2 workers 0, 1 end round 1 and exchange (0-1, 2 -> 3; each has sent
  after 2 steps and merges at its step boundary t=3, after step 3: 1 stale step);
  worker 2 posts for 3 and computes on. At t=4 worker 3 ends its round: 2-3 runs
  4 -> 5; worker 2 ended round 2 at t=4 with its exchange pending, so it waits idle
  and merges at 5 (0 stale), worker 3 merges at its boundary t=6 (1 stale). At t=4
  workers 0 and 1 post for 3 and 2 (round 2's matching). At t=5 worker 2 posts:
  1-2 runs 5 -> 15 (1 sent after 5 steps, 2 after 4; both finish their steps and wait:
  stale 1 and 2). Worker 3 ends round 2 at t=8: 0-3 runs 8 -> 18 (0 sent after its 6
  steps, 3 after 4; stale 0 and 2). Their third rounds' exchanges (round 3: {0-1, 2-3},
  steps done) run 18 -> 19 once 0 and 3 are free; 1 and 2 waited since 15.
  """
  bandwidth = np.full((4, 4), 100.0)
  bandwidth[0, 3] = bandwidth[3, 0] = bandwidth[1, 2] = bandwidth[2, 1] = 10.0
  net = _net([1.0, 1.0, 1.0, 2.0], bandwidth)
  np.testing.assert_array_equal(schedule_lib.rotation(RING4, 0), [[1, 0, 3, 2], [3, 2, 1, 0]])
  sched = schedule_lib.simulate_async(net, steps=6, sync_every=2, peers=RING4,
                                      exchange_bytes=100.0, peer_choice='rotation',
                                      overlap='compute')
  got = sorted(zip([tuple(map(float, x)) for x in sched.exchanges],
                   map(tuple, sched.staleness.tolist())))
  assert got == [((0, 1, 2.0, 3.0), (1, 1)), ((0, 1, 18.0, 19.0), (0, 0)),
                 ((0, 3, 8.0, 18.0), (0, 2)), ((1, 2, 5.0, 15.0), (1, 2)),
                 ((2, 3, 4.0, 5.0), (0, 1)), ((2, 3, 18.0, 19.0), (0, 0))]
  # Steps each worker had taken when it sent, and when it merged, its three exchanges.
  assert _steps_at(sched, sched.send) == [[2, 6, 6], [2, 5, 6], [4, 4, 6], [2, 4, 6]]
  assert _steps_at(sched, sched.sync) == [[3, 6, 6], [3, 6, 6], [4, 6, 6], [3, 6, 6]]
  np.testing.assert_array_equal(sched.active.sum(0), 6)
  # Waiting is idle time, not compute: compute is 6 steps x step time; all end at 19.
  np.testing.assert_allclose(sched.compute[-1], [6.0, 6.0, 6.0, 12.0])
  np.testing.assert_allclose(sched.worker_seconds[-1], [19.0] * 4)
  assert sched.seconds[-1] == 19.0
  metrics = timeline_lib.clock_metrics(sched.seconds[-1], sched.worker_seconds[-1],
                                       sched.compute[-1])
  assert metrics['idle_seconds'] == [13.0, 13.0, 13.0, 7.0]
  # Every merge reads a snapshot sent in an earlier tick; a mixing row per merger.
  for t in np.flatnonzero(sched.sync.any(1)):
    for i in np.flatnonzero(sched.sync[t]):
      assert sched.mixing[t, i, i] == 0.5 and (sched.mixing[t, i] > 0).sum() == 2


def test_blocking_replay_is_still_there_and_never_stale():
  bandwidth = np.full((4, 4), 100.0)
  bandwidth[0, 3] = bandwidth[3, 0] = bandwidth[1, 2] = bandwidth[2, 1] = 10.0
  sched = schedule_lib.simulate_async(_net([1.0, 1.0, 1.0, 2.0], bandwidth), steps=6,
                                      sync_every=2, peers=RING4, exchange_bytes=100.0,
                                      peer_choice='rotation', overlap='none')
  assert sched.send is None and (sched.staleness == 0).all()
  # A blocked worker computes nothing while it waits: compute is its steps only.
  np.testing.assert_allclose(sched.compute[-1], [6.0, 6.0, 6.0, 12.0])
  assert (sched.worker_seconds[-1] > sched.compute[-1]).all()


def test_staleness_is_positive_on_slow_links_and_zero_on_an_instant_network():
  m = 8
  slow = np.full((m, m), 1000.0)
  slow[:2, :] = slow[:, :2] = 10.0
  instant = np.full((m, m), 1e15)
  for bandwidth, stale in ((slow, True), (instant, False)):
    sched = schedule_lib.simulate_async(_net(np.ones(m), bandwidth), steps=60, sync_every=5,
                                        peers=~np.eye(m, dtype=bool), exchange_bytes=100.0,
                                        overlap='compute')
    np.testing.assert_array_equal(sched.active.sum(0), 60)
    assert len(sched.staleness) == len(sched.exchanges) > 0
    if stale:   # measured: mean 2.0 steps, max 5 (the slow links' 10 s exchanges)
      assert sched.staleness.mean() > 1.0 and sched.staleness.max() >= 5
    else:
      assert (sched.staleness == 0).all()


def test_rotation_bounds_the_rounds_between_a_pair_and_mixes_slow_links():
  """'rotation' on the complete graph of 8 workers, two behind 100x slower links:
  every worker meets each of its 7 neighbours once in every 7 consecutive exchanges of
  its own. 'ready' splits the workers into cohorts: over the first 24 exchanges it
  uses 16 distinct pairs (9 with the blocking replay), 'rotation' 24 (measured)."""
  m = 8
  bandwidth = np.full((m, m), 1000.0)
  bandwidth[:2, :] = bandwidth[:, :2] = 10.0
  net = _net(np.ones(m), bandwidth)
  peers = ~np.eye(m, dtype=bool)
  k = len(schedule_lib.rotation(peers))
  assert k == m - 1
  distinct = {}
  for choice in ('ready', 'rotation'):
    sched = schedule_lib.simulate_async(net, steps=400, sync_every=5, peers=peers,
                                        exchange_bytes=100.0, peer_choice=choice,
                                        overlap='compute')
    np.testing.assert_array_equal(sched.active.sum(0), 400)
    distinct[choice] = len({(i, j) for i, j, _, _ in sched.exchanges[:24]})
    if choice == 'rotation':
      assert len(sched.exchanges) == m * 80 // 2        # one exchange per round each
      for w in range(m):
        partners = [j if i == w else i for i, j, _, _ in sched.exchanges if w in (i, j)]
        assert len(partners) == 80
        for start in range(len(partners) - k + 1):
          assert set(partners[start:start + k]) == set(range(m)) - {w}, (w, start)
  assert distinct['rotation'] == 24 and distinct['ready'] <= 16
  blocking = schedule_lib.simulate_async(net, steps=400, sync_every=5, peers=peers,
                                         exchange_bytes=100.0, peer_choice='rotation')
  assert len({(i, j) for i, j, _, _ in blocking.exchanges[:24]}) == 24


def test_auto_local_steps_follow_speed_and_links():
  # Worker 2 computes at 2 s a step, worker 3's links take 10 s (the others' 1 s):
  # x = (1, 1, 1, 10) (median link); H_i = max(floor(6 x 1 / c_i), ceil(x_i / c_i)):
  # worker 2 takes 3 steps (its round lasts the others' 6 s), worker 3 takes 10 (its
  # 10 s exchange hides behind 10 s of compute).
  bandwidth = np.full((4, 4), 100.0)
  bandwidth[3, :] = bandwidth[:, 3] = 10.0
  net = _net([1.0, 1.0, 2.0, 1.0], bandwidth)
  np.testing.assert_allclose(schedule_lib.exchange_seconds(net, COMPLETE4, 100.0),
                             [1.0, 1.0, 1.0, 10.0])
  np.testing.assert_array_equal(schedule_lib.local_steps_per_round(
      net, 6, 'auto', peers=COMPLETE4, exchange_bytes=100.0), [6, 6, 3, 10])
  sched = schedule_lib.simulate_async(net, steps=30, sync_every=6, peers=COMPLETE4,
                                      exchange_bytes=100.0, local_work='auto',
                                      overlap='compute')
  np.testing.assert_array_equal(sched.active.sum(0), 30)
  # Worker 3 sends after each 10 steps (10, 20, 30 s at 1 s a step); each exchange takes
  # its 10 s link, in flight while it takes its next 10 steps (it merges 10 steps stale).
  mine = [k for k, e in enumerate(sched.exchanges) if 3 in e[:2]]
  assert [sched.exchanges[k][2:] for k in mine] == [(10.0, 20.0), (20.0, 30.0), (30.0, 40.0)]
  assert [int(sched.staleness[k][1]) for k in mine[:2]] == [10, 10]


def test_bad_new_config_values_are_one_line_errors():
  for key, value in (('overlap', 'sometimes'), ('local_work', 'fast'),
                     ('peer_choice', 'mixing')):
    with pytest.raises(ConfigError) as err:
      net_lib.parse_network(dict(profile='homogeneous', mode='async', **{key: value}))
    assert str(err.value).startswith(f'network.{key} must be one of') and '\n' not in str(err.value)
  # One key, per mode: the synchronous clock's overlaps, the asynchronous replay's.
  sync_error = str(pytest.raises(ConfigError, net_lib.parse_network,
                                 dict(profile='homogeneous', overlap='compute')).value)
  assert sync_error == ("network.overlap must be one of ('none', 'backward') with "
                        "network.mode='sync', got 'compute'.")
  async_error = str(pytest.raises(ConfigError, net_lib.parse_network,
                                  dict(profile='homogeneous', mode='async',
                                       overlap='backward')).value)
  assert "('compute', 'none')" in async_error and '\n' not in async_error
  cfg = net_lib.parse_network(dict(profile='homogeneous', peer_choice='rotation'))
  alg = algorithms.make('gasloc', optax.sgd(0.1), sync_every=2)
  with pytest.raises(ConfigError, match="applies to network.mode='async'") as err:
    timeline_lib.make_timeline(cfg, num_workers=4, steps=4, algorithm=alg,
                               name='gasloc', flops_per_token=1.0, tokens_per_step=1,
                               model_bytes=20)
  assert '\n' not in str(err.value)
  assert net_lib.parse_network(dict(profile='homogeneous', mode='async')).async_overlap == 'compute'


# ---------------------------------------------------------------------------
# Through the engine.


def _toy(alg, num_workers=4):
  target = jnp.arange(num_workers * 5, dtype=jnp.float32).reshape(num_workers, 5)
  state = alg.init({'w': jnp.zeros((5,))}, num_workers, jax.random.PRNGKey(0))
  return state, lambda params: {'w': params['w'] - target}


@pytest.mark.slow
def test_overlapped_run_on_an_instant_network_equals_synchronous_gasloc():
  """With instant links and equal speeds every worker ends round r at the same
  instant; the 'ready' rule pairs them into a perfect matching, each sends its model
  as it is after its H steps, and the partner's arrives at that same step boundary,
  before any further step. So each merge mixes the two models after exactly H steps,
  as synchronous GASLoC does when its round-r mixing matrix is that matching's
  pairwise average (GASLoC over random matchings, topology='matching', with the
  schedule's matchings). The replay's extra tick per round, with no step (merges
  after sends), leaves params and inner states unchanged."""
  net = _net(np.ones(4), np.full((4, 4), 1e15))
  sched = schedule_lib.simulate_async(net, steps=12, sync_every=3, peers=COMPLETE4,
                                      exchange_bytes=20.0, overlap='compute')
  assert (sched.staleness == 0).all() and sched.num_ticks == 16
  base = algorithms.make('gasloc', optax.adam(0.05), sync_every=3, topology='matching',
                         outer_lr=0.7, outer_momentum=0.5)
  overlapped = base.replay.overlapped()
  assert overlapped.replay.snapshots and not base.replay.snapshots
  sync_state, grads = _toy(base)
  async_state, _ = _toy(overlapped)
  rounds = {}
  for i, j, start, _ in sched.exchanges:
    w = rounds.setdefault(int(round(start)) // 3 - 1, np.eye(4, dtype=np.float32))
    w[[i, j, i, j], [i, j, j, i]] = 0.5
  sync_step, async_step = jax.jit(base.step), jax.jit(overlapped.step)
  for t in range(12):
    sync_state, _ = sync_step(sync_state, grads(sync_state.params),
                              StepContext(mixing=jnp.asarray(rounds[t // 3])))
  for t in range(sched.num_ticks):
    async_state, info = async_step(async_state, grads(async_state.params), StepContext(
        active=jnp.asarray(sched.active[t]), mixing=jnp.asarray(sched.mixing[t]),
        participation=Participation(sync=jnp.asarray(sched.sync[t]),
                                    send=jnp.asarray(sched.send[t]))))
    np.testing.assert_array_equal(np.asarray(info.wire.sent) > 0, sched.sync[t])
  np.testing.assert_allclose(async_state.params['w'], sync_state.params['w'], rtol=1e-6)
  np.testing.assert_allclose(async_state.anchor['w'], sync_state.anchor['w'], rtol=1e-6)
  assert float(jnp.std(sync_state.params['w'][:, 0])) > 0


@pytest.mark.slow
def test_a_merge_reads_the_partners_model_as_it_was_when_sent():
  """On slow links a worker merges its partner's snapshot: replaying the same ticks
  with each merge reading the partner's current model instead gives other params."""
  bandwidth = np.full((4, 4), 100.0)
  bandwidth[0, 3] = bandwidth[3, 0] = bandwidth[1, 2] = bandwidth[2, 1] = 10.0
  sched = schedule_lib.simulate_async(_net([1.0, 1.0, 1.0, 2.0], bandwidth), steps=6,
                                      sync_every=2, peers=RING4, exchange_bytes=100.0,
                                      peer_choice='rotation', overlap='compute')
  base = algorithms.make('gasloc', optax.sgd(0.1), sync_every=2, topology='ring',
                         outer_optimizer='sgd', outer_lr=1.0)
  alg = base.replay.overlapped()
  (stale, grads), (fresh, _) = _toy(alg), _toy(base)
  stale_step, fresh_step = jax.jit(alg.step), jax.jit(base.step)
  for t in range(sched.num_ticks):
    sync = Participation(sync=jnp.asarray(sched.sync[t]))
    ctx = StepContext(active=jnp.asarray(sched.active[t]), mixing=jnp.asarray(sched.mixing[t]),
                      participation=sync)
    stale, _ = stale_step(stale, grads(stale.params), ctx._replace(
        participation=sync._replace(send=jnp.asarray(sched.send[t]))))
    fresh, _ = fresh_step(fresh, grads(fresh.params), ctx)
  assert np.all(np.isfinite(stale.params['w']))
  assert not np.allclose(stale.params['w'], fresh.params['w'])


def _snapshots(state):
  found = [x.snapshot for x in jax.tree.leaves(
      state.outer_state, is_leaf=lambda x: isinstance(x, comm.GossipState))
      if isinstance(x, comm.GossipState)]
  assert len(found) == 1
  return np.asarray(found[0]['w'])


def test_a_send_tick_stores_only_the_senders_snapshots():
  """Workers 0 and 1 send at tick 1, workers 2 and 3 at tick 2 (after everyone stepped):
  the first pair's snapshots stay what they sent at tick 1 (their exchange is still in
  flight), and only the second pair's change."""
  alg = algorithms.make('gasloc', optax.sgd(0.1), sync_every=2,
                        topology='ring').replay.overlapped()
  state, grads = _toy(alg)
  step = jax.jit(alg.step)
  mixing, silent = jnp.eye(4, dtype=jnp.float32), jnp.zeros(4, bool)
  first = jnp.asarray([True, True, False, False])
  state, _ = step(state, grads(state.params), StepContext(
      mixing=mixing, participation=Participation(sync=silent, send=first)))
  sent = _snapshots(state)
  np.testing.assert_array_equal(sent[2:], 0.0)            # not sent yet: as initialised
  assert np.abs(sent[:2]).max() > 0
  state, _ = step(state, grads(state.params), StepContext(
      mixing=mixing, participation=Participation(sync=silent, send=~first)))
  after = _snapshots(state)
  np.testing.assert_array_equal(after[:2], sent[:2])      # still what they sent
  assert not np.allclose(after[2:], 0.0)                  # the second pair's, now
  assert not np.allclose(after[2:], sent[2:])


@pytest.mark.slow
@pytest.mark.parametrize('name,kwargs', [
    ('gasloc', dict(sync_every=2, topology='ring')),
    ('gasloc', dict(sync_every=2, topology='ring', transport_dtype='bfloat16')),
    ('gasloc', dict(sync_every=2, topology='ring', form='proposed_points')),
    ('noloco', dict(sync_every=2)),
])
@pytest.mark.parametrize('overlap', ['none', 'compute'])
def test_replay_bytes_per_exchange_equal_the_engines(name, kwargs, overlap):
  params = {'w': jnp.zeros((5,)), 'b': jnp.zeros((3, 2), jnp.bfloat16)}
  cfg = net_lib.parse_network(dict(profile='homogeneous', mode='async', overlap=overlap,
                                   step_seconds=1.0, bandwidth=1e3))
  alg = algorithms.make(name, optax.sgd(0.1), **kwargs)
  if overlap == 'compute':
    alg = alg.replay.overlapped()
  timeline = timeline_lib.make_timeline(
      cfg, num_workers=4, steps=4, algorithm=alg, name=name,
      flops_per_token=1.0, tokens_per_step=1, model_bytes=4 * 11,
      params=jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params))
  itemsize = 2 if kwargs.get('transport_dtype') == 'bfloat16' else 4
  assert timeline.exchange_bytes == 11 * itemsize
  state = alg.init(params, 4, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  merged = 0
  for t in range(timeline.num_ticks):
    ctx = timeline.contexts(t, 1)
    ctx = jax.tree.map(lambda x: jnp.asarray(x[0]), ctx)
    state, info = step(state, jax.tree.map(jnp.ones_like, state.params), ctx)
    on = np.asarray(ctx.participation.sync)
    np.testing.assert_allclose(np.asarray(info.wire.sent)[on], timeline.exchange_bytes)
    np.testing.assert_allclose(np.asarray(info.wire.received)[on], timeline.exchange_bytes)
    np.testing.assert_allclose(np.asarray(info.wire.payload)[on], timeline.exchange_bytes)
    assert (np.asarray(info.wire.sent)[~on] == 0).all()
    merged += on.sum()
  assert merged == 2 * len(timeline.schedule.exchanges) > 0
  metrics = timeline.metrics(timeline.num_ticks)
  assert metrics['stale_steps_max'] >= 0 and 'stale_steps_mean' in metrics


@pytest.mark.slow
def test_overlapped_gasloc_through_the_loop_reports_staleness(nano_config, tmp_path):
  from loco.run import train
  nano_config.num_workers = 4
  nano_config.algorithm.name = 'gasloc'
  nano_config.algorithm.sync_every = 5
  nano_config.algorithm.topology = 'ring'
  nano_config.network.profile = 'custom'
  nano_config.network.mode = 'async'        # overlap: 'compute' by default
  nano_config.network.peer_choice = 'rotation'
  nano_config.network.step_seconds = 1.0
  bandwidth = np.full((4, 4), 1e9)
  bandwidth[0, 3] = bandwidth[3, 0] = bandwidth[1, 2] = bandwidth[2, 1] = 1e3
  nano_config.network.bandwidth_matrix = bandwidth.tolist()
  record = train.run(nano_config, str(tmp_path / 'run'))
  assert record['tokens'] == 20 * 4 * 2 * 32     # every worker took its 20 steps
  assert record['step'] > 20                     # send-then-merge ticks without steps
  assert record['stale_steps_max'] > 0 and record['stale_steps_mean'] > 0
  assert np.isfinite(record['eval_loss'])


@pytest.mark.slow
def test_an_async_run_from_before_the_overlap_key_resumes_blocking(nano_config, tmp_path):
  """A run whose stored config has no network.overlap used the blocking replay: resuming
  it with the new default ('compute') would be another run, so it is refused in one
  line, and network.overlap='none' resumes it."""
  import json
  from loco.run import train
  from loco.errors import WorkdirError
  nano_config.num_workers = 4
  nano_config.algorithm.name = 'gasloc'
  nano_config.algorithm.sync_every = 5
  nano_config.network.profile = 'homogeneous'
  nano_config.network.mode = 'async'
  nano_config.network.step_seconds = 1.0
  nano_config.network.overlap = 'none'
  workdir = str(tmp_path / 'run')
  record = train.run(nano_config, workdir)
  path = tmp_path / 'run' / 'config.json'
  stored = json.loads(path.read_text())
  del stored['config']['network']['overlap']         # as written before the key existed
  path.write_text(json.dumps(stored))
  nano_config.network.overlap = None
  with pytest.raises(WorkdirError, match="resume it with network.overlap='none'") as err:
    train.run(nano_config, workdir)
  assert '\n' not in str(err.value)
  nano_config.network.overlap = 'none'
  assert train.run(nano_config, workdir) == record


@pytest.mark.slow
def test_overlapped_replay_on_8_devices_matches_one_device():
  """The send phase and the snapshot merges under shard_map (one worker per device)
  give the one-device run's params and bytes."""
  from loco.run.placement import make_mesh, state_shardings
  m = 8
  bandwidth = np.full((m, m), 1000.0)
  bandwidth[:2, :] = bandwidth[:, :2] = 10.0
  sched = schedule_lib.simulate_async(_net(np.ones(m), bandwidth), steps=8, sync_every=2,
                                      peers=~np.eye(m, dtype=bool), exchange_bytes=100.0,
                                      peer_choice='rotation', overlap='compute')
  assert sched.staleness.max() > 0
  target = jnp.arange(m * 5, dtype=jnp.float32).reshape(m, 5)
  results = []
  for mesh in (None, make_mesh(8, m)):
    alg = algorithms.make('gasloc', optax.sgd(0.1), sync_every=2, topology='matching',
                          mesh=mesh).replay.overlapped()
    state = alg.init({'w': jnp.zeros((5,))}, m, jax.random.PRNGKey(0))
    if mesh is not None:
      state = jax.device_put(state, state_shardings(state, mesh))
    step, sent = jax.jit(alg.step), []
    for t in range(sched.num_ticks):
      state, info = step(state, {'w': state.params['w'] - target}, StepContext(
          active=jnp.asarray(sched.active[t]), mixing=jnp.asarray(sched.mixing[t]),
          participation=Participation(sync=jnp.asarray(sched.sync[t]),
                                      send=jnp.asarray(sched.send[t]))))
      sent.append(np.asarray(info.wire.sent))
    results.append((np.asarray(state.params['w']), np.stack(sent)))
  np.testing.assert_array_equal(results[1][1], results[0][1])
  np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6, atol=1e-6)
