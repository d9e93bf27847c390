"""Finals for claims 1 and 2: each method at its best tuning setting, 3 new seeds.

Reads the finished tuning sweep (launch/sweeps/claims_outer_tuning.py, scored on
`validation[:50%]`), picks each method's setting with the lowest final eval loss, and
runs it at seeds 1, 2, 3 (the tuning used seed 0), scored on the other half of the
validation split. `python -m loco.report runs/sweeps/claims_outer_finals` gives mean ±
std over the seeds.

Command (after the tuning sweep has finished):
  python -m loco.sweep launch/sweeps/claims_outer_finals.py --out=runs/sweeps/claims_outer_finals --parallel=2
Expected: about 55 minutes on 2 CPU cores (9 runs).
"""

import os

from loco import report
from loco.sweep import Run, SweepError, load_spec

HERE = os.path.dirname(os.path.abspath(__file__))
TUNING = os.path.join('runs', 'sweeps', 'claims_outer_tuning')
METHODS = ('ddp', 'diloco_nesterov', 'diloco_sgd')
SEEDS = (1, 2, 3)
FINAL_SPLIT = 'validation[50%:]'


def picks(tuning_dir: str = TUNING) -> dict[str, tuple[Run, float]]:
  """method -> (its best tuning run, that run's final eval loss)."""
  tuning = load_spec(os.path.join(HERE, 'claims_outer_tuning.py'))
  rows = {r['name']: r for r in report.summarize(
      [os.path.join(tuning_dir, run.name) for run in tuning], names=[r.name for r in tuning])}
  out = {}
  for method in METHODS:
    grid = [run for run in tuning if run.name == method or run.name.startswith(method + '_')]
    done = [run for run in grid if rows[run.name]['status'] == 'finished']
    if len(done) < len(grid):
      raise SweepError(f'the finals need the finished tuning sweep: {len(done)} of '
                       f'{len(grid)} {method} runs are finished in {tuning_dir}; run '
                       'python -m loco.sweep launch/sweeps/claims_outer_tuning.py '
                       f'--out={tuning_dir} first.')
    best = min(done, key=lambda run: rows[run.name]['final_eval_loss'])
    out[method] = (best, rows[best.name]['final_eval_loss'])
  return out


def get_sweep():
  return [Run(f'{method}_seed{seed}', run.config,
              {**run.overrides, 'data.eval_split': FINAL_SPLIT, 'seed': seed})
          for method, (run, _) in picks().items() for seed in SEEDS]
