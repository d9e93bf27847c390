"""The worker axis: stacking, per-worker mapping, and placement on a device mesh.

Every per-worker pytree has a leading axis of size M named "workers" (DESIGN §1). On
one device per-worker code is `jax.vmap(..., axis_name="workers")`. On a mesh with a
"workers" axis of D devices the same per-worker code runs under `jax.shard_map` over
that axis, each device holding a block of M / D workers with a `jax.vmap` named
`comm.axis.BLOCK` inside the block (drjax's placement, made explicit): the collectives
of `loco.comm.axis` span both levels, so nothing is left to the partitioner to guess.
Other mesh axes (`fsdp`) stay automatic inside the map and shard each worker's state.
"""

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loco.comm.axis import BLOCK, WORKERS
from loco.errors import ConfigError

PyTree = Any
FSDP = 'fsdp'   # the mesh axis each worker's state and batch are sharded over


def replicate(tree: PyTree, num_workers: int) -> PyTree:
  """Stacks `num_workers` copies of a single tree on a new leading axis."""
  return jax.tree.map(
      lambda x: jnp.broadcast_to(x, (num_workers,) + jnp.shape(x)), tree)


def vmap(fn: Callable, in_axes=0, mesh: Mesh | None = None) -> Callable:
  """Maps `fn` over the worker axis: a vmap on one device, shard_map + vmap on a mesh.

  Args:
    fn: one worker's function; it may use `loco.comm` collectives.
    in_axes: 0 (per-worker) or None (shared) for each argument, or one for all.
    mesh: a mesh with a "workers" axis, or None. Every output is per-worker.
  """
  if mesh is None:
    return jax.vmap(fn, in_axes=in_axes, axis_name=WORKERS)
  return _on_mesh(jax.vmap(fn, in_axes=in_axes, axis_name=BLOCK), in_axes, mesh)


def _on_mesh(block_fn: Callable, in_axes, mesh: Mesh) -> Callable:
  """`block_fn` (one device's block of workers) under shard_map over "workers"."""
  def mapped(*args):
    axes = in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
    specs = tuple(PartitionSpec(WORKERS) if a == 0 else PartitionSpec() for a in axes)
    return jax.shard_map(block_fn, mesh=mesh, in_specs=specs,
                         out_specs=PartitionSpec(WORKERS), axis_names={WORKERS},
                         check_vma=False)(*args)
  # Jitted, so that an eager call works too: eager shard_map needs every axis manual.
  return jax.jit(mapped) if len(mesh.axis_names) > 1 else mapped


GRAD_MODES = ('auto', 'vmap', 'map')


def map_workers(fn: Callable, mode: str = 'auto', mesh: Mesh | None = None) -> Callable:
  """Maps a communication-free per-worker `fn` (a gradient) over stacked arguments.

  'vmap' batches the workers into one computation; 'map' runs them one after another
  (`lax.map`), which keeps each worker's activations cache-sized and is faster on a
  CPU; 'auto' picks 'map' on a CPU and 'vmap' on accelerators. On a mesh each device
  maps its own block of workers that way, under shard_map.

  The mapped function takes an optional `active=` [M] bool mask. Under 'map' a worker
  whose flag is False skips `fn` (a `lax.cond`; its outputs are zeros). Under 'vmap'
  every worker computes: a batched computation cannot skip one of its members.
  """
  if mode not in GRAD_MODES:
    raise ConfigError(f'grad_mode must be one of {GRAD_MODES}, got {mode!r}.')
  if mode == 'auto':
    mode = 'map' if jax.default_backend() == 'cpu' else 'vmap'
  if mode == 'vmap':
    mapped = jax.vmap(fn)
    block = lambda args, active: mapped(*args)
  else:
    def skip(*args):
      return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, *args))

    def one(xs):
      args, active = xs
      return fn(*args) if active is None else jax.lax.cond(active, fn, skip, *args)

    block = lambda args, active: jax.lax.map(one, (args, active))
  if mesh is None:
    return lambda *args, active=None: block(args, active)
  on_mesh = _on_mesh(lambda args, active: block(args, active), 0, mesh)
  return lambda *args, active=None: on_mesh(args, active)


def num_workers_of(tree: PyTree) -> int:
  return jax.tree.leaves(tree)[0].shape[0]


def mean_model(tree_MxP: PyTree) -> PyTree:
  """The worker-averaged model, for evaluation only (no communication is implied)."""
  return jax.tree.map(lambda x: jnp.mean(x.astype(jnp.float32), axis=0).astype(x.dtype),
                      tree_MxP)


def worker_spread(tree_MxP: PyTree) -> jax.Array:
  """RMS distance of the workers' params to their mean, relative to the mean's norm."""
  mean = mean_model(tree_MxP)
  dist2 = sum(jnp.sum((x - m[None]) ** 2) for x, m in
              zip(jax.tree.leaves(tree_MxP), jax.tree.leaves(mean)))
  norm2 = sum(jnp.sum(m ** 2) for m in jax.tree.leaves(mean))
  num = jax.tree.leaves(tree_MxP)[0].shape[0]
  return jnp.sqrt(dist2 / num) / jnp.maximum(jnp.sqrt(norm2), 1e-12)


def make_mesh(num_devices: int, num_workers: int, fsdp: int = 1) -> Mesh | None:
  """A `num_devices` x `fsdp` mesh of axes ("workers", "fsdp") ("workers" alone when
  `fsdp` is 1); None for one device.

  Worker blocks are spread over "workers"; each worker's state and batch are sharded
  over the `fsdp` devices of its row (its gradients reduced among them).
  """
  if num_devices * fsdp <= 1:
    return None
  available = len(jax.devices())
  if num_devices * fsdp > available:
    raise ConfigError(f'mesh.workers x mesh.fsdp = {num_devices} x {fsdp} devices '
                      f'requested but only {available} are available.')
  if num_workers % num_devices:
    raise ConfigError(f'num_workers={num_workers} must be divisible by '
                      f'mesh.workers={num_devices} to shard the worker axis.')
  devices = np.array(jax.devices()[:num_devices * fsdp])
  if fsdp == 1:
    return Mesh(devices, (WORKERS,), axis_types=(jax.sharding.AxisType.Auto,))
  return Mesh(devices.reshape(num_devices, fsdp), (WORKERS, FSDP),
              axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _fsdp_dim(shape: tuple[int, ...], size: int) -> int | None:
  """The largest dimension of one worker's leaf that `size` devices divide (or None)."""
  dims = [d for d in range(len(shape)) if shape[d] % size == 0 and shape[d] >= size]
  return max(dims, key=lambda d: shape[d], default=None) if size > 1 else None


def worker_spec(shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """A worker-stacked leaf's spec: its leading axis on "workers", its largest
  divisible dimension on "fsdp" (the rest replicated)."""
  if not shape:
    return PartitionSpec()
  spec = [WORKERS] + [None] * (len(shape) - 1)
  dim = _fsdp_dim(shape[1:], mesh.shape.get(FSDP, 1))
  if dim is not None:
    spec[dim + 1] = FSDP
  return PartitionSpec(*spec)


def worker_sharding(mesh: Mesh | None, tree: PyTree) -> PyTree:
  """Shardings of a worker-stacked tree (`worker_spec` per leaf; None without a mesh)."""
  if mesh is None:
    return None
  return jax.tree.map(lambda x: NamedSharding(mesh, worker_spec(jnp.shape(x), mesh)), tree)


def shard(tree: PyTree, mesh: Mesh | None) -> PyTree:
  """Places a worker-stacked tree on the mesh (no-op without one)."""
  if mesh is None:
    return tree
  return jax.device_put(tree, worker_sharding(mesh, tree))


def steps_sharding(mesh: Mesh | None, batch_per_worker: int = 1) -> NamedSharding | None:
  """The sharding of a [steps, workers, batch, ...] array: workers on "workers", each
  worker's batch over "fsdp" where it divides."""
  if mesh is None:
    return None
  fsdp = mesh.shape.get(FSDP, 1)
  return NamedSharding(mesh, PartitionSpec(
      None, WORKERS, FSDP if fsdp > 1 and batch_per_worker % fsdp == 0 else None))


@functools.cache      # shard_steps asks once per chunk
def process_workers(mesh: Mesh | None, num_workers: int,
                    batch_per_worker: int = 1) -> tuple[int, ...]:
  """The workers whose batches this process's devices hold (all of them on one host).

  On several hosts each process loads only these workers' data (`shard_steps`
  assembles the global array from every process's rows)."""
  if mesh is None or jax.process_count() == 1:
    return tuple(range(num_workers))
  index_map = steps_sharding(mesh, batch_per_worker).addressable_devices_indices_map(
      (1, num_workers, batch_per_worker))
  mine = sorted({w for index in index_map.values()
                 for w in range(*index[1].indices(num_workers))})
  if mine != list(range(mine[0], mine[-1] + 1)):
    raise ConfigError(f'process {jax.process_index()} holds workers {mine}, not a '
                      'contiguous block; put each process\'s devices in whole mesh rows.')
  return tuple(mine)


def shard_steps(batches_KxM, mesh: Mesh | None, num_workers: int | None = None):
  """Places a [steps, workers, batch, ...] array of batches (`steps_sharding`).

  On one host `batches_KxM` holds every worker; on several it holds this process's
  `process_workers` and the global array (of `num_workers`) is assembled from each
  process's rows, so that no host reads or tokenizes another's data."""
  if mesh is None:
    return jnp.asarray(batches_KxM)
  sharding = steps_sharding(mesh, batches_KxM.shape[2])
  if jax.process_count() == 1:
    return jax.device_put(batches_KxM, sharding)
  first = process_workers(mesh, num_workers, batches_KxM.shape[2])[0]
  shape = (batches_KxM.shape[0], num_workers, *batches_KxM.shape[2:])

  def rows(index):
    start, stop, _ = index[1].indices(num_workers)
    return batches_KxM[(index[0], slice(start - first, stop - first), *index[2:])]
  return jax.make_array_from_callback(shape, sharding, rows)


def state_shardings(state, mesh: Mesh | None):
  """Shardings of a LocoState: per-worker fields by `worker_spec`, step and key
  replicated (None without a mesh)."""
  if mesh is None:
    return None
  replicated = NamedSharding(mesh, PartitionSpec())
  stacked = {k: v for k, v in state._asdict().items() if k not in ('step', 'key')}
  return state._replace(step=replicated, key=replicated,
                        **worker_sharding(mesh, stacked))
