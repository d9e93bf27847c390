"""Cost of a Streaming DiLoCo round against a DiLoCo round of the same H.

  python scripts/bench_streaming.py [--workers=4 --batch=8 --sync_every=50]

Every variant runs the train loop's own jitted chunk (lax.scan over H steps of vmapped
value_and_grad + Algorithm.step, state donated) on the tiny preset, so a chunk is one
round: DiLoCo syncs once (float32 all-reduce, Nesterov, reset); Streaming DiLoCo syncs
each of its 5 fragments once (4 blocks + the embedding), each with its own outer step
and a merge one step later. Two streaming variants: the paper's (E3M0 quantize-dequantize
twice per sync, the simulation's extra work) and float32 on the wire, which isolates the
fragment schedule. The variants are timed in turn, best of --repeats. Target: the
schedule adds <= 5% to the round.
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
_H = flags.DEFINE_integer('sync_every', 50, 'Inner steps per round (H).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed rounds per variant (best is kept).')

VARIANTS = {
    'diloco': ('diloco', {}),
    'streaming (e3m0)': ('streaming_diloco', {}),
    'streaming (float32)': ('streaming_diloco', {'compression': 'none'}),
}


def build(name: str, kwargs: dict):
  cfg = model.model_config('tiny', vocab_size=257)
  graphdef, params = model.init_params(cfg, jax.random.key(0))
  inner = optim.inner_optimizer(optim.InnerConfig())
  alg = algorithms.make(name, inner, sync_every=_H.value, **kwargs)
  chunk = step_lib.make_train_chunk(alg, cfg, graphdef)
  state = alg.init(params, _WORKERS.value, jax.random.key(1))
  return chunk, state


def main(argv):
  del argv
  rng = np.random.default_rng(0)
  batches = rng.integers(0, 257, (_H.value, _WORKERS.value, _BATCH.value, _SEQ.value + 1),
                         dtype=np.int32)
  valid = np.ones(_H.value, bool)
  runs = {}
  for label, (name, kwargs) in VARIANTS.items():
    chunk, state = build(name, kwargs)
    state, out = chunk(state, batches, None, valid)   # compile + warm up
    jax.block_until_ready(out)
    syncs = int(np.asarray(out[1].synced).sum())
    runs[label] = [chunk, state, float('inf'), syncs]
  for _ in range(_REPEATS.value):                 # interleaved: load drifts hit all alike
    for run in runs.values():
      chunk, state = run[0], run[1]
      t0 = time.perf_counter()
      state, out = chunk(state, batches, None, valid)
      jax.block_until_ready((state, out))
      run[1], run[2] = state, min(run[2], time.perf_counter() - t0)
  base = runs['diloco'][2]
  print(f'tiny preset, {_WORKERS.value} workers x {_BATCH.value} x {_SEQ.value} tokens, '
        f'H={_H.value}, best of {_REPEATS.value}')
  for label, (_, _, seconds, syncs) in runs.items():
    print(f'{label:>20}: {seconds:7.3f} s per round ({syncs} syncs)   '
          f'ratio {seconds / base:.4f}')
  print('target: ratio <= 1.05')


if __name__ == '__main__':
  app.run(main)
