"""Dropout three ways, checked against a NumPy replay written from each definition.

- keep_local (the DiLoCo paper's dropped outer gradients): an absent worker's
  pseudo-gradient is not sent, the outer step averages the senders, and the absent
  worker receives the new anchor and outer state but keeps its own params.
- offline: an absent worker sends and receives nothing and keeps its whole state; at
  its next sync it sends its pseudo-gradient against its own (stale) anchor, then copies
  an up-to-date worker's anchor and outer momentum (bytes counted).
- discard: an absent worker adopts the result; its round is lost.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import example, given, settings, strategies as st

from loco import comm
from loco.sim import network as network_lib
from loco.sim import schedule as schedule_lib
from loco.sim import timeline as timeline_lib
from loco.core import merge as merge_lib
from loco.algorithms.diloco import diloco
from loco.core.engine import StepContext, local_updates
from loco.core.participation import Participation
from loco.errors import ConfigError
from loco.wire import Wire

M, H, N = 3, 2, 5          # workers, steps per round, params
INNER_LR, OUTER_LR, MU = 0.1, 0.7, 0.9
TARGETS = np.arange(M * N, dtype=np.float32).reshape(M, N) / 7.0


def _grads(params):
  """The gradient of 0.5 |x - t_i|^2 for each worker."""
  return params - jnp.asarray(TARGETS)


def _algorithm():
  outer = optax.chain(comm.all_reduce_mean(), optax.sgd(OUTER_LR, momentum=MU, nesterov=True))
  return local_updates(optax.sgd(INNER_LR), outer, H)


def _run(alive_rounds, mode: str):
  """Runs len(alive_rounds) rounds; alive_rounds[r] is the [M] alive mask of round r."""
  alg = _algorithm()
  state = alg.init(jnp.zeros((N,), jnp.float32), M, jax.random.key(0))
  step = jax.jit(alg.step)
  infos = []
  stale = np.zeros(M, bool)
  ones = np.ones(M, bool)
  for alive in alive_rounds:
    alive_np = np.asarray(alive, bool)
    for _ in range(H):
      ctx = StepContext(active=ones, alive=alive_np)
      if mode == 'keep_local':
        ctx = ctx._replace(participation=Participation(keep=ones))
      elif mode == 'offline':
        ctx = ctx._replace(participation=Participation(keep=ones, isolate=ones,
                                                           rejoin=alive_np & stale))
      state, info = step(state, _grads(state.params), ctx)
      infos.append(info)
    stale = ~alive_np
  return state, infos


def _numpy_replay(alive_rounds, mode: str):
  """The definitions, in NumPy (float64)."""
  x = np.zeros((M, N))                    # params
  anchor = np.zeros((M, N))
  mom = np.zeros((M, N))
  stale = np.zeros(M, bool)
  for alive in alive_rounds:
    alive = np.asarray(alive, bool)
    for _ in range(H):
      x = x - INNER_LR * (x - TARGETS)
    mean = (anchor - x)[alive].mean(axis=0)       # the senders' pseudo-gradients
    new_mom = MU * mom + mean                     # each worker's own outer step
    new_anchor = anchor - OUTER_LR * (mean + MU * new_mom)    # Nesterov
    if mode == 'offline':
      # The lowest up-to-date sender; with none alive, the lowest alive one's history.
      source = np.flatnonzero((alive & ~stale) if (alive & ~stale).any() else alive)[0]
      for i in np.flatnonzero(alive):
        anchor[i], mom[i] = new_anchor[source], new_mom[source]
        x[i] = anchor[i]
      stale = ~alive
    else:                          # everyone receives the result (anchors stay equal)
      anchor[:], mom[:] = new_anchor[0], new_mom[0]
      adopt = alive if mode == 'keep_local' else np.ones(M, bool)
      x[adopt] = anchor[adopt]
  return x, anchor, mom


ROUNDS = [(1, 1, 1), (1, 1, 0), (1, 0, 0), (1, 1, 1), (0, 1, 1)]
# Every alive worker of round 2 is rejoining (0 missed rounds 0 and 1, 1 missed round 1):
# none is up to date, so the lowest alive one's history wins and 1 copies it.
NO_FRESH = [(0, 1, 1), (0, 0, 1), (1, 1, 0), (1, 1, 1), (1, 1, 1)]


@pytest.mark.parametrize('rounds', [ROUNDS, NO_FRESH], ids=['rounds', 'no_fresh'])
@pytest.mark.parametrize('mode', ['keep_local', 'offline', 'discard'])
def test_engine_matches_the_definition(mode, rounds):
  state, _ = _run(rounds, mode)
  x, anchor, mom = _numpy_replay(rounds, mode)
  np.testing.assert_allclose(np.asarray(state.params), x, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(state.anchor), anchor, rtol=1e-5, atol=1e-6)
  momenta = [l for l in jax.tree.leaves(state.outer_state)
             if hasattr(l, 'shape') and l.shape == (M, N)]
  assert len(momenta) == 1
  np.testing.assert_allclose(np.asarray(momenta[0]), mom, rtol=1e-5, atol=1e-6)


def test_offline_anchors_are_one_again_after_a_sync_where_no_worker_is_up_to_date():
  """Absent {0}, then {0, 1}, then {2}, then everyone: at round 2's sync both alive
  workers are stale. They must leave it with one anchor (and worker 2, rejoining at
  round 3, copy it), so the all-alive rounds end with a single anchor and momentum."""
  state, infos = _run(NO_FRESH, 'offline')
  anchor = np.asarray(state.anchor)
  np.testing.assert_array_equal(anchor, np.broadcast_to(anchor[0], anchor.shape))
  mom = [l for l in jax.tree.leaves(state.outer_state) if getattr(l, 'shape', ()) == (M, N)]
  np.testing.assert_array_equal(mom[0], np.broadcast_to(mom[0][0], (M, N)))
  # Round 2's sync: worker 0 serves anchor + momentum (2 S) to worker 1 alone.
  s = N * 4.0
  sync2 = infos[2 * H + H - 1].wire
  ring = s            # a ring of two: 2 (2 - 1) / 2 S each
  np.testing.assert_allclose(np.asarray(sync2.sent), [ring + 2 * s, ring, 0.0])
  np.testing.assert_allclose(np.asarray(sync2.received), [ring, ring + 2 * s, 0.0])


def test_the_three_modes_differ_where_they_should():
  """Round 2 drops worker 2: with keep_local and offline it ends the round on its own
  params (not the anchor), with discard on the anchor the others agreed on; keep_local's
  worker 2 holds the new anchor, offline's its old one."""
  out = {mode: _run(ROUNDS[:2], mode)[0] for mode in ('keep_local', 'offline', 'discard')}
  params = {k: np.asarray(v.params) for k, v in out.items()}
  anchors = {k: np.asarray(v.anchor) for k, v in out.items()}
  np.testing.assert_array_equal(params['discard'][2], params['discard'][0])   # adopted
  for mode in ('keep_local', 'offline'):
    assert np.abs(params[mode][2] - params[mode][0]).max() > 1e-3            # its own
    np.testing.assert_array_equal(params[mode][:2], params['discard'][:2])   # senders
  np.testing.assert_array_equal(anchors['keep_local'][2], anchors['keep_local'][0])
  assert np.abs(anchors['offline'][2] - anchors['offline'][0]).max() > 1e-3


def test_bytes_follow_what_was_sent():
  s = N * 4.0                                   # one float32 tree
  _, infos = _run(ROUNDS, 'offline')
  sync = lambda r, field: np.asarray(getattr(infos[r * H + H - 1].wire, field))
  # Round 1 (index 1): worker 2 absent: a ring of two (2 (2-1)/2 S = S each); it sends
  # and receives nothing.
  np.testing.assert_allclose(sync(1, 'sent'), [s, s, 0.0])
  np.testing.assert_allclose(sync(1, 'received'), [s, s, 0.0])
  # Round 2: workers 1 and 2 absent: a ring of one: nothing moves.
  np.testing.assert_allclose(sync(2, 'sent'), [0.0, 0.0, 0.0])
  # Round 3: all alive; 1 and 2 rejoin: ring of three (4/3 S each), and worker 0 (the
  # up-to-date one) sends each the anchor and the momentum (2 S).
  ring = 4.0 / 3.0 * s
  np.testing.assert_allclose(sync(3, 'sent'), [ring + 2 * 2 * s, ring, ring], rtol=1e-6)
  np.testing.assert_allclose(sync(3, 'received'), [ring, ring + 2 * s, ring + 2 * s],
                             rtol=1e-6)
  # Steps between syncs send nothing.
  assert all(float(np.asarray(infos[t].wire.sent).sum()) == 0.0
             for t in range(len(infos)) if (t + 1) % H)
  # keep_local and discard: an absent worker downloads the result (S), the two
  # participants upload it (S / 2 each on top of their ring share S); no catch-up later.
  for mode in ('keep_local', 'discard'):
    _, infos = _run(ROUNDS, mode)
    np.testing.assert_allclose(np.asarray(infos[H + H - 1].wire.received), [s, s, s])
    np.testing.assert_allclose(np.asarray(infos[H + H - 1].wire.sent), [1.5 * s, 1.5 * s, 0.0])
    np.testing.assert_allclose(np.asarray(infos[3 * H + H - 1].wire.received), [ring] * 3,
                               rtol=1e-6)


def test_schedule_marks_who_rejoins():
  # Worker 2 leaves for steps [2, 4): it misses the sync at the end of round 1 (tick 3)
  # and rejoins through round 2 (ticks 4, 5), catching up at its sync (tick 5).
  sched = schedule_lib.SyncSchedule(3, round_steps=2, churn=((2, 2, 4),),
                                    dropout_mode='offline')
  keep, isolate, rejoin = sched.dropout_masks(0, 8)
  assert keep.all() and isolate.all()
  assert rejoin[:, :2].sum() == 0
  np.testing.assert_array_equal(rejoin[:, 2], [0, 0, 0, 0, 1, 1, 0, 0])
  # Resuming mid-way gives the same rows.
  np.testing.assert_array_equal(sched.dropout_masks(5, 3)[2], rejoin[5:])
  np.testing.assert_array_equal(sched.dropout_masks(4, 1)[2], rejoin[4:5])
  discard = schedule_lib.SyncSchedule(3, round_steps=2, churn=((2, 2, 4),),
                                      dropout_mode='discard')
  assert discard.dropout_masks(0, 8) is None
  keep_local = schedule_lib.SyncSchedule(3, round_steps=2, churn=((2, 2, 4),))
  keep, isolate, rejoin = keep_local.dropout_masks(0, 8)
  assert keep.all() and isolate is None and rejoin is None


def test_seeded_dropout_rejoins_after_every_missed_sync():
  sched = schedule_lib.SyncSchedule(6, round_steps=4, dropout=0.5, seed=3,
                                    dropout_mode='offline')
  _, alive = sched.masks(0, 40)
  _, _, rejoin = sched.dropout_masks(0, 40)
  for r in range(1, 10):
    missed = ~alive[4 * r - 1]
    # A worker rejoins through round r iff it missed round r - 1's sync and is back.
    np.testing.assert_array_equal(rejoin[4 * r: 4 * r + 4],
                                  np.broadcast_to(alive[4 * r] & missed, (4, 6)))
  assert rejoin.any()


def _timeline(algorithm, **net):
  cfg = network_lib.parse_network(dict(profile='homogeneous', step_seconds=1.0, **net))
  return timeline_lib.make_timeline(cfg, num_workers=4, steps=24, algorithm=algorithm,
                                    name='x', flops_per_token=1.0, tokens_per_step=1,
                                    model_bytes=4)


def test_rounds_are_the_algorithms_own_not_a_key_name():
  """An algorithm whose round key has another name (here `period`) still drops workers
  for whole rounds: the timeline reads `Algorithm.round_steps`."""
  def periodic(inner, *, period=6):
    return diloco(inner, sync_every=period)
  alg = periodic(optax.sgd(0.1))
  assert alg.round_steps == 6
  tl = _timeline(alg, dropout=0.5, seed=1)
  assert tl.sync.round_steps == 6
  alive = np.asarray(tl.contexts(0, 24).alive)
  for r in range(4):
    assert (alive[6 * r: 6 * r + 6] == alive[6 * r]).all()
  assert len({tuple(alive[6 * r]) for r in range(4)}) > 1


def test_a_delayed_merge_refuses_keep_local_in_one_line():
  outer = optax.chain(comm.all_reduce_mean(), optax.sgd(0.7))
  alg = local_updates(optax.sgd(0.1), outer, 4, merge=merge_lib.delayed(1, 0.5))  # tau = 1
  assert not alg.keeps_local
  with pytest.raises(ConfigError, match="dropout_mode='discard'"):
    _timeline(alg, dropout=0.25)
  _timeline(alg, dropout=0.25, dropout_mode='discard')      # fine
  _timeline(alg)                                              # no dropout: fine
  with pytest.raises(ConfigError, match='network.dropout_mode must be one of'):
    _timeline(diloco(optax.sgd(0.1), sync_every=4), dropout=0.25, dropout_mode='lose')


def test_clock_times_the_catch_up_download():
  """A ring all-reduce of S bytes among 3 workers on links of B bytes/s and latency L:
  4 phases of L + S/3/B; the worker that also received E more bytes (its catch-up)
  downloads them after the ring: L + E/B more."""
  b, lat, s, e = 1000.0, 0.01, 300.0, 500.0
  net = network_lib.Network(step_seconds=np.ones(3), bandwidth=np.full((3, 3), b),
                            latency=np.full((3, 3), lat))
  clock = network_lib.Clock(net)
  ring = 4.0 / 3.0 * s
  clock.step(Wire(sent=np.array([ring + e, ring, ring]),
                  received=np.array([ring, ring, ring + e]), events=np.ones(3, int),
                  kind=np.ones(3, int), payload=np.full(3, s), peers=~np.eye(3, dtype=bool)),
             active=np.ones(3, bool))
  ring_time = 4 * (lat + s / 3 / b)
  np.testing.assert_allclose(clock.now, [1 + ring_time, 1 + ring_time,
                                         1 + ring_time + lat + e / b])


def test_local_steps_are_an_engine_key_of_every_algorithm_with_rounds():
  """`local_steps` narrows who steps for any algorithm with rounds (DiLoCo here), and the
  timeline's active mask (what the clock charges as compute) follows it."""
  from loco import algorithms
  alg = algorithms.make('diloco', optax.sgd(0.1), sync_every=4, local_steps=[4, 2, 1, 4])
  assert alg.local_steps == (4, 2, 1, 4)
  tl = _timeline(alg)
  active = tl.active(0, 8)
  np.testing.assert_array_equal(active.sum(axis=0), [8, 4, 2, 8])
  np.testing.assert_array_equal(active[:4, 1], [1, 1, 0, 0])
  # The engine follows the same mask: worker 2's params move in 1 step of 4.
  state = alg.init(jnp.zeros((N,), jnp.float32), 4, jax.random.key(0))
  targets = jnp.ones((4, N))
  moved = []
  for _ in range(3):
    before = np.asarray(state.params)
    state, _ = alg.step(state, state.params - targets)
    moved.append(np.abs(np.asarray(state.params) - before).max(axis=1) > 0)
  np.testing.assert_array_equal(np.array(moved)[:, 2], [True, False, False])
  np.testing.assert_array_equal(np.array(moved)[:, 1], [True, True, False])
  with pytest.raises(ConfigError, match='needs an algorithm with rounds'):
    algorithms.make('ddp', optax.sgd(0.1), local_steps=[1, 1])
  with pytest.raises(ConfigError, match=r'integers in \[1, sync_every=4\]'):
    algorithms.make('diloco', optax.sgd(0.1), sync_every=4, local_steps=[5, 1])


@pytest.mark.slow
def test_keep_local_on_a_mesh_equals_one_device():
  """16 workers in blocks of 2 on 8 devices, dropout and churn offline: the
  catch-up's copy from the up-to-date worker crosses devices; params, anchors and bytes
  equal the one-device run's."""
  from loco.run.placement import make_mesh, state_shardings
  m, h = 16, 2
  sched = schedule_lib.SyncSchedule(m, round_steps=h, dropout=0.4, churn=((5, 1, 6),),
                                    seed=2, dropout_mode='offline')
  targets = jnp.asarray(np.random.default_rng(0).normal(size=(m, N)), jnp.float32)

  def run(mesh):
    outer = optax.chain(comm.all_reduce_mean(),
                        optax.sgd(OUTER_LR, momentum=MU, nesterov=True))
    alg = local_updates(optax.sgd(INNER_LR), outer, h, mesh=mesh)
    state = alg.init(jnp.zeros((N,), jnp.float32), m, jax.random.key(0))
    if mesh is not None:
      state = jax.device_put(state, state_shardings(state, mesh))
    step, sent = jax.jit(alg.step), []
    active, alive = sched.masks(0, 12)
    keep, isolate, rejoin = sched.dropout_masks(0, 12)
    for t in range(12):
      ctx = StepContext(active=active[t], alive=alive[t], participation=Participation(
          keep=keep[t], isolate=isolate[t], rejoin=rejoin[t]))
      state, info = step(state, state.params - targets, ctx)
      sent.append(np.asarray(info.wire.received))
    return jax.device_get(state), np.stack(sent)

  want, want_bytes = run(None)
  got, got_bytes = run(make_mesh(8, m))
  assert sched.dropout_masks(0, 12)[2].any()          # someone caught up
  np.testing.assert_array_equal(got_bytes, want_bytes)
  for a, b in zip(jax.tree.leaves((got.params, got.anchor)),
                  jax.tree.leaves((want.params, want.anchor))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_derived_local_steps_in_synchronous_rounds():
  """network.local_work='auto' in the synchronous mode: H_i = floor(H min c / c_i), so a
  worker 2x (4x) slower steps 3 (1) of a round of 6 and the round's wall time is about
  the fastest worker's; the clock charges the rest as idle, not compute."""
  alg = diloco(optax.sgd(0.1), sync_every=6)
  cfg = network_lib.parse_network(dict(profile='homogeneous', step_seconds=1.0,
                                       speeds=[1.0, 0.5, 0.25, 1.0], local_work='auto',
                                       bandwidth=1e15, latency=0.0))
  tl = timeline_lib.make_timeline(cfg, num_workers=4, steps=12, algorithm=alg, name='d',
                                  flops_per_token=1.0, tokens_per_step=1, model_bytes=4)
  np.testing.assert_array_equal(tl.local_steps, [6, 3, 1, 6])
  np.testing.assert_array_equal(tl.active(0, 12).sum(axis=0), [12, 6, 2, 12])
  # Two rounds on an instant network: every worker spends 6 s computing per round
  # (6 x 1 s, 3 x 2 s, 1 x 4 s) and waits for nobody.
  from loco.core.engine import StepInfo
  m = 4
  zeros = np.zeros((12, m))
  info = StepInfo(Wire(sent=zeros, received=zeros, events=zeros.astype(int),
                       kind=zeros.astype(int), payload=zeros,
                       peers=np.zeros((12, m, m), bool)),
                  synced=np.zeros(12, bool))
  tl.advance(0, info)
  metrics = tl.metrics(12)
  assert metrics['sim_seconds'] == pytest.approx(12.0)
  assert metrics['idle_seconds'] == [0.0, 0.0, 0.0, 0.0]
  with pytest.raises(ConfigError, match='needs an algorithm with rounds'):
    timeline_lib.make_timeline(cfg, num_workers=4, steps=12, name='ddp',
                               algorithm=algorithms_make('ddp'), flops_per_token=1.0,
                               tokens_per_step=1, model_bytes=4)


def algorithms_make(name, **kwargs):
  from loco import algorithms
  return algorithms.make(name, optax.sgd(0.1), **kwargs)


# Every algorithm whose workers share one anchor (the all-reduce family), each built
# with short rounds; Streaming with two fragments synced at different steps of a round.
SHARED_ANCHOR = {
    'diloco': dict(sync_every=2),
    'sparseloco': dict(sync_every=2),
    'muloco': dict(sync_every=2),
    'streaming_diloco': dict(sync_every=4, num_fragments=2, overlap_steps=0,
                             compression='none'),
}
_STEPS = {}


def _shared_anchor_step(name):
  """(round steps, jitted step, initial state) of `name` on a small block tree, once."""
  if name not in _STEPS:
    from loco import algorithms
    alg = algorithms.make(name, optax.sgd(0.05), **SHARED_ANCHOR[name])
    params = {'embed': jnp.zeros((2, 4)),
              'blocks': {i: {'w': jnp.zeros((4, 3)), 'b': jnp.zeros(3)} for i in range(2)}}
    _STEPS[name] = (alg.round_steps, jax.jit(alg.step),
                    alg.init(params, 4, jax.random.key(0)))
  return _STEPS[name]


@pytest.mark.parametrize('name', sorted(SHARED_ANCHOR))
@settings(max_examples=25, deadline=None)
@example(rounds=[[False, True, True, True], [False, False, True, True],
                 [True, True, False, False]], seed=0)       # no worker up to date
@given(rounds=st.lists(st.lists(st.booleans(), min_size=4, max_size=4).filter(any),
                       min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_offline_dropout_keeps_one_shared_anchor(name, rounds, seed):
  """Under any schedule of offline rounds, the workers alive for a round end it with one
  anchor, and a round that every worker is alive for ends with one anchor for all."""
  h, step, state = _shared_anchor_step(name)
  rng = np.random.default_rng(seed)
  targets = rng.normal(size=(4, 1)).astype(np.float32)
  stale = np.zeros(4, bool)
  ones = np.ones(4, bool)
  for alive in rounds + [[True] * 4]:
    alive = np.asarray(alive, bool)
    for _ in range(h):
      grads = jax.tree.map(lambda x: x - targets.reshape((4,) + (1,) * (x.ndim - 1)),
                           state.params)
      state, _ = step(state, grads, StepContext(
          active=ones, alive=alive,
          participation=Participation(keep=ones, isolate=ones, rejoin=alive & stale)))
    stale = ~alive
    for leaf in jax.tree.leaves(state.anchor):
      leaf = np.asarray(leaf)[alive]
      np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))


def test_the_anchor_spread_script_prints_the_reproducer_and_the_count(monkeypatch, capsys):
  import importlib.util, os
  path = os.path.join(os.path.dirname(__file__), '..', 'scripts', 'dropout_anchor_spread.py')
  spec = importlib.util.spec_from_file_location('dropout_anchor_spread', path)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  monkeypatch.setattr('sys.argv', ['x', '--workers=3', '--rounds=6', '--seeds=0'])
  script.main()
  out = capsys.readouterr().out
  assert out.count('anchor spread 0.000000') == 2          # the two all-alive rounds
  # Without dropout every sync has an up-to-date worker.
  assert script.no_fresh_syncs(3, 0.0, 4, 0) == []
  monkeypatch.setattr('sys.argv', ['x', '--dropout=1.5'])
  with pytest.raises(SystemExit):
    script.main()
