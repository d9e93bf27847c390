"""Does a pick hold at its own knob? The protocol tunes coordinate-wise: the inner lr over
its grid at the knob's first value, then the knob at the chosen inner lr. Where the knob
moved away from that first value, the inner lr was never tried at the picked knob. This
check trains the pick's knob at each inner lr of the grid the method tried (tuning seed,
tuning split, the page's own run settings) and says whether the pick's inner lr is still
the best there.

  python scripts/coordinate_check.py [--out=runs/claims70] [--methods=a,b,...]
      [--page_only] [--batch_runs=3]

The runs go to OUT/coordinate_check/METHOD/LABEL (the tuning runs' names); the picks and
the finals are not changed. Default methods: the reference DiLoCo family (every claim is
tested against its best member; claim 2 against its SGD member). Prints one row per
method: the knob value the inner lr was tuned at, the pick, the loss of each inner lr at
the picked knob, and whether the pick holds.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import claims  # noqa: E402
from loco import cli  # noqa: E402
from loco.errors import LocoError  # noqa: E402
from loco.lab import study  # noqa: E402
from loco.lab import sweep  # noqa: E402


def plan(picks, methods):
  """Per method: (method, the knob key, its first value, the pick's setting, the inner lrs
  the method tried, the settings to check: the picked knob at each inner lr)."""
  rows = []
  for m in methods:
    p = picks[m.name]
    if m.knob is None:
      continue
    key = m.knob.key
    lrs = sorted({s[study.LR] for s, _ in p['tried']})
    k0 = m.knob.values[1]          # step 1 tunes the inner lr at the knob's middle value
    checks = [{study.LR: lr, key: p['setting'][key]} for lr in lrs]
    rows.append((m, key, k0, p['setting'], lrs, checks))
  return rows


def main(argv=None) -> int:
  parser = cli.Parser(prog='python scripts/coordinate_check.py', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', default=os.path.join('runs', 'claims70'))
  parser.add_argument('--methods', default=','.join(claims.REFERENCE),
                      help='comma-separated methods of the claims page (default: the '
                      'reference family)')
  parser.add_argument('--page_only', action='store_true', help='train nothing; print '
                      'what the finished check runs say')
  parser.add_argument('--batch_runs', type=cli.positive_int, default=3)
  args = parser.parse_args(argv)

  def body() -> int:
    scale = claims.SCALES['full']
    budget = scale.budget
    every = {m.name: m for m in claims.methods(scale)}
    names = [n for n in args.methods.split(',') if n]
    unknown = [n for n in names if n not in every]
    if unknown:
      raise LocoError(f'--methods: {", ".join(unknown)} not among the claims page\'s '
                      f'methods ({", ".join(sorted(every))})')
    if not os.path.isdir(os.path.join(args.out, 'tune')):
      raise LocoError(f'{args.out}/tune does not exist: the claims page\'s tuning runs are '
                      'read from there')
    picks = study.tune(args.out, list(every.values()), budget, train=False,
                       finals=claims.finals(scale), families=scale.plan.families)
    rows = plan(picks, [every[n] for n in names])
    folder = os.path.join(args.out, 'coordinate_check')
    tried = {m.name: {study.label(s): loss for s, loss in picks[m.name]['tried']}
             for m, *_ in rows}
    runs = [study.tuning_run(m, budget, s) for m, _, _, _, _, checks in rows
            for s in checks if study.label(s) not in tried[m.name]]
    if runs and not args.page_only:
      code = sweep.run_sweep(runs, folder, report=False, batch_runs=args.batch_runs)
      study.drop_checkpoints(folder, [r.name for r in runs])
      if code == 130:
        raise KeyboardInterrupt
    print('| method | inner lr tuned at | pick | at the picked knob: loss per inner lr '
          '(seed 0, tuning split) | the pick holds |')
    print('|---|---|---|---|---|')
    for m, key, k0, setting, lrs, checks in rows:
      losses = [tried[m.name][study.label(s)] if study.label(s) in tried[m.name] else
                study.tuning_score(os.path.join(folder, m.name, study.label(s)))
                for s in checks]
      cells = [f'{s[study.LR]:g}: ' + ('not run' if x is None else f'{x:.4f}')
               for s, x in zip(checks, losses)]
      best = None if None in losses else min(zip(losses, (s[study.LR] for s in checks)))
      holds = ('—' if best is None else 'yes' if best[1] == setting[study.LR] else
               f'no: inner lr {best[1]:g} is better ({best[0]:.4f})')
      print(f'| {m.name} | {key.split(".")[-1]} {k0:g} | {study.label(setting)} | '
            f'{", ".join(cells)} | {holds} |')
    return 0

  return cli.run('coordinate_check', body)


if __name__ == '__main__':
  cli.exit(main())
