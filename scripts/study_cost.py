"""What a study's runs cost on this machine, from their status.json files (`study.cost`),
in units of one M = 8 micro run of 1,050 steps (8 workers x 4 x 64 tokens per step).

  python scripts/study_cost.py runs/claims70 [--planned]

Prints the units trained so far, the median seconds per unit over the finished programs
(a batch of runs is one program; the median ignores programs slowed by a pause or by
other work beside them) and, with --planned, what the claims page's plan (its tuning,
a range, and every final) costs at that median. Scoring and re-timing are not included.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import claims  # noqa: E402
from loco.lab import study  # noqa: E402
from loco.errors import LocoError  # noqa: E402


def planned_units() -> float:
  """The finals of the claims page's plan at its first seeds, in units."""
  s = claims.SCALES['full']
  h1 = {m.name for m in claims.methods(s) if m.h1}
  total = 0.0
  for f in claims.finals(s):
    keys = {'steps': s.budget.steps_h1 if f.method in h1 else s.budget.steps, **f.keys}
    total += study.run_units(keys) * len(f.seeds_of(s.budget))
  return total


def planned_tuning_units() -> tuple[float, float]:
  """The tuning of the claims page's plan, in units: (fewest, most). A method trains 5
  settings and a re-tuned variant 3, each up to 2 more past an edge (1 for a variant),
  and a method whose knob moved up to 3 more inner lrs at it (`study.settings`' step 4);
  with a check seed the pick and its neighbour train again (more where a pick diverges
  there, not counted)."""
  s = claims.SCALES['full']
  b = s.budget
  check = 2 if b.check_seed is not None else 0
  methods = {m.name: m for m in claims.methods(s)}
  low = high = 0.0
  for m in methods.values():
    u = study.run_units(study.run_keys(m, b, tuning=True))
    # Up to 2 edge steps, and where a knob moved, up to 3 inner lrs at it (step 4).
    low, high = low + (5 + check) * u, high + (7 + 3 * (m.knob is not None) + check) * u
  for f in claims.finals(s):
    if f.retune is None:
      continue
    parent = methods.get(f.method) or methods[claims.REFERENCE[0]]
    u = study.run_units({**study.run_keys(parent, b, tuning=True), **f.keys})
    low, high = low + (3 + check) * u, high + (4 + check) * u
  return low, high


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
  if not c['programs'] and not c['elsewhere']:
    print(f'study_cost: no finished runs under {folders[0]}', file=sys.stderr)
    return 1
  hours = lambda u: u * c['per_unit'] / 3600  # noqa: E731
  print(f'{folders[0]}: {c["programs"]} programs on this machine; median '
        f'{c["per_unit"]:.1f} s per unit')
  print(f'  tuning: {c["tuning"]:.1f} units = {hours(c["tuning"]):.2f} h at the median')
  print(f'  finals so far: {c["finals"]:.1f} units = {hours(c["finals"]):.2f} h')
  for host, e in c['elsewhere'].items():
    print(f'  trained on {host}: {e["tuning"]:.1f} units of tuning, {e["finals"]:.1f} of '
          f'finals, in flight {e["in_flight"] / 60:.1f} min there (not in the median)')
  if '--planned' in argv:
    plan = planned_units()
    low, high = planned_tuning_units()
    print(f'  finals planned (launch.claims, full scale): {plan:.1f} units = '
          f'{hours(plan):.2f} h, before the extra seeds of undecided first looks')
    print(f'  tuning planned: {low:.1f}-{high:.1f} units = {hours(low):.2f}-{hours(high):.2f} h;'
          f' with the finals {hours(plan + low):.2f}-{hours(plan + high):.2f} h')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
