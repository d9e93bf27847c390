"""Training tokens per second under each batch layout (data.sampling), paired.

  python scripts/bench_sampling.py [--configs=experiments/tiny_ddp.py,experiments/micro.py:ddp]
      [--steps=120] [--log_every=20] [--repeats=2]

Each run is a fresh `python -m loco.main` process on the config with `--steps` steps,
no evals and no checkpoints, in a new workdir, under `data.sampling=stream` (the old
layout) and `windows` (the default), in the order A B B A per repeat so that a drift in
the machine's load falls on both. A run's tokens/s is the median of its metrics rows'
`tokens_per_second` after the first (which holds the compilation). Prints, per config,
each layout's tokens/s (median over repeats) and windows / stream.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(config: str, sampling: str, steps: int, log_every: int, tmp: str) -> float:
  workdir = tempfile.mkdtemp(dir=tmp)
  cmd = [sys.executable, '-m', 'loco.main', f'--config={config}', f'--workdir={workdir}',
         f'--config.steps={steps}', f'--config.log_every={log_every}',
         '--config.eval.every=0', '--config.checkpoint.every=0',
         '--config.progress=False', f'--config.data.sampling={sampling}']
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  if done.returncode:
    raise SystemExit(f'bench_sampling: {" ".join(cmd[2:])} failed:\n{done.stderr[-2000:]}')
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  rates = [r['tokens_per_second'] for r in rows if 'tokens_per_second' in r][1:]
  return statistics.median(rates)


def main() -> None:
  sys.path.insert(0, REPO)
  from loco import cli  # pylint: disable=g-import-not-at-top
  parser = cli.Parser(prog='scripts/bench_sampling.py', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--configs', default='experiments/tiny_ddp.py,experiments/micro.py:ddp')
  parser.add_argument('--steps', type=int, default=120)
  parser.add_argument('--log_every', type=int, default=20)
  parser.add_argument('--repeats', type=int, default=2)
  args = parser.parse_args()
  if args.steps < 2 * args.log_every or args.steps % args.log_every or args.repeats < 1:
    parser.error('--steps must be a multiple of --log_every and at least two of them; '
                 '--repeats at least 1')
  print('| config | stream tok/s | windows tok/s | windows / stream | runs |')
  print('|---|---|---|---|---|')
  with tempfile.TemporaryDirectory(prefix='loco-bench-sampling-') as tmp:
    for config in args.configs.split(','):
      rates = {'stream': [], 'windows': []}
      for r in range(args.repeats):
        order = ('stream', 'windows') if r % 2 == 0 else ('windows', 'stream')
        for sampling in order + order[::-1]:
          rates[sampling].append(one_run(config, sampling, args.steps, args.log_every, tmp))
      s, w = statistics.median(rates['stream']), statistics.median(rates['windows'])
      print(f'| {config} | {s:,.0f} | {w:,.0f} | {w / s:.3f} | '
            f'{len(rates["stream"])} + {len(rates["windows"])} |', flush=True)


if __name__ == '__main__':
  main()
