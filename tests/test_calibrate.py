"""The clock against real transfers (loco.calibrate, loco.sim.netns): the pure parts (counter
parsing, step times, the prediction, the fit, the table), the link-efficiency key, bad
input as one line, and (slow) the smallest case end to end in a shaped namespace."""

import os

import numpy as np
import pytest

from loco.lab import calibrate
from loco import configs
from loco.configs import default
from loco.sim import netns
from loco.sim import network
from loco.lab import retime
from loco.errors import ConfigError, LocoError, UsageError
from loco.wire import ALL_GATHER, ALL_REDUCE, GOSSIP, Wire

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 22041800   20582    0    0    0     0          0         0 22041900   20583    0    0    0     0       0          0
  eth0: 1 2 0 0 0 0 0 0 3 4 0 0 0 0 0 0
"""
TC = """qdisc tbf 8004: root refcnt 2 rate 100Mbit burst 4Kb lat 50ms
 Sent 22330146 bytes 20585 pkt (dropped 3, overlimits 21555 requeues 0)
 backlog 0b 0p requeues 0
"""


def test_counters_are_read_from_proc_net_dev_and_tc():
  assert netns.parse_net_dev(NET_DEV) == (22041800, 22041900)
  assert netns.parse_net_dev(NET_DEV, 'eth0') == (1, 3)
  with pytest.raises(LocoError, match='no counters for wlan0'):
    netns.parse_net_dev(NET_DEV, 'wlan0')
  assert netns.parse_tc_stats(TC) == dict(bytes=22330146, packets=20585, dropped=3)
  assert netns.parse_tc_stats('qdisc noqueue 0: root refcnt 2\n') == dict(
      bytes=0, packets=0, dropped=0)
  assert netns.tbf_command(50) == ['tc', 'qdisc', 'add', 'dev', 'lo', 'root', 'tbf', 'rate',
                                   '50mbit', 'burst', '32kbit', 'latency', '50ms']


def _rows(seconds, tokens_per_step=100):
  """One-step metrics rows whose interval k is seconds[k]."""
  return [dict(step=k + 1, tokens=(k + 1) * tokens_per_step,
               tokens_per_second=tokens_per_step / s) for k, s in enumerate(seconds)]


def test_step_times_shift_each_row_to_the_step_it_timed():
  rows = _rows([9.0, 1.0, 2.0, 3.0, 0.01])
  # Several processes: row t times step t + 1; the first row (the first two steps)
  # and the last (nothing left to time) are left out.
  assert calibrate.step_times(rows) == pytest.approx({3: 1.0, 4: 2.0, 5: 3.0})
  assert calibrate.step_times(rows, lag=0) == pytest.approx({2: 1.0, 3: 2.0, 4: 3.0,
                                                             5: 0.01})
  assert calibrate.compute_seconds({3: 1.0, 4: 2.0, 5: 30.0}) == 2.0
  with pytest.raises(LocoError, match='timed no step'):
    calibrate.compute_seconds({})


def _wire(kind, payload, m=2, sent=None, overlap=None):
  peers = ~np.eye(m, dtype=bool)
  return (np.ones(m, bool), Wire(sent=np.full(m, payload if sent is None else sent),
                                 received=None, events=np.ones(m, int),
                                 kind=np.full(m, kind), payload=np.full(m, float(payload)),
                                 peers=peers, overlap=overlap))


def test_prediction_is_the_clock_at_the_shared_links_rate():
  """Two workers on a loopback of R bytes/s shared by both: per link R / 2. A ring
  all-reduce of S moves S each way: 2 S / R; an all-gather of P per worker 2 P / R; a
  gossip exchange of P each way 2 P / R; an overlapped one (tau 1) does not block."""
  rate, size = 1e6, 3e5
  log = {2: _wire(ALL_REDUCE, size), 3: _wire(ALL_GATHER, size), 4: _wire(GOSSIP, size),
         5: _wire(ALL_REDUCE, size, overlap=np.ones(2, int))}
  got = calibrate.predict(log, 2, 6, 0.5, rate / 2)
  assert got == pytest.approx({1: 0.5, 2: 0.5 + 2 * size / rate, 3: 0.5 + 2 * size / rate,
                               4: 0.5 + 2 * size / rate, 5: 0.5, 6: 0.6})
  half = calibrate.predict(log, 2, 6, 0.5, rate / 2, link_efficiency=0.5)
  assert half[2] == pytest.approx(0.5 + 4 * size / rate)
  assert calibrate.sync_steps(log) == {2: 0, 3: 0, 4: 0, 5: 1}
  assert calibrate.bytes_sent(log) == 8 * size


def test_compare_fit_and_table():
  measured = {3: 2.5, 4: 1.0, 5: 2.5}          # compute 1 s; syncs at 3 and 5 take 1.5 s
  predicted = {3: 2.2, 4: 1.0, 5: 2.2}         # the clock says 1.2 s
  c = calibrate.compare(measured, predicted, predicted, {3: 0, 5: 0, 9: 0}, compute=1.0)
  assert [s[:2] for s in c.syncs] == [(3, 0), (5, 0)]
  assert [s[2:4] for s in c.syncs] == [pytest.approx((1.5, 1.2))] * 2
  assert (c.measured, c.predicted) == pytest.approx((6.0, 5.4))
  assert calibrate.fit_efficiency([c]) == pytest.approx(0.8)
  # Only blocking syncs predicted long enough to time count; never above 1.
  short = calibrate.compare({3: 1.5}, {3: 1.01}, {3: 1.01}, {3: 0}, compute=1.0)
  overlapped = calibrate.compare({3: 9.0}, {3: 2.0}, {3: 2.0}, {3: 1}, compute=1.0)
  assert calibrate.fit_efficiency([c, short, overlapped]) == pytest.approx(0.8)
  assert calibrate.fit_efficiency([short]) is None
  fast = calibrate.compare({3: 1.5}, {3: 2.0}, {3: 2.0}, {3: 0}, compute=1.0)
  assert calibrate.fit_efficiency([fast]) == 1.0
  result = calibrate.Result('ddp', 50.0, c, loco_bytes=2e6, wire_bytes=2.1e6,
                            qdisc_bytes=2.2e6, load=(1.5, 1.0, 0.5), wall=30.0)
  lines = calibrate.table([result, calibrate.Result('x', 200.0, short, 1.0, 1.0, 1.0,
                                                    (0.0, 0.0, 0.0), 1.0)], 0.8)
  assert len(lines) == 4 and 'link_efficiency 0.800' in lines[0]
  cells = [cell.strip() for cell in lines[2].strip('|').split('|')]
  assert cells[:9] == ['ddp', '50', '1.000', '2', '1.50', '1.20', '1.25', '1.20', '1.25']
  assert cells[11:] == ['1.11', '1.11', '2.00', '2.10 (2.20)', '1.050', '1.50']
  assert [cell.strip() for cell in lines[3].split('|')][7] == '-'   # 0.01 s: no ratio
  assert calibrate.sync_lines(result)[0] == (
      '  step   3: sync measured   1.500 s, predicted   1.200 s, ratio 1.25, after   '
      '1.200 s, ratio 1.25')


def test_the_link_efficiency_key_is_off_by_default_and_range_checked():
  cfg = network.parse_network(dict(profile='homogeneous', bandwidth=1e6))
  assert cfg.link_efficiency == 1.0
  plain = network.make_network(cfg, 3, 1.0)
  assert np.all(plain.bandwidth == 1e6)
  calibrated = network.make_network(
      network.parse_network(dict(profile='multi_region', link_efficiency=0.5, regions=3)),
      3, 1.0)
  assert calibrated.bandwidth[0, 1] == 0.5 * network.GBIT   # the inter-region default
  # A re-timing with the term sits beside the plain one.
  assert retime.default_name(cfg) == 'homogeneous'
  assert retime.default_name(network.parse_network(dict(
      profile='homogeneous', link_efficiency=0.93))) == 'homogeneous,link_efficiency=0.93'
  for bad in (0.0, 1.5):
    with pytest.raises(ConfigError, match=r'network.link_efficiency must be in \(0, 1\]'):
      network.parse_network(dict(profile='homogeneous', link_efficiency=bad))
  config = configs.load(default.__file__, {'network.profile': 'homogeneous',
                                                   'network.link_efficiency': '2'})
  with pytest.raises(ConfigError, match='link_efficiency'):
    configs.validate(config)


def test_bad_input_is_one_line(capsys, monkeypatch):
  for args, words in ((['--rates=fast'], '--rates takes Mbit/s numbers'),
                      (['--rates=0'], '--rates takes positive'),
                      (['--algorithms=ddp,nope'], "got 'nope'"),
                      (['--processes=1'], '--processes must be at least 2'),
                      (['--link_efficiency=2'], '--link_efficiency must be in (0, 1]'),
                      (['--steps=3'], '--steps must be at least 4')):
    assert calibrate.main(args) == 2, args
    err = capsys.readouterr().err
    assert err.startswith('loco.calibrate: error: ') and words in err and err.count('\n') == 1
  monkeypatch.setattr(netns, 'available', lambda: 'a private network namespace (unshare '
                      '-n) and tc need root; run as root.')
  assert calibrate.main([]) == 1
  err = capsys.readouterr().err
  assert err == ('loco.calibrate: error: a private network namespace (unshare -n) and tc '
                 'need root; run as root.\n')


def test_an_earlier_calibration_is_replaced_but_nothing_else(tmp_path):
  run = tmp_path / 'ddp' / 'free'
  os.makedirs(run / 'run')
  (run / 'process-0.log').write_text('x')
  calibrate._fresh(str(run))
  assert os.listdir(run) == []
  (run / 'notes.txt').write_text('mine')
  with pytest.raises(LocoError, match="not a calibration run's"):
    calibrate._fresh(str(run))
  assert (run / 'notes.txt').read_text() == 'mine'


@pytest.mark.slow
def test_ddp_over_a_shaped_loopback_matches_the_clock(tmp_path, monkeypatch, capsys):
  """DDP, 2 processes, 200 Mbit/s, 6 steps, in a private namespace: each sync within
  [0.75, 1.35] of the clock's time (Gloo's ring of two over the shared queue is the
  clock's ring at rate / 2: measured 0.94 to 1.11 on a shared 2-core machine), and the
  bytes on the loopback (less the coordination baseline) are loco's count plus TCP/IP
  framing: within [1.0, 1.12] of it."""
  reason = netns.available()
  if reason is not None:
    pytest.skip(reason)
  monkeypatch.setenv('LOCO_JAX_CACHE', str(tmp_path / 'jax'))   # the free and shaped
  results, efficiency = calibrate.calibrate(                    # runs compile once
      ['ddp'], [200.0], str(tmp_path / 'out'), processes=2, steps=6, timeout=600,
      link_efficiency=None)
  (result,) = results
  measured, predicted, _ = calibrate.median_sync(result.comparison)
  assert len(result.comparison.syncs) == 4      # steps 3..6 timed, each a sync
  assert 0.75 <= measured / predicted <= 1.35, calibrate.sync_lines(result)
  assert 0.75 <= result.comparison.measured / result.comparison.predicted <= 1.35
  assert 1.0 <= result.wire_bytes / result.loco_bytes <= 1.12
  assert 0.5 <= efficiency <= 1.0
  assert 'baseline (no sync, 6 steps)' in capsys.readouterr().out
