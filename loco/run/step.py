"""The jitted program: the state's init (born sharded) and the train chunk, compiled ahead.

One jit boundary (STYLE 7): `make_train_chunk` scans a chunk of steps of (per-worker
value_and_grad -> `Algorithm.step`) with the state donated; `init_state` draws the
state with the shardings the chunk keeps; `compile_ahead` compiles the chunk in a
background thread while the host initialises and reads data; chunks are padded to one
length (`pad_steps`) so the program compiles once per run. `enable_compilation_cache`
keeps compiled programs across starts.
"""

import functools
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from loco.comm import axis
from loco import model as model_lib
from loco.run import placement
from loco.core.engine import Algorithm, LocoState
from loco.run.experiment import Experiment


def make_train_chunk(algorithm: Algorithm, model_cfg, graphdef, mesh=None,
                     grad_mode: str = 'auto'):
  """A jitted function scanning steps of (per-worker value_and_grad -> algorithm.step).

  Every chunk has the same length K (the last one is padded, its extra steps masked
  out by `valid`), so the chunk compiles once per run. A tick's train loss is the mean
  over the workers that step in it (`StepContext.active`).
  """
  return jax.jit(chunk_fn(algorithm, model_cfg, graphdef, mesh, grad_mode), donate_argnums=0)


def chunk_fn(algorithm: Algorithm, model_cfg, graphdef, mesh=None, grad_mode: str = 'auto'):
  """`make_train_chunk`'s function before jit: `train_chunk(state, batches_KxMxBxL,
  contexts, valid_K) -> (state, (losses_KxM, StepInfo))` (`loco.run.run_axis` maps it over
  runs)."""
  loss_and_grad = jax.value_and_grad(
      functools.partial(model_lib.loss_fn, model_cfg, graphdef), has_aux=True)
  per_worker = axis.map_workers(loss_and_grad, grad_mode, mesh)

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
      state = jax.lax.with_sharding_constraint(state, placement.state_shardings(state, mesh))
    return state, outputs

  return train_chunk


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
  shardings = placement.state_shardings(abstract, mesh)
  if shardings is not None:
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            abstract, shardings)
  jitted = jax.jit(init) if shardings is None else jax.jit(init, out_shardings=shardings)
  return graphdef, jitted, abstract


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


class CompileAhead:
  """Compiles a lowered computation in a background thread.

  XLA compiles without holding the GIL, so the train chunk compiles while the main
  thread initialises the state and reads the data. Tracing and lowering stay in the
  main thread: they import modules lazily, and two threads importing at once can see
  half-initialised modules. The thread is not a daemon: a run that fails early lets it
  finish (a daemon thread still inside XLA when Python exits aborts the process).
  """

  def __init__(self, lowered):
    self._result = self._error = None
    self.seconds = 0.0    # how long compiling took, once get() returned
    self._thread = threading.Thread(target=self._compile, args=(lowered,), daemon=False)
    self._thread.start()

  def _compile(self, lowered):
    t = time.perf_counter()
    try:
      self._result = lowered.compile()
    except BaseException as e:  # re-raised in the main thread by get()
      self._error = e
    self.seconds = time.perf_counter() - t

  def get(self):
    self._thread.join()
    if self._error is not None:
      raise self._error
    return self._result


def compile_ahead(train_chunk, abstract_state, batches: jax.ShapeDtypeStruct,
                  contexts=None) -> CompileAhead:
  """Starts compiling `train_chunk` for chunks shaped like `batches` ([K, M, B, L + 1]);
  `contexts` is None or one step's StepContext (padded here to the chunk's K steps)."""
  steps = batches.shape[0]
  return CompileAhead(train_chunk.lower(abstract_state, batches, pad_steps(contexts, steps),
                                        jax.ShapeDtypeStruct((steps,), jnp.bool_)))


def pad_steps(tree, length: int):
  """Pads the leading (steps) axis of every leaf to `length` by repeating the last row."""
  def pad(x):
    x = np.asarray(x)
    extra = length - x.shape[0]
    return x if extra == 0 else np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
  return jax.tree.map(pad, tree)


def all_finite(tree) -> jax.Array:
  """Whether every floating leaf of `tree` is finite (checked before a checkpoint)."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
                            if jnp.issubdtype(x.dtype, jnp.floating)]))
