"""Placement: where a run's arrays live on a device mesh (or on one device), and how
each process's share of them is read, placed and gathered.

`Placement` is the one value the training loop asks: the state's shardings (every
per-worker leaf's leading axis on the mesh axis "workers", its largest divisible
dimension on "fsdp"), the placed batches of a chunk, the workers whose data this
process reads, and host copies of worker-sharded results from every process. Without
a mesh every answer is the one-device one (no shardings, plain arrays, every worker).
The axis itself, and how per-worker code is bound to it, is `loco.axis`;
`initialize_distributed` starts a multi-host run's processes.
"""

import dataclasses
import functools
from typing import Any

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loco.axis import WORKERS
from loco.errors import ConfigError

PyTree = Any
FSDP = 'fsdp'   # the mesh axis each worker's state and batch are sharded over


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


def fetch(tree: PyTree) -> PyTree:
  """Host copies of (possibly worker-sharded) arrays, from every process's devices."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def every_position(data_state: dict[str, Any]) -> dict[str, Any]:
  """The data state with every worker's position: on several hosts each process
  knows only the workers it reads (None for the others), so they are gathered."""
  if jax.process_count() == 1:
    return data_state
  mine = np.array([(-1, -1) if p is None else p for p in data_state['workers']], np.int32)
  every = multihost_utils.process_allgather(mine).max(axis=0)   # [processes, M, 2] -> [M, 2]
  return dict(data_state, workers=every.tolist())


def initialize_distributed(**given) -> None:
  """`jax.distributed.initialize(**given)`: one process per host of a TPU pod slice or
  a SLURM job (launch/MULTIHOST.md); a failure is one sentence naming loco.main's flags."""
  try:
    jax.distributed.initialize(**given)
  except Exception as e:  # jax raises ValueError / RuntimeError / XlaRuntimeError
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    raise ConfigError(
        f'--distributed: jax.distributed.initialize() failed ({first}); outside a TPU VM '
        'or a SLURM job give --coordinator_address, --num_processes and --process_id '
        '(launch/MULTIHOST.md).') from None


@dataclasses.dataclass(frozen=True)
class Placement:
  """A run's placement: M workers of `batch_per_worker` sequences on `mesh` (or None,
  one device). Every question the loop has about devices goes through it."""
  mesh: Mesh | None
  num_workers: int
  batch_per_worker: int

  @classmethod
  def make(cls, mesh_workers: int, num_workers: int, fsdp: int,
           batch_per_worker: int) -> 'Placement':
    """The placement of a `mesh_workers` x `fsdp` mesh (`make_mesh`)."""
    return cls(make_mesh(mesh_workers, num_workers, fsdp), num_workers, batch_per_worker)

  def batches(self, steps: int, seq_len: int) -> jax.ShapeDtypeStruct:
    """The shape, dtype and sharding of a chunk's [steps, M, B, seq_len + 1] tokens."""
    return jax.ShapeDtypeStruct(
        (steps, self.num_workers, self.batch_per_worker, seq_len + 1), jnp.int32,
        sharding=steps_sharding(self.mesh, self.batch_per_worker))

  def place_batches(self, batches_KxM) -> jax.Array:
    """A chunk's batches (this process's workers' rows) as one placed global array."""
    return shard_steps(batches_KxM, self.mesh, self.num_workers)

  @property
  def process_workers(self) -> tuple[int, ...]:
    """The workers whose data this process reads (every worker on one host)."""
    return process_workers(self.mesh, self.num_workers, self.batch_per_worker)

  # Multi-host gathering needs no mesh; asked through the run's placement all the same.
  fetch = staticmethod(fetch)
  every_position = staticmethod(every_position)
