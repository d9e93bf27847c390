"""Schedules and their timing, checked against hand counts and replays of the definitions.

- Offline dropout's catch-up for any number of workers and any SyncSchedule (random
  dropout, churn): who copies whose anchor and momentum, who steps, and the bytes of the
  catch-up, against a NumPy replay that keeps its own record of who is stale.
- The clock of a round with absent workers: a worker absent under keep_local or
  discard downloads the result once it exists and once its own step is done, over its
  fastest link into it; a rejoining worker downloads its catch-up after the ring.
- The utilization model's DiLoCo: one send on a round's last step, due when the next
  round starts; its stall per round in closed form.
- The sync plan's non-block fragment: which step each leaf syncs at with
  non_block='own' and 'first', and that the engine syncs exactly those leaves then.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import example, given, settings, strategies as st

from loco import algorithms
from loco import comm
from loco.sim import network as network_lib
from loco.sim import schedule as schedule_lib
from loco.core import sync_plan
from loco.sim import timeline as timeline_lib
from loco import overlap_model as u
from loco.core.engine import StepContext, local_updates
from loco.core.participation import Participation
from loco.wire import ALL_GATHER, ALL_REDUCE, NO_COMM, Wire

# ---------------------------------------------------------------------------
# Offline dropout's catch-up, for M = 5 workers and schedules from SyncSchedule.

M, H, N = 5, 2, 3          # workers, steps per round, params
STEPS = 8 * H
INNER_LR, OUTER_LR, MU = 0.1, 0.7, 0.9
TARGETS = np.arange(M * N, dtype=np.float64).reshape(M, N) / 9.0 - 0.5
S = 4.0 * N                # one float32 tree on the wire


def _algorithm():
  outer = optax.chain(comm.all_reduce_mean(), optax.sgd(OUTER_LR, momentum=MU, nesterov=True))
  return local_updates(optax.sgd(INNER_LR), outer, H)


_ALG = _algorithm()
_STEP = jax.jit(_ALG.step)


def _engine(sched: schedule_lib.SyncSchedule):
  """Runs the engine over STEPS ticks of `sched`; returns the state and per-tick wires."""
  active, alive = sched.masks(0, STEPS)
  masks = sched.dropout_masks(0, STEPS) or (None, None, None)
  state = _ALG.init(jnp.zeros((N,), jnp.float32), M, jax.random.key(0))
  wires = []
  for t in range(STEPS):
    keep, isolate, rejoin = (None if x is None else x[t] for x in masks)
    ctx = StepContext(active=active[t], alive=alive[t], participation=Participation(
        keep=keep, isolate=isolate, rejoin=rejoin))
    state, info = _STEP(state, state.params - jnp.asarray(TARGETS, jnp.float32), ctx)
    wires.append(jax.tree.map(np.asarray, info.wire))
  momentum = [l for l in jax.tree.leaves(state.outer_state) if np.shape(l) == (M, N)]
  assert len(momentum) == 1
  return np.asarray(state.params), np.asarray(state.anchor), np.asarray(momentum[0]), wires


def _replay(active, alive, mode):
  """The definitions in NumPy (float64), with the replay's own record of who is stale.

  Returns params, anchors, momenta, per-tick (sent, received) and per-tick rejoin rows.
  """
  x, anchor, mom = np.zeros((M, N)), np.zeros((M, N)), np.zeros((M, N))
  stale = np.zeros(M, bool)
  wires, rejoins = [], []
  for t in range(len(active)):
    x = np.where(active[t][:, None], x - INNER_LR * (x - TARGETS), x)   # absent: no step
    a = alive[t]
    rejoins.append(a & stale)
    sent, received = np.zeros(M), np.zeros(M)
    if (t + 1) % H == 0:
      m = int(a.sum())
      ring = 2.0 * (m - 1) / m * S
      mean = (anchor - x)[a].mean(axis=0)            # each sender against its own anchor
      new_mom = MU * mom + mean
      new_anchor = anchor - OUTER_LR * (mean + MU * new_mom)
      if mode == 'offline':
        fresh = a & ~stale
        source = np.flatnonzero(fresh if fresh.any() else a)[0]
        takers = a & stale
        takers[source] = False
        anchor[a], mom[a] = new_anchor[source], new_mom[source]
        x[a] = anchor[a]
        sent[a], received[a] = ring, ring
        sent[source] += 2 * S * takers.sum()         # the anchor and the momentum
        received[takers] += 2 * S
        stale = ~a
      else:
        absent = ~a
        anchor, mom = new_anchor, new_mom            # one value, everyone receives it
        adopt = a if mode == 'keep_local' else np.ones(M, bool)
        x[adopt] = anchor[adopt]
        sent[a] = ring + S * absent.sum() / m
        received[a], received[absent] = ring, S
    wires.append((sent, received))
  return x, anchor, mom, wires, np.array(rejoins)


def _check_against_replay(sched):
  active, alive = sched.masks(0, STEPS)
  syncs = alive[H - 1::H]
  if not syncs.any(axis=1).all():
    return None                                      # a sync with nobody: not defined
  x, anchor, mom, wires = _engine(sched)
  want_x, want_anchor, want_mom, want_wires, want_rejoin = _replay(active, alive,
                                                                   sched.dropout_mode)
  np.testing.assert_allclose(x, want_x, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(anchor, want_anchor, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(mom, want_mom, rtol=1e-5, atol=1e-5)
  for t, (wire, (sent, received)) in enumerate(zip(wires, want_wires)):
    np.testing.assert_allclose(wire.sent, sent, rtol=1e-6, err_msg=f'tick {t}')
    np.testing.assert_allclose(wire.received, received, rtol=1e-6, err_msg=f'tick {t}')
  if sched.dropout_mode == 'offline':
    np.testing.assert_array_equal(sched.dropout_masks(0, STEPS)[2], want_rejoin)
  return want_rejoin


# Worker 3 misses round 0's sync and catches up at round 1's from worker 1, the lowest
# up-to-date one, while worker 0 (lower, not rejoining) is cut off; 0 catches up at
# round 2's beside the cut-off 2, and 2 at round 3's.
_CHURN_CASE = ((3, 0, 2), (0, 2, 4), (2, 4, 6))


@pytest.mark.parametrize('mode', ['offline', 'keep_local', 'discard'])
def test_five_workers_with_churn_match_the_replay(mode):
  sched = schedule_lib.SyncSchedule(M, round_steps=H, churn=_CHURN_CASE, dropout_mode=mode)
  rejoin = _check_against_replay(sched)
  if mode == 'offline':
    # Round 1 (ticks 2, 3): worker 3 rejoins; round 2 (ticks 4, 5): worker 0; worker 2
    # misses round 2's sync and rejoins through round 3.
    np.testing.assert_array_equal(np.flatnonzero(rejoin.any(axis=0)), [0, 2, 3])
    np.testing.assert_array_equal(rejoin[:, 3], [0, 0, 1, 1] + [0] * 12)
    np.testing.assert_array_equal(rejoin[:, 0], [0, 0, 0, 0, 1, 1] + [0] * 10)
    np.testing.assert_array_equal(rejoin[:, 2], [0] * 6 + [1, 1] + [0] * 8)


def test_no_fresh_sync_with_five_workers_copies_the_lowest_alive():
  """Worker 2 misses the syncs of rounds 1 and 2, worker 3 that of round 2; round 3 has
  only 2 and 3 alive, both stale: 2's history wins and 3 copies it (2 S from 2 to 3,
  nothing to the cut-off 0, 1, 4). In round 4 those three rejoin and copy from 2."""
  churn = ((2, 2, 6), (3, 4, 6), (0, 6, 8), (1, 6, 8), (4, 6, 8))
  sched = schedule_lib.SyncSchedule(M, round_steps=H, churn=churn, dropout_mode='offline')
  _, alive = sched.masks(0, STEPS)
  rejoin = sched.dropout_masks(0, STEPS)[2]
  sync = 3 * H + H - 1
  np.testing.assert_array_equal(alive[sync], [0, 0, 1, 1, 0])
  np.testing.assert_array_equal(rejoin[sync], [0, 0, 1, 1, 0])      # nobody fresh
  np.testing.assert_array_equal(rejoin[sync + H], [1, 1, 0, 0, 1])
  _check_against_replay(sched)
  _, _, _, wires = _engine(sched)
  ring = S                                   # two members: 2 (2 - 1) / 2 S
  np.testing.assert_allclose(wires[sync].sent, [0, 0, ring + 2 * S, ring, 0])
  np.testing.assert_allclose(wires[sync].received, [0, 0, ring, ring + 2 * S, 0])
  assert wires[sync].peers[2, 3] and wires[sync].peers[3, 2]
  assert not wires[sync].peers[[0, 1, 4]].any()
  ring = 8.0 / 5.0 * S                       # five members
  np.testing.assert_allclose(wires[sync + H].sent, [ring, ring, ring + 3 * 2 * S, ring, ring],
                             rtol=1e-6)
  np.testing.assert_allclose(wires[sync + H].received,
                             [ring + 2 * S, ring + 2 * S, ring, ring, ring + 2 * S], rtol=1e-6)


@settings(max_examples=20, deadline=None)
@example(seed=5, dropout=0.6, churn=[(0, 0, 3)], mode='offline')
@given(seed=st.integers(0, 2**16), dropout=st.sampled_from([0.0, 0.3, 0.6]),
       churn=st.lists(st.tuples(st.integers(0, M - 1), st.integers(0, STEPS - 1),
                                st.integers(1, 6)), max_size=2),
       mode=st.sampled_from(['offline', 'offline', 'keep_local', 'discard']))
def test_random_schedules_match_the_replay(seed, dropout, churn, mode):
  """Any seeded dropout and churn: params, anchors, momenta, every tick's bytes (ring,
  downloads, catch-ups) and the rejoin rows equal the replay's."""
  churn = tuple((w, leave, leave + length) for w, leave, length in churn)
  sched = schedule_lib.SyncSchedule(M, round_steps=H, dropout=dropout, churn=churn,
                                    seed=seed, dropout_mode=mode)
  _check_against_replay(sched)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), h=st.integers(1, 4), start=st.integers(0, 30),
       count=st.integers(1, 12),
       churn=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(1, 9)),
                      max_size=3))
def test_rejoin_rows_follow_the_definition_in_any_window(seed, h, start, count, churn):
  """A worker is stale from a sync it misses (a round's last step) until the end of the
  next round whose sync it is alive for; `rejoin` is alive and stale. Any window of
  ticks (a resumed run) gives the rows of the whole run."""
  churn = tuple((w, leave, leave + length) for w, leave, length in churn)
  sched = schedule_lib.SyncSchedule(4, round_steps=h, dropout=0.4, churn=churn, seed=seed,
                                    dropout_mode='offline')
  end = start + count
  _, alive = sched.masks(0, end)
  stale, want = np.zeros(4, bool), []
  for t in range(end):
    want.append(alive[t] & stale)
    if t % h == h - 1:
      stale = ~alive[t]
  keep, isolate, rejoin = sched.dropout_masks(start, count)
  assert keep.all() and isolate.all() and keep.shape == (count, 4)
  np.testing.assert_array_equal(rejoin, np.array(want)[start:])


@pytest.mark.parametrize('churn, rejoin_rows', [
    ((1, 2, 3), [0, 0, 0, 1, 1, 1, 0, 0, 0]),   # out for the sync step alone
    ((1, 3, 5), [0] * 9),                       # out mid-round, back for its sync
    ((1, 2, 7), [0] * 7 + [1, 1]),              # misses two syncs, back mid-round
    ((1, 0, 9), [0] * 9),                       # never back
])
def test_churn_rejoin_by_hand(churn, rejoin_rows):
  """Rounds of 3 (syncs at ticks 2, 5, 8): worker 1 rejoins through the rounds after a
  missed sync, for the ticks it is present, and nobody else ever does."""
  sched = schedule_lib.SyncSchedule(4, round_steps=3, churn=(churn,), dropout_mode='offline')
  rejoin = sched.dropout_masks(0, 9)[2]
  np.testing.assert_array_equal(rejoin[:, 1], rejoin_rows)
  assert not rejoin[:, [0, 2, 3]].any()


# ---------------------------------------------------------------------------
# The clock: absent workers' downloads and a rejoining worker's catch-up, by hand.


def _clock(step_seconds, bandwidth, latency):
  m = len(step_seconds)
  bw = np.full((m, m), float(bandwidth)) if np.ndim(bandwidth) == 0 else bandwidth
  lat = np.full((m, m), float(latency)) if np.ndim(latency) == 0 else latency
  return network_lib.Clock(network_lib.Network(np.asarray(step_seconds, float),
                                               np.asarray(bw, float), np.asarray(lat, float)))


def _all_reduce(alive, size, kind=ALL_REDUCE, overlap=None):
  """A keep_local / discard sync: members ring-reduce `size` bytes, each absent worker
  downloads them (as comm.ring_all_reduce_state reports)."""
  alive = np.asarray(alive, bool)
  m, a = alive.sum(), (~alive).sum()
  ring = 2.0 * (m - 1) / m * size
  return Wire(sent=np.where(alive, ring + size * a / m, 0.0),
              received=np.where(alive, ring, size), events=np.ones(len(alive), int),
              kind=np.full(len(alive), kind), payload=np.full(len(alive), float(size)),
              peers=np.outer(alive, alive) & ~np.eye(len(alive), dtype=bool),
              overlap=None if overlap is None else np.full(len(alive), overlap))


def test_a_dropped_straggler_downloads_after_its_own_step():
  """Worker 3 (4 s per step) drops out; the ring of 0, 1, 2 reduces 300 B in 4 phases
  of 0.01 + 100 / 1000 s and ends at 1.44; worker 3 computes until 4 and only then
  downloads the 300 B result: 0.01 + 0.3 s more."""
  clock = _clock([1, 1, 1, 4], 1000.0, 0.01)
  clock.step(_all_reduce([1, 1, 1, 0], 300.0), np.ones(4, bool))
  np.testing.assert_allclose(clock.now, [1.44, 1.44, 1.44, 4.31])
  np.testing.assert_allclose(clock.compute, [1, 1, 1, 4])


def test_a_churned_out_worker_downloads_when_the_result_exists():
  """The same round with worker 3 gone (it does not compute): its clock is at 0, so its
  download starts when the ring ends, 1.44, and ends 0.31 s later."""
  clock = _clock([1, 1, 1, 4], 1000.0, 0.01)
  clock.step(_all_reduce([1, 1, 1, 0], 300.0), np.array([1, 1, 1, 0], bool))
  np.testing.assert_allclose(clock.now, [1.44, 1.44, 1.44, 1.75])
  np.testing.assert_allclose(clock.compute, [1, 1, 1, 0])


def test_the_download_takes_the_fastest_link_into_the_absent_worker():
  """Into worker 3: from 0 at 100 B/s (3.01 s for 300 B), from 1 at 2000 B/s behind 0.5
  s latency (0.65 s), from 2 at 500 B/s (0.61 s): 0.61 s. Worker 3's own links out are
  instant; they carry nothing of the download."""
  bw = np.full((4, 4), 1000.0)
  lat = np.full((4, 4), 0.01)
  bw[0, 3], bw[1, 3], bw[2, 3] = 100.0, 2000.0, 500.0
  lat[1, 3] = 0.5
  bw[3, :] = 1e12
  lat[3, :] = 0.0
  clock = _clock([1, 1, 1, 1], bw, lat)
  clock.step(_all_reduce([1, 1, 1, 0], 300.0), np.ones(4, bool))
  np.testing.assert_allclose(clock.now, [1.44, 1.44, 1.44, 1.44 + 0.61])


def test_two_absent_workers_and_a_ring_of_two():
  """Workers 0 and 2 ring-reduce 200 B (2 phases of 0.01 + 0.1 s); 1 and 3 download the
  200 B each at 0.01 + 0.2 s, independently; the members do not wait for them."""
  clock = _clock([1, 1, 1, 1], 1000.0, 0.01)
  clock.step(_all_reduce([1, 0, 1, 0], 200.0), np.ones(4, bool))
  np.testing.assert_allclose(clock.now, [1.22, 1.43, 1.22, 1.43])


def test_an_absent_worker_of_an_all_gather_downloads_every_message():
  """All-gather of 100 B and 200 B messages by 0 and 1: one phase, bound by 200 B
  (0.01 + 0.2 s); worker 2 downloads both messages, 300 B: 0.01 + 0.3 s after."""
  alive = np.array([1, 1, 0], bool)
  wire = Wire(sent=np.array([100.0, 200.0, 0.0]), received=np.array([200.0, 100.0, 300.0]),
              events=np.ones(3, int), kind=np.full(3, ALL_GATHER),
              payload=np.array([100.0, 200.0, 0.0]),
              peers=np.outer(alive, alive) & ~np.eye(3, dtype=bool))
  clock = _clock([1, 1, 1], 1000.0, 0.01)
  clock.step(wire, np.ones(3, bool))
  np.testing.assert_allclose(clock.now, [1.21, 1.21, 1.52])


def test_an_overlapped_download_is_due_tau_steps_later():
  """tau = 1: the ring of 0 and 1 (1000 B: 2 x (0.01 + 0.5) s) started after step 1
  arrives at 2.02, worker 2's download at 2.02 + 0.01 + 1 = 3.03; step 1 waits for
  neither, step 2 ends for each when its own arrives."""
  clock = _clock([1, 1, 1], 1000.0, 0.01)
  clock.step(_all_reduce([1, 1, 0], 1000.0, overlap=1), np.ones(3, bool))
  np.testing.assert_allclose(clock.now, [1, 1, 1])
  silent = Wire(sent=np.zeros(3), received=np.zeros(3), events=np.zeros(3, int),
                kind=np.full(3, NO_COMM), payload=np.zeros(3), peers=np.zeros((3, 3), bool))
  clock.step(silent, np.ones(3, bool))
  np.testing.assert_allclose(clock.now, [2.02, 2.02, 3.03])


_ALG_3 = local_updates(optax.sgd(0.1), optax.chain(comm.all_reduce_mean(),
                                                   optax.sgd(0.7, momentum=0.9, nesterov=True)), 2)
_STEP_3 = jax.jit(_ALG_3.step)


def _run_timeline(mode):
  """DiLoCo, M 3, H 2, 25 float32 params (S = 100 B) on 1000 B/s, 0.01 s links, 1 s
  steps; worker 2 is gone for round 0. Returns the engine's wires and the timeline."""
  alg = _ALG_3
  cfg = network_lib.parse_network(dict(profile='homogeneous', step_seconds=1.0,
                                       bandwidth=1000.0, latency=0.01, churn=[[2, 0, 2]],
                                       dropout_mode=mode))
  tl = timeline_lib.make_timeline(cfg, num_workers=3, steps=4, algorithm=alg, name='d',
                                  flops_per_token=1.0, tokens_per_step=1, model_bytes=100)
  ctx = tl.contexts(0, 4)
  state = alg.init(jnp.zeros((25,), jnp.float32), 3, jax.random.key(0))
  infos = []
  for t in range(4):
    state, info = _STEP_3(state, state.params - 1.0, jax.tree.map(lambda x: x[t], ctx))
    infos.append(jax.tree.map(np.asarray, info))
  tl.advance(0, jax.tree.map(lambda *xs: np.stack(xs), *infos))
  return infos, tl


@pytest.mark.parametrize('mode', ['keep_local', 'discard'])
def test_timeline_charges_the_absent_workers_download(mode):
  """Round 0: 0 and 1 compute 2 s, ring of two 2 x (0.01 + 0.05) = 0.12 s, end 2.12;
  worker 2 (gone, its clock at 0) downloads 100 B: 2.23. Round 1: 2 s of compute each,
  the ring of three starts with the last, 4.23, and takes 4 x (0.01 + 100 / 3 / 1000)."""
  infos, tl = _run_timeline(mode)
  sync0 = infos[1].wire
  np.testing.assert_array_equal(sync0.kind, [ALL_REDUCE] * 3)
  np.testing.assert_allclose(sync0.sent, [150.0, 150.0, 0.0])
  np.testing.assert_allclose(sync0.received, [100.0, 100.0, 100.0])
  ring3 = 4 * (0.01 + 100 / 3 / 1000)
  np.testing.assert_allclose(tl.clock.now, [4.23 + ring3] * 3, rtol=1e-12)
  metrics = tl.metrics(4)
  assert metrics['sim_seconds'] == pytest.approx(4.23 + ring3, rel=1e-12)
  np.testing.assert_allclose(metrics['idle_seconds'],
                             [0.23 + ring3, 0.23 + ring3, 2.23 + ring3], atol=1e-6)


def test_timeline_charges_the_rejoining_workers_catch_up():
  """Offline: worker 2 takes no part in round 0 (its clock stays at 0). Round 1 ring of
  three starts at 4.12 (workers 0, 1); worker 2 then downloads the anchor and momentum,
  200 B, from a member: 0.01 + 0.2 s more."""
  infos, tl = _run_timeline('offline')
  np.testing.assert_array_equal(infos[1].wire.kind, [ALL_REDUCE, ALL_REDUCE, NO_COMM])
  ring3 = 4 * (0.01 + 100 / 3 / 1000)
  share = 4.0 / 3.0 * 100.0
  np.testing.assert_allclose(infos[3].wire.received, [share, share, share + 200.0], rtol=1e-6)
  end = 4.12 + ring3
  np.testing.assert_allclose(tl.clock.now, [end, end, end + 0.21], rtol=1e-8)   # float32 bytes
  np.testing.assert_allclose(tl.clock.compute, [4, 4, 2])


def test_a_catch_up_beside_an_isolated_worker_downloads_only_its_excess():
  """Offline, M 4: worker 3 is cut off, worker 2 rejoins. The ring is 0, 1, 2 (share
  4/3 S); worker 2's excess is its 2 S catch-up alone, 0.01 + 2 S / B after the ring,
  whatever the number of workers outside the ring."""
  s = 4.0 * N
  alg = local_updates(optax.sgd(0.1), optax.chain(comm.all_reduce_mean(),
                                                  optax.sgd(0.7, momentum=0.9)), 1)
  state = alg.init(jnp.zeros((N,), jnp.float32), 4, jax.random.key(0))
  ones = np.ones(4, bool)
  alive = np.array([1, 1, 1, 0], bool)
  state, info = jax.jit(alg.step)(state, state.params - 1.0, StepContext(
      active=ones, alive=alive, participation=Participation(
          keep=ones, isolate=ones, rejoin=np.array([0, 0, 1, 0], bool))))
  wire = jax.tree.map(np.asarray, info.wire)
  np.testing.assert_allclose(wire.sent, [4 / 3 * s + 2 * s, 4 / 3 * s, 4 / 3 * s, 0], rtol=1e-6)
  np.testing.assert_allclose(wire.received, [4 / 3 * s, 4 / 3 * s, 10 / 3 * s, 0], rtol=1e-6)
  clock = _clock([1, 1, 1, 1], 100.0, 0.01)
  clock.step(wire, ones)
  ring = 4 * (0.01 + s / 3 / 100.0)
  np.testing.assert_allclose(clock.now, [1 + ring, 1 + ring, 1 + ring + 0.01 + 2 * s / 100.0,
                                         1.0], rtol=1e-6)


# ---------------------------------------------------------------------------
# The utilization model's DiLoCo: one send on the round's last step.

F = u.FORWARD_SHARE


def _diloco(**kw):
  kw = dict(dict(params=1e9, step_seconds=3.0, workers=2, algorithm='diloco', sync_every=5,
                 buckets=4), **kw)
  return u.Workload(**kw)


def _closed_form(w: u.Workload, gbit_per_s: float) -> float:
  """CU of DiLoCo: its send starts with the round's last step, its K pieces released
  through the backward pass from T (F + (1 - F) / K) on, each taking c; the next round
  waits for the last: stall = max(T (F + (1 - F) / K) + K c - T, c)."""
  t, k = w.step_seconds, w.buckets
  c = w.latency + w.params * w.bits * 2 * (1 - 1 / w.workers) / k / (gbit_per_s * 1e9)
  stall = max(t * (F + (1 - F) / k) + k * c - t, c)
  return w.sync_every * t / (w.sync_every * t + stall)


def test_diloco_sends_once_on_the_last_step_of_its_round():
  for h, m in ((1, 2), (5, 2), (100, 4)):
    w = _diloco(sync_every=h, workers=m)
    assert w.sends() == [(h - 1, 1e9 * 16 * 2 * (1 - 1 / m), 0)]
    assert w.round_steps == h


@pytest.mark.parametrize('gbit, latency, cu', [
    (4.0, 0.0, 15 / 17.5),      # c = 1 s: queue-bound, stall 1.5 + 4 - 3 = 2.5 s
    (16.0, 0.0, 15 / 15.25),    # c = 0.25 s: hidden but the last piece, stall c
    (16.0, 0.1, 15 / 15.35),    # c = 0.35 s with latency
    (8.0, 0.0, 15 / 15.5),      # c = 0.5 s: both bounds meet, stall 0.5 s
])
def test_diloco_utilization_by_hand(gbit, latency, cu):
  """T 3 s (forward 1 s, backward 2 s), K 4 pieces released at 1.5, 2, 2.5, 3 s into the
  round's last step, 1e9 bfloat16 values between M 2 (1.6e10 bits, c = 4e9 / B), H 5."""
  w = _diloco(latency=latency)
  assert u.compute_utilization(w, gbit) == pytest.approx(cu, rel=1e-12)
  # One measured round and no warm-up: the round's own send is due when it ends.
  assert u.compute_utilization(w, gbit, rounds=1, warmup_rounds=0) == pytest.approx(
      cu, rel=1e-12)
  assert u.compute_utilization(w, gbit, rounds=7, warmup_rounds=1) == pytest.approx(
      cu, rel=1e-12)


def test_diloco_required_bandwidth_by_hand():
  """50%: stall = H T = 15 s = 4 c - 1.5, so c = 4.125 s and B = 4e9 / 4.125 bit/s; 99%:
  stall = 15 / 99 s, where the last piece is the bound (4 c - 1.5 < c): c = 15 / 99 s."""
  w = _diloco()
  half, most = u.required_bandwidth(w, (0.5, 0.99))
  assert half == pytest.approx(4.0 / 4.125, rel=1e-5)
  assert most == pytest.approx(4.0 / (15 / 99), rel=1e-5)


@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 40), k=st.sampled_from([1, 2, 4, 128]), m=st.integers(1, 8),
       step=st.floats(0.05, 5.0), latency=st.sampled_from([0.0, 1e-3, 0.05]),
       bits=st.sampled_from([4, 16, 32]), gbit=st.floats(1e-2, 1e3))
def test_diloco_utilization_is_the_closed_form(h, k, m, step, latency, bits, gbit):
  w = _diloco(sync_every=h, buckets=k, workers=m, step_seconds=step, latency=latency,
              bits=bits)
  assert u.compute_utilization(w, gbit) == pytest.approx(_closed_form(w, gbit), rel=1e-9)


@settings(max_examples=20, deadline=None)
@given(k=st.sampled_from([1, 4, 128]), m=st.integers(2, 8), gbit=st.floats(1e-2, 1e3),
       latency=st.sampled_from([0.0, 1e-3]))
def test_diloco_with_rounds_of_one_step_is_ddp(k, m, gbit, latency):
  kw = dict(params=1e9, step_seconds=0.8, workers=m, buckets=k, latency=latency)
  assert u.compute_utilization(u.Workload(algorithm='diloco', sync_every=1, **kw), gbit) == (
      pytest.approx(u.compute_utilization(u.Workload(algorithm='ddp', **kw), gbit),
                    rel=1e-12))


# ---------------------------------------------------------------------------
# The sync plan's non-block fragment.


def _tree(blocks=4, non_block=True):
  tree = {'blocks': {i: {'w': jnp.zeros(2)} for i in range(blocks)}}
  if non_block:
    tree.update(embed=jnp.zeros(2), final_norm={'scale': jnp.zeros(2)})
  return tree


def _leaf_names(tree):
  """'blocks/<i>' or the non-block leaf's top key, in leaf order (read by hand)."""
  names = []
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    names.append(f'blocks/{path[1].key}' if path[0].key == 'blocks' else path[0].key)
  return names


def _names(group):
  """The leaf names of a hand table's group: NB, or a tuple of block indices."""
  return [g if isinstance(g, str) else f'blocks/{g}' for g in group]


def _sync_steps(schedule, tree, rounds=2):
  """{leaf name: steps s in 1 .. rounds H at which its fragment syncs}."""
  steps = range(1, rounds * schedule.sync_every + 1)
  syncing = {s: int(schedule.syncing(jnp.asarray(s))[0]) for s in steps}
  out = {}
  for leaf, name in enumerate(_leaf_names(tree)):
    fragment = next(f for f, members in enumerate(schedule.members) if leaf in members)
    out[name] = [s for s in steps if syncing[s] == fragment]
  return out


NB = ('embed', 'final_norm')


@pytest.mark.parametrize('h, keys, non_block_leaves, want', [
    # 'own': non-block fragment 0 at s % 6 == 0, blocks {0, 2} at 2, {1, 3} at 4.
    (6, dict(non_block='own'), True, {NB: [6, 12], (0, 2): [2, 8], (1, 3): [4, 10]}),
    # 'first': they join blocks {0, 2} at 6; {1, 3} at 6 // 2 = 3.
    (6, dict(non_block='first'), True, {NB: [6, 12], (0, 2): [6, 12], (1, 3): [3, 9]}),
    # 'own' without non-block leaves: no shift, two fragments.
    (6, dict(non_block='own'), False, {(0, 2): [6, 12], (1, 3): [3, 9]}),
    (6, dict(non_block='own', fragment_pattern='sequential'), True,
     {NB: [6, 12], (0, 1): [2, 8], (2, 3): [4, 10]}),
    # H 7, three fragments: floor(7 / 3) = 2, floor(14 / 3) = 4.
    (7, dict(non_block='own'), True, {NB: [7, 14], (0, 2): [2, 9], (1, 3): [4, 11]}),
    (7, dict(non_block='first'), True, {NB: [7, 14], (0, 2): [7, 14], (1, 3): [3, 10]}),
])
def test_which_step_each_leaf_syncs_by_hand(h, keys, non_block_leaves, want):
  tree = _tree(non_block=non_block_leaves)
  got = _sync_steps(sync_plan.streaming(h, 2, **keys).schedule(tree), tree)
  assert got == {name: steps for group, steps in want.items() for name in _names(group)}


@settings(max_examples=60, deadline=None)
@given(blocks=st.integers(1, 6), data=st.data(), non_block=st.sampled_from(['own', 'first']),
       pattern=st.sampled_from(['strided', 'sequential']), has_rest=st.booleans())
def test_non_block_leaves_sync_at_the_round_end_and_blocks_are_spread(
    blocks, data, non_block, pattern, has_rest):
  """Non-block leaves sync at s = H, 2H (both modes); under 'own' they sync alone and
  the P block fragments take the offsets (f H) // (P + 1), f = 1 .. P, else (f H) // P,
  f = 0 .. P - 1; every leaf syncs once per round."""
  p = data.draw(st.integers(1, blocks))
  own = non_block == 'own' and has_rest
  count = p + own
  h = data.draw(st.integers(count, 3 * count))
  tree = _tree(blocks, has_rest)
  got = _sync_steps(sync_plan.streaming(h, p, fragment_pattern=pattern,
                                        non_block=non_block).schedule(tree), tree)
  for name, steps in got.items():
    if name in NB:
      assert steps == [h, 2 * h]
      continue
    b = int(name.split('/')[1])
    q = b % p if pattern == 'strided' else b * p // blocks    # the block's fragment
    offset = (q + own) * h // count
    assert steps == [s for s in range(1, 2 * h + 1) if s % h == offset], name
    if own:
      assert h not in steps                    # the round's end is the non-block's
  if has_rest and not own:                     # 'first': with block fragment 0
    assert got['blocks/0'] == got['embed']


@pytest.mark.parametrize('non_block', ['own', 'first'])
def test_the_engine_syncs_each_leaf_at_its_step(non_block):
  """Streaming with tau 0, alpha 0, outer SGD lr 1, three workers with distinct constant
  gradients: a leaf's anchor moves (to the workers' mean) exactly at the steps the hand
  table gives it, and each step's wire names the fragment that synced."""
  h = 6
  want = ({NB: [6, 12], (0, 2): [2, 8], (1, 3): [4, 10]} if non_block == 'own'
          else {NB: [6, 12], (0, 2): [6, 12], (1, 3): [3, 9]})
  fragment = ({NB: 0, (0, 2): 1, (1, 3): 2} if non_block == 'own'
              else {NB: 0, (0, 2): 0, (1, 3): 1})
  alg = algorithms.make('streaming_diloco', optax.sgd(1.0), sync_every=h, num_fragments=2,
                        non_block=non_block, overlap_steps=0, merge_alpha=0.0,
                        compression='none', outer_optimizer='sgd', outer_lr=1.0,
                        outer_momentum=0.0)
  tree = _tree()
  state = alg.init(tree, 3, jax.random.key(0))
  g = jnp.array([1.0, -2.0, 0.5])
  grads = jax.tree.map(lambda x: g[:, None] * jnp.ones_like(x), state.params)
  names = _leaf_names(tree)
  step = jax.jit(alg.step)
  for s in range(1, 2 * h + 1):
    before = [np.asarray(a) for a in jax.tree.leaves(state.anchor)]
    state, info = step(state, grads)
    after = [np.asarray(a) for a in jax.tree.leaves(state.anchor)]
    syncing = [group for group, steps in want.items() if s in steps]
    want_fragment = fragment[syncing[0]] if syncing else -1
    np.testing.assert_array_equal(info.wire.fragment, [want_fragment] * 3, err_msg=f's={s}')
    for name, a, b in zip(names, before, after):
      group = next(k for k in want if name in _names(k))
      moved = bool(np.any(a != b))
      assert moved == (s in want[group]), (s, name)
      if moved:   # every worker holds the mean of the workers' params
        np.testing.assert_allclose(b, np.broadcast_to(b[0], b.shape))
