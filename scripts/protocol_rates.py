"""The error rates of the study protocol's two rules, by simulation (loco.lab.study).

  python scripts/protocol_rates.py [--trials=200000]

1. The two-look seed rule (`study.sequential`, `study.two_look_rates`): per-seed
   differences at exactly the margin (the boundary of both hypotheses; a t test's level
   does not depend on the spread), 3 seeds then 2 more where the first look straddles.
   Prints how often the claim is passed ('reproduced') and refuted at each look level:
   Pocock's per-look 1.4% (`study.LOOK_ALPHA`) and, for contrast, two 95% looks.
2. The pick rule with a check seed (`study.pick_checked`): five outer lrs whose loss
   falls towards the largest, the largest diverging with probability q per seed. Prints
   how often the risky setting is kept, how often the pick is flagged, and false alarms
   (a pass or a flag where nothing diverged).
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loco.lab import study  # noqa: E402


def two_looks(trials: int) -> None:
  rng = np.random.default_rng(0)
  d = rng.standard_normal((trials, 3 + study.MORE_SEEDS))
  print(f'two-look seed rule, {trials:,} comparisons at the margin:')
  for name, alpha in (('Pocock, each look at 97.2%', study.LOOK_ALPHA),
                      ('two 95% looks', 0.025)):
    accepted, refuted = study.two_look_rates(d, alpha)
    print(f'  {name}: passed {accepted.mean():.2%}, refuted {refuted.mean():.2%} '
          f'(one look at 3 seeds: 2.50% each)')


def pick_rule(trials: int) -> None:
  rng = np.random.default_rng(0)
  key = study.OUTER_LR
  wanted = [{study.LR: 3e-3, key: v} for v in (0.25, 0.5, 1.0, 2.0, 4.0)]
  print(f'pick rule with a check seed, {trials:,} landscapes per risk q:')
  for q in (0.0, 0.1, 0.2, 0.5):
    kept = flagged = alarms = 0
    for _ in range(trials):
      losses = [2.0 + 0.05 * (4 - i) + rng.normal(0, 0.005) for i in range(5)]
      div0, div1 = rng.random() < q, rng.random() < q
      known = {study.label(s): math.inf if i == 4 and div0 else x
               for i, (s, x) in enumerate(zip(wanted, losses))}
      checked = {study.label(s): math.inf if i == 4 and div1 else x + 0.01
                 for i, (s, x) in enumerate(zip(wanted, losses))}
      _, pick = study.pick_checked(wanted, known, checked, key)
      kept += pick['setting'][key] == 4.0
      flagged += bool(pick['flag'])
      alarms += bool(pick['flag'] or pick['passed']) and not (div0 or div1)
    print(f'  q = {q:g}: risky setting kept {kept / trials:.1%} (one seed: {1 - q:.0%}), '
          f'pick flagged {flagged / trials:.1%}, false alarms {alarms}')


def main(argv: list[str]) -> int:
  trials = 200_000
  for a in argv:
    if not a.startswith('--trials=') or not a[9:].isdigit() or int(a[9:]) < 100:
      print('usage: python scripts/protocol_rates.py [--trials=N], N >= 100',
            file=sys.stderr)
      return 2
    trials = int(a[9:])
  two_looks(trials)
  pick_rule(min(trials, 20_000))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
