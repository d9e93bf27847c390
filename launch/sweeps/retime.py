"""Re-timing: DDP, DiLoCo, SparseLoCo and Streaming DiLoCo on nine networks, trained once.

Command:
  python -m loco.sweep launch/sweeps/retime.py --out=runs/sweeps/retime
Expected: about 15 minutes on 2 idle CPU cores (five training runs of 2-3 minutes;
measured 25 minutes with the machine shared, runs of 258-351 s); the 45 re-timings take
under a second in all. Tiny model, 8 workers x 4 x 128 tokens per
step, 150 steps (614k tokens), eval every 25 steps, trained on main.py's network
(0.1 s per step, 1 Gbit/s, 10 ms); then `loco.retime` replays each run's communication
log on every network of `get_retimes()` (0.1 s per step on all of them). DiLoCo with
25% of workers dropping out of each round is a fifth training run: dropout decides which
work is done, so it is part of the run, not of a network it can be re-timed on.
Measured (WORKSPACE.md, "Re-timing finished runs"): the report's table of simulated
seconds to the target per run x network and its plot, one panel per network.
"""

from launch.sweeps.common import COMMON
from launch.sweeps.main import CURVES_AND_CLOCK
from loco.lab.sweep import Run

STEPS = 150
GBIT = 1e9 / 8
# main.py's runs and training network, shorter, with evaluations every 25 steps.
SHORT = {**COMMON, **CURVES_AND_CLOCK, 'steps': STEPS, 'log_every': 25, 'eval.every': 25,
         'eval.per_worker': False, 'checkpoint.every': STEPS}

# Per-worker access links (Gbit/s): four in a datacenter, two on 1 Gbit/s, two on
# 100 Mbit/s; a link is as fast as the slower of its two ends.
UPLINKS = [10, 10, 10, 10, 1, 1, 0.1, 0.1]


def _network(profile, **keys):
  return {'network.profile': profile, 'network.step_seconds': 0.1,
          **{f'network.{k}': v for k, v in keys.items()}}


def get_sweep():
  return [
      Run('ddp', 'experiments/tiny_ddp.py', SHORT),
      Run('diloco', 'experiments/tiny_diloco.py', SHORT),
      Run('sparseloco', 'experiments/tiny_sparseloco.py', {**SHORT, 'algorithm.topk': 64}),
      Run('streaming_diloco', 'experiments/tiny_streaming.py', SHORT),
      Run('diloco_dropout25', 'experiments/tiny_diloco.py',
          {**SHORT, 'network.dropout': 0.25, 'network.dropout_mode': 'discard'}),
  ]


def get_retimes():
  return {
      'dc_100gbit': _network('homogeneous', bandwidth=100 * GBIT, latency=1e-4),
      'homogeneous_10gbit': _network('homogeneous', bandwidth=10 * GBIT, latency=1e-3),
      'homogeneous_1gbit': _network('homogeneous', bandwidth=GBIT, latency=0.01),
      'homogeneous_100mbit': _network('homogeneous', bandwidth=0.1 * GBIT, latency=0.01),
      'multi_region': _network('multi_region', bandwidth=10 * GBIT, latency=1e-3,
                               regions=2, inter_bandwidth=GBIT, inter_latency=0.05),
      'lognormal': _network('lognormal', bandwidth=GBIT, latency=0.01, sigma=1.0),
      'slow_links': _network('slow_links', bandwidth=GBIT, latency=0.01, slow_workers=2,
                             slow_factor=100.0),
      'stragglers': _network('stragglers', bandwidth=GBIT, latency=0.01),
      'custom_uplinks': _network('custom', latency=0.01, bandwidth_matrix=[
          [0.0 if i == j else min(a, b) * GBIT for j, b in enumerate(UPLINKS)]
          for i, a in enumerate(UPLINKS)]),
  }
