"""The main comparison: one run per algorithm family at equal tokens.

Command:
  python -m loco.sweep launch/sweeps/main.py --out=runs/sweeps/main
Expected: about 25 minutes on 2 CPU cores (5 runs of 4-5 minutes; --parallel=1 is the
fastest there, each run already uses both cores). Tiny model, 8 workers x 4 x 128
tokens per step, 300 steps (1.23M tokens) each: DDP, DiLoCo (H=50, outer Nesterov
0.7 / 0.5), GASLoC (ring, H=50), SparseLoCo (H=15, top-64/4096, 2-bit) and Streaming
DiLoCo (4 fragments, tau=1, E3M0), with the settings scripts/compare.py uses for them.
Measured so far (WORKSPACE.md): DDP 1.976 (6,749 MB per worker), DiLoCo 2.268 (135 MB),
GASLoC 2.344 (154 MB), SparseLoCo 2.181 (1.8 MB). The report (runs/sweeps/main/report.md)
has the time to reach the worst finished run's loss in steps, tokens and bytes.
"""

from launch.sweeps.common import suite


def get_sweep():
  return suite([
      ('ddp', 'experiments/tiny_ddp.py', {}),
      ('diloco', 'experiments/tiny_diloco.py', {}),
      ('gasloc_ring', 'experiments/tiny_gasloc.py', {}),
      ('sparseloco', 'experiments/tiny_sparseloco.py', {'algorithm.topk': 64}),
      ('streaming_diloco', 'experiments/tiny_streaming.py', {}),
  ])
