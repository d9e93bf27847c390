"""The training loop: `run(config, workdir)`. The only module that reads a ConfigDict.

One jit boundary: `train_chunk` scans `log_every` steps of (per-worker gradients ->
`Algorithm.step`) with the state donated; the metrics of a chunk are fetched after the
next chunk is dispatched, except at checkpoints, where the chunk's losses are checked
finite before the state is written.
"""

import dataclasses
import functools
import math
import os
import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from loco import algorithms
from loco import commlog
from loco import configs
from loco import data as data_lib
from loco import evaluate as evaluate_lib
from loco import model as model_lib
from loco import network as network_lib
from loco import optim
from loco import timeline as timeline_lib
from loco import workers
from loco import checkpoint as checkpoint_lib
from loco.checkpoint import Checkpointer
from loco.engine import Algorithm, LocoState
from loco import workdir as workdir_lib
from loco.errors import ConfigError, DivergenceError, Interrupted, WorkdirError
from loco.metrics import MetricsWriter, ProgressBar, SinkConfig, make_sinks


INNER_STATES = ('fresh', 'carried')


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
  mesh_fsdp: int
  grad_mode: str
  progress: bool
  init_from: str = ''
  init_inner_state: str = 'fresh'

  def __post_init__(self):
    for key in ('num_workers', 'steps', 'batch_per_worker', 'seq_len', 'log_every',
                'eval_batches', 'eval_batch_size', 'mesh_workers', 'mesh_fsdp'):
      if getattr(self, key) < 1:
        raise ConfigError(f'{_config_key(key)} must be >= 1, got {getattr(self, key)}.')
    if self.init_inner_state not in INNER_STATES:
      raise ConfigError(f'init_inner_state must be one of {INNER_STATES}, got '
                        f'{self.init_inner_state!r}.')
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
  sinks: SinkConfig = SinkConfig()


def _set(d) -> dict[str, Any]:
  return {k: v for k, v in d.items() if v is not None}


def parse_config(config: ml_collections.ConfigDict) -> Experiment:
  """Converts a ConfigDict into typed settings, with one clear error per bad value."""
  configs.validate(config)   # every key, type and range: the schema and algorithm specs
  c = config
  run = RunConfig(
      seed=c.seed, num_workers=c.num_workers, steps=c.steps,
      batch_per_worker=c.batch_per_worker, seq_len=c.seq_len, log_every=c.log_every,
      eval_every=c.eval.every, eval_batches=c.eval.batches,
      eval_batch_size=c.eval.batch_size, eval_per_worker=c.eval.per_worker,
      checkpoint_every=c.checkpoint.every, checkpoint_keep=c.checkpoint.keep,
      mesh_workers=c.mesh.workers, mesh_fsdp=c.mesh.fsdp, grad_mode=c.grad_mode,
      progress=c.progress, init_from=c.init_from, init_inner_state=c.init_inner_state)
  data = data_lib.DataConfig(**c.data)
  model_overrides = _set(c.model)
  preset = model_overrides.pop('preset')
  if 'vocab_size' not in model_overrides:
    model_overrides['vocab_size'] = data_lib.make_tokenizer(data).vocab_size
  model = model_lib.model_config(preset, **model_overrides)
  if run.seq_len > model.max_seq_len:
    raise ConfigError(f'seq_len={run.seq_len} is above the model\'s max_seq_len='
                      f'{model.max_seq_len}.')
  algorithm_kwargs = _set(c.algorithm)
  name = algorithm_kwargs.pop('name')
  inner_kwargs = _set(c.optimizer)
  inner_kwargs.setdefault('decay_steps', max(1, run.steps - c.optimizer.warmup_steps))
  inner_kwargs.setdefault('name', algorithms.spec_of(name).inner)
  inner = optim.InnerConfig(**inner_kwargs)
  network = network_lib.parse_network(c.network.to_dict())
  return Experiment(run, model, data, inner, name, algorithm_kwargs, network,
                    SinkConfig(**_set(c.metrics)))


def build_algorithm(exp: Experiment, mesh=None) -> Algorithm:
  inner = optim.inner_optimizer(exp.inner)
  return algorithms.make(exp.algorithm_name, inner, mesh=mesh, **exp.algorithm_kwargs)


def make_train_chunk(algorithm: Algorithm, model_cfg, graphdef, mesh=None,
                     grad_mode: str = 'auto'):
  """A jitted function scanning steps of (per-worker value_and_grad -> algorithm.step).

  Every chunk has the same length K (the last one is padded, its extra steps masked
  out by `valid`), so the chunk compiles once per run. A tick's train loss is the mean
  over the workers that step in it (`StepContext.active`).
  """
  loss_and_grad = jax.value_and_grad(
      functools.partial(model_lib.loss_fn, model_cfg, graphdef), has_aux=True)
  per_worker = workers.map_workers(loss_and_grad, grad_mode, mesh)

  def one_step(state, batch_MxBxL, ctx):
    if ctx is None or ctx.active is None:
      (_, aux), grads = per_worker(state.params, batch_MxBxL)
      ce_M = aux['ce']
    else:
      # Workers that sit the tick out take no gradient (skipped under grad_mode 'map')
      # and report the mean loss of those that step; worker 0 measures a tick where
      # nobody steps.
      measured = ctx.active.at[0].set(ctx.active[0] | ~jnp.any(ctx.active))
      (_, aux), grads = per_worker(state.params, batch_MxBxL, active=measured)
      mean = jnp.sum(jnp.where(measured, aux['ce'], 0.0)) / jnp.sum(measured)
      ce_M = jnp.where(measured, aux['ce'], mean)
    state, info = algorithm.step(state, grads, ctx)
    return state, (ce_M, info)

  def train_chunk(state: LocoState, batches_KxMxBxL: jax.Array, contexts, valid_K):
    """Scans the K steps; `contexts` is None or a StepContext of [K, ...] arrays."""
    def body(state, xs):
      batch_MxBxL, ctx, valid = xs
      out_shape = jax.eval_shape(one_step, state, batch_MxBxL, ctx)[1]
      skip = lambda state, *_: (state, jax.tree.map(
          lambda s: jnp.zeros(s.shape, s.dtype), out_shape))
      return jax.lax.cond(valid, one_step, skip, state, batch_MxBxL, ctx)
    state, outputs = jax.lax.scan(body, state, (batches_KxMxBxL, contexts, valid_K))
    if mesh is not None:   # the state leaves placed as it came, so its donation is reused
      state = jax.lax.with_sharding_constraint(state, workers.state_shardings(state, mesh))
    return state, outputs

  return jax.jit(train_chunk, donate_argnums=0)


def init_state(exp: Experiment, algorithm: Algorithm, key: jax.Array, mesh=None):
  """(graphdef, init, abstract): the model's structure, the state's jitted init (call
  it with `key`, and one model's params to start from for a warm start) and the
  state's shapes, dtypes and shardings (for compiling ahead).

  Jitted outputs never share buffers, so the state can be donated even where an init
  aliases (an anchor or an auxiliary variable equal to the params).
  """
  params_key, alg_key = jax.random.split(key)
  graphdef = jax.eval_shape(functools.partial(model_lib.init_params, exp.model),
                            params_key)[0]

  def init(key, params=None):
    # `params`: one model to start every worker from (a warm start), else drawn.
    params_key, alg_key = jax.random.split(key)
    if params is None:
      params = model_lib.init_params(exp.model, params_key)[1]
    return algorithm.init(params, exp.run.num_workers, alg_key)

  abstract = jax.eval_shape(init, key)
  shardings = workers.state_shardings(abstract, mesh)
  if shardings is not None:
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            abstract, shardings)
  jitted = jax.jit(init) if shardings is None else jax.jit(init, out_shardings=shardings)
  return graphdef, jitted, abstract


def _warm_start(init, key, like: LocoState, source: str, inner_state: str,
                note: Callable[[str], None]) -> LocoState:
  """The initial state from another run's checkpoint: every worker starts from the mean
  of the source's workers' params (the anchor too); the inner optimizer state is fresh,
  or the source's averaged over its workers ('carried'; step counts from its worker 0)."""
  where, saved = checkpoint_lib.read_named_state(source)

  def averaged(field: str) -> list[np.ndarray]:
    one_worker = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                              getattr(like, field))
    try:
      return checkpoint_lib.worker_means(saved[field], one_worker, field)
    except KeyError as e:
      differs = ('its model differs' if field == 'params' else
                 'its inner optimizer differs (init_inner_state=fresh starts it anew)')
      raise ConfigError(f'init_from: the checkpoint at {where} has no {e.args[0]}; '
                        f'{differs}.') from None
    except ValueError as e:
      name, saved_shape, shape = e.args
      raise ConfigError(f'init_from: {name} is {saved_shape} in {where} but {shape} here; '
                        'the models differ.') from None

  params = jax.tree.unflatten(jax.tree.structure(like.params), averaged('params'))
  state = init(key, params)
  if inner_state == 'carried':
    leaves = [jax.device_put(np.broadcast_to(v, x.shape), x.sharding)
              for v, x in zip(averaged('inner_state'), jax.tree.leaves(like.inner_state))]
    state = state._replace(inner_state=jax.tree.unflatten(
        jax.tree.structure(like.inner_state), leaves))
  note(f'warm start from {where}: the mean of its workers\' params, inner optimizer '
       f'state {inner_state}.')
  return state


def enable_compilation_cache() -> str | None:
  """Turns on JAX's persistent compilation cache; returns its folder (None if off).

  The folder is $LOCO_JAX_CACHE (default ~/.cache/loco/jax; an empty value turns it
  off), unless jax_compilation_cache_dir is already set. A run then compiles its step
  once per machine and config, not at every start. Call before anything compiles.
  """
  if jax.config.jax_compilation_cache_dir:
    return jax.config.jax_compilation_cache_dir
  path = os.environ.get('LOCO_JAX_CACHE', os.path.join('~', '.cache', 'loco', 'jax'))
  if not path:
    return None
  path = os.path.expanduser(path)
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.2)
  return path


class _CompileAhead:
  """Compiles a lowered computation in a background thread.

  XLA compiles without holding the GIL, so the train chunk compiles while the main
  thread initialises the state and reads the data. Tracing and lowering stay in the
  main thread: they import modules lazily, and two threads importing at once can see
  half-initialised modules. The thread is not a daemon: a run that fails early lets it
  finish (a daemon thread still inside XLA when Python exits aborts the process).
  """

  def __init__(self, lowered):
    self._result = self._error = None
    self._thread = threading.Thread(target=self._compile, args=(lowered,), daemon=False)
    self._thread.start()

  def _compile(self, lowered):
    try:
      self._result = lowered.compile()
    except BaseException as e:  # re-raised in the main thread by get()
      self._error = e

  def get(self):
    self._thread.join()
    if self._error is not None:
      raise self._error
    return self._result


def _pad_steps(tree, length: int):
  """Pads the leading (steps) axis of every leaf to `length` by repeating the last row."""
  def pad(x):
    x = np.asarray(x)
    extra = length - x.shape[0]
    return x if extra == 0 else np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
  return jax.tree.map(pad, tree)


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
    self.best_loss = float(d.get('best_loss', math.inf))

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
                syncs=self.syncs, best_loss=self.best_loss, timeline=self.timeline)


# The divergence rule: a run has diverged when a step's mean training loss is not
# finite, or when, after the run has learned something (its best loss is LEARNED_MARGIN
# nats below ln V, the loss of uniform guessing over the vocabulary), a step's loss is
# back within UNIFORM_MARGIN of ln V or above (the model exploded: its predictions are
# no better than uniform, whatever its parameters). No checkpoint is written after it.
LEARNED_MARGIN = 0.5
UNIFORM_MARGIN = 0.01


def check_losses(losses_KxM: np.ndarray, first_step: int, best: float,
                 vocab_size: int) -> tuple[float, int | None, str | None]:
  """(best loss so far, None, None), or (best, the step, why) if the run diverged."""
  uniform = math.log(vocab_size)
  for i, row in enumerate(np.asarray(losses_KxM, np.float64)):
    loss, step = float(row.mean()), first_step + i
    if not np.all(np.isfinite(row)):
      return best, step, f'the training loss became {loss} at step {step}'
    if best < uniform - LEARNED_MARGIN and loss >= uniform - UNIFORM_MARGIN:
      return best, step, (f'the training loss rose to {loss:.3f} at step {step}, no '
                          f'better than uniform guessing (ln V = {uniform:.3f}) after '
                          f'reaching {best:.3f}: the model exploded')
    best = min(best, loss)
  return best, None, None


def run(config: ml_collections.ConfigDict, workdir: str, *,
        timings: dict[str, float] | None = None) -> dict[str, Any]:
  """Trains (or resumes) the experiment in `workdir`; returns the last metrics record.

  Everything a user can cause ends in one `LocoError` (a config, data, workdir or
  checkpoint problem, divergence, Ctrl-C / SIGTERM) and never loses a committed
  checkpoint. A workdir holds one run at a time (a lock); resuming needs the same
  config (only `steps` may grow); a finished run returns its last record.

  Args:
    config: the experiment's ConfigDict (experiments/base.py).
    workdir: the run directory.
    timings: if given, filled with seconds per start-up phase (config, init, data,
      restore, compile, first_chunk).
  """
  clock = _Phases(timings)
  exp = parse_config(config)
  r = exp.run
  mesh = workers.make_mesh(r.mesh_workers, r.num_workers, r.mesh_fsdp)
  algorithm = build_algorithm(exp, mesh)
  clock.lap('config')
  is_main = jax.process_index() == 0
  with workdir_lib.Workdir(workdir, lock=is_main) as wd:
    checkpointer = None
    try:
      checkpointer = Checkpointer(wd.file('checkpoints'), r.checkpoint_keep,
                                  note=_note if is_main else None)
      return _train(wd, config, exp, algorithm, mesh, checkpointer, is_main, clock)
    except OSError as e:
      raise WorkdirError(f'{_os_error(e)}; {_kept(checkpointer, wd.path)}: fix it and '
                         'the same command resumes.') from e
    except KeyboardInterrupt:
      at = f' after step {clock.step}' if clock.step is not None else ' while starting'
      raise Interrupted(f'interrupted{at}; {_kept(checkpointer, wd.path)}: the same '
                        'command resumes from it.') from None
    finally:
      if checkpointer is not None:
        _close_quietly(checkpointer)


# Set by loco.main's SIGINT / SIGTERM handler: the loop stops before its next chunk.
STOP = threading.Event()


class _Phases:
  """Wall seconds of the start-up phases (into a caller's dict), and the step reached."""

  def __init__(self, out: dict[str, float] | None):
    self.out = out
    self.t = time.perf_counter()
    self.step: int | None = None    # the last step whose results are in, for messages

  def wants(self, name: str) -> bool:
    return self.out is not None and name not in self.out

  def lap(self, name: str) -> None:
    now = time.perf_counter()
    if self.out is not None:
      self.out[name] = self.out.get(name, 0.0) + now - self.t
    self.t = now


def _os_error(e: OSError) -> str:
  where = f' ({e.filename})' if e.filename else ''
  return f'{e.strerror or e}{where}'


def _kept(checkpointer: Checkpointer | None, path: str) -> str:
  """Names the newest committed checkpoint, after an in-flight save commits or fails."""
  step = None
  if checkpointer is not None:
    try:
      checkpointer.wait()
    except Exception:  # a failed save: the newest committed one is what is kept
      pass
    try:
      step = checkpointer.latest_step()
    except Exception:  # the checkpoint dir itself may be unreadable
      step = None
  if step:
    return f'the last good checkpoint (step {step}) is kept in {path}'
  return f'no checkpoint was written in {path} yet'


def _close_quietly(checkpointer: Checkpointer) -> None:
  try:
    checkpointer.close()
  except Exception:  # the error that matters is the one already being raised
    pass


def _note(message: str) -> None:
  print(f'loco: note: {message}', file=sys.stderr, flush=True)


def _train(wd: workdir_lib.Workdir, config, exp: Experiment, algorithm: Algorithm, mesh,
           checkpointer: Checkpointer, is_main: bool, clock: _Phases) -> dict[str, Any]:
  r = exp.run
  note = _note if is_main else (lambda message: None)
  diverged = wd.diverged()
  if diverged:
    raise DivergenceError(
        f'the run in {wd.path} diverged at step {diverged.get("step")} (see '
        f'{workdir_lib.DIVERGED}): resuming it would diverge again; use a new workdir, '
        f'or delete {workdir_lib.DIVERGED} to try anyway.')
  sequence_tokens = r.batch_per_worker * r.seq_len       # one worker's tokens per step
  round_steps = algorithms.settings_of(exp.algorithm_name,
                                       exp.algorithm_kwargs).get('sync_every') or 1
  timeline = timeline_lib.make_timeline(
      exp.network, num_workers=r.num_workers, steps=r.steps, round_steps=round_steps,
      algorithm=algorithm, name=exp.algorithm_name,
      flops_per_token=model_lib.flops_per_token(exp.model, r.seq_len),
      tokens_per_step=sequence_tokens, model_bytes=4 * model_lib.param_count(exp.model))
  # Ticks: inner steps, or the asynchronous replay's ticks.
  total = timeline.num_ticks if timeline is not None else r.steps

  start = checkpointer.latest_step() or 0
  if start:
    for message in wd.check_resume(config.to_dict(), start):
      note(message)
    if start > total:
      raise WorkdirError(f'the checkpoint in {wd.path} is at step {start}, past this '
                         f'run\'s {total} steps; steps may only grow on resume.')
    if start == total:
      note(f'the run in {wd.path} finished before (step {start} of {total}); nothing to do.')
      return wd.last_record()

  tokenizer_vocab = data_lib.make_tokenizer(exp.data).vocab_size
  if exp.model.vocab_size < tokenizer_vocab:
    # Token ids past the embedding table would be clipped silently by the gather.
    raise ConfigError(f'model.vocab_size={exp.model.vocab_size} is below the tokenizer\'s '
                      f'{tokenizer_vocab} tokens; leave it unset (the tokenizer\'s size) or '
                      'make it at least that.')
  key = jax.random.key(r.seed)
  graphdef, init, abstract_state = init_state(exp, algorithm, key, mesh)
  train_chunk = make_train_chunk(algorithm, exp.model, graphdef, mesh, r.grad_mode)
  chunk_len = min(r.log_every, total)
  batches_shape = (chunk_len, r.num_workers, r.batch_per_worker, r.seq_len + 1)
  ahead = _CompileAhead(train_chunk.lower(
      abstract_state,
      jax.ShapeDtypeStruct(batches_shape, jnp.int32, sharding=workers.steps_sharding(mesh, r.batch_per_worker)),
      None if timeline is None else _pad_steps(timeline.contexts(0, 1), chunk_len),
      jax.ShapeDtypeStruct((chunk_len,), jnp.bool_)))
  if r.init_from and not start:
    state = _warm_start(init, key, abstract_state, r.init_from, r.init_inner_state, note)
  else:
    state = init(key)
  clock.lap('init')

  # On several hosts each process reads and tokenizes only its own workers' data.
  train_data = data_lib.make_train_iterator(
      exp.data, num_workers=r.num_workers, batch_per_worker=r.batch_per_worker,
      seq_len=r.seq_len, seed=r.seed,
      workers=workers.process_workers(mesh, r.num_workers, r.batch_per_worker))
  if jax.process_count() > 1:
    mine = train_data.workers
    print(f'loco: process {jax.process_index()} reads the data of workers '
          f'{mine[0]}-{mine[-1]} of {r.num_workers}.', flush=True)
  eval_windows = data_lib.make_eval_windows(
      exp.data, batch_size=r.eval_batch_size, seq_len=r.seq_len,
      num_batches=r.eval_batches)
  clock.lap('data')

  counters = _Counters()
  if start:
    state, data_state, host_state = checkpointer.restore(start, state)
    train_data.set_state(data_state)
    counters = _Counters(host_state)
    if timeline is not None:
      timeline.load_state_dict(counters.timeline)
  if is_main:
    _write_config_json(wd, config, exp)
  clock.lap('restore')

  evaluate = evaluate_lib.make_evaluator(exp.model, graphdef, r.eval_per_worker)
  check_finite = jax.jit(_all_finite)
  writer = (MetricsWriter(wd.path, resume_step=start, note=note,
                          sinks=make_sinks(wd.path, exp.sinks, config.to_dict(), start))
            if is_main else _NoWriter())
  comm_log = (commlog.CommLog(wd.path, r.num_workers, resume_step=start) if is_main
              else _NoWriter())
  progress = ProgressBar(total, start, enabled=r.progress and is_main)
  compiled = None
  last: dict[str, Any] = {}

  def next_chunk(step):
    # Chunks end on multiples of log_every (and at the end); each is padded to chunk_len.
    k = min(chunk_len - step % chunk_len, total - step)
    batches = np.stack([next(train_data) for _ in range(k)])
    contexts = None if timeline is None else timeline.contexts(step, k)
    valid = np.arange(chunk_len) < k
    batches, contexts = _pad_steps((batches, contexts), chunk_len)
    return (k, workers.shard_steps(batches, mesh, r.num_workers), contexts, valid,
            train_data.get_state())

  # Throughput: wall time between consecutive chunk results, less compilation,
  # evaluation and checkpointing (each restarts the interval when it ends).
  t_mark = time.perf_counter()

  def finish_chunk(end_step, k, outputs):
    """Host-side work for a chunk whose outputs are ready (or about to be)."""
    nonlocal last, t_mark
    losses, info = _fetch(outputs)
    now = time.perf_counter()
    elapsed, t_mark = max(now - t_mark, 1e-9), now
    clock.step = end_step
    losses = np.asarray(losses)[:k]                              # [k, M]
    info = jax.tree.map(lambda x: np.asarray(x)[:k], info)
    start_step = end_step - k
    counters.best_loss, bad_step, why = check_losses(
        losses, start_step + 1, counters.best_loss, exp.model.vocab_size)
    if why:
      message = f'{why}; {_kept(checkpointer, wd.path)}.'
      if is_main:
        wd.mark_diverged(bad_step, message)
      raise DivergenceError(message)
    active = (np.ones((k, r.num_workers), bool) if timeline is None
              else timeline.active(start_step, k))
    worker_steps = active.sum()
    counters.add(info, worker_steps * sequence_tokens)
    comm_log.append(start_step + 1, timeline_lib.wires(active, info))
    sim = dict(sim_seconds=0.0)
    if timeline is not None:
      timeline.advance(start_step, info)
      counters.timeline = timeline.state_dict()
      sim = timeline.metrics(end_step)
    record = dict(step=end_step, tokens=counters.tokens,
                  train_loss=float(losses[-1].mean()),
                  bytes_sent=counters.bytes_sent, bytes_received=counters.bytes_received,
                  peak_bytes=counters.peak_bytes, syncs=counters.syncs, **sim,
                  tokens_per_second=float(worker_steps * sequence_tokens / elapsed))
    last = record
    return record, elapsed / k

  step = start
  pending = None          # (end_step, k, outputs) of the chunk in flight
  eval_cost_said = False
  while step < total:
    if STOP.is_set():
      raise KeyboardInterrupt
    k, batches, contexts, valid, data_state = next_chunk(step)
    if compiled is None:
      clock.lap('first_batch')
      compiled = ahead.get()
      clock.lap('compile')
      t_mark = time.perf_counter()
    state, outputs = compiled(state, batches, contexts, valid)
    step += k
    if pending is not None:
      _emit(writer, progress, *finish_chunk(*pending))
    pending = (step, k, outputs)
    boundary_eval = r.eval_every and (step % r.eval_every == 0 or step == total)
    boundary_ckpt = step == total or (r.checkpoint_every and step % r.checkpoint_every == 0)
    if boundary_eval or boundary_ckpt:
      record, step_seconds = finish_chunk(*pending)
      pending = None
      if boundary_eval:
        t_eval = time.perf_counter()
        record.update(evaluate(state.params, eval_windows))
        if not eval_cost_said:
          eval_cost_said = True
          note(f'eval: {r.eval_batches} x {r.eval_batch_size} windows from '
               f'{len(np.unique(eval_windows.docs))} of {eval_windows.split_documents} '
               f'documents of {exp.data.eval_split}, {time.perf_counter() - t_eval:.1f} s '
               'per eval (the first includes compiling it).')
      # The row first, then the checkpoint: a checkpoint never exists without its row.
      _emit(writer, progress, record, step_seconds)
      if boundary_ckpt:
        if not bool(check_finite(state.params)):
          message = (f'the parameters became non-finite by step {step}; '
                     f'{_kept(checkpointer, wd.path)}.')
          if is_main:
            wd.mark_diverged(step, message)
          raise DivergenceError(message)
        checkpointer.save(step, state, _every_position(data_state), counters.as_dict())
      t_mark = time.perf_counter()
    if clock.wants('first_chunk'):
      jax.block_until_ready(outputs)
      clock.lap('first_chunk')
  if pending is not None:
    _emit(writer, progress, *finish_chunk(*pending))
  progress.close()
  writer.close()
  comm_log.close()
  checkpointer.wait()
  return last


def _emit(writer: MetricsWriter, progress: ProgressBar, record: dict,
          step_seconds: float) -> None:
  writer.write(record)
  progress.update(record['step'], record['train_loss'], record['tokens_per_second'],
                  record.get('eval_loss'), step_seconds=step_seconds)


def _fetch(tree):
  """Host copies of (possibly worker-sharded) arrays, from every process's devices."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


def _every_position(data_state: dict[str, Any]) -> dict[str, Any]:
  """The data state with every worker's position: on several hosts each process
  knows only the workers it reads (None for the others), so they are gathered."""
  if jax.process_count() == 1:
    return data_state
  from jax.experimental import multihost_utils
  mine = np.array([(-1, -1) if p is None else p for p in data_state['workers']], np.int32)
  every = multihost_utils.process_allgather(mine).max(axis=0)   # [processes, M, 2] -> [M, 2]
  return dict(data_state, workers=every.tolist())


class _NoWriter:
  """The metrics and communication-log writer of processes other than process 0."""

  def write(self, record: dict[str, Any]) -> None:
    del record

  def append(self, *args) -> None:
    del args

  def close(self) -> None:
    pass


def _write_config_json(wd: workdir_lib.Workdir, config, exp: Experiment) -> None:
  out = dict(config=config.to_dict(),
             model=dict(dataclasses.asdict(exp.model),
                        param_count=model_lib.param_count(exp.model),
                        flops_per_token=model_lib.flops_per_token(exp.model,
                                                                  exp.run.seq_len)),
             data_fingerprint=data_lib.dataset_fingerprint(exp.data))
  workdir_lib.write_json(wd.file(workdir_lib.CONFIG), out)


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
