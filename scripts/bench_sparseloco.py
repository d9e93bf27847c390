"""Cost of SparseLoCo's communication step against a whole round, on this machine.

Usage: python scripts/bench_sparseloco.py [--preset=tiny] [--workers=8] [--batch=16]
    [--seq=128] [--sync_every=15] [--topk=64] [--repeats=3]

Times, for `--workers` vmapped workers of the model preset: (a) one outer step of
SparseLoCo (error feedback, top-k per 64x64 tile, 2-bit binned quantizer, sparse
all-gather mean, SGD; jitted, on a pseudo-gradient of the model's size) and (b) one
whole round: `--sync_every` training steps of the model (vmapped value_and_grad +
`alg.step`, scanned as the train loop does), the last of which runs the outer step.
Prints both and the fraction (a) / (b); the target is <= 5%.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loco import model as model_lib  # pylint: disable=g-import-not-at-top
from loco.algorithms import optim
from loco.run import step as step_lib
from loco.algorithms.sparseloco import sparseloco, sparseloco_outer
from loco.comm import WorkerContext


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
  """Best wall time of `repeats` calls; `fn` must block until done."""
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='tiny')
  parser.add_argument('--workers', type=int, default=8)
  parser.add_argument('--batch', type=int, default=16)
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--sync_every', type=int, default=15)
  parser.add_argument('--topk', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args(argv)
  m, h = args.workers, args.sync_every

  cfg = model_lib.model_config(args.preset)
  graphdef, params = model_lib.init_params(cfg, jax.random.key(0))
  n = sum(x.size for x in jax.tree.leaves(params))
  print(f'{args.preset}: {n / 1e6:.2f}M params, {m} workers, batch {args.batch} x seq '
        f'{args.seq}, H {h}, top-{args.topk}/4096, 2-bit; '
        f'{jax.device_count()} {jax.devices()[0].platform} device(s)')

  # (a) One outer step on a pseudo-gradient the size of the model.
  outer = sparseloco_outer(topk=args.topk)
  stack = lambda t: jax.tree.map(lambda x: jnp.broadcast_to(x, (m,) + x.shape), t)
  keys = jax.random.split(jax.random.key(1), len(jax.tree.leaves(params)))
  delta = jax.tree.unflatten(jax.tree.structure(params), [
      1e-3 * jax.random.normal(k, (m,) + x.shape) for k, x in
      zip(keys, jax.tree.leaves(params))])
  outer_state = jax.vmap(outer.init)(stack(params))
  outer_step = jax.jit(jax.vmap(
      lambda d, s: outer.update(d, s, context=WorkerContext()), axis_name='workers'))
  start = time.perf_counter()
  jax.block_until_ready(outer_step(delta, outer_state))
  compile_a = time.perf_counter() - start
  seconds_a = _best_seconds(
      lambda: jax.block_until_ready(outer_step(delta, outer_state)), args.repeats)

  # (b) A whole round: H scanned training steps, the last one syncing.
  inner = optim.inner_optimizer(optim.InnerConfig(decay_steps=1000))
  alg = sparseloco(inner, sync_every=h, topk=args.topk)
  state = alg.init(params, m, jax.random.key(2))
  chunk = step_lib.make_train_chunk(alg, cfg, graphdef)
  batches = jax.random.randint(jax.random.key(3), (h, m, args.batch, args.seq + 1), 0,
                               cfg.vocab_size, jnp.int32)
  start = time.perf_counter()
  state, (_, info) = chunk(state, batches)
  jax.block_until_ready(state)
  compile_b = time.perf_counter() - start
  assert int(info.synced.sum()) == 1, 'the round must contain exactly one sync'
  seconds_b = float('inf')
  for _ in range(args.repeats):
    start = time.perf_counter()
    state, (_, info) = chunk(state, batches)
    jax.block_until_ready(state)
    seconds_b = min(seconds_b, time.perf_counter() - start)

  sent = float(info.wire.sent[-1, 0])
  print(f'outer step (EF + top-k + 2-bit + all-gather + SGD): {seconds_a * 1e3:8.1f} ms '
        f'(compile {compile_a:.1f} s)')
  print(f'whole round ({h} steps incl. the sync):            {seconds_b * 1e3:8.1f} ms '
        f'(compile {compile_b:.1f} s)')
  print(f'fraction: {seconds_a / seconds_b:.2%} (target <= 5%); bytes sent per worker per '
        f'sync {sent:,.0f} ({n * 4 / sent:.0f}x less than float32)')


if __name__ == '__main__':
  main()
