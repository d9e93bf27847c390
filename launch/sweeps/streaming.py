"""Streaming DiLoCo: overlap tau and transport.

Command:
  python -m loco.sweep launch/sweeps/streaming.py --out=runs/sweeps/streaming
Expected: about 20 minutes on 2 CPU cores (4 runs of ~5 minutes, --parallel=1). Tiny
model, 8 workers, 300 steps, 4 block fragments; tau = 1 or 5 steps from a fragment's
sync to its merge, E3M0 or float32 outer gradients. Compare with DiLoCo (engine.py).
"""

from launch.sweeps.common import suite


def get_sweep():
  return suite([
      ('streaming_tau1_e3m0', 'experiments/tiny_streaming.py', {}),
      ('streaming_tau5_e3m0', 'experiments/tiny_streaming.py', {'algorithm.overlap_steps': 5}),
      ('streaming_tau1_float32', 'experiments/tiny_streaming.py',
       {'algorithm.compression': 'none'}),
      ('streaming_tau5_float32', 'experiments/tiny_streaming.py',
       {'algorithm.overlap_steps': 5, 'algorithm.compression': 'none'}),
  ])
