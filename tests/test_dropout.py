"""Dropout as the DiLoCo paper defines it (keep_local) beside loco's old one (discard).

The engine's numbers are checked against a NumPy replay written from the definition:
a worker absent at a sync sends and receives nothing and keeps its params, inner state,
anchor and outer state; at its next sync it sends its pseudo-gradient against its own
(stale) anchor, the outer step averages the senders, and it then copies an up-to-date
worker's anchor and outer momentum (bytes counted).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import comm
from loco import network as network_lib
from loco import schedule as schedule_lib
from loco import timeline as timeline_lib
from loco import merge as merge_lib
from loco.algorithms.diloco import diloco
from loco.engine import StepContext, local_updates
from loco.errors import ConfigError

M, H, N = 3, 2, 5          # workers, steps per round, params
INNER_LR, OUTER_LR, MU = 0.1, 0.7, 0.9
TARGETS = np.arange(M * N, dtype=np.float32).reshape(M, N) / 7.0


def _grads(params):
  """The gradient of 0.5 |x - t_i|^2 for each worker."""
  return params - jnp.asarray(TARGETS)


def _algorithm():
  outer = optax.chain(comm.all_reduce_mean(), optax.sgd(OUTER_LR, momentum=MU, nesterov=True))
  return local_updates(optax.sgd(INNER_LR), outer, H)


def _run(alive_rounds, keep: bool):
  """Runs len(alive_rounds) rounds; alive_rounds[r] is the [M] alive mask of round r."""
  alg = _algorithm()
  state = alg.init(jnp.zeros((N,), jnp.float32), M, jax.random.key(0))
  step = jax.jit(alg.step)
  infos = []
  stale = np.zeros(M, bool)
  for r, alive in enumerate(alive_rounds):
    for k in range(H):
      alive_np = np.asarray(alive, bool)
      ctx = StepContext(active=np.ones(M, bool), alive=alive_np)
      if keep:
        ctx = ctx._replace(keep=np.ones(M, bool), rejoin=alive_np & stale)
      state, info = step(state, _grads(state.params), ctx)
      infos.append(info)
    if keep:
      stale = ~np.asarray(alive, bool)
  return state, infos


def _numpy_replay(alive_rounds, keep: bool):
  """The definition, in NumPy (float64)."""
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
    if keep:
      source = np.flatnonzero(alive & ~stale)[0]   # the lowest up-to-date sender
      for i in np.flatnonzero(alive):
        anchor[i], mom[i] = new_anchor[source], new_mom[source]
        x[i] = anchor[i]
      stale = ~alive
    else:                                          # everyone adopts the result
      anchor[:], mom[:] = new_anchor[0], new_mom[0]
      x[:] = anchor
  return x, anchor, mom


ROUNDS = [(1, 1, 1), (1, 1, 0), (1, 0, 0), (1, 1, 1), (0, 1, 1)]


@pytest.mark.parametrize('keep', [True, False])
def test_engine_matches_the_definition(keep):
  state, _ = _run(ROUNDS, keep)
  x, anchor, mom = _numpy_replay(ROUNDS, keep)
  np.testing.assert_allclose(np.asarray(state.params), x, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(state.anchor), anchor, rtol=1e-5, atol=1e-6)
  momenta = [l for l in jax.tree.leaves(state.outer_state)
             if hasattr(l, 'shape') and l.shape == (M, N)]
  assert len(momenta) == 1
  np.testing.assert_allclose(np.asarray(momenta[0]), mom, rtol=1e-5, atol=1e-6)


def test_keep_local_keeps_the_absent_workers_progress():
  """Round 2 drops worker 2: with keep_local it ends the round on its own params (not the
  anchor), and with discard on the anchor the others agreed on."""
  kept, _ = _run(ROUNDS[:2], keep=True)
  lost, _ = _run(ROUNDS[:2], keep=False)
  kept, lost = np.asarray(kept.params), np.asarray(lost.params)
  np.testing.assert_array_equal(lost[2], lost[0])            # adopted
  assert np.abs(kept[2] - kept[0]).max() > 1e-3                 # its own
  np.testing.assert_array_equal(kept[0], lost[0])   # the senders' average is the same


def test_bytes_follow_what_was_sent():
  s = N * 4.0                                   # one float32 tree
  _, infos = _run(ROUNDS, keep=True)
  sync = lambda r, field: np.asarray(getattr(infos[r * H + H - 1], field))
  # Round 1 (index 1): worker 2 absent: a ring of two (2 (2-1)/2 S = S each); it sends
  # and receives nothing.
  np.testing.assert_allclose(sync(1, 'bytes_sent'), [s, s, 0.0])
  np.testing.assert_allclose(sync(1, 'bytes_received'), [s, s, 0.0])
  # Round 2: workers 1 and 2 absent: a ring of one: nothing moves.
  np.testing.assert_allclose(sync(2, 'bytes_sent'), [0.0, 0.0, 0.0])
  # Round 3: all alive; 1 and 2 rejoin: ring of three (4/3 S each), and worker 0 (the
  # up-to-date one) sends each the anchor and the momentum (2 S).
  ring = 4.0 / 3.0 * s
  np.testing.assert_allclose(sync(3, 'bytes_sent'), [ring + 2 * 2 * s, ring, ring], rtol=1e-6)
  np.testing.assert_allclose(sync(3, 'bytes_received'), [ring, ring + 2 * s, ring + 2 * s],
                             rtol=1e-6)
  # Steps between syncs send nothing.
  assert all(float(np.asarray(infos[t].bytes_sent).sum()) == 0.0
             for t in range(len(infos)) if (t + 1) % H)
  # discard: an absent worker downloads the result (S), the two participants upload it.
  _, infos = _run(ROUNDS, keep=False)
  np.testing.assert_allclose(np.asarray(infos[H + H - 1].bytes_received), [s, s, s])
  np.testing.assert_allclose(np.asarray(infos[H + H - 1].bytes_sent), [1.5 * s, 1.5 * s, 0.0])


def test_schedule_marks_who_rejoins():
  # Worker 2 leaves for steps [2, 4): it misses the sync at the end of round 1 (tick 3)
  # and rejoins through round 2 (ticks 4, 5), catching up at its sync (tick 5).
  sched = schedule_lib.SyncSchedule(3, round_steps=2, churn=((2, 2, 4),))
  keep, rejoin = sched.keep_rejoin(0, 8)
  assert keep.all()
  assert rejoin[:, :2].sum() == 0
  np.testing.assert_array_equal(rejoin[:, 2], [0, 0, 0, 0, 1, 1, 0, 0])
  # Resuming mid-way gives the same rows.
  np.testing.assert_array_equal(sched.keep_rejoin(5, 3)[1], rejoin[5:])
  np.testing.assert_array_equal(sched.keep_rejoin(4, 1)[1], rejoin[4:5])
  discard = schedule_lib.SyncSchedule(3, round_steps=2, churn=((2, 2, 4),),
                                      dropout_mode='discard')
  assert discard.keep_rejoin(0, 8) is None


def test_seeded_dropout_rejoins_after_every_missed_sync():
  sched = schedule_lib.SyncSchedule(6, round_steps=4, dropout=0.5, seed=3)
  _, alive = sched.masks(0, 40)
  _, rejoin = sched.keep_rejoin(0, 40)
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
  clock.step(network_lib.StepWire(
      active=np.ones(3, bool), kind=np.ones(3, int), sent=np.array([ring + e, ring, ring]),
      payload=np.full(3, s), peers=~np.eye(3, dtype=bool),
      received=np.array([ring, ring, ring + e])))
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


def test_keep_local_on_a_mesh_equals_one_device():
  """16 workers in blocks of 2 on 8 devices, dropout and churn with keep_local: the
  catch-up's copy from the up-to-date worker crosses devices; params, anchors and bytes
  equal the one-device run's."""
  from loco.placement import make_mesh, state_shardings
  m, h = 16, 2
  sched = schedule_lib.SyncSchedule(m, round_steps=h, dropout=0.4, churn=((5, 1, 6),),
                                    seed=2)
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
    keep, rejoin = sched.keep_rejoin(0, 12)
    for t in range(12):
      ctx = StepContext(active=active[t], alive=alive[t], keep=keep[t], rejoin=rejoin[t])
      state, info = step(state, state.params - targets, ctx)
      sent.append(np.asarray(info.bytes_received))
    return jax.device_get(state), np.stack(sent)

  want, want_bytes = run(None)
  got, got_bytes = run(make_mesh(8, m))
  assert sched.keep_rejoin(0, 12)[1].any()          # someone caught up
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
  from loco.engine import StepInfo
  m = 4
  zeros = np.zeros((12, m))
  info = StepInfo(bytes_sent=zeros, bytes_received=zeros, comms=zeros.astype(int),
                  synced=np.zeros(12, bool), kind=zeros.astype(int), payload=zeros,
                  peers=np.zeros((12, m, m), bool))
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
