"""The cheap-round scale: DDP and DiLoCo (paper outer 0.7 / 0.9) on the micro model,
2,000 steps (40 rounds of H = 50) at 3 seeds, to show that it learns far below the
unigram entropy, how far apart seeds end, and what a round costs.

Command:
  python -m loco.sweep launch/sweeps/micro_scale.py --out=runs/sweeps/micro_scale --parallel=2
Expected: about 30 minutes on 2 CPU cores (6 runs). Table: WORKSPACE.md, "A scale where
rounds are cheap". Not a tuned comparison: DiLoCo's outer settings are the paper's.
"""

from loco.lab.sweep import Run

SEEDS = (0, 1, 2)


def get_sweep():
  return [Run(f'{variant}_seed{seed}', f'experiments/micro.py:{variant}',
              {'seed': seed, 'progress': False})
          for variant in ('ddp', 'diloco') for seed in SEEDS]
