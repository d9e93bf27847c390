"""DDP as 1 worker x 32 rows against 8 workers x 4 rows, under each batch layout.

  python -m launch.batch_shapes --out=runs/batch_shapes [--samplings=stream,windows]
      [--seeds=1,2,3] [--steps=720] [--batch_runs=3]

DDP averages the workers' gradients every step, so M workers x B rows and one worker x
M B rows take the same update from the same rows: only which rows a step reads can make
them differ. Under the stream layout (`data.sampling='stream'`) a 1 x 32 step reads about
one document and an 8 x 4 step about eight; under independent windows (the default)
both read about 32. This trains both shapes at equal tokens under each layout, with the
micro scaling study's DDP (`python -m launch.scaling --preset=micro`: the micro model,
32 x 64 tokens a step, its picked inner lr 1.5e-3, warm-up a sixth of the run), at the
same seeds (paired: a seed fixes the initialisation), scores every final with
`loco.evaluate` on validation[50%:] (512 batches of 16), and writes OUT/batch_shapes.md:
per layout, 8 x 4 minus 1 x 32 with its paired 95% CI over seeds. Resumable: the same
command skips finished runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from loco import cli
from loco.lab import study
from loco.errors import LocoError
from loco.lab.study import Final, Method

PROG = 'python -m launch.batch_shapes'
BASE = 'experiments/micro.py:ddp'
SHAPES = ((1, 32), (8, 4))
LR = 1.5e-3       # the micro scaling study's DDP pick (docs/scaling/micro.md)


def _name(sampling: str, m: int, b: int) -> str:
  return f'ddp_{m}x{b}_{sampling}'


def plan(samplings, seeds, steps) -> tuple[list[Method], list[Final], study.Budget]:
  methods = [Method(_name(s, m, b), {'num_workers': m, 'batch_per_worker': b,
                                     'data.sampling': s})
             for s in samplings for m, b in SHAPES]
  common = {'model.preset': 'micro', 'seq_len': 64, 'eval.batches': 32,
            'eval.batch_size': 16, 'eval.per_worker': False, 'eval.every': steps // 4,
            'log_every': 30, 'checkpoint.every': steps // 2, 'progress': False}
  budget = study.Budget(base=BASE, steps=steps, steps_h1=steps, common=common,
                        inner_lrs=(LR, LR, LR), seeds=tuple(seeds))
  return methods, [Final(m.name, m.name) for m in methods], budget


def page(samplings, groups, budget, seconds) -> str:
  rows = ['| layout | 1 x 32 | 8 x 4 | 8 x 4 - 1 x 32 (paired by seed) | verdict |',
          '|---|---|---|---|---|']
  for s in samplings:
    a, b = groups.get(_name(s, *SHAPES[1])), groups.get(_name(s, *SHAPES[0]))
    if a is None or b is None:
      rows.append(f'| {s} | not run | not run | | |')
      continue
    c = study.compare(a, b)
    ci = c.ci
    verdict = ('—' if ci is None else 'equal within seed noise' if ci[0] <= 0 <= ci[1]
               else '8 x 4 lower' if ci[1] < 0 else '8 x 4 higher')
    rows.append(f'| {s} | {b.text()} ({b.per_seed()}) | {a.text()} ({a.per_seed()}) | '
                f'{c.text()} | {verdict} |')
  return '\n'.join([
      '# DDP as 1 x 32 and as 8 x 4: the batch layout, not the algorithm', '',
      f'`{PROG}` ({seconds / 60:.0f} minutes of runs on this machine). Micro model, '
      f'{budget.steps} steps x 32 x 64 tokens (the micro scaling study\'s DDP, inner lr '
      f'{LR:g}), seeds {list(budget.seeds)}; final eval loss (nats/token) on '
      f'{budget.final_split}, {budget.score_batches} batches of 16 windows, mean ± std '
      '(per seed).', '', *rows, '',
      'DDP averages gradients, so both shapes take the same update from the same rows. '
      "Under `data.sampling='stream'` a 1 x 32 step reads about one document and an "
      "8 x 4 step about eight (scripts/batch_documents.py); under `'windows'` both read "
      'about 32.', ''])


def main(argv: list[str] | None = None) -> int:
  parser = cli.Parser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', required=True)
  parser.add_argument('--samplings', default='stream,windows')
  parser.add_argument('--seeds', default='1,2,3')
  parser.add_argument('--steps', type=cli.positive_int, default=720)
  parser.add_argument('--batch_runs', type=cli.positive_int, default=3)
  parser.add_argument('--parallel', type=cli.positive_int, default=1)
  args = parser.parse_args(argv)
  samplings = args.samplings.split(',')
  if not samplings or not set(samplings) <= {'stream', 'windows'}:
    parser.error(f'--samplings {args.samplings!r}: choose from stream,windows')
  try:
    seeds = [int(s) for s in args.seeds.split(',')]
  except ValueError:
    parser.error(f'--seeds {args.seeds!r} is not a list of whole numbers like 1,2,3')
  if args.steps % 120:
    parser.error(f'--steps {args.steps} must be a multiple of 120 (an eval every '
                 'quarter, on a log step: every 30 steps)')

  def body() -> int:
    cli.check_output_dir(args.out)
    methods, finals, budget = plan(samplings, seeds, args.steps)
    picks = {m.name: dict(setting={study.LR: LR}) for m in methods}
    clock = os.path.join(args.out, 'seconds.json')
    t0 = time.time()
    with study.clocked(clock):
      runs = study.final_runs(methods, finals, budget, picks, args.out)
      code = study.run_sweep(runs, os.path.join(args.out, 'final'), args.parallel,
                             report=False, batch_runs=args.batch_runs)
      if code == 130:
        raise KeyboardInterrupt
      if code:
        raise LocoError(f'some runs failed (see {os.path.join(args.out, "final")}).')
      study.score_finals(args.out, finals, budget)
    groups = study.groups(args.out, finals, budget)
    text = page(samplings, groups, budget, study.read_seconds(clock, time.time() - t0))
    with open(os.path.join(args.out, 'batch_shapes.md'), 'w') as f:
      f.write(text)
    print(text)
    return 0

  return cli.run(PROG, body)


if __name__ == '__main__':
  cli.exit(main())
