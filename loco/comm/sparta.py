"""SPARTA's link: after each local step, average a shared random share of the parameters."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from loco.comm.core import (WORKERS, Wire, WorkerContext, alive_of, empty_wire,
                            ring_all_reduce_state, transport_dtype, worker_mean)
from loco.errors import ConfigError

PyTree = Any


class SpartaState(NamedTuple):
  """State of `random_parameter_average`: its wire and its own PRNG key."""
  comm: Wire
  key: jax.Array


def shared_masks(key: jax.Array, tree: PyTree, fraction: float) -> PyTree:
  """Each leaf's bool mask: every coordinate drawn with probability `fraction` from a
  key every worker holds (the tick's key), so all workers pick the same coordinates."""
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, [
      jax.random.bernoulli(jax.random.fold_in(key, i), fraction, jnp.shape(x))
      for i, x in enumerate(leaves)])


def random_parameter_average(fraction: float = 0.005, *, dtype: str = 'float32', seed: int = 0,
                             axis_name: str = WORKERS) -> optax.GradientTransformationExtraArgs:
  """Averages a random `fraction` of every tensor's coordinates of the stepped params.

  Placed after the optimizer in the inner chain: with `u` the optimizer's updates and
  `p` the params, each worker's `p + u` is replaced by the mean over the alive
  workers on the coordinates of a shared random mask (each drawn with probability
  `fraction`, from `context.key`, the tick's key every worker holds, else from the
  transform's own key seeded by `seed`), and kept elsewhere. A worker that is not
  alive keeps its own params and sends nothing.

  Bytes: the masked values go through a ring all-reduce at `dtype`; the mask is
  common knowledge, so no indices travel: `2 (m - 1) / m * n * width` per
  participant, n the coordinates drawn this step.

  Args:
    fraction: p, the expected fraction of each tensor averaged per step, in (0, 1].
    dtype: transport dtype, 'float32', 'bfloat16' or 'float16'.
    seed: seed of the own key, used when no context key is given.
    axis_name: the worker axis name.

  Returns:
    An optax transformation (it needs `params`) whose state is a `SpartaState`.

  References:
    Baioumy & Cheema, SPARTA (sparse parameter averaging), as shipped in EXO Gym.
  """
  if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction <= 1:
    raise ConfigError(f'algorithm.fraction must be in (0, 1], got {fraction!r}.')
  wire = transport_dtype(dtype)

  def init(params):
    del params
    return SpartaState(empty_wire(axis_name), jax.random.key(seed))

  def update(updates, state, params=None, *, context: WorkerContext | None = None, **extra):
    del extra
    if params is None:
      raise ValueError('random_parameter_average needs params (it averages them).')
    next_key, key = jax.random.split(state.key)
    if context is not None and context.key is not None:
      next_key, key = state.key, context.key
    alive = alive_of(context)
    stepped = optax.tree.cast(optax.apply_updates(params, updates), jnp.float32)
    masks = shared_masks(key, stepped, float(fraction))
    sent = optax.tree.cast(jax.tree.map(lambda m, x: jnp.where(m, x, 0.0), masks, stepped),
                           wire)
    mean = worker_mean(sent, alive.astype(jnp.float32), axis_name)
    moved = jax.tree.map(lambda m, avg, x: jnp.where(m & alive, avg - x, 0.0),
                         masks, mean, stepped)
    count = sum(jnp.sum(m, dtype=jnp.float32) for m in jax.tree.leaves(masks))
    size = count * jnp.dtype(wire).itemsize
    wire_state = ring_all_reduce_state(alive, size, axis_name, absent_receive=False)
    out = jax.tree.map(lambda u, d: (u.astype(jnp.float32) + d).astype(u.dtype), updates, moved)
    return out, SpartaState(wire_state, next_key)

  return optax.GradientTransformationExtraArgs(init, update)
