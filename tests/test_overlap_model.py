"""The compute-utilization model (loco.overlap_model): hand-computed cases, the oracles
between algorithms, the latency floor, the CLI's JSON and its bad-input paths."""

import json
import math
import subprocess
import sys

import pytest

from loco import overlap_model as u
from loco.errors import ConfigError

T = 1.0                      # seconds per step
N = 1e9                      # parameters
S = N * 16                   # bits per worker per full sync (bfloat16, M = 2: factor 1)


def workload(algorithm='ddp', **kw):
  kw.setdefault('params', N)
  kw.setdefault('step_seconds', T)
  kw.setdefault('workers', 2)
  return u.Workload(algorithm=algorithm, **kw)


def gbit(bits_per_s):
  return bits_per_s / 1e9


def test_one_bucket_ddp_by_hand():
  # One bucket, released when the backward pass ends and due then: every step stalls
  # S / B, so CU = T / (T + S / B): 50% at B = S / T, 99% at B = 99 S / T, and 100% at
  # no finite bandwidth.
  w = workload(buckets=1)
  assert u.compute_utilization(w, gbit(S / T)) == pytest.approx(0.5)
  assert u.compute_utilization(w, gbit(2 * S / T)) == pytest.approx(2 / 3)
  assert u.compute_utilization(w, math.inf) == 1.0
  assert u.compute_utilization(w, 1e6) < 1.0
  need = u.required_bandwidth(w, (0.5, 0.99))
  assert need[0] == pytest.approx(gbit(S / T), rel=1e-5)
  assert need[1] == pytest.approx(gbit(99 * S / T), rel=1e-5)


def test_bucketed_ddp_by_hand():
  # K buckets from T/3 + (2T/3)/K on: once the queue is the bottleneck (S/B >= 2T/3),
  # the last bucket is done at r0 + S/B, so 50% CU (stall T) needs B = S / (2T - r0).
  k = 128
  r0 = T / 3 + 2 * T / 3 / k
  w = workload(buckets=k)
  assert u.required_bandwidth(w, (0.5,))[0] == pytest.approx(gbit(S / (2 * T - r0)),
                                                             rel=1e-5)


def test_the_workers_factor_is_the_ring_all_reduce():
  # 2 (1 - 1/M): M = 4 sends 1.5 x what M = 2 sends; M = 1 sends nothing.
  two = u.required_bandwidth(workload(buckets=1), (0.5,))[0]
  four = u.required_bandwidth(workload(buckets=1, workers=4), (0.5,))[0]
  assert four == pytest.approx(1.5 * two, rel=1e-5)
  assert u.required_bandwidth(workload(workers=1)) == [0.0] * 5


def test_diloco_amortizes_over_h_steps():
  # One bucket (no overlap with compute): DiLoCo stalls S / B once per H steps, so it
  # needs exactly 1/H of DDP's bandwidth at every target. With 128 buckets the overlap
  # with the backward pass (T - r0) counts once per H T of compute for DiLoCo but once
  # per T for DDP: at 50% (stall = compute) S/B is 2T - r0 against H T + T - r0.
  h = 50
  ddp = u.required_bandwidth(workload(buckets=1))
  diloco = u.required_bandwidth(workload('diloco', sync_every=h, buckets=1))
  for a, b in zip(ddp, diloco):
    assert b == pytest.approx(a / h, rel=1e-5)
  ddp = u.required_bandwidth(workload())
  diloco = u.required_bandwidth(workload('diloco', sync_every=h))
  r0 = T / 3 + 2 * T / 3 / 128
  assert ddp[0] / diloco[0] == pytest.approx((h * T + T - r0) / (2 * T - r0), rel=1e-5)


def test_streaming_with_one_fragment_and_no_overlap_is_diloco():
  for bw in (0.5, 3.0, 40.0):
    assert u.compute_utilization(
        workload('streaming_diloco', sync_every=20, fragments=1, overlap_steps=0), bw
    ) == pytest.approx(u.compute_utilization(workload('diloco', sync_every=20), bw))


def test_streaming_needs_less_than_diloco_and_overlap_less_still():
  h = 100
  diloco = u.required_bandwidth(workload('diloco', sync_every=h))
  streaming = u.required_bandwidth(
      workload('streaming_diloco', sync_every=h, fragments=10, overlap_steps=0))
  overlapped = u.required_bandwidth(
      workload('streaming_diloco', sync_every=h, fragments=10, overlap_steps=1))
  for d, s, o in zip(diloco, streaming, overlapped):
    assert o < s <= d * (1 + 1e-6)
  # At high utilization the gap is large: the fragment has a whole step more to arrive.
  assert overlapped[-1] < diloco[-1] / 5


def test_latency_floor_by_hand():
  # One bucket of latency 0.1 s: the best CU is T / (T + 0.1) = 0.909, so 95% and 99%
  # are unreachable (inf), and 90% needs S / B = T (1/0.9 - 1) - 0.1.
  w = workload(buckets=1, latency=0.1)
  assert u.max_utilization(w) == pytest.approx(1 / 1.1)
  need = u.required_bandwidth(w, (0.9, 0.95, 0.99))
  assert need[0] == pytest.approx(gbit(S / (T * (1 / 0.9 - 1) - 0.1)), rel=1e-5)
  assert need[1:] == [math.inf, math.inf]


def test_utilization_grows_with_bandwidth():
  w = workload('streaming_diloco', sync_every=30, fragments=3, overlap_steps=2,
               latency=1e-3)
  cus = [u.compute_utilization(w, 10 ** e) for e in (-2, -1, 0, 0.5, 1, 2, 3)]
  assert cus == sorted(cus)


@pytest.mark.parametrize('tau', [0, 1, 5])
def test_more_rounds_change_nothing(tau):
  w = workload('streaming_diloco', sync_every=72, fragments=36, overlap_steps=tau)
  for bw in (0.3, 1.0, 3.0):
    assert u.compute_utilization(w, bw, rounds=40, warmup_rounds=5) == pytest.approx(
        u.compute_utilization(w, bw), rel=1e-9)


def test_fragments_follow_loco_streaming_offsets():
  # H = 100, P = 16 (the paper's 10B setting): fragment f at step f * 100 // 16.
  w = workload('streaming_diloco', sync_every=100, fragments=16, overlap_steps=1)
  assert [s for s, _, _ in w.sends()] == [f * 100 // 16 for f in range(16)]
  assert sum(b for _, b, _ in w.sends()) == pytest.approx(S)


def test_golden_10b():
  # The 10B / 0.8 s / M = 2 / bfloat16 numbers docs/utilization.md reports. If a change
  # to the model moves them, re-run scripts/utilization_tables.py and update the doc.
  def need(**kw):
    return [round(x, 2) for x in u.required_bandwidth(u.make_workload(**kw))]
  assert need(algorithm='ddp') == [120.38, 219.43, 258.88, 280.08, 297.81]
  assert need(algorithm='diloco') == [1.99, 7.79, 16.99, 33.76, 119.65]
  assert need(algorithm='streaming_diloco') == [1.58, 3.88, 5.31, 6.28, 7.25]


def test_defaults_and_unread_knobs():
  w = u.make_workload(algorithm='streaming_diloco', params=100e9)
  assert (w.sync_every, w.fragments, w.overlap_steps, w.bits) == (100, 36, 1, 16)
  assert u.make_workload(algorithm='diloco').sync_every == 100
  with pytest.raises(ConfigError, match='not read'):
    u.make_workload(algorithm='diloco', overlap_steps=1)
  with pytest.raises(ConfigError, match='distinct steps'):
    u.make_workload(algorithm='streaming_diloco', sync_every=4, fragments=8)
  with pytest.raises(ConfigError):
    u.required_bandwidth(workload(), (1.0,))


def cli(*args):
  return subprocess.run([sys.executable, '-m', 'loco.overlap_model', *args],
                        capture_output=True, text=True, timeout=60)


def test_cli_json_shape():
  out = cli('--params=10e9', '--step_seconds=0.8', '--workers=2', '--algorithm=diloco',
            '--sync_every=100', '--json')
  assert out.returncode == 0, out.stderr
  data = json.loads(out.stdout)
  assert list(data) == ['target', 'gbit_per_s']
  assert data['target'] == [0.5, 0.8, 0.9, 0.95, 0.99]
  assert len(data['gbit_per_s']) == 5
  assert all(isinstance(x, float) for x in data['gbit_per_s'])
  assert data['gbit_per_s'] == sorted(data['gbit_per_s'])


def test_cli_latency_above_the_step_is_null_not_a_hang():
  out = cli('--algorithm=ddp', '--step_seconds=0.8', '--latency=1.0', '--buckets=1',
            '--json')
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout)['gbit_per_s'][-1] is None
  table = cli('--algorithm=ddp', '--step_seconds=0.8', '--latency=1.0')
  assert table.returncode == 0 and 'unreachable' in table.stdout


@pytest.mark.parametrize('args, says', [
    (['--algorithm=ddp', '--params=-1'], '--params'),
    (['--algorithm=ddp', '--params=nan'], '--params'),
    (['--algorithm=sgd'], '--algorithm'),
    ([], '--algorithm'),
    (['--algorithm=ddp', '--workers=1.5'], 'whole number'),
    (['--algorithm=ddp', '--step_seconds=0'], '--step_seconds'),
    (['--algorithm=streaming_diloco', '--sync_every=4', '--fragments=8'], 'fragments=8'),
    (['--algorithm=streaming_diloco', '--overlap_steps=-1'], '--overlap_steps'),
    (['--algorithm=ddp', '--sync_every=10'], '--sync_every'),
    (['--algorithm=diloco', '--fragments=4'], '--fragments'),
    (['--algorithm=ddp', '--dtype=int3'], '--dtype'),
    (['--algorithm=ddp', '--latency=-0.1'], '--latency'),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, says):
  out = cli(*args)
  assert out.returncode == 2, (out.stdout, out.stderr)
  assert 'Traceback' not in out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('loco.overlap_model: error: '), lines
  assert says in lines[0]
  assert out.stdout == ''


def test_the_doc_tables_script_runs():
  out = subprocess.run([sys.executable, 'scripts/utilization_tables.py'], capture_output=True,
                       text=True, timeout=120,
                       cwd=__file__.rsplit('/tests/', 1)[0])
  assert out.returncode == 0, out.stderr
  assert out.stdout.count('| paper |') == 14 + 15 + 3
  assert 'python -m loco.overlap_model --params=1e+10 --step_seconds=0.8' in out.stdout
  # docs/utilization.md quotes these counts; re-run the script and update it if they move.
  assert 'equals the paper in 9 of 70 cells' in out.stdout
  assert 'equals the paper in 52 of 75 cells and is within one grid step (x1.207) in 72' \
      in out.stdout
