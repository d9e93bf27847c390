"""Per-device memory of a training step on a workers x fsdp mesh, to size a run.

Usage: python scripts/bench_mesh.py [--models=tiny,150m,1b] [--meshes=8x1,4x2,8x4,8x8]
    [--workers=8] [--algorithm=diloco] [--batch=8] [--seq=1024] [--steps=0] [--init_only]

For each model and mesh (mesh.workers x mesh.fsdp devices) it compiles loco's own
initialisation (`jax.jit(init, out_shardings=...)`) and one step of its training
chunk (per-worker value_and_grad, then the algorithm's step, state donated) and
prints, from `compile().memory_analysis()`, what one device holds: the training
state (arguments), the step's temporaries, and the initialisation's output and
temporaries. Nothing is
allocated, so it runs on a CPU: without accelerators it simulates the largest mesh
asked for with XLA's host platform devices (about 6 minutes on 2 cores for the
defaults). On real accelerators, `--steps=N` also runs N steps and prints tokens/s
and MFU (against `--peak_tflops` per device, e.g. 989 for an H100's bf16 dense).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _parse() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='tiny,150m,1b')
  parser.add_argument('--meshes', default='8x1,4x2,8x4,8x8')
  parser.add_argument('--workers', type=int, default=8)
  parser.add_argument('--algorithm', default='diloco')
  parser.add_argument('--batch', type=int, default=8, help='sequences per worker')
  parser.add_argument('--seq', type=int, default=1024)
  parser.add_argument('--grad_mode', default='vmap')
  parser.add_argument('--steps', type=int, default=0, help='timed steps (accelerators)')
  parser.add_argument('--peak_tflops', type=float, default=0.0)
  parser.add_argument('--init_only', action='store_true',
                      help='compile the initialisation only (fast; step columns 0)')
  return parser.parse_args()


ARGS = _parse()
MESHES = [tuple(int(n) for n in m.split('x')) for m in ARGS.meshes.split(',')]
if 'XLA_FLAGS' not in os.environ and os.environ.get('JAX_PLATFORMS', 'cpu') == 'cpu':
  # Must be set before JAX starts; only the host platform reads it.
  os.environ['XLA_FLAGS'] = ('--xla_force_host_platform_device_count='
                             f'{max(w * f for w, f in MESHES)}')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loco.configs import default  # pylint: disable=g-import-not-at-top,wrong-import-position
from loco import model as model_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from loco.run import experiment, placement  # pylint: disable=g-import-not-at-top,wrong-import-position
from loco.run import step as step_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

GIB = 2 ** 30


def _experiment(preset: str, mesh_workers: int, fsdp: int) -> experiment.Experiment:
  c = default.get_config()
  c.model.preset = preset
  c.model.vocab_size = model_lib.PRESETS[preset]['vocab_size']   # no tokenizer needed
  c.num_workers, c.batch_per_worker, c.seq_len = ARGS.workers, ARGS.batch, ARGS.seq
  c.algorithm.name = ARGS.algorithm
  c.grad_mode = ARGS.grad_mode
  c.mesh.workers, c.mesh.fsdp = mesh_workers, fsdp
  return experiment.parse_config(c)


def measure(preset: str, mesh_workers: int, fsdp: int) -> dict[str, float]:
  """Per-device bytes of the sharded init and of one training step (compiled only)."""
  exp = _experiment(preset, mesh_workers, fsdp)
  r = exp.run
  mesh = placement.make_mesh(mesh_workers, r.num_workers, fsdp)
  algorithm = experiment.build_algorithm(exp, mesh)
  key = jax.random.key(0)
  graphdef, init, abstract = step_lib.init_state(exp, algorithm, key, mesh)
  start = time.perf_counter()
  init_memory = init.lower(key).compile().memory_analysis()
  out = dict(init_out=init_memory.output_size_in_bytes, init_temp=init_memory.temp_size_in_bytes,
             total_state=sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract)),
             state=0, temp=0)
  if ARGS.init_only:
    return dict(out, compile_s=time.perf_counter() - start)
  chunk = step_lib.make_train_chunk(algorithm, exp.model, graphdef, mesh, r.grad_mode)
  batches = jax.ShapeDtypeStruct((1, r.num_workers, r.batch_per_worker, r.seq_len + 1),
                                 jnp.int32,
                                 sharding=placement.steps_sharding(mesh, r.batch_per_worker))
  compiled = chunk.lower(abstract, batches, None,
                         jax.ShapeDtypeStruct((1,), jnp.bool_)).compile()
  step_memory = compiled.memory_analysis()
  out.update(state=step_memory.argument_size_in_bytes, temp=step_memory.temp_size_in_bytes,
             compile_s=time.perf_counter() - start)
  if ARGS.steps:
    out['tokens_per_s'] = _tokens_per_s(init, key, chunk, batches, exp)
  return out


def _tokens_per_s(init, key, chunk, batches, exp) -> float:
  state = init(key)
  tokens = jax.device_put(jnp.zeros(batches.shape, jnp.int32), batches.sharding)
  valid = jnp.ones((1,), bool)
  state, out = chunk(state, tokens, None, valid)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(ARGS.steps):
    state, out = chunk(state, tokens, None, valid)
  jax.block_until_ready((state, out))
  seconds = (time.perf_counter() - start) / ARGS.steps
  return exp.run.num_workers * exp.run.batch_per_worker * exp.run.seq_len / seconds


def main() -> None:
  print(f'backend {jax.default_backend()}, {len(jax.devices())} devices, jax '
        f'{jax.__version__}; M={ARGS.workers} workers x {ARGS.batch} x {ARGS.seq} tokens, '
        f'{ARGS.algorithm}, grad_mode={ARGS.grad_mode}')
  print(f'{"model":6s} {"params":>7s} {"mesh":>5s} {"devices":>7s} {"state/dev":>10s} '
        f'{"temp/dev":>9s} {"init/dev":>9s} {"init tmp":>9s} {"all state":>10s} {"compile":>8s}'
        + ('  tokens/s    MFU' if ARGS.steps else ''))
  for preset in ARGS.models.split(','):
    cfg = model_lib.model_config(preset)
    for mesh_workers, fsdp in MESHES:
      m = measure(preset, mesh_workers, fsdp)
      line = (f'{preset:6s} {model_lib.param_count(cfg) / 1e6:6.0f}M '
              f'{mesh_workers}x{fsdp:<3d} {mesh_workers * fsdp:7d} '
              f'{m["state"] / GIB:8.3f}Gi {m["temp"] / GIB:7.3f}Gi '
              f'{m["init_out"] / GIB:7.3f}Gi {m["init_temp"] / GIB:7.3f}Gi '
              f'{m["total_state"] / GIB:8.2f}Gi '
              f'{m["compile_s"]:7.1f}s')
      if ARGS.steps:
        flops = m['tokens_per_s'] * model_lib.flops_per_token(cfg, ARGS.seq)
        mfu = (f'{100 * flops / (ARGS.peak_tflops * 1e12 * mesh_workers * fsdp):5.1f}%'
               if ARGS.peak_tflops else '  n/a')
        line += f'  {m["tokens_per_s"]:8.0f} {mfu}'
      print(line, flush=True)


if __name__ == '__main__':
  main()
