"""Equal tuning budgets for claims 1 and 2 (docs: DiLoCo vs DDP; Nesterov vs SGD outer).

Nine outer settings per method on the micro scale (experiments/micro.py: 2,000 steps,
40 rounds of H = 50), scored on the first half of the validation split; the second
half is kept for the 3-seed final runs at each method's best setting:
  DiLoCo, outer Nesterov: lr {0.3, 0.5, 0.7} x momentum {0.5, 0.7, 0.9};
  DiLoCo, outer SGD (FedAvg when lr = 1): lr {0.3, 0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 2.0};
  DDP: no outer setting (one run, for reference).

Command:
  python -m loco.sweep launch/sweeps/claims_outer_tuning.py --out=runs/sweeps/claims_outer_tuning --parallel=2
Expected: about 1 h 40 min on 2 CPU cores (19 runs of about 10 minutes, two at a time).
Then `python -m loco.report runs/sweeps/claims_outer_tuning` ranks the settings.
"""

from loco.sweep import Run

TUNING_SPLIT = 'validation[:50%]'     # the finals report on 'validation[50%:]'
NESTEROV = [(lr, mu) for lr in (0.3, 0.5, 0.7) for mu in (0.5, 0.7, 0.9)]
SGD = (0.3, 0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 2.0)


def get_sweep():
  common = {'data.eval_split': TUNING_SPLIT, 'progress': False}
  runs = [Run('ddp', 'experiments/micro.py:ddp', common)]
  runs += [Run(f'diloco_nesterov_lr{lr}_mu{mu}', 'experiments/micro.py:diloco',
               {**common, 'algorithm.outer_lr': lr, 'algorithm.outer_momentum': mu})
           for lr, mu in NESTEROV]
  runs += [Run(f'diloco_sgd_lr{lr}', 'experiments/micro.py:diloco',
               {**common, 'algorithm.outer_optimizer': 'sgd', 'algorithm.outer_lr': lr,
                'algorithm.outer_momentum': 0.0})
           for lr in SGD]
  return runs
