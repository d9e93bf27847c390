"""Cost of one sparse gossip mix against one inner step, for many workers on one device.

Usage: python scripts/bench_gossip.py [--workers=64] [--topology=ring] [--preset=tiny]
    [--batch=16] [--seq=128] [--chunk=16] [--repeats=3]

Times, on the worker-stacked params of `--workers` copies of the `--preset` model:
  * one gossip mix as GASLoC runs it at a sync (`comm.gossip(topology, 'models',
    impl='sparse')`: phi = theta - delta, the plan's ppermutes, the Laplacian step),
    vmapped over the worker axis and jitted;
  * one inner step of all workers: value_and_grad of the model at batch x seq per
    worker, then AdamW, vmapped. The workers are processed `--chunk` at a time with
    `lax.map` so that activations fit in memory; on a CPU the work is serial anyway.
and prints both and their ratio (the target is <= 10%). The best of `--repeats` runs
is reported, as in scripts/bench_model.py, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loco import comm  # pylint: disable=g-import-not-at-top
from loco import model as model_lib  # pylint: disable=g-import-not-at-top
from loco import topology as topology_lib  # pylint: disable=g-import-not-at-top


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def _stack(tree: Any, num_workers: int) -> Any:
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_workers,) + x.shape).copy(), tree)


def bench_gossip(params_MxP: Any, topology: str, repeats: int) -> tuple[float, float]:
  """(compile seconds, seconds) of one sparse 'models' gossip mix of all workers."""
  mixer = comm.gossip(topology, 'models', impl='sparse')
  key = jax.random.key(0)

  def worker(delta, theta):
    context = comm.WorkerContext(alive=jnp.ones((), bool), key=key)
    out, state = mixer.update(delta, mixer.init(delta), theta, context=context)
    return out, state.comm.bytes_sent

  mix = jax.jit(jax.vmap(worker, axis_name=comm.WORKERS))
  delta = jax.tree.map(lambda x: 1e-3 * jnp.ones_like(x), params_MxP)
  start = time.perf_counter()
  jax.block_until_ready(mix(delta, params_MxP))
  compile_s = time.perf_counter() - start
  return compile_s, _best_seconds(lambda: mix(delta, params_MxP), repeats)


def bench_inner(cfg: model_lib.ModelConfig, graphdef: Any, params_MxP: Any,
                batch: int, seq: int, chunk: int, repeats: int) -> tuple[float, float]:
  """(compile seconds, seconds) of one AdamW inner step of all workers."""
  tx = optax.adamw(3e-4, b1=0.9, b2=0.95, weight_decay=0.1)
  num_workers = jax.tree.leaves(params_MxP)[0].shape[0]
  if num_workers % chunk:
    raise SystemExit(f'--chunk={chunk} must divide --workers={num_workers}.')
  loss = functools.partial(model_lib.loss_fn, cfg, graphdef)

  def one(params, opt_state, tokens):
    (_, _), grads = jax.value_and_grad(loss, has_aux=True)(params, tokens)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def step(params, opt_state, tokens):
    split = lambda t: jax.tree.map(
        lambda x: x.reshape((num_workers // chunk, chunk) + x.shape[1:]), t)
    merge = lambda t: jax.tree.map(lambda x: x.reshape((num_workers,) + x.shape[2:]), t)
    out = jax.lax.map(lambda a: jax.vmap(one)(*a),
                      (split(params), split(opt_state), split(tokens)))
    return merge(out)

  step = jax.jit(step)
  opt_state = jax.vmap(tx.init)(params_MxP)
  tokens = jax.random.randint(jax.random.key(1), (num_workers, batch, seq + 1), 0,
                              cfg.vocab_size, jnp.int32)
  start = time.perf_counter()
  jax.block_until_ready(step(params_MxP, opt_state, tokens))
  compile_s = time.perf_counter() - start
  return compile_s, _best_seconds(lambda: step(params_MxP, opt_state, tokens), repeats)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workers', type=int, default=64)
  parser.add_argument('--topology', default='ring')
  parser.add_argument('--preset', default='tiny')
  parser.add_argument('--batch', type=int, default=16)
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--chunk', type=int, default=16)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()

  cfg = model_lib.model_config(args.preset)
  graphdef, params = model_lib.init_params(cfg, jax.random.key(0))
  params_MxP = _stack(params, args.workers)
  size = comm.tree_bytes(params)
  topo = topology_lib.make_topology(args.topology, args.workers)
  print(f'backend {jax.default_backend()}, {os.cpu_count()} cpus, jax {jax.__version__}')
  print(f'{args.workers} workers x {model_lib.param_count(cfg):,} params '
        f'({size / 2**20:.1f} MiB each), topology {args.topology} '
        f'({topo.plans[0].num_perms} ppermutes per mix)')
  g_compile, g_seconds = bench_gossip(params_MxP, args.topology, args.repeats)
  print(f'gossip mix (sparse, models): {g_seconds * 1e3:9.1f} ms  (compile {g_compile:.1f} s)')
  i_compile, i_seconds = bench_inner(cfg, graphdef, params_MxP, args.batch, args.seq,
                                     args.chunk, args.repeats)
  print(f'inner step (grad + AdamW):   {i_seconds * 1e3:9.1f} ms  (compile {i_compile:.1f} s, '
        f'batch {args.batch} x seq {args.seq} per worker)')
  print(f'ratio gossip / inner step: {100 * g_seconds / i_seconds:.1f}%  (target <= 10%)')


if __name__ == '__main__':
  main()
