"""The main comparison: one run per algorithm family at equal tokens.

Command:
  python -m loco.sweep launch/sweeps/main.py --out=runs/sweeps/main
Expected: about 25 minutes on 2 CPU cores (5 runs of 4-5 minutes; --parallel=1 is the
fastest there, each run already uses both cores). Tiny model, 8 workers x 4 x 128
tokens per step, 300 steps (1.23M tokens) each: DDP, DiLoCo (H=50, outer Nesterov
0.7 / 0.5), GASLoC (ring, H=50), SparseLoCo (H=15, top-64/4096, 2-bit) and Streaming
DiLoCo (4 fragments, tau=1, E3M0), with the settings engine.py, gossip.py,
sparseloco.py and streaming.py use for them.
Every run also has a simulated network (see CURVES_AND_CLOCK) for the time axis.
Measured (WORKSPACE.md, "The main comparison"; every row of a batch an independent
window): DDP 1.715 (6,749 MB per worker), DiLoCo 2.173 (135 MB), GASLoC 2.281 (154 MB),
SparseLoCo 2.101 (1.8 MB), Streaming DiLoCo 2.243 (16.9 MB); on the stream layout
(before 26 November 2026) 1.976, 2.268, 2.344, 2.181 and 2.341. The report (runs/sweeps/main/report.md) has the time to reach the worst
finished run's loss in steps, tokens, bytes and simulated seconds.
"""

from launch.sweeps.common import suite


# Evaluations every 50 steps for the loss curves, and a simulated network for the
# time axis (the loss does not depend on it): 0.1 s per step, 1 Gbit/s links with
# 10 ms latency between all workers, as in experiments/tiny_hetero.py.
CURVES_AND_CLOCK = {'eval.every': 50, 'network.profile': 'homogeneous',
                    'network.step_seconds': 0.1, 'network.bandwidth': 1e9 / 8,
                    'network.latency': 0.01}


def get_sweep():
  return suite([
      ('ddp', 'experiments/tiny_ddp.py', CURVES_AND_CLOCK),
      ('diloco', 'experiments/tiny_diloco.py', CURVES_AND_CLOCK),
      ('gasloc_ring', 'experiments/tiny_gasloc.py', CURVES_AND_CLOCK),
      ('sparseloco', 'experiments/tiny_sparseloco.py', {'algorithm.topk': 64,
                                                        **CURVES_AND_CLOCK}),
      ('streaming_diloco', 'experiments/tiny_streaming.py', CURVES_AND_CLOCK),
  ])
