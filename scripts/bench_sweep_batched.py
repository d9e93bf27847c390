"""A sweep end to end: R runs as R `loco.main` processes against `--batch_runs=R`.

  python scripts/bench_sweep_batched.py [--preset=micro --runs=3,9 --steps=150]
  python scripts/bench_sweep_batched.py --preset=tiny --runs=4 --steps=60 --seq_len=128

Each run is the claims page's shape on the embedded corpus: DiLoCo (H = 15, Nesterov
0.5) on 8 workers x 4 sequences, with its own seed, inner lr and outer lr (three values
each, cycling), evaluating and checkpointing at its end. The wall time of
`python -m loco.sweep SPEC --out=... --no_report` is measured whole (start-up, data,
compilation, training, eval, checkpoints), each case with an empty compilation cache
(what a sweep of new settings pays); tokens/s = every run's training tokens / wall.
"""

import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_PRESET = flags.DEFINE_string('preset', 'micro', 'Model preset.')
_RUNS = flags.DEFINE_list('runs', ['3', '9'], 'Run counts R.')
_STEPS = flags.DEFINE_integer('steps', 150, 'Steps per run.')
_SEQ = flags.DEFINE_integer('seq_len', 64, 'Tokens per sequence.')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M, B, H = 8, 4, 15

_SPEC = """
from loco.lab.sweep import Run


def get_sweep():
  common = {{'model.preset': {preset!r}, 'num_workers': {M}, 'batch_per_worker': {B},
            'seq_len': {seq}, 'steps': {steps}, 'algorithm.name': 'diloco',
            'algorithm.sync_every': {H}, 'algorithm.outer_optimizer': 'nesterov',
            'algorithm.outer_momentum': 0.5, 'eval.every': {steps},
            'checkpoint.every': {steps}, 'log_every': {H}, 'progress': False}}
  return [Run(f'r{{i}}', 'experiments/micro.py:ddp',
              {{**common, 'seed': i, 'optimizer.lr': 1.5e-3 * (1 + i % 3),
               'algorithm.outer_lr': 0.5 + 0.25 * (i // 3 % 3)}})
          for i in range({runs})]
"""


def sweep_seconds(runs: int, batch: int, folder: str) -> float:
  spec = os.path.join(folder, f'spec{runs}.py')
  with open(spec, 'w') as f:
    f.write(_SPEC.format(preset=_PRESET.value, M=M, B=B, H=H, seq=_SEQ.value,
                         steps=_STEPS.value, runs=runs))
  out = os.path.join(folder, f'out_r{runs}_b{batch}')
  env = {**os.environ, 'LOCO_JAX_CACHE': os.path.join(folder, f'cache_r{runs}_b{batch}')}
  t = time.perf_counter()
  done = subprocess.run([sys.executable, '-m', 'loco.sweep', spec, f'--out={out}',
                         '--no_report', f'--batch_runs={batch}'], cwd=REPO, env=env,
                        capture_output=True, text=True)
  seconds = time.perf_counter() - t
  if done.returncode:
    sys.exit(f'the sweep failed:\n{done.stdout}\n{done.stderr}')
  return seconds


def main(argv):
  del argv
  tokens_per_run = _STEPS.value * M * B * _SEQ.value
  print(f'{_PRESET.value}, {_STEPS.value} steps per run, {M} workers x {B} x '
        f'{_SEQ.value} tokens; wall of the whole sweep, an empty compilation cache each')
  print(f'{"runs":>5} {"processes (s)":>14} {"batched (s)":>12} {"tok/s processes":>16} '
        f'{"tok/s batched":>14} {"speed-up":>9}')
  with tempfile.TemporaryDirectory() as folder:
    for runs in map(int, _RUNS.value):
      alone = sweep_seconds(runs, 1, folder)
      together = sweep_seconds(runs, runs, folder)
      tokens = runs * tokens_per_run
      print(f'{runs:>5} {alone:>14.1f} {together:>12.1f} {tokens / alone:>16.0f} '
            f'{tokens / together:>14.0f} {alone / together:>8.2f}x', flush=True)


if __name__ == '__main__':
  app.run(main)
