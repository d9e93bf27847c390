"""The clock's overlap model (network.overlap): 'backward' times a step's collective as
loco.overlap_model does (arXiv 2501.18512 section 3.1), 'none' as before."""

import numpy as np
import pytest

from loco.sim import network as net_lib
from loco import overlap_model as util
from loco.errors import ConfigError
from loco.wire import Wire

K = util.BUCKETS


def _net(step_seconds, bandwidth, latency=0.0):
  m = len(step_seconds)
  return net_lib.Network(np.asarray(step_seconds, float), np.full((m, m), float(bandwidth)),
                         np.full((m, m), float(latency)))


def _all_reduce(size, m):
  """Every worker all-reduces a `size`-byte tree (the ring's bytes per worker sent)."""
  ring = np.full(m, 2 * (m - 1) / m * size)
  return Wire(sent=ring, received=ring, events=np.ones(m, int), kind=np.ones(m, int),
              payload=np.full(m, size), peers=~np.eye(m, dtype=bool))


def _silent(m):
  return Wire(sent=np.zeros(m), received=np.zeros(m), events=np.zeros(m, int),
              kind=np.zeros(m, int), payload=np.zeros(m), peers=np.zeros((m, m), bool))


def _step(clock, wire):
  """One step of `clock` in which every worker computed."""
  clock.step(wire, np.ones(len(wire.sent), bool))


@pytest.mark.parametrize('workers', [2, 4])
@pytest.mark.parametrize('algorithm,sync_every', [('ddp', 1), ('diloco', 5)])
@pytest.mark.parametrize('gbit_per_s', [0.2, 0.02, 0.002])
def test_backward_overlap_is_the_utilization_model(workers, algorithm, sync_every,
                                                   gbit_per_s):
  """DDP (an all-reduce of every gradient every step) and DiLoCo (of the outer gradient
  every H steps) as wire records: the clock's compute / wall time, and each round's
  wall time, equal loco.overlap_model's for the same parameters (bfloat16 on the wire),
  step time and bandwidth: hidden (0.2 Gbit/s), partly hidden (0.02) and mostly
  exposed (0.002)."""
  params, step = 1e6, 0.8
  workload = util.make_workload(params=params, step_seconds=step, workers=workers,
                                algorithm=algorithm,
                                **({} if algorithm == 'ddp' else dict(sync_every=sync_every)))
  expected = util.compute_utilization(workload, gbit_per_s)
  clock = net_lib.Clock(_net([step] * workers, gbit_per_s * net_lib.GBIT), overlap='backward')
  rounds = []
  for k in range(1, 4 * sync_every + 1):
    _step(clock, _all_reduce(2 * params, workers) if k % sync_every == 0 else _silent(workers))
    if k % sync_every == 0:
      rounds.append(clock.seconds)
  assert net_lib.utilization(clock.compute, clock.seconds) == pytest.approx(expected, rel=1e-12)
  np.testing.assert_allclose(np.diff([0.0] + rounds), sync_every * step / expected, rtol=1e-12)
  assert expected < 1.0                           # the last piece is never hidden


def test_a_collective_shorter_than_the_backward_pass_is_hidden_but_its_last_piece():
  """Two workers, 0.9 s steps (forward 0.3 s, backward 0.6 s), 1e6 B/s links, no
  latency; a 128000-byte all-reduce: 2 phases of 64000 B, 0.128 s in all ('none': the
  step ends at 0.9 + 0.128 = 1.028 s). With 'backward' it is K = 128 pieces of 0.001 s,
  piece k released at 0.3 + 0.6 (k + 1) / 128: the first at 0.3046875 s, so the queue
  would be done at 0.3046875 + 0.128 = 0.4326875 s, but the last piece is released at
  0.9 s and done at 0.901 s. A worker twice as slow (1.8 s steps) sets the releases:
  first piece 0.609375 s, last 1.8 s, done at 1.801 s."""
  size = 128000.0
  none = net_lib.Clock(_net([0.9, 0.9], 1e6))
  _step(none, _all_reduce(size, 2))
  np.testing.assert_allclose(none.now, [1.028, 1.028], rtol=1e-12)
  hidden = net_lib.Clock(_net([0.9, 0.9], 1e6), overlap='backward')
  _step(hidden, _all_reduce(size, 2))
  np.testing.assert_allclose(hidden.now, [0.901, 0.901], rtol=1e-12)
  np.testing.assert_allclose(hidden.compute, [0.9, 0.9])
  slow = net_lib.Clock(_net([0.9, 1.8], 1e6), overlap='backward')
  _step(slow, _all_reduce(size, 2))
  np.testing.assert_allclose(slow.now, [1.801, 1.801], rtol=1e-12)
  assert util.backward_overlap_end([0.0, 0.0], [0.9, 1.8], 0.001) == pytest.approx(1.801)


def test_a_collective_longer_than_the_backward_pass_is_hidden_in_part():
  """As above, a 1280000-byte all-reduce: 1.28 s ('none': 0.9 + 1.28 = 2.18 s), pieces
  of 0.01 s from 0.3046875 s on, back to back: done at 0.3046875 + 1.28 = 1.5846875 s;
  0.5953125 s of it (the backward pass less one piece's release interval) is hidden.
  With 1 ms latency per hop every piece pays it on both phases: pieces of 0.012 s, done
  at 0.3046875 + 128 x 0.012 = 1.8406875 s ('none' pays it once: 2.182 s)."""
  size = 1280000.0
  none = net_lib.Clock(_net([0.9, 0.9], 1e6))
  _step(none, _all_reduce(size, 2))
  np.testing.assert_allclose(none.now, [2.18, 2.18], rtol=1e-12)
  partly = net_lib.Clock(_net([0.9, 0.9], 1e6), overlap='backward')
  _step(partly, _all_reduce(size, 2))
  np.testing.assert_allclose(partly.now, [1.5846875, 1.5846875], rtol=1e-12)
  assert none.seconds - partly.seconds == pytest.approx(0.5953125, rel=1e-12)
  # A second step starts from the first's end: the same again.
  _step(partly, _all_reduce(size, 2))
  np.testing.assert_allclose(partly.now, 2 * 1.5846875, rtol=1e-12)
  late = net_lib.Clock(_net([0.9, 0.9], 1e6, latency=1e-3), overlap='backward')
  _step(late, _all_reduce(size, 2))
  np.testing.assert_allclose(late.now, 1.8406875, rtol=1e-12)
  lat_none = net_lib.Clock(_net([0.9, 0.9], 1e6, latency=1e-3))
  _step(lat_none, _all_reduce(size, 2))
  np.testing.assert_allclose(lat_none.now, 2.182, rtol=1e-12)


def test_none_is_the_default_and_tau_fragments_are_timed_as_before():
  """'none' is what Clock(net) does; an overlapped collective (tau = 2) is timed alike
  by both models: started after the step, due two steps later."""
  net = _net([1.0, 3.0, 1.0], 100.0)
  wires = [_silent(3), _all_reduce(300.0, 3), _silent(3),
           _all_reduce(300.0, 3)._replace(overlap=np.full(3, 2)), _silent(3), _silent(3)]
  default, none, backward = (net_lib.Clock(net), net_lib.Clock(net, overlap='none'),
                             net_lib.Clock(net, overlap='backward'))
  times = {id(c): [] for c in (default, none, backward)}
  for wire in wires:
    for c in (default, none, backward):
      _step(c, wire)
      times[id(c)].append(c.now.copy())
  assert default.overlap == 'none'
  np.testing.assert_array_equal(times[id(default)], times[id(none)])
  # By hand ('none', test_network.py): the all-reduce starts at 6 (worker 1) and takes
  # 4 x 1 s. 'backward': 128 pieces of 4/128 s released through the backward passes
  # (worker 1's, the later: from 3 + 1 + 2/128 = 4.015625 s on), back to back: done
  # at 8.015625 s, 1.984375 s sooner.
  np.testing.assert_allclose(times[id(none)][1], [10, 10, 10])
  np.testing.assert_allclose(times[id(backward)][1], [8.015625] * 3, rtol=1e-12)
  # After the tau = 2 fragment both advanced by the same amounts.
  shift = times[id(none)][1] - times[id(backward)][1]
  np.testing.assert_allclose(np.array(times[id(backward)][2:]) + shift, times[id(none)][2:])


def test_one_piece_is_none_again_and_fewer_pieces_pay_less_latency():
  """overlap_buckets = 1: the one piece is released at the end of the backward pass,
  so the collective starts after the step, as with 'none'. Pieces pay the ring's
  latency each: the 1.28 s all-reduce above on 1 ms hops, cut in 8 pieces of 2 x
  (0.001 + 80000 / 1e6) = 0.162 s from 0.3 + 0.6 / 8 = 0.375 s: done at 1.671 s."""
  net = _net([0.9, 0.9], 1e6, latency=1e-3)
  none, one = net_lib.Clock(net), net_lib.Clock(net, overlap='backward', buckets=1)
  eight = net_lib.Clock(net, overlap='backward', buckets=8)
  for clock in (none, one, eight):
    _step(clock, _all_reduce(1280000.0, 2))
  np.testing.assert_allclose(one.now, none.now, rtol=1e-12)
  np.testing.assert_allclose(eight.now, 1.671, rtol=1e-12)


def test_a_bad_overlap_is_a_config_error():
  with pytest.raises(ConfigError, match=r"network.overlap must be one of \('none', "
                     r"'backward'\) with network.mode='sync', got 'forward'"):
    net_lib.NetworkConfig(profile='homogeneous', overlap='forward')
  with pytest.raises(ConfigError, match='network.overlap must be one of'):
    net_lib.Clock(_net([1.0, 1.0], 1.0), overlap='layer')
  with pytest.raises(ConfigError, match=r"network.overlap must be one of \('compute', "
                     r"'none'\) with network.mode='async', got 'backward'"):
    net_lib.parse_network(dict(profile='homogeneous', mode='async', overlap='backward'))
  assert net_lib.parse_network(dict(profile='homogeneous', overlap=None)).clock_overlap == 'none'
  with pytest.raises(ConfigError, match='network.overlap_buckets must be >= 1, got 0'):
    net_lib.parse_network(dict(profile='homogeneous', overlap='backward', overlap_buckets=0))
  with pytest.raises(ConfigError, match="overlap_buckets is read only with network.overlap="):
    net_lib.parse_network(dict(profile='homogeneous', overlap_buckets=8))
  assert net_lib.parse_network(dict(profile='homogeneous', overlap='backward',
                                    overlap_buckets=8)).overlap_buckets == 8
