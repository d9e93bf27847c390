"""Cost of one sparse gossip mix against one inner step, for many workers on one device.

Usage: python scripts/bench_gossip.py [--workers=64] [--topology=ring] [--preset=tiny]
    [--batch=16] [--seq=128] [--chunk=16] [--repeats=3]
       python scripts/bench_gossip.py --partner [--workers=8,16] [--size=1000000]

Times, on the worker-stacked params of `--workers` copies of the `--preset` model:
  * one gossip mix as GASLoC runs it at a sync (`comm.gossip(topology, 'models',
    impl='sparse')`: phi = theta - delta, the plan's ppermutes, the Laplacian step),
    vmapped over the worker axis and jitted;
  * one inner step of all workers: value_and_grad of the model at batch x seq per
    worker, then AdamW, vmapped. The workers are processed `--chunk` at a time with
    `lax.map` so that activations fit in memory; on a CPU the work is serial anyway.
and prints both and their ratio (the target is <= 10%). The best of `--repeats` runs
is reported, as in scripts/bench_model.py, since the machine may be shared.

With --partner: the ways to mix with a per-tick matrix W under vmap on one device
(`--size` float32 parameters per worker, W a pairwise matching with one pair left
out), each jitted, with its time, the compiled temp memory and the largest array op
in the HLO: the row of W against `x[None] - all_gather(x)` (O(M^2 P) memory), a
scan over the senders, `all_gather` + a dynamic index of the partner, `all_gather`
+ a one-hot contraction, M - 1 static shifts + `lax.switch`, and `comm.gossip` with
the per-tick matrix (pairwise: the partner gather; a dense W: the scan).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loco import comm  # pylint: disable=g-import-not-at-top
from loco import model as model_lib  # pylint: disable=g-import-not-at-top
from loco.comm import topology as topology_lib  # pylint: disable=g-import-not-at-top


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
    return out, state.comm.sent

  mix = jax.jit(jax.vmap(worker, axis_name=comm.WORKERS))
  delta = jax.tree.map(lambda x: 1e-3 * jnp.ones_like(x), params_MxP)
  start = time.perf_counter()
  jax.block_until_ready(mix(delta, params_MxP))
  compile_s = time.perf_counter() - start
  return compile_s, _best_seconds(lambda: mix(delta, params_MxP), repeats)


def _pairwise_matrix(m: int) -> jax.Array:
  perm = np.random.default_rng(0).permutation(m)
  w = np.eye(m, dtype=np.float32)
  for a, b in zip(perm[0:m - 2:2], perm[1:m - 2:2]):     # one pair sits out
    w[a, a] = w[b, b] = w[a, b] = w[b, a] = 0.5
  return jnp.asarray(w)


def _partner_formulations():
  """Per-worker `residual = sum_j W_ij (x_i - x_j)` for a pairwise W, several ways."""
  def row(w):
    i = jax.lax.axis_index(comm.WORKERS)
    w_in = jnp.where(jnp.arange(w.shape[0]) != i, w[i], 0.0)
    return i, w_in, jnp.argmax(w_in > 0)

  def dense_differences(x, w):
    _, w_in, _ = row(w)
    return jnp.tensordot(w_in, x[None] - jax.lax.all_gather(x, comm.WORKERS), axes=1)

  def scan_senders(x, w):
    _, w_in, _ = row(w)
    step = lambda r, wg: (r + wg[0] * (x - wg[1]), None)
    return jax.lax.scan(step, jnp.zeros_like(x),
                        (w_in, jax.lax.all_gather(x, comm.WORKERS)))[0]

  def gather_index(x, w):
    _, w_in, p = row(w)
    return w_in[p] * (x - jax.lax.all_gather(x, comm.WORKERS)[p])

  def gather_one_hot(x, w):
    _, w_in, p = row(w)
    g = jax.lax.all_gather(x, comm.WORKERS)
    return w_in[p] * (x - jnp.tensordot(jax.nn.one_hot(p, w.shape[0]), g, axes=1))

  def shifts(x, w):
    i, w_in, p = row(w)
    m = w.shape[0]
    outs = [jax.lax.ppermute(x, comm.WORKERS, [(j, (j - k) % m) for j in range(m)])
            for k in range(1, m)]
    y = jax.lax.switch(jnp.maximum((p - i) % m - 1, 0), [lambda o=o: o for o in outs])
    return w_in[p] * (x - y)

  def gossip_transform(x, w):
    g = comm.gossip('complete', 'deltas')
    out, _ = g.update(x, g.init(x), None, context=comm.WorkerContext(mixing=w))
    return x - out

  return {'x[None]-all_gather (old)': dense_differences, 'scan over senders': scan_senders,
          'all_gather+index': gather_index, 'all_gather+one_hot': gather_one_hot,
          'M-1 shifts+switch': shifts, 'comm.gossip (pairwise W)': gossip_transform}


def bench_partner(workers: list[int], size: int, repeats: int) -> None:
  """Prints time, temp memory and the largest op of each mixing formulation."""
  for m in workers:
    x = jax.random.normal(jax.random.key(0), (m, size))
    for mixing in ('pairwise', 'dense'):
      w = _pairwise_matrix(m) if mixing == 'pairwise' else jnp.full((m, m), 1.0 / m)
      want = x - w @ x
      for name, fn in _partner_formulations().items():
        if mixing == 'dense' and name not in ('x[None]-all_gather (old)', 'scan over senders',
                                              'comm.gossip (pairwise W)'):
          continue
        f = jax.jit(jax.vmap(fn, axis_name=comm.WORKERS, in_axes=(0, None)))
        compiled = f.lower(x, w).compile()
        shapes = [tuple(int(d) for d in dims.split(',')) for dims in
                  re.findall(r'= f32\[([0-9,]+)\]', compiled.as_text())]
        largest = max(shapes, key=lambda s: int(np.prod(s)))
        err = float(jnp.max(jnp.abs(f(x, w) - want)))
        label = name.replace('(pairwise W)', f'({mixing} W)')
        seconds = _best_seconds(lambda: f(x, w), repeats)
        print(f'M={m:3d} {mixing:8s} {label:26s} {seconds * 1e3:8.1f} ms'
              f'  temp {compiled.memory_analysis().temp_size_in_bytes / 2**20:7.1f} MiB'
              f'  largest f32{list(largest)}  err {err:.1e}', flush=True)


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
  parser.add_argument('--workers', default='64', help='an int (with --partner: a list)')
  parser.add_argument('--partner', action='store_true')
  parser.add_argument('--size', type=int, default=1_000_000)
  parser.add_argument('--topology', default='ring')
  parser.add_argument('--preset', default='tiny')
  parser.add_argument('--batch', type=int, default=16)
  parser.add_argument('--seq', type=int, default=128)
  parser.add_argument('--chunk', type=int, default=16)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  if args.partner:
    print(f'backend {jax.default_backend()}, {os.cpu_count()} cpus, jax {jax.__version__}')
    bench_partner([int(m) for m in args.workers.split(',')], args.size, args.repeats)
    return
  args.workers = int(args.workers)

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
