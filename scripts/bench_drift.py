"""Step-time cost of the drift diagnostics (`metrics.diagnostics`): the train loop's own
jitted chunk with them on and off.

  python scripts/bench_drift.py [--presets=micro,tiny --algorithms=diloco,gasloc
                                 --sync_every=1,10 --workers=8 --batch=4 --steps=20]

For each model preset, algorithm and H, the chunk (lax.scan over `steps` steps of
vmapped value_and_grad + Algorithm.step, state donated) is compiled twice, built with
and without the diagnostics; the two are timed in alternation (`repeats` times each,
the best kept) and the script prints the seconds per step of each and their ratio.
H = 1 syncs every step: the diagnostics' worst case. Then, per preset, the diagnostics
alone: one sync's measurement of the whole model (`drift.measure_stacked`, jitted), in
seconds, against the same chunk's seconds per step without them.
"""

import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from loco import algorithms, model  # noqa: E402
from loco.comm import axis
from loco.algorithms import optim
from loco.comm import drift  # noqa: E402
from loco.run import step as step_lib  # noqa: E402

_PRESETS = flags.DEFINE_list('presets', ['micro', 'tiny'], 'Model presets.')
_ALGORITHMS = flags.DEFINE_list('algorithms', ['diloco', 'gasloc'], 'Algorithms with rounds.')
_H = flags.DEFINE_list('sync_every', ['1', '10'], 'Inner steps per round (H).')
_WORKERS = flags.DEFINE_integer('workers', 8, 'Simulated workers.')
_BATCH = flags.DEFINE_integer('batch', 4, 'Sequences per worker per step.')
_SEQ = flags.DEFINE_integer('seq_len', 128, 'Tokens per sequence.')
_STEPS = flags.DEFINE_integer('steps', 20, 'Steps per timed chunk.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed chunks per variant (best is kept).')


def _chunk(preset: str, name: str, sync_every: int, diagnostics: bool):
  """(run once: seconds) for the chunk of `name` built with or without diagnostics."""
  cfg = model.model_config(preset, vocab_size=257)
  graphdef, params = model.init_params(cfg, jax.random.key(0))
  inner = optim.inner_optimizer(optim.InnerConfig(decay_steps=10 ** 6))
  alg = algorithms.make(name, inner, sync_every=sync_every, diagnostics=diagnostics)
  chunk = step_lib.make_train_chunk(alg, cfg, graphdef)
  k, m = _STEPS.value, _WORKERS.value
  batches = np.random.default_rng(0).integers(
      0, 257, (k, m, _BATCH.value, _SEQ.value + 1), dtype=np.int32)
  valid = np.ones((k,), bool)
  holder = [alg.init(params, m, jax.random.key(1))]

  def run() -> float:
    t0 = time.perf_counter()
    holder[0], out = chunk(holder[0], batches, None, valid)
    jax.block_until_ready((holder[0], out))
    return time.perf_counter() - t0

  run()                                   # compile and warm up
  return run


def _measure_alone(preset: str) -> float:
  """Seconds of one sync's diagnostics of `preset` on M workers (best of `repeats`)."""
  cfg = model.model_config(preset, vocab_size=257)
  params = jax.tree.leaves(model.init_params(cfg, jax.random.key(0))[1])
  m = _WORKERS.value
  keys = jax.random.split(jax.random.key(1), len(params))
  x = [axis.replicate(p, m) + 0.01 * jax.random.normal(k, (m,) + p.shape)
       for p, k in zip(params, keys)]
  a = [axis.replicate(p, m).astype(np.float32) for p in params]
  fn = jax.jit(drift.measure_stacked)
  part = np.ones((m,), bool)
  jax.block_until_ready(fn(x, a, part))
  best = float('inf')
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x, a, part))
    best = min(best, time.perf_counter() - t0)
  return best


def main(argv):
  del argv
  print(f'{_WORKERS.value} workers x {_BATCH.value} x {_SEQ.value} tokens, {_STEPS.value} '
        f'steps per chunk, best of {_REPEATS.value}; backend {jax.default_backend()}, '
        f'{len(jax.devices())} device(s)')
  print(f'{"preset":<7}{"algorithm":<10}{"H":>4}{"off s/step":>13}{"on s/step":>13}'
        f'{"on/off":>9}')
  for preset in _PRESETS.value:
    for name in _ALGORITHMS.value:
      for h in map(int, _H.value):
        runs = {on: _chunk(preset, name, h, on) for on in (False, True)}
        best = {on: float('inf') for on in runs}
        for _ in range(_REPEATS.value):
          for on, run in runs.items():       # alternated, so load changes hit both
            best[on] = min(best[on], run())
        off, on = (best[x] / _STEPS.value for x in (False, True))
        print(f'{preset:<7}{name:<10}{h:>4}{off:>13.5f}{on:>13.5f}{on / off:>9.3f}',
              flush=True)
  for preset in _PRESETS.value:
    print(f'{preset}: one sync\'s diagnostics alone, {_WORKERS.value} workers: '
          f'{_measure_alone(preset):.4f} s', flush=True)


if __name__ == '__main__':
  app.run(main)
