"""Cost of a DiLoCo round against the same inner steps without any sync.

  python scripts/bench_diloco_round.py [--workers=4 --batch=8 --sync_every=50]

Both runs use the train loop's own jitted chunk (lax.scan over H steps of vmapped
value_and_grad + Algorithm.step, state donated) on the tiny preset; the only difference
is whether the outer step (pseudo-gradient, all-reduce, Nesterov, reset) fires at the
end of the chunk. Target: ratio <= 1.05.
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
from loco.algorithms import optim
from loco.run import step as step_lib  # noqa: E402

_WORKERS = flags.DEFINE_integer('workers', 4, 'Simulated workers.')
_BATCH = flags.DEFINE_integer('batch', 8, 'Sequences per worker per step.')
_SEQ = flags.DEFINE_integer('seq_len', 128, 'Tokens per sequence.')
_H = flags.DEFINE_integer('sync_every', 50, 'Inner steps per round.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed rounds per variant (best is kept).')


def time_round(sync_every: int) -> float:
  cfg = model.model_config('tiny', vocab_size=257)
  graphdef, params = model.init_params(cfg, jax.random.key(0))
  inner = optim.inner_optimizer(optim.InnerConfig())
  alg = algorithms.make('diloco', inner, sync_every=sync_every)
  chunk = step_lib.make_train_chunk(alg, cfg, graphdef)
  state = alg.init(params, _WORKERS.value, jax.random.key(1))
  rng = np.random.default_rng(0)
  batches = rng.integers(0, 257, (_H.value, _WORKERS.value, _BATCH.value, _SEQ.value + 1),
                         dtype=np.int32)
  state, out = chunk(state, batches)              # compile + warm up
  jax.block_until_ready(out)
  best = float('inf')
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    state, out = chunk(state, batches)
    jax.block_until_ready((state, out))
    best = min(best, time.perf_counter() - t0)
  assert bool(out[1].synced[-1]) == (sync_every == _H.value)
  return best


def main(argv):
  del argv
  local = time_round(10 ** 9)
  diloco = time_round(_H.value)
  print(f'tiny preset, {_WORKERS.value} workers x {_BATCH.value} x {_SEQ.value} tokens, '
        f'H={_H.value}')
  print(f'{_H.value} local inner steps (no sync): {local:.3f} s')
  print(f'one DiLoCo round (H={_H.value}, outer step + all-reduce): {diloco:.3f} s')
  print(f'ratio: {diloco / local:.4f} (target <= 1.05)')


if __name__ == '__main__':
  app.run(main)
