"""loco on one accelerator, measured against the host's CPU: the study behind docs/gpu.md.

  bash scripts/device/gpu_study.sh                          # a GPU host without network
  python -m launch.gpu_study --out=docs/gpu.md              # loco installed (pip install -e .)
  python -m launch.gpu_study --dry_run --out=/tmp/gpu.md    # every phase at CPU sizes

Five phases, each in its own process with its own time cap (a phase that overruns is
stopped, its process group killed, and the study goes on), each printing its wall time
as it ends. The page is rewritten after every phase (with every number behind it in a
.json beside it: docs/gpu.json), and a phase keeps each result as it gets it, so a study
cut short still leaves the numbers it reached. Sized to end in
about 8 minutes on one H100 (`--minutes`: no phase starts after that, and a phase's cap
is cut to the time left).

  env         the device, driver, host and versions.
  parity      the README's main job (experiments/tiny_gasloc.py), shortened, trained by
              `loco.main` three times at once: on the host's CPU (JAX_PLATFORMS=cpu), on
              the device at its default matmul precision (TF32 on an H100) and on the
              device with float32 matmuls (`JAX_DEFAULT_MATMUL_PRECISION=highest`). The
              losses must agree within TOLERANCE, the bytes exactly (metrics.jsonl's
              counters and every comms.jsonl record).
  throughput  tokens/s and MFU of loco's own train chunk (per-worker value_and_grad, then
              the main job's GASLoC step; state donated, bf16 compute) for the tiny model
              and a 35M-weight model at a realistic batch, against the device's datasheet
              bf16 peak (PEAKS) and a measured bf16 matmul.
  mesh        the main job's chunk without a mesh (what `loco.main` runs on one device)
              and on a 1 x 1 workers x fsdp mesh of the device (the shard_map path):
              compile time against step time, and their losses compared.
  batched     R = 1, 4, 16 runs of the micro and tiny models in one program
              (`loco.run.run_axis`) against one run at a time (the train loop's own chunk).

A dry run (`--dry_run`) runs the same phases through the same code and page writer at
CPU sizes (nano and micro models, a few steps; about 2 minutes on 2 cores):
tests/test_gpu_study.py keeps the study from rotting between accelerator sessions.
Every timing phase draws random tokens (no data pipeline); only parity reads the corpus,
which it prepares once into the study's work folder (`--work`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

from loco import cli
from loco.files import runs as runs_lib
from loco.errors import LocoError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = 'launch.gpu_study'
# In this order: the phase with the most compilations last, where the deadline trims it.
PHASES = ('env', 'parity', 'throughput', 'mesh', 'batched')
MIN_PHASE_SECONDS = 10   # a phase is not started with less time than this left
MAIN_JOB = 'experiments/tiny_gasloc.py'

# Dense (no sparsity) bf16 tensor-core peaks, FLOP/s, from NVIDIA's datasheets; the first
# name found in the device kind wins (the H100 PCIe and NVL before the SXM's 989).
PEAKS = (('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', 989e12), ('H200', 989e12),
         ('GH200', 989e12), ('A100', 312e12))

# |loss difference| allowed between the device and the CPU on every metrics row (train
# loss, eval loss, the workers' own eval loss), in nats/token. Two CPU programs that
# compute the same math in another order (grad_mode map and vmap) agree to 5e-7 after
# the 40 steps (measured on 2 cores); the device adds its own reduction order and math
# library (each op off by ~1e-7 relative), so float32 gets 1e-3 (0.04% of a loss of 2.7).
# The default precision rounds every float32 matmul's inputs to TF32 (10 mantissa bits,
# ~5e-4 relative): 1e-2, the width of the smallest effects the claims page resolves.
TOLERANCE = {'highest': 1e-3, 'default': 1e-2}
BYTE_KEYS = ('bytes_sent', 'bytes_received', 'peak_bytes', 'syncs')
LOSS_KEYS = ('train_loss', 'eval_loss', 'eval_loss_workers')

# What stays float32 when model.dtype is bfloat16 (loco/model.py, loco/core/engine.py).
FLOAT32_PARTS = ('the parameters (master weights) and their gradients, the inner AdamW '
                 'state, the anchor and the outer state; RMSNorm statistics, RoPE angles, '
                 'attention scores and softmax, the logits and the loss. In bf16: the '
                 'matmuls (q/k/v, attention, output projection, MLP, output head) and the '
                 'activations between them')


@dataclasses.dataclass(frozen=True)
class Shape:
  """A timed training shape: model config keys, M workers x B sequences x L tokens."""
  name: str
  model: Mapping[str, Any]
  workers: int
  batch: int
  seq: int


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Everything the accelerator study and its dry run do differently: sizes and caps."""
  accelerator: bool                  # the env phase fails where jax sees only the CPU
  parity_flags: tuple[str, ...]      # loco.main overrides of the main job
  parity_steps: int
  precisions: tuple[str, ...]        # the device runs' matmul precisions
  throughput: tuple[Shape, ...]
  batched_presets: tuple[str, ...]
  batched_runs: tuple[int, ...]
  batched_shape: Shape               # its model preset is replaced by each of the above
  mesh_shape: Shape
  sync_every: int                    # H of the timed chunks: timed_chunks x chunk steps
  chunk: int                         # steps per dispatch (the main job's log_every)
  timed_chunks: int
  matmul_n: int                      # the side of the measured bf16 matmul
  caps: Mapping[str, float]          # seconds per phase


_BF16 = {'dtype': 'bfloat16'}
# About 35M weights (35.3M): 6 layers, d_model 512, 8 heads of 64, d_ff 2048, a 32k
# vocabulary tied to the head (16.4M of them): the smallest size of the DiLoCo scaling-law
# study (arXiv 2503.09799), with the paper-scale presets' QK-norm and z-loss.
MODEL_35M = {'preset': 'tiny', 'vocab_size': 32000, 'd_model': 512, 'num_layers': 6,
             'num_heads': 8, 'd_ff': 2048, 'max_seq_len': 1024, 'qk_norm': True,
             'z_loss': 1e-4}

SIZES = {
    'gpu': Sizes(
        accelerator=True,
        parity_flags=('--config.algorithm.sync_every=10', '--config.eval.every=20',
                      '--config.eval.batches=4', '--config.checkpoint.every=40'),
        parity_steps=40, precisions=('default', 'highest'),
        throughput=(
            Shape('tiny', {'preset': 'tiny', **_BF16}, 8, 32, 512),
            Shape('35m', {**MODEL_35M, **_BF16}, 8, 8, 1024)),
        batched_presets=('micro', 'tiny'), batched_runs=(1, 4, 16),
        batched_shape=Shape('', {'preset': 'tiny'}, 8, 4, 128),
        mesh_shape=Shape('tiny', {'preset': 'tiny'}, 8, 4, 128),
        sync_every=50, chunk=10, timed_chunks=5, matmul_n=8192,
        caps={'env': 45, 'parity': 150, 'throughput': 120, 'mesh': 75, 'batched': 150}),
    'dry': Sizes(
        accelerator=False,
        parity_flags=('--config.model.preset=nano', '--config.algorithm.sync_every=2',
                      '--config.log_every=2', '--config.eval.every=4',
                      '--config.eval.batches=1', '--config.eval.batch_size=4',
                      '--config.checkpoint.every=4', '--config.batch_per_worker=2',
                      '--config.seq_len=32'),
        parity_steps=4, precisions=('default',),
        throughput=(
            Shape('nano', {'preset': 'nano', **_BF16}, 2, 2, 32),
            Shape('micro', {'preset': 'micro', **_BF16}, 2, 2, 32)),
        batched_presets=('nano',), batched_runs=(1, 2),
        batched_shape=Shape('', {'preset': 'nano'}, 2, 2, 32),
        mesh_shape=Shape('nano', {'preset': 'nano'}, 2, 2, 32),
        sync_every=4, chunk=2, timed_chunks=2, matmul_n=256,
        caps={'env': 60, 'parity': 120, 'throughput': 90, 'mesh': 90, 'batched': 90}),
}


# ---- the phases (each runs in its own process) ------------------------------------------

class Results:
  """A phase's results file (WORK/<phase>.json), rewritten at every `put` so that a phase
  stopped at its cap leaves what it finished."""

  def __init__(self, work: str, phase: str):
    self.path = os.path.join(work, f'{phase}.json')
    self.data: dict[str, Any] = {}

  def put(self, key: str, value: Any) -> None:
    self.data[key] = value
    _write_json(self.path, self.data)


def _write_json(path: str, data: Any) -> None:
  runs_lib.write_atomic(path, json.dumps(data, indent=1, default=float), sync=False)


def _read_json(path: str) -> dict[str, Any]:
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    return {}
  return data if isinstance(data, dict) else {}


def _versions() -> dict[str, str]:
  from importlib import metadata
  names = ['jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'chex', 'numpy',
           'ml-collections', 'tensorflow-datasets', 'grain', 'array-record',
           'tensorboardX', 'protobuf']
  # The accelerator plugins (jax-cuda13-plugin, jax-cuda13-pjrt, ...) by whatever name.
  names += sorted({d.metadata['Name'] for d in metadata.distributions()
                   if (d.metadata['Name'] or '').lower().startswith(('jax-cuda', 'jax_cuda',
                                                                      'libtpu'))})
  out = {'python': platform.python_version()}
  for name in names:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = 'not installed'
  return out


def _commit() -> str:
  if os.environ.get('LOCO_COMMIT'):   # a copy of the tree without .git
    return os.environ['LOCO_COMMIT']
  try:
    return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, text=True,
                          capture_output=True, timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return 'unknown (no git here; LOCO_COMMIT names it)'


def _nvidia_smi() -> dict[str, str]:
  if not shutil.which('nvidia-smi'):
    return {}
  fields = 'name,driver_version,memory.total,clocks.max.sm,power.limit'
  try:
    line = subprocess.run(['nvidia-smi', f'--query-gpu={fields}', '--format=csv,noheader'],
                          text=True, capture_output=True, timeout=30).stdout.splitlines()
    header = subprocess.run(['nvidia-smi'], text=True, capture_output=True,
                            timeout=30).stdout
  except (OSError, subprocess.SubprocessError):
    return {}
  out = dict(zip(fields.split(','), (x.strip() for x in line[0].split(',')))) if line else {}
  cuda = [w for w in header.split('|') if 'CUDA Version' in w]
  if cuda:
    out['cuda'] = cuda[0].split('CUDA Version:')[-1].strip()
  return out


def phase_env(sizes: Sizes, res: Results) -> None:
  res.put('versions', _versions())
  res.put('commit', _commit())
  res.put('host', {'cpus': os.cpu_count(), 'machine': platform.machine(),
                   'system': f'{platform.system()} {platform.release()}'})
  res.put('nvidia_smi', _nvidia_smi())
  import jax
  devices = jax.devices()
  d = devices[0]
  stats = d.memory_stats() or {}
  res.put('device', {'platform': d.platform, 'kind': d.device_kind, 'count': len(devices),
                     'memory_bytes': stats.get('bytes_limit')})
  print(f'env: {len(devices)} x {d.device_kind} ({d.platform}), jax {jax.__version__}',
        flush=True)
  if sizes.accelerator and d.platform == 'cpu':
    # jax falls back to the CPU with a warning; the GPU backend's own error says why.
    try:
      jax.devices('gpu')
      why = ''
    except RuntimeError as e:
      why = f': {(str(e).strip().splitlines() or [""])[0][:200]}'
    raise LocoError(f'jax sees no accelerator, only the CPU{why} (the study\'s numbers '
                    'would be the CPU\'s; use --dry_run for that).')


def _loco_main_cmd(workdir: str, sizes: Sizes) -> list[str]:
  return [sys.executable, '-m', 'loco.main', f'--config={MAIN_JOB}', f'--workdir={workdir}',
          f'--config.steps={sizes.parity_steps}', '--config.progress=False',
          *sizes.parity_flags]


def phase_parity(sizes: Sizes, res: Results, work: str) -> None:
  """The main job, shortened, on the CPU and on the device at once; compared row by row."""
  base = dict(os.environ, LOCO_DATA_DIR=os.path.join(work, 'data'), LOCO_JAX_CACHE='',
              PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
  base.pop('JAX_DEFAULT_MATMUL_PRECISION', None)
  runs = {'cpu': dict(base, JAX_PLATFORMS='cpu')}
  for precision in sizes.precisions:
    # Two device runs share the device: neither may take 75% of its memory up front.
    env = dict(base, XLA_PYTHON_CLIENT_PREALLOCATE='false')
    if precision != 'default':
      env['JAX_DEFAULT_MATMUL_PRECISION'] = precision
    runs[f'device_{precision}'] = env
  folder = os.path.join(work, 'parity')
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  res.put('command', ' '.join(['python -m loco.main', f'--config={MAIN_JOB}',
                               f'--config.steps={sizes.parity_steps}',
                               *sizes.parity_flags]))
  started = {}
  for name, env in runs.items():
    log = open(os.path.join(folder, f'{name}.log'), 'w')
    proc = subprocess.Popen(_loco_main_cmd(os.path.join(folder, name), sizes), cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    started[name] = (proc, log, time.perf_counter())
  pending = dict(started)
  while pending:
    for name, (proc, log, t0) in list(pending.items()):
      if proc.poll() is None:
        continue
      log.close()
      del pending[name]
      seconds = time.perf_counter() - t0
      print(f'parity: {name} run ended (exit {proc.returncode}) in {seconds:.1f} s',
            flush=True)
      res.put(name, _read_parity_run(os.path.join(folder, name), proc.returncode,
                                     seconds, log.name))
    time.sleep(0.2)
  cpu = res.data['cpu']
  for precision in sizes.precisions:
    name = f'device_{precision}'
    res.put(f'compare_{precision}', compare_runs(cpu, res.data[name],
                                                 TOLERANCE[precision]))


def _read_parity_run(workdir: str, code: int, seconds: float, log: str) -> dict[str, Any]:
  from loco.files import runs as runs_lib
  out: dict[str, Any] = {'exit': code, 'seconds': seconds}
  if code:
    with open(log, errors='replace') as f:
      lines = [line.strip() for line in f if line.strip()]
    out['error'] = next((line for line in reversed(lines) if 'error' in line.lower()),
                        lines[-1] if lines else f'exit {code}')[:300]
    return out
  rows = runs_lib.read_metrics(workdir).rows
  comms = runs_lib.read_comms(workdir, rows)
  out['rows'] = [{k: r[k] for k in ('step', *LOSS_KEYS, *BYTE_KEYS) if k in r}
                 for r in rows]
  out['comms'] = {str(step): record for step, record in sorted(comms.records.items())}
  return out


def compare_runs(cpu: Mapping[str, Any], device: Mapping[str, Any],
                 tolerance: float) -> dict[str, Any]:
  """The device run against the CPU run: per row, each loss's |difference| and whether
  every byte counter is equal; every comms.jsonl record compared exactly."""
  if 'rows' not in cpu or 'rows' not in device:
    return {'error': 'a run failed: ' + (cpu.get('error') or device.get('error') or '?')}
  a, b = cpu['rows'], device['rows']
  rows, worst, bytes_equal = [], 0.0, [r['step'] for r in a] == [r['step'] for r in b]
  for ra, rb in zip(a, b):
    # A loss that is not finite is as far as can be (a NaN would slip through max()).
    diffs = {k: abs(ra[k] - rb[k]) if math.isfinite(ra[k] - rb[k]) else math.inf
             for k in LOSS_KEYS if k in ra and k in rb}
    worst = max([worst, *diffs.values()])
    same = all(ra.get(k) == rb.get(k) for k in BYTE_KEYS)
    bytes_equal &= same
    rows.append({'step': ra['step'], 'diffs': diffs, 'bytes_equal': same})
  comms_equal = cpu['comms'] == device['comms']
  return {'rows': rows, 'max_diff': worst, 'tolerance': tolerance,
          'losses_within': bool(worst <= tolerance), 'bytes_equal': bool(bytes_equal),
          'comms_equal': bool(comms_equal), 'comms_records': len(cpu['comms'])}


def _experiment(shape: Shape, seed: int = 0, **keys: Any):
  """The main job's config at `shape` (model keys, M x B x L), with more config keys."""
  from experiments import tiny_gasloc
  from loco import model as model_lib
  from loco.run.experiment import parse_config
  c = tiny_gasloc.get_config()
  model = dict(shape.model)
  c.model.preset = model.pop('preset')
  c.model.vocab_size = model_lib.PRESETS[c.model.preset]['vocab_size']  # no tokenizer
  for key, value in model.items():
    c.model[key] = value
  c.num_workers, c.batch_per_worker, c.seq_len, c.seed = (shape.workers, shape.batch,
                                                          shape.seq, seed)
  for key, value in keys.items():
    node = c
    *path, leaf = key.split('.')
    for part in path:
      node = node[part]
    node[leaf] = value
  return parse_config(c)


def _grad_mode(exp) -> str:
  """The run's grad_mode as `loco.comm.axis.map_workers` resolves 'auto' here."""
  import jax
  if exp.run.grad_mode != 'auto':
    return exp.run.grad_mode
  return 'map' if jax.default_backend() == 'cpu' else 'vmap'


def _device_memory() -> float | None:
  import jax
  return (jax.devices()[0].memory_stats() or {}).get('bytes_limit')


def _memory(compiled) -> float:
  m = compiled.memory_analysis()
  if m is None:
    return math.nan
  return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def _timed(call: Callable[[], Any], chunks: int) -> float:
  """Seconds per chunk of `chunks` calls dispatched back to back, after one untimed."""
  import jax
  jax.block_until_ready(call())
  start = time.perf_counter()
  out = None
  for _ in range(chunks):
    out = call()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / chunks


class _Chunk:
  """A train chunk compiled ahead for one placement, its state and a chunk of tokens."""

  def __init__(self, exp, sizes: Sizes, mesh=None):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from loco.run import experiment as experiment_lib
    from loco.run import placement
    from loco.run import step as step_lib
    r = exp.run
    algorithm = experiment_lib.build_algorithm(exp, mesh)
    key = jax.random.key(r.seed)
    graphdef, init, abstract = step_lib.init_state(exp, algorithm, key, mesh)
    chunk = step_lib.make_train_chunk(algorithm, exp.model, graphdef, mesh, r.grad_mode)
    sharding = placement.steps_sharding(mesh, r.batch_per_worker)
    shape = (sizes.chunk, r.num_workers, r.batch_per_worker, r.seq_len + 1)
    start = time.perf_counter()
    self.compiled = chunk.lower(abstract, jax.ShapeDtypeStruct(shape, jnp.int32,
                                                               sharding=sharding),
                                None, jax.ShapeDtypeStruct((sizes.chunk,), jnp.bool_)
                                ).compile()
    self.compile_seconds = time.perf_counter() - start
    self.bytes = _memory(self.compiled)
    tokens = np.random.default_rng(0).integers(0, exp.model.vocab_size, shape, np.int32)
    self.tokens = jax.device_put(tokens, sharding) if sharding is not None else (
        jnp.asarray(tokens))
    self.valid = jnp.ones((sizes.chunk,), bool)
    self._init = lambda: init(key)   # on the first call: after the memory check
    self.state = None
    self.losses = []

  def __call__(self):
    if self.state is None:
      self.state = self._init()
    self.state, (losses, _) = self.compiled(self.state, self.tokens, None, self.valid)
    self.losses.append(losses)
    return losses


def _matmul_flops(n: int, dtype: str) -> float:
  """Best FLOP/s of a jitted n x n matmul in `dtype` (default precision), of 10."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = math.inf
  for _ in range(10):
    start = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best


def datasheet_peak(kind: str) -> tuple[str, float] | None:
  """(name, dense bf16 FLOP/s) of a device kind from PEAKS, or None if it is not there."""
  for name, flops in PEAKS:
    if name.lower() in kind.lower():
      return name, flops
  return None


def phase_throughput(sizes: Sizes, res: Results) -> None:
  """Tokens/s and MFU of one run of each shape, bf16 compute."""
  import jax
  from loco import model as model_lib
  kind = jax.devices()[0].device_kind
  res.put('datasheet', datasheet_peak(kind))
  res.put('matmul_bf16', _matmul_flops(sizes.matmul_n, 'bfloat16'))
  res.put('matmul_n', sizes.matmul_n)
  res.put('float32', FLOAT32_PARTS)
  print(f'throughput: bf16 matmul {res.data["matmul_bf16"] / 1e12:.1f} TFLOP/s '
        f'({sizes.matmul_n}^3)', flush=True)
  limit = _device_memory()
  for shape in sizes.throughput:
    batch = shape.batch
    while True:   # halve the batch until the step fits the device's memory
      exp = _experiment(dataclasses.replace(shape, batch=batch),
                        **{'algorithm.sync_every': sizes.sync_every})
      chunk = _Chunk(exp, sizes)
      if limit is None or chunk.bytes <= 0.9 * limit or batch == 1:
        break
      print(f'throughput: {shape.name} at batch {batch} needs '
            f'{chunk.bytes / 2**30:.1f} GiB of {limit / 2**30:.1f}; halving', flush=True)
      del chunk
      batch //= 2
    seconds = _timed(chunk, sizes.timed_chunks)
    tokens = sizes.chunk * shape.workers * batch * shape.seq
    flops_token = model_lib.flops_per_token(exp.model, shape.seq)
    row = {'shape': shape.name, 'params': model_lib.param_count(exp.model),
           'workers': shape.workers, 'batch': batch, 'seq': shape.seq,
           'dtype': exp.model.dtype, 'grad_mode': _grad_mode(exp),
           'step_seconds': seconds / sizes.chunk, 'tokens_per_s': tokens / seconds,
           'flops_per_token': flops_token, 'compile_seconds': chunk.compile_seconds,
           'memory_bytes': chunk.bytes}
    res.put(shape.name, row)
    print(f'throughput: {shape.name}: {row["tokens_per_s"]:,.0f} tokens/s, '
          f'{row["step_seconds"] * 1e3:.1f} ms/step, compile {chunk.compile_seconds:.1f} s',
          flush=True)
    del chunk


def phase_batched(sizes: Sizes, res: Results) -> None:
  """R runs in one program against one run at a time, per preset."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from loco.run import run_axis
  keys = {'algorithm.sync_every': sizes.sync_every}
  for preset in sizes.batched_presets:
    shape = dataclasses.replace(sizes.batched_shape, name=preset, model={'preset': preset})
    tokens_per_chunk = sizes.chunk * shape.workers * shape.batch * shape.seq
    solo = _Chunk(_experiment(shape, **keys), sizes)
    seconds = _timed(solo, sizes.timed_chunks)
    rows = [{'case': 'solo', 'runs': 1, 'tokens_per_s': tokens_per_chunk / seconds,
             'compile_seconds': solo.compile_seconds}]
    del solo
    res.put(preset, rows)
    print(f'batched: {preset} solo {rows[0]["tokens_per_s"]:,.0f} tokens/s', flush=True)
    for r in sizes.batched_runs:
      # Runs differ in seed and inner lr (run knobs), as a sweep's batch does.
      exps = [_experiment(shape, seed, **keys, **{'optimizer.lr': 1.5e-3 * (1 + seed % 3)})
              for seed in range(r)]
      knobs = run_axis.knobs_of(exps)
      graphdef, states = run_axis.init_states(exps[0], knobs, list(range(r)))
      batched = run_axis.make_batched_chunk(exps[0], graphdef)
      vocab = exps[0].model.vocab_size
      batches = jnp.asarray(np.random.default_rng(0).integers(
          0, vocab, (r, sizes.chunk, shape.workers, shape.batch, shape.seq + 1), np.int32))
      valid = jnp.ones((sizes.chunk,), bool)
      start = time.perf_counter()
      compiled = batched.lower(knobs, states, batches, None, valid).compile()
      compile_seconds = time.perf_counter() - start
      holder = {'states': states}

      def call(compiled=compiled, holder=holder, knobs=knobs, batches=batches, valid=valid):
        holder['states'], (losses, _) = compiled(knobs, holder['states'], batches, None,
                                                 valid)
        return losses
      seconds = _timed(call, sizes.timed_chunks)
      rows.append({'case': f'batched {r}', 'runs': r,
                   'tokens_per_s': r * tokens_per_chunk / seconds,
                   'compile_seconds': compile_seconds})
      res.put(preset, rows)
      print(f'batched: {preset} R={r} {rows[-1]["tokens_per_s"]:,.0f} tokens/s '
            f'(x{rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"]:.2f} solo)', flush=True)
      del holder, compiled
    res.put(f'{preset}_shape', dataclasses.asdict(shape))


def phase_mesh(sizes: Sizes, res: Results) -> None:
  """The main job's chunk without a mesh and on a 1 x 1 workers x fsdp mesh."""
  import jax
  import numpy as np
  from jax.sharding import AxisType, Mesh
  from loco.run import placement
  from loco.comm.axis import WORKERS
  exp = _experiment(sizes.mesh_shape, **{'algorithm.sync_every': sizes.sync_every})
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), (WORKERS, placement.FSDP),
              axis_types=(AxisType.Auto,) * 2)
  r = exp.run
  res.put('shape', dataclasses.asdict(sizes.mesh_shape))
  res.put('grad_mode', _grad_mode(exp))
  tokens_per_chunk = sizes.chunk * r.num_workers * r.batch_per_worker * r.seq_len
  losses = {}
  for name, m in (('none', None), ('1x1', mesh)):
    chunk = _Chunk(exp, sizes, m)
    seconds = _timed(chunk, sizes.timed_chunks)
    losses[name] = np.concatenate([np.asarray(x).ravel() for x in chunk.losses])
    row = {'compile_seconds': chunk.compile_seconds, 'step_seconds': seconds / sizes.chunk,
           'tokens_per_s': tokens_per_chunk / seconds, 'memory_bytes': chunk.bytes}
    res.put(name, row)
    print(f'mesh: {name}: compile {row["compile_seconds"]:.1f} s, '
          f'{row["step_seconds"] * 1e3:.2f} ms/step', flush=True)
    del chunk
  res.put('max_loss_diff', float(np.max(np.abs(losses['none'] - losses['1x1']))))


# ---- the page --------------------------------------------------------------------------

def _f(x: Any, digits: int = 1, unit: str = '') -> str:
  if x is None or (isinstance(x, float) and not math.isfinite(x)):
    return 'n/a'
  return f'{x:,.{digits}f}{unit}'


def _gib(x: Any) -> str:
  return 'n/a' if x is None or not math.isfinite(x) else f'{x / 2**30:.2f}'


def render(results: Mapping[str, Any], status: Mapping[str, Any], meta: Mapping[str, Any]
           ) -> str:
  """The page (Markdown) from the phases' results so far and their states."""
  dry = meta['dry_run']
  env = results.get('env', {})
  device = env.get('device', {})
  kind = device.get('kind', 'unknown device')
  done = [p for p in PHASES if status.get(p, {}).get('state') == 'ok']
  missing = [p for p in meta['phases'] if p not in done]
  out = ['# loco on one accelerator' + (' (dry run on the CPU)' if dry else ''), '']
  out.append(f'Written by `{meta["command"]}` ([launch/gpu_study.py](../launch/gpu_study.py))'
             f' on {meta["date"]}, loco {env.get("commit", "?")}: '
             + ('every phase finished.' if not missing else
                f'**partial**: {", ".join(missing)} not finished (below).'))
  if dry:
    out.append('')
    out.append('A dry run: the same phases at CPU sizes, to check the study; its numbers '
               'are not an accelerator\'s.')
  out += ['', '| phase | state | wall s | cap s |', '|---|---|---:|---:|']
  for p in meta['phases']:
    s = status.get(p, {})
    state = s.get('state', 'not run')
    if s.get('error'):
      state += f': {s["error"]}'
    out.append(f'| {p} | {state} | {_f(s.get("seconds"))} | {_f(s.get("cap"), 0)} |')
  out += _env_section(env)
  out += _parity_section(results.get('parity', {}), meta)
  out += _throughput_section(results.get('throughput', {}), kind)
  out += _mesh_section(results.get('mesh', {}))
  out += _batched_section(results.get('batched', {}), meta)
  return '\n'.join(out) + '\n'


def _env_section(env: Mapping[str, Any]) -> list[str]:
  out = ['', '## Device and versions', '']
  if not env:
    return out + ['Not measured.']
  d, smi, host = env.get('device', {}), env.get('nvidia_smi', {}), env.get('host', {})
  out += ['| | |', '|---|---|',
          f'| device | {d.get("count")} x {d.get("kind")} ({d.get("platform")}), '
          f'{_gib(d.get("memory_bytes"))} GiB usable |']
  if smi:
    out.append(f'| driver | {smi.get("driver_version")}, CUDA {smi.get("cuda", "?")}; '
               f'{smi.get("memory.total")}, max SM clock {smi.get("clocks.max.sm")}, '
               f'power limit {smi.get("power.limit")} |')
  out.append(f'| host | {host.get("cpus")} CPUs, {host.get("machine")}, '
             f'{host.get("system")} |')
  versions = env.get('versions', {})
  out.append('| versions | ' + ', '.join(f'{k} {v}' for k, v in versions.items()) + ' |')
  return out


def _parity_section(p: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str]:
  out = ['', '## The main job on the device against the CPU', '']
  if not p:
    return out + ['Not measured.']
  devices = {'default': 'the device at its default matmul precision',
             'highest': 'the device with float32 matmuls (`JAX_DEFAULT_MATMUL_PRECISION='
                        'highest`)'}
  out.append(f'`{p.get("command")}`, {1 + len(meta["precisions"])} runs at once on this '
             'host (so their wall times overlap): the CPU (`JAX_PLATFORMS=cpu`), '
             + ' and '.join(devices[k] for k in meta['precisions'])
             + '. Tolerance on every loss of every row: '
             + ', '.join(f'{TOLERANCE[k]:g} nats ({k})' for k in meta['precisions'])
             + ' (launch/gpu_study.py, TOLERANCE, says why); bytes must be equal.')
  for name in ['cpu'] + [f'device_{k}' for k in meta['precisions']]:
    run = p.get(name)
    if run is None:
      out.append(f'- {name}: not finished')
    elif 'error' in run:
      out.append(f'- {name}: failed (exit {run["exit"]}): {run["error"]}')
    else:
      out.append(f'- {name}: {len(run["rows"])} rows in {_f(run["seconds"])} s')
  for precision in meta['precisions']:
    c = p.get(f'compare_{precision}')
    cpu, dev = p.get('cpu', {}), p.get(f'device_{precision}', {})
    if not c:
      continue
    out += ['', f'### Device ({precision} precision) against the CPU', '']
    if 'error' in c:
      out.append(c['error'])
      continue
    out += ['| step | train loss CPU | device | abs diff | eval loss CPU | device | '
            'abs diff | bytes sent per worker | bytes equal |',
            '|---:|---:|---:|---:|---:|---:|---:|---:|---|']
    for ra, rb, rc in zip(cpu['rows'], dev['rows'], c['rows']):
      d = rc['diffs']
      out.append(
          f'| {ra["step"]} | {ra["train_loss"]:.6f} | {rb["train_loss"]:.6f} | '
          f'{d["train_loss"]:.1e} | '
          + (f'{ra["eval_loss"]:.6f} | {rb["eval_loss"]:.6f} | {d["eval_loss"]:.1e}'
             if 'eval_loss' in d else ' | | ')
          + f' | {ra["bytes_sent"]:,.0f} | {"yes" if rc["bytes_equal"] else "**no**"} |')
    verdict = 'within' if c['losses_within'] else '**not within**'
    out += ['', f'Losses: largest difference {c["max_diff"]:.2e} nats, {verdict} the '
            f'tolerance {c["tolerance"]:g}. Bytes: '
            + ('equal on every row (bytes sent, received, peak, syncs) and in every one of '
               f'the {c["comms_records"]} comms.jsonl records.'
               if c['bytes_equal'] and c['comms_equal'] else
               f'**not equal** (rows equal: {c["bytes_equal"]}, comms.jsonl equal: '
               f'{c["comms_equal"]}).')]
  return out


def _throughput_section(t: Mapping[str, Any], kind: str) -> list[str]:
  out = ['', '## Throughput and MFU', '']
  if not t:
    return out + ['Not measured.']
  sheet = t.get('datasheet')
  measured = t.get('matmul_bf16')
  out.append(
      'One run of each shape through loco\'s train chunk (the main job\'s GASLoC on a '
      'ring, a chunk of steps per dispatch, timed over a whole round of H steps after a '
      'compiled warm-up), bf16 compute (`model.dtype=bfloat16`), random tokens. '
      'MFU = tokens/s x training FLOPs per token (`loco.model.flops_per_token`: 6 x the '
      'matmul weights + attention) / peak; '
      + (f'peak: {sheet[1] / 1e12:.0f} TFLOP/s, the dense bf16 datasheet figure of the '
         f'{sheet[0]}' if sheet else f'no datasheet peak known for {kind}')
      + f'; measured bf16 {t.get("matmul_n")}^3 matmul: {_f(measured and measured / 1e12, 2)} '
      'TFLOP/s.')
  out += ['', '| model | weights | workers x batch x seq | ms/step | tokens/s | TFLOP/s | '
          'MFU (datasheet) | MFU (measured matmul) | compile s | memory GiB |',
          '|---|---:|---|---:|---:|---:|---:|---:|---:|---:|']
  for key, row in t.items():
    if not isinstance(row, dict) or 'tokens_per_s' not in row:
      continue
    flops = row['tokens_per_s'] * row['flops_per_token']
    mfu = f'{100 * flops / sheet[1]:.1f}%' if sheet else 'n/a'
    mfu_m = f'{100 * flops / measured:.1f}%' if measured else 'n/a'
    out.append(f'| {key} ({row["dtype"]}) | {row["params"] / 1e6:.1f}M | {row["workers"]} x '
               f'{row["batch"]} x {row["seq"]} | {row["step_seconds"] * 1e3:.2f} | '
               f'{row["tokens_per_s"]:,.0f} | {flops / 1e12:.2f} | {mfu} | {mfu_m} | '
               f'{row["compile_seconds"]:.1f} | {_gib(row["memory_bytes"])} |')
  out += ['', f'What stays float32 in bf16 compute: {t.get("float32", FLOAT32_PARTS)}.']
  return out


def _batched_section(b: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str]:
  out = ['', '## Batched runs', '']
  if not b:
    return out + ['Not measured.']
  out.append('R runs of the main job\'s shape (different seeds and inner lr) in one '
             'program (`loco.run.run_axis.make_batched_chunk`) against one run at a time '
             '(`loco.run.step.make_train_chunk`, what one process per run trains). Tokens/s '
             'over all runs; start-up and compilation not counted.')
  for preset in meta['batched_presets']:
    rows = b.get(preset)
    if not rows:
      continue
    shape = b.get(f'{preset}_shape') or {}
    out += ['', f'{preset}' + (f' ({shape["workers"]} workers x {shape["batch"]} x '
                               f'{shape["seq"]})' if shape else '') + ':', '',
            '| case | runs | tokens/s (all runs) | vs one run at a time | compile s |',
            '|---|---:|---:|---:|---:|']
    solo = rows[0]['tokens_per_s']
    for row in rows:
      out.append(f'| {row["case"]} | {row["runs"]} | {row["tokens_per_s"]:,.0f} | '
                 f'{row["tokens_per_s"] / solo:.2f}x | {row["compile_seconds"]:.1f} |')
  return out


def _mesh_section(m: Mapping[str, Any]) -> list[str]:
  out = ['', '## The workers x fsdp mesh on one device', '']
  if not m:
    return out + ['Not measured.']
  s = m.get('shape', {})
  out.append(f'The main job\'s chunk ({s.get("name")}, {s.get("workers")} workers x '
             f'{s.get("batch")} x {s.get("seq")}, grad_mode {m.get("grad_mode")}) '
             'without a mesh (the worker axis mapped on one device, what `loco.main` runs '
             'there) and on a 1 x 1 workers x fsdp mesh of the same device (shard_map '
             'over "workers", each worker\'s state on "fsdp": the multi-device code path).')
  out += ['', '| placement | compile s | ms/step | tokens/s | compile = steps | memory GiB |',
          '|---|---:|---:|---:|---:|---:|']
  for name, label in (('none', 'no mesh'), ('1x1', '1 x 1 mesh')):
    row = m.get(name)
    if row:
      out.append(f'| {label} | {row["compile_seconds"]:.1f} | '
                 f'{row["step_seconds"] * 1e3:.2f} | {row["tokens_per_s"]:,.0f} | '
                 f'{row["compile_seconds"] / row["step_seconds"]:,.0f} | '
                 f'{_gib(row["memory_bytes"])} |')
  if 'max_loss_diff' in m:
    out += ['', f'Largest |loss difference| between the two over the timed chunks: '
            f'{m["max_loss_diff"]:.1e} nats.']
  return out


def write_page(path: str, text: str) -> None:
  runs_lib.write_atomic(path, text)


def _save(out: str, results, status, meta) -> None:
  """The page, and beside it (docs/gpu.json) every number it was made from."""
  write_page(out, render(results, status, meta))
  _write_json(os.path.splitext(out)[0] + '.json',
              {'meta': meta, 'status': status, 'results': results})


# ---- the orchestrator ------------------------------------------------------------------

def run_capped(cmd: Sequence[str], cap: float, results: str) -> dict[str, Any]:
  """Runs `cmd` (a phase) in its own process group for at most `cap` seconds, then kills
  the group (the phase and the processes it started); `results` is its results file,
  whose `_error` names a failure."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
  start = time.perf_counter()
  proc = subprocess.Popen(list(cmd), cwd=ROOT, env=env, start_new_session=True)
  try:
    code = proc.wait(timeout=cap)
  except subprocess.TimeoutExpired:
    _kill_group(proc)
    return {'state': 'timed out', 'seconds': time.perf_counter() - start, 'cap': cap,
            'error': f'stopped at its cap of {cap:.0f} s'}
  except KeyboardInterrupt:
    _kill_group(proc)
    raise
  seconds = time.perf_counter() - start
  if code:
    error = _read_json(results).get('_error') or f'exit {code}'
    return {'state': 'failed', 'seconds': seconds, 'cap': cap, 'error': error}
  return {'state': 'ok', 'seconds': seconds, 'cap': cap}


def _kill_group(proc: subprocess.Popen) -> None:
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()


def run_study(out: str, work: str, dry: bool, phases: Sequence[str], minutes: float,
              command: str) -> dict[str, Any]:
  """Runs the phases in order, rewriting the page at `out` after each; returns the
  phases' states."""
  sizes = SIZES['dry' if dry else 'gpu']
  meta = {'dry_run': dry, 'phases': list(phases), 'command': command,
          'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
          'precisions': list(sizes.precisions), 'batched_presets': list(sizes.batched_presets)}
  status: dict[str, Any] = {}
  results: dict[str, Any] = {}
  deadline = time.perf_counter() + 60 * minutes
  _save(out, results, status, meta)
  for phase in phases:
    left = deadline - time.perf_counter()
    cap = min(sizes.caps[phase], left)
    if left < MIN_PHASE_SECONDS:
      status[phase] = {'state': 'skipped', 'cap': 0.0,
                       'error': f'the study\'s {minutes:g} minutes were spent'}
      print(f'phase {phase}: skipped (the study\'s time is spent)', flush=True)
      continue
    print(f'phase {phase}: started (cap {cap:.0f} s)', flush=True)
    cmd = [sys.executable, '-m', PROG, f'--phase={phase}', f'--work={work}']
    status[phase] = run_capped(cmd + ['--dry_run'] * dry, cap,
                               os.path.join(work, f'{phase}.json'))
    results[phase] = {k: v for k, v in _read_json(os.path.join(work, f'{phase}.json')).items()
                      if not k.startswith('_')}
    s = status[phase]
    print(f'phase {phase}: {s["state"]} in {s["seconds"]:.1f} s'
          + (f' ({s["error"]})' if s.get('error') else ''), flush=True)
    _save(out, results, status, meta)
    if phase == 'env' and s['state'] != 'ok' and sizes.accelerator:
      for rest in phases[phases.index(phase) + 1:]:
        status[rest] = {'state': 'skipped', 'cap': 0.0,
                        'error': 'no accelerator (the env phase failed)'}
      print('phase env failed: the other phases would measure no accelerator; stopped.',
            flush=True)
      _save(out, results, status, meta)
      break
  return status


def _phase_main(phase: str, work: str, dry: bool) -> int:
  """One phase in this process: its results go to WORK/<phase>.json, a failure's line
  too (as `_error`), with the traceback on stderr."""
  sizes = SIZES['dry' if dry else 'gpu']
  res = Results(work, phase)
  try:
    if phase == 'parity':
      phase_parity(sizes, res, work)
    else:
      {'env': phase_env, 'throughput': phase_throughput, 'batched': phase_batched,
       'mesh': phase_mesh}[phase](sizes, res)
  except Exception as e:  # a phase's failure is a row of the page; the study goes on
    if isinstance(e, LocoError):
      print(f'{PROG}: {phase}: error: {e}', file=sys.stderr)
    else:
      traceback.print_exc()   # a bug: its traceback is for whoever reads the log
    first = (str(e).strip().splitlines() or [''])[0][:300]
    res.put('_error', first if isinstance(e, LocoError) else f'{type(e).__name__}: {first}')
    return 1
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m launch.gpu_study', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', default=os.path.join('docs', 'gpu.md'),
                      help='the page to write (default docs/gpu.md); its numbers go beside '
                      'it (.json)')
  parser.add_argument('--work', default='',
                      help='a folder for the runs and results (default: a new temporary one)')
  parser.add_argument('--dry_run', action='store_true',
                      help='every phase at CPU sizes (about a minute on 2 cores)')
  parser.add_argument('--phases', default=','.join(PHASES),
                      help=f'a comma-separated subset of {",".join(PHASES)}, run in that order')
  parser.add_argument('--minutes', type=cli.positive_float, default=None,
                      help='no phase starts after this (default 8; a dry run 15)')
  parser.add_argument('--phase', choices=PHASES, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)

  if args.phase:   # one phase, started by the study
    return _phase_main(args.phase, args.work, args.dry_run)

  def body() -> int:
    phases = [p.strip() for p in args.phases.split(',') if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
      raise LocoError(f'--phases takes names from {",".join(PHASES)}, got '
                      f'{args.phases!r}.')
    minutes = args.minutes if args.minutes is not None else (15.0 if args.dry_run else 8.0)
    folder = os.path.dirname(os.path.abspath(args.out))
    cli.check_output_dir(folder, '--out\'s folder')
    if os.path.isdir(args.out):
      raise LocoError(f'--out {args.out} is a directory; name the page to write.')
    work = args.work or tempfile.mkdtemp(prefix='loco-gpu-study-')
    cli.check_output_dir(work, '--work')
    start = time.perf_counter()
    command = 'bash scripts/device/gpu_study.sh' if os.environ.get('LOCO_STUDY_SH') else (
        'python -m launch.gpu_study' + (' --dry_run' if args.dry_run else ''))
    print(f'{PROG}: work folder {work}; page {args.out}', flush=True)
    status = run_study(args.out, work, args.dry_run, phases, minutes, command)
    bad = [p for p in phases if status[p]['state'] != 'ok']
    print(f'{PROG}: {len(phases) - len(bad)} of {len(phases)} phases ok in '
          f'{time.perf_counter() - start:.0f} s; page: {args.out}', flush=True)
    if bad:
      raise LocoError(f'phases not finished: {", ".join(bad)} (the page has the rest).')
    return 0

  return cli.run(PROG, body)


if __name__ == '__main__':
  cli.exit(main())
