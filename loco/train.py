"""The training loop: `run(config, workdir)`. The only module that reads a ConfigDict.

One jit boundary: `train_chunk` scans `log_every` steps of (per-worker gradients ->
`Algorithm.step`) with the state donated; the metrics of a chunk are fetched after the
next chunk is dispatched, except at checkpoints, where the chunk's losses are checked
finite before the state is written.
"""

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from loco import algorithms
from loco import data as data_lib
from loco import model as model_lib
from loco import network as network_lib
from loco import optim
from loco import timeline as timeline_lib
from loco import workers
from loco.checkpoint import Checkpointer
from loco.engine import Algorithm, LocoState
from loco.errors import ConfigError, DivergenceError
from loco.metrics import MetricsWriter, ProgressBar


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The loop's own settings, typed (see experiments/base.py for their meaning)."""
  seed: int
  num_workers: int
  steps: int
  batch_per_worker: int
  seq_len: int
  log_every: int
  eval_every: int
  eval_batches: int
  eval_batch_size: int
  eval_per_worker: bool
  checkpoint_every: int
  checkpoint_keep: int
  mesh_workers: int
  grad_mode: str
  progress: bool

  def __post_init__(self):
    for key in ('num_workers', 'steps', 'batch_per_worker', 'seq_len', 'log_every',
                'eval_batches', 'eval_batch_size', 'mesh_workers'):
      if getattr(self, key) < 1:
        raise ConfigError(f'{_config_key(key)} must be >= 1, got {getattr(self, key)}.')
    if self.grad_mode not in workers.GRAD_MODES:
      raise ConfigError(f'grad_mode must be one of {workers.GRAD_MODES}, got '
                        f'{self.grad_mode!r}.')
    for key in ('eval_every', 'checkpoint_every'):
      value = getattr(self, key)
      if value < 0 or value % self.log_every:
        raise ConfigError(f'{_config_key(key)} must be a non-negative multiple of '
                          f'log_every={self.log_every}, got {value}.')


def _config_key(field: str) -> str:
  for prefix in ('eval', 'checkpoint', 'mesh'):
    if field.startswith(prefix + '_'):
      return f'{prefix}.{field[len(prefix) + 1:]}'
  return field


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything `run` builds from a config: typed settings, model, data, algorithm."""
  run: RunConfig
  model: model_lib.ModelConfig
  data: data_lib.DataConfig
  inner: optim.InnerConfig
  algorithm_name: str
  algorithm_kwargs: dict[str, Any]
  network: network_lib.NetworkConfig | None = None


def _set(d) -> dict[str, Any]:
  return {k: v for k, v in d.items() if v is not None}


def parse_config(config: ml_collections.ConfigDict) -> Experiment:
  """Converts a ConfigDict into typed settings, with one clear error per bad value."""
  c = config
  run = RunConfig(
      seed=c.seed, num_workers=c.num_workers, steps=c.steps,
      batch_per_worker=c.batch_per_worker, seq_len=c.seq_len, log_every=c.log_every,
      eval_every=c.eval.every, eval_batches=c.eval.batches,
      eval_batch_size=c.eval.batch_size, eval_per_worker=c.eval.per_worker,
      checkpoint_every=c.checkpoint.every, checkpoint_keep=c.checkpoint.keep,
      mesh_workers=c.mesh.workers, grad_mode=c.grad_mode, progress=c.progress)
  data = data_lib.DataConfig(**c.data)
  model_overrides = _set(c.model)
  preset = model_overrides.pop('preset')
  if 'vocab_size' not in model_overrides:
    model_overrides['vocab_size'] = data_lib.make_tokenizer(data).vocab_size
  model = model_lib.model_config(preset, **model_overrides)
  if run.seq_len > model.max_seq_len:
    raise ConfigError(f'seq_len={run.seq_len} is above the model\'s max_seq_len='
                      f'{model.max_seq_len}.')
  inner_kwargs = _set(c.optimizer)
  inner_kwargs.setdefault('decay_steps', max(1, run.steps - c.optimizer.warmup_steps))
  inner = optim.InnerConfig(**inner_kwargs)
  algorithm_kwargs = _set(c.algorithm)
  name = algorithm_kwargs.pop('name')
  if name not in algorithms.REGISTRY:
    raise ConfigError(f'algorithm.name must be one of {sorted(algorithms.REGISTRY)}, '
                      f'got {name!r}.')
  network = network_lib.parse_network(c.network.to_dict())
  return Experiment(run, model, data, inner, name, algorithm_kwargs, network)


def build_algorithm(exp: Experiment, mesh=None) -> Algorithm:
  inner = optim.inner_optimizer(exp.inner)
  return algorithms.make(exp.algorithm_name, inner, mesh=mesh, **exp.algorithm_kwargs)


def make_train_chunk(algorithm: Algorithm, model_cfg, graphdef, mesh=None,
                     grad_mode: str = 'auto'):
  """A jitted function scanning steps of (per-worker value_and_grad -> algorithm.step)."""
  loss_and_grad = jax.value_and_grad(
      functools.partial(model_lib.loss_fn, model_cfg, graphdef), has_aux=True)
  per_worker = workers.map_workers(loss_and_grad, grad_mode, mesh)

  def train_chunk(state: LocoState, batches_KxMxBxL: jax.Array, contexts=None):
    """Scans the K steps; `contexts` is None or a StepContext of [K, ...] arrays."""
    def body(state, xs):
      batch_MxBxL, ctx = xs
      (_, aux), grads = per_worker(state.params, batch_MxBxL)
      state, info = algorithm.step(state, grads, ctx)
      return state, (aux['ce'], info)
    return jax.lax.scan(body, state, (batches_KxMxBxL, contexts))

  return jax.jit(train_chunk, donate_argnums=0)


def make_evaluator(model_cfg, graphdef, per_worker: bool):
  """Jitted eval of the worker-averaged model and, optionally, of each worker."""
  def loss_on(params, batches_NxBxL):
    def body(total, batch):
      return total + model_lib.loss_fn(model_cfg, graphdef, params, batch)[1]['ce'], None
    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), batches_NxBxL)
    return total / batches_NxBxL.shape[0]

  @jax.jit
  def evaluate(params_MxP, batches):
    out = {'eval_loss': loss_on(workers.mean_model(params_MxP), batches),
           'worker_spread': workers.worker_spread(params_MxP)}
    if per_worker:
      losses = jax.vmap(loss_on, in_axes=(0, None))(params_MxP, batches)
      out['eval_loss_workers'] = jnp.mean(losses)
    return out

  return evaluate


def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
                            if jnp.issubdtype(x.dtype, jnp.floating)]))


class _Counters:
  """Host-side cumulative accounting, checkpointed with the state."""

  def __init__(self, d: dict | None = None):
    d = d or {}
    self.timeline = d.get('timeline', {})
    self.tokens = int(d.get('tokens', 0))
    self.bytes_sent = float(d.get('bytes_sent', 0.0))
    self.bytes_received = float(d.get('bytes_received', 0.0))
    self.peak_bytes = float(d.get('peak_bytes', 0.0))
    self.syncs = float(d.get('syncs', 0.0))

  def add(self, info, tokens: int) -> None:
    sent = np.asarray(info.bytes_sent, np.float64)        # [K, M]
    self.tokens += int(tokens)
    self.bytes_sent += float(sent.mean(axis=1).sum())
    self.bytes_received += float(np.asarray(info.bytes_received, np.float64).mean(1).sum())
    self.peak_bytes = max(self.peak_bytes, float(sent.max()))
    self.syncs += float(np.asarray(info.comms, np.float64).mean(axis=1).sum())

  def as_dict(self) -> dict:
    return dict(tokens=self.tokens, bytes_sent=self.bytes_sent,
                bytes_received=self.bytes_received, peak_bytes=self.peak_bytes,
                syncs=self.syncs, timeline=self.timeline)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (or resumes) the experiment in `workdir`; returns the last metrics record."""
  exp = parse_config(config)
  r = exp.run
  os.makedirs(workdir, exist_ok=True)
  mesh = workers.make_mesh(r.mesh_workers, r.num_workers)
  algorithm = build_algorithm(exp, mesh)

  key = jax.random.PRNGKey(r.seed)
  params_key, alg_key = jax.random.split(key)
  graphdef, params = model_lib.init_params(exp.model, params_key)
  state = algorithm.init(params, r.num_workers, alg_key)
  # The chunk donates the state: give every leaf its own buffer, since an init may
  # legitimately alias (an anchor or an auxiliary variable equal to the params).
  state = workers.shard_state(jax.tree.map(jnp.copy, state), mesh)

  train_data = data_lib.make_train_iterator(
      exp.data, num_workers=r.num_workers, batch_per_worker=r.batch_per_worker,
      seq_len=r.seq_len, seed=r.seed)
  eval_batches = jnp.asarray(data_lib.make_eval_batches(
      exp.data, batch_size=r.eval_batch_size, seq_len=r.seq_len,
      num_batches=r.eval_batches))

  sequence_tokens = r.batch_per_worker * r.seq_len       # one worker's tokens per step
  timeline = timeline_lib.make_timeline(
      exp.network, num_workers=r.num_workers, steps=r.steps,
      algorithm=exp.algorithm_name, algorithm_kwargs=exp.algorithm_kwargs,
      flops_per_token=model_lib.flops_per_token(exp.model, r.seq_len),
      tokens_per_step=sequence_tokens, model_bytes=4 * model_lib.param_count(exp.model))
  # Ticks: inner steps, or the asynchronous replay's ticks.
  total = timeline.num_ticks if timeline is not None else r.steps

  checkpointer = Checkpointer(os.path.join(workdir, 'checkpoints'), r.checkpoint_keep)
  counters = _Counters()
  start = checkpointer.latest_step() or 0
  if start:
    state, data_state, host_state = checkpointer.restore(start, state)
    train_data.set_state(data_state)
    counters = _Counters(host_state)
    if timeline is not None:
      timeline.load_state_dict(counters.timeline)
  # On several hosts every process runs the same program; process 0 writes the files.
  is_main = jax.process_index() == 0
  if is_main:
    _write_config_json(workdir, config, exp)

  train_chunk = make_train_chunk(algorithm, exp.model, graphdef, mesh, r.grad_mode)
  evaluate = make_evaluator(exp.model, graphdef, r.eval_per_worker)
  check_finite = jax.jit(_all_finite)
  writer = MetricsWriter(workdir, resume_step=start) if is_main else _NoWriter()
  progress = ProgressBar(total, start, enabled=r.progress and is_main)
  last: dict[str, Any] = {}

  def next_chunk(step):
    k = min(r.log_every, total - step)
    batches = np.stack([next(train_data) for _ in range(k)])
    contexts = None if timeline is None else timeline.contexts(step, k)
    return (k, workers.shard_steps(jnp.asarray(batches), mesh), contexts,
            train_data.get_state())

  def finish_chunk(end_step, k, outputs, t_dispatch):
    """Host-side work for a chunk whose outputs are ready (or about to be)."""
    nonlocal last
    losses, info = _fetch(outputs)
    losses = np.asarray(losses)                                  # [K, M]
    if not np.all(np.isfinite(losses)):
      bad = end_step - k + 1 + int(np.argmax(~np.all(np.isfinite(losses), axis=1)))
      good = checkpointer.latest_step()
      kept = f'the last good checkpoint (step {good}) is kept' if good else 'no checkpoint was written yet'
      raise DivergenceError(f'the training loss became {losses[bad - (end_step - k + 1)].mean()} '
                            f'at step {bad}; {kept} in {workdir}.')
    start_step = end_step - k
    worker_steps = (k * r.num_workers if timeline is None
                    else timeline.active(start_step, k).sum())
    counters.add(info, worker_steps * sequence_tokens)
    clock = dict(sim_seconds=0.0)
    if timeline is not None:
      timeline.advance(start_step, info)
      counters.timeline = timeline.state_dict()
      clock = timeline.metrics(end_step)
    elapsed = max(time.time() - t_dispatch, 1e-9)
    record = dict(step=end_step, tokens=counters.tokens,
                  train_loss=float(losses[-1].mean()),
                  bytes_sent=counters.bytes_sent, bytes_received=counters.bytes_received,
                  peak_bytes=counters.peak_bytes, syncs=counters.syncs, **clock,
                  tokens_per_second=worker_steps * sequence_tokens / elapsed)
    last = record
    return record

  step = start
  pending = None          # (end_step, k, outputs, t_dispatch) of the chunk in flight
  t_prev = time.time()
  while step < total:
    k, batches, contexts, data_state = next_chunk(step)
    state, outputs = train_chunk(state, batches, contexts)
    step += k
    if pending is not None:
      _emit(writer, progress, finish_chunk(*pending))
    pending = (step, k, outputs, t_prev)
    boundary_eval = r.eval_every and (step % r.eval_every == 0 or step == total)
    boundary_ckpt = step == total or (r.checkpoint_every and step % r.checkpoint_every == 0)
    if boundary_eval or boundary_ckpt:
      record = finish_chunk(*pending)
      pending = None
      if boundary_eval:
        record.update({k_: float(v) for k_, v in evaluate(state.params, eval_batches).items()})
      if boundary_ckpt:
        if not bool(check_finite(state.params)):
          raise DivergenceError(f'the parameters became non-finite by step {step}; the '
                                f'last good checkpoint (step {checkpointer.latest_step()}) '
                                f'is kept in {workdir}.')
        checkpointer.save(step, state, data_state, counters.as_dict())
      _emit(writer, progress, record)
    t_prev = time.time()
  if pending is not None:
    _emit(writer, progress, finish_chunk(*pending))
  progress.close()
  writer.close()
  checkpointer.close()
  return last


def _emit(writer: MetricsWriter, progress: ProgressBar, record: dict) -> None:
  writer.write(record)
  progress.update(record['step'], record['train_loss'], record['tokens_per_second'],
                  record.get('eval_loss'))


def _fetch(tree):
  """Host copies of (possibly worker-sharded) arrays, from every process's devices."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


class _NoWriter:
  """The metrics writer of processes other than process 0."""

  def write(self, record: dict[str, Any]) -> None:
    del record

  def close(self) -> None:
    pass


def _write_config_json(workdir: str, config, exp: Experiment) -> None:
  out = dict(config=config.to_dict(),
             model=dict(dataclasses.asdict(exp.model),
                        param_count=model_lib.param_count(exp.model),
                        flops_per_token=model_lib.flops_per_token(exp.model,
                                                                  exp.run.seq_len)),
             data_fingerprint=data_lib.dataset_fingerprint(exp.data))
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(out, f, indent=2, default=str)


def print_summary(config, workdir: str, record: dict[str, Any]) -> None:
  """Prints the end-of-run lines: final eval loss against the unigram-entropy reference."""
  if jax.process_index() != 0:
    return
  exp = parse_config(config)
  lines = [f'workdir: {workdir}', f'steps: {record.get("step")}  tokens: {record.get("tokens")}']
  if 'eval_loss' in record:
    entropy = data_lib.unigram_entropy_nats(exp.data)
    lines.append(f'final eval_loss: {record["eval_loss"]:.4f} nats/token  '
                 f'(unigram entropy of the eval split: {entropy:.4f} nats/token)')
  lines.append(f'bytes sent per worker: {record.get("bytes_sent", 0):,.0f}  '
               f'syncs: {record.get("syncs", 0):.0f}')
  if record.get('sim_seconds'):
    lines.append(f'simulated time: {record["sim_seconds"]:,.1f} s  compute utilization: '
                 f'{record["utilization"]:.1%}  (network.profile={exp.network.profile!r})')
  print('\n'.join(lines))
