"""SparseLoCo and compressed DiLoCo.

Command:
  python -m loco.sweep launch/sweeps/sparseloco.py --out=runs/sweeps/sparseloco
Expected: about 13 minutes on 2 CPU cores (3 runs, --parallel=1). Measured results:
WORKSPACE.md, "SparseLoCo and compressed DiLoCo" (top-64 2.181 with 1.8 MB per worker,
top-128 2.267, DiLoCo E3M0 2.277); DDP and float32 DiLoCo are in engine.py.
Measured with the stream layout (before 26 November 2026); not yet re-measured on
independent-row batches (add --config.data.sampling=stream to reproduce these).
"""

from launch.sweeps.common import suite


def get_sweep():
  return suite([
      ('sparseloco_h15_top64_2bit', 'experiments/tiny_sparseloco.py', {'algorithm.topk': 64}),
      ('sparseloco_h15_top128_2bit', 'experiments/tiny_sparseloco.py', {'algorithm.topk': 128}),
      ('diloco_h50_e3m0', 'experiments/tiny_diloco.py', {'algorithm.compression': 'e3m0'}),
  ])
