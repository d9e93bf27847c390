"""What a study's runs cost on this machine, from their status.json files (`study.cost`),
in units of one M = 8 micro run of 1,050 steps (8 workers x 4 x 64 tokens per step).

  python scripts/study_cost.py runs/claims70 [--planned]

Prints the units trained so far, the median seconds per unit over the finished programs
(a batch of runs is one program; the median ignores programs slowed by a pause or by
other work beside them) and, with --planned, what every final of the claims page's plan
costs at that median. Scoring and re-timing are not included.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import claims  # noqa: E402
from loco import study  # noqa: E402
from loco.errors import LocoError  # noqa: E402


def planned_units() -> float:
  s = claims.SCALES['full']
  h1 = {m.name for m in claims.methods(s) if m.h1}
  total = 0.0
  for f in claims.finals(s):
    keys = {'steps': s.budget.steps_h1 if f.method in h1 else s.budget.steps, **f.keys}
    total += study.run_units(keys) * len(f.seeds_of(s.budget))
  return total


def main(argv: list[str]) -> int:
  folders = [a for a in argv if not a.startswith('--')]
  if len(folders) != 1 or set(argv) - set(folders) - {'--planned'}:
    print('usage: python scripts/study_cost.py OUT [--planned]', file=sys.stderr)
    return 2
  try:
    c = study.cost(folders[0])
  except LocoError as e:
    print(f'study_cost: error: {e}', file=sys.stderr)
    return 1
  if not c['programs']:
    print(f'study_cost: no finished runs under {folders[0]}', file=sys.stderr)
    return 1
  hours = lambda u: u * c['per_unit'] / 3600  # noqa: E731
  print(f'{folders[0]}: {c["programs"]} programs; median {c["per_unit"]:.1f} s per unit')
  print(f'  tuning: {c["tuning"]:.1f} units = {hours(c["tuning"]):.2f} h at the median')
  print(f'  finals so far: {c["finals"]:.1f} units = {hours(c["finals"]):.2f} h')
  if '--planned' in argv:
    plan = planned_units()
    print(f'  finals planned (launch.claims, full scale): {plan:.1f} units = '
          f'{hours(plan):.2f} h; with the tuning {hours(plan + c["tuning"]):.2f} h')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
