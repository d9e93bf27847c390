"""DDP vs DiLoCo vs Local SGD at equal tokens.

Command:
  python -m loco.sweep launch/sweeps/engine.py --out=runs/sweeps/engine
Expected: about 17 minutes on 2 CPU cores (4 runs, --parallel=1). Tiny model, 8
workers, 300 steps; the measured table is WORKSPACE.md's "DDP vs DiLoCo vs Local SGD"
(DDP 1.976, Local SGD 2.260, DiLoCo 0.7 / 0.9 2.326, DiLoCo 0.7 / 0.5 2.268).
Measured with the stream layout (before 26 November 2026); not yet re-measured on
independent-row batches (add --config.data.sampling=stream to reproduce these).
"""

from launch.sweeps.common import suite


def get_sweep():
  return suite([
      ('ddp', 'experiments/tiny_ddp.py', {}),
      ('local_sgd_h50', 'experiments/tiny_diloco.py:local_sgd', {}),
      ('diloco_h50_outer0.7_0.9_paper', 'experiments/tiny_diloco.py',
       {'algorithm.outer_lr': 0.7, 'algorithm.outer_momentum': 0.9}),
      ('diloco_h50_outer0.7_0.5', 'experiments/tiny_diloco.py', {}),
  ])
