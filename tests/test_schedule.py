"""The asynchronous simulation's two policies, blocking (overlap='none') and overlapped
(overlap='compute'): where they must agree and where they must not."""

import numpy as np
import pytest

from loco.sim import network as net_lib
from loco.sim import schedule as schedule_lib


def _net(step_seconds, bytes_per_second: float = 50.0):
  m = len(step_seconds)
  return net_lib.Network(np.asarray(step_seconds, float), np.full((m, m), bytes_per_second),
                         np.zeros((m, m)))


def _both(net, **kwargs):
  return [schedule_lib.simulate_async(net, overlap=overlap, **kwargs)
          for overlap in ('none', 'compute')]


def _steps_at_merges(sched):
  """Per worker: its inner steps done at each tick where it merges an exchange."""
  done = np.cumsum(sched.active, 0)
  return [done[sched.sync[:, w], w].tolist() for w in range(sched.active.shape[1])]


@pytest.mark.parametrize('m, steps, sync_every', [(2, 8, 4), (4, 11, 3), (6, 7, 2)])
def test_policies_agree_when_exchanges_take_no_time(m, steps, sync_every):
  """Equal step times, instant links, the 'rotation' rule (its pairs do not depend on
  who arrives first): every pair ends its rounds together, so no worker ever waits or
  computes past an exchange, and overlapping changes nothing. The same exchanges at the
  same times, each merged after the same steps (none stale), the same clocks."""
  blocking, overlapped = _both(_net([0.5] * m), steps=steps, sync_every=sync_every,
                               peers=~np.eye(m, dtype=bool), exchange_bytes=0.0,
                               peer_choice='rotation')
  assert sorted(blocking.exchanges) == sorted(overlapped.exchanges)
  assert len(blocking.exchanges) == m // 2 * -(-steps // sync_every)
  assert _steps_at_merges(blocking) == _steps_at_merges(overlapped)
  assert not overlapped.staleness.any() and not blocking.staleness.any()
  for a, b in ((blocking.seconds[-1], overlapped.seconds[-1]),
               (blocking.worker_seconds[-1], overlapped.worker_seconds[-1]),
               (blocking.compute[-1], overlapped.compute[-1])):
    np.testing.assert_allclose(a, b)
  np.testing.assert_allclose(overlapped.seconds[-1], steps * 0.5)


@pytest.mark.parametrize('peer_choice', ['ready', 'sampled', 'rotation'])
def test_policies_agree_on_the_work_done(peer_choice):
  """On any network both policies take every worker's steps: the same compute seconds
  (steps x step time), one inner step per active tick."""
  rng = np.random.default_rng(3)
  net = net_lib.Network(rng.uniform(0.5, 2.0, 5), rng.uniform(20.0, 200.0, (5, 5)),
                        rng.uniform(0.0, 1.0, (5, 5)))
  for sched in _both(net, steps=13, sync_every=3, peers=~np.eye(5, dtype=bool),
                     exchange_bytes=100.0, peer_choice=peer_choice, seed=1):
    np.testing.assert_array_equal(sched.active.sum(0), 13)
    np.testing.assert_allclose(sched.compute[-1], 13 * net.step_seconds)


def test_overlap_hides_the_exchange_behind_the_next_round():
  """Two workers at 1 s a step, H = 4, 16 steps, each exchange 2 s (100 B at 50 B/s).

  Blocking: each round is 4 s of compute then 2 s of waiting, 4 rounds: 24 s, the
  exchanges start at 4, 10, 16, 22, and every worker idles 8 s. Overlapped: the
  exchanges start at each round's end (4, 8, 12, 16) while the next round computes;
  each model arrives 2 steps later (2 stale steps), except the last, awaited after the
  final round: 16 + 2 = 18 s, 2 s idle."""
  blocking, overlapped = _both(_net([1.0, 1.0]), steps=16, sync_every=4,
                               peers=~np.eye(2, dtype=bool), exchange_bytes=100.0,
                               peer_choice='rotation')
  assert [x[2:] for x in blocking.exchanges] == [(4, 6), (10, 12), (16, 18), (22, 24)]
  assert [x[2:] for x in overlapped.exchanges] == [(4, 6), (8, 10), (12, 14), (16, 18)]
  assert blocking.seconds[-1] == 24.0 and overlapped.seconds[-1] == 18.0
  np.testing.assert_allclose(blocking.worker_seconds[-1] - blocking.compute[-1], [8, 8])
  np.testing.assert_allclose(overlapped.worker_seconds[-1] - overlapped.compute[-1], [2, 2])
  assert blocking.staleness.tolist() == [[0, 0]] * 4
  assert overlapped.staleness.tolist() == [[2, 2]] * 3 + [[0, 0]]
  assert _steps_at_merges(blocking) == [[4, 8, 12, 16]] * 2
  assert _steps_at_merges(overlapped) == [[6, 10, 14, 16]] * 2
  assert blocking.send is None and overlapped.send.sum() == 8
