"""Start-up time of a run: process start to the first training step, phase by phase.

  python scripts/bench_startup.py                  # nano, 10 steps, twice (cold, warm)
  python scripts/bench_startup.py --config=experiments/tiny_gasloc.py --set=model.preset=tiny

Each run is a fresh process doing what `python -m loco.main` does (import, load the
config, `train.run`), in a new workdir; the data cache and JAX's compilation cache
(`LOCO_JAX_CACHE`, default ~/.cache/loco/jax) persist between the runs, so the first
run is what a new machine sees and the second what every later start sees. Prints
seconds for: interpreter start, imports, config, init (params and algorithm state),
data (train stream and eval batches), restore (+ config.json), first batch, compile,
first chunk (a log_every chunk of steps), and the total to the first step, then the
end-to-end wall time of the run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ('python', 'imports', 'config', 'init', 'data', 'restore', 'first_batch',
          'compile', 'first_chunk')


def child(spec: str, overrides: dict, workdir: str, t_launch: float) -> None:
  t0 = time.time()
  from loco import configs
  from loco.run import step as step_lib
  from loco.run import train
  t1 = time.time()
  step_lib.enable_compilation_cache()   # as loco.main does
  config = configs.load(spec, overrides)
  timings = {}
  train.run(config, workdir, timings=timings)
  t2 = time.time()
  out = dict(python=t0 - t_launch, imports=t1 - t0, **timings, end_to_end=t2 - t_launch)
  # Throughput after the first chunk: as reported (each record's tokens over its
  # seconds) and from the wall clock (the same tokens over the loop's wall time).
  from loco.files.metrics import read_metrics
  records = read_metrics(workdir)[1:]
  if records:
    tokens = records[-1]['tokens'] - read_metrics(workdir)[0]['tokens']
    reported = sum(r2['tokens'] - r1['tokens'] for r1, r2 in
                   zip(read_metrics(workdir), records)) / sum(
                       (r2['tokens'] - r1['tokens']) / r2['tokens_per_second']
                       for r1, r2 in zip(read_metrics(workdir), records))
    loop = out['end_to_end'] - sum(out.get(p, 0.0) for p in PHASES)
    out.update(reported_tokens_per_second=reported, wall_tokens_per_second=tokens / loop)
  print('TIMINGS ' + json.dumps(out))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--config', default='experiments/tiny_ddp.py')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='config overrides (default: the nano model, 4 x 64 tokens)')
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--runs', type=int, default=2)
  parser.add_argument('--child', nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    spec, overrides, workdir = args.child
    child(spec, json.loads(overrides), workdir, float(os.environ['LOCO_T_LAUNCH']))
    return
  sets = dict(item.split('=', 1) for item in args.set) or {
      'model.preset': 'nano', 'batch_per_worker': '4', 'seq_len': '64'}
  overrides = json.dumps({**sets, 'steps': str(args.steps),
                          'log_every': str(min(10, args.steps)), 'eval.every': '0',
                          'checkpoint.every': '0', 'progress': 'false'})
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(args.runs):
      env = dict(os.environ, LOCO_T_LAUNCH=repr(time.time()))
      out = subprocess.run(
          [sys.executable, __file__, '--child', args.config, overrides,
           os.path.join(tmp, f'run{i}')], env=env, cwd=REPO, capture_output=True, text=True)
      if out.returncode:
        sys.exit(out.stderr[-3000:])
      line = [x for x in out.stdout.splitlines() if x.startswith('TIMINGS ')][-1]
      rows.append(json.loads(line[len('TIMINGS '):]))
  print(f'{args.config} {sets}, {args.steps} steps: seconds per phase (run 1: first start on '
        'this machine\'s caches as they were; later runs: warm caches)')
  print(f'{"phase":<22}' + ''.join(f'{"run " + str(i + 1):>10}' for i in range(len(rows))))
  for phase in PHASES:
    print(f'{phase:<22}' + ''.join(f'{r.get(phase, 0.0):10.2f}' for r in rows))
  first_step = [sum(r.get(p, 0.0) for p in PHASES[:-1]) for r in rows]
  print(f'{"to the first step":<22}' + ''.join(f'{t:10.2f}' for t in first_step))
  print(f'{"end to end":<22}' + ''.join(f'{r["end_to_end"]:10.2f}' for r in rows))
  for key in ('reported_tokens_per_second', 'wall_tokens_per_second'):
    if all(key in r for r in rows):
      print(f'{key.replace("_tokens_per_second", " tok/s"):<22}'
            + ''.join(f'{r[key]:10,.0f}' for r in rows))


if __name__ == '__main__':
  main()
