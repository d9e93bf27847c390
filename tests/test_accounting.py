"""Per-worker communication counters through the training loop, against a hand count.

DESIGN §5: values travel at float32 (4 bytes each), so one model (or one gradient or
pseudo-gradient) is S = 4 * param_count bytes (2 * param_count at bfloat16). A ring all-reduce of S bytes over M
workers sends and receives 2 (M - 1) / M * S per worker; a gossip exchange sends (and
receives) S per edge used, two edges per worker on a ring. DDP syncs every step,
DiLoCo / GASLoC every H steps. metrics.jsonl reports per-worker means, cumulative;
comms.jsonl one row per step that communicated.
"""

import json
import os

import pytest

from loco.run import experiment
from loco import model as model_lib
from loco.run import train
from loco.files.metrics import read_metrics
from loco.wire import ALL_REDUCE, GOSSIP

STEPS, LOG_EVERY, BATCH, SEQ = 6, 2, 1, 16


def _ring_all_reduce(m):
  return lambda s: 2 * (m - 1) / m * s


# name, M, algorithm keys, sync steps, per-worker bytes of one sync as f(S), kind, peers,
# bytes per value on the wire
CASES = {
    'ddp_m2': ('ddp', 2, {}, range(1, STEPS + 1), _ring_all_reduce(2), ALL_REDUCE,
               lambda i, m: [1 - i], 4),
    'ddp_m4': ('ddp', 4, {}, range(1, STEPS + 1), _ring_all_reduce(4), ALL_REDUCE,
               lambda i, m: [j for j in range(m) if j != i], 4),
    'diloco_h3': ('diloco', 4, dict(sync_every=3), (3, 6), _ring_all_reduce(4), ALL_REDUCE,
                  lambda i, m: [j for j in range(m) if j != i], 4),
    'diloco_h3_bf16': ('diloco', 4, dict(sync_every=3, transport_dtype='bfloat16'), (3, 6),
                       _ring_all_reduce(4), ALL_REDUCE,
                       lambda i, m: [j for j in range(m) if j != i], 2),
    'dsgd_ring': ('dsgd', 4, dict(topology='ring'), range(1, STEPS + 1), lambda s: 2 * s,
                  GOSSIP, lambda i, m: sorted({(i - 1) % m, (i + 1) % m}), 4),
    'gasloc_ring_h2': ('gasloc', 4, dict(topology='ring', sync_every=2), (2, 4, 6),
                       lambda s: 2 * s, GOSSIP, lambda i, m: sorted({(i - 1) % m, (i + 1) % m}),
                       4),
}


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(CASES))
def test_counters_match_a_hand_count(nano_config, tmp_path, case):
  name, m, keys, sync_steps, per_sync, kind, peers_of, itemsize = CASES[case]
  c = nano_config
  c.num_workers, c.steps, c.log_every = m, STEPS, LOG_EVERY
  c.batch_per_worker, c.seq_len = BATCH, SEQ
  c.eval.every, c.checkpoint.every = 0, 0
  c.algorithm.name = name
  for k, v in keys.items():
    c.algorithm[k] = v
  workdir = str(tmp_path / case)
  train.run(c, workdir)

  params = model_lib.param_count(experiment.parse_config(c).model)
  # nano by hand: tied 257 x 32 embedding; per block qkv 32 x 3 x 2 x 16, out 2 x 16 x 32,
  # mlp 2 x 32 x 64, two norm scales of 32; a final norm of 32.
  assert params == 257 * 32 + 2 * (3072 + 1024 + 4096 + 64) + 32 == 24768
  size = itemsize * params                            # at the transport dtype
  one_sync = per_sync(size)
  assert one_sync == int(one_sync)                    # whole bytes: exact comparisons below

  records = read_metrics(workdir)
  assert [r['step'] for r in records] == [2, 4, 6]
  for r in records:
    t = r['step']
    syncs = sum(1 for s in sync_steps if s <= t)
    assert r['tokens'] == t * m * BATCH * SEQ, r
    assert r['syncs'] == syncs, r
    assert r['bytes_sent'] == syncs * one_sync, r
    assert r['bytes_received'] == syncs * one_sync, r
    assert r['peak_bytes'] == (one_sync if syncs else 0.0), r

  with open(os.path.join(workdir, 'comms.jsonl')) as f:
    lines = [json.loads(line) for line in f]
  assert lines[0] == {'workers': m}
  rows = lines[1:]
  assert [row['step'] for row in rows] == list(sync_steps)
  for row in rows:
    assert row['kind'] == [kind] * m
    assert row['sent'] == [one_sync] * m
    assert row['payload'] == [size] * m
    assert row['peers'] == [peers_of(i, m) for i in range(m)]
  # The log sums to the metrics' totals at every logged step.
  for r in records:
    logged = sum(sum(row['sent']) / m for row in rows if row['step'] <= r['step'])
    assert logged == r['bytes_sent']
