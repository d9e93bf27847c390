"""Placement: where a run's arrays live on a device mesh (or on one device), and how
each process's share of them is read, placed and gathered.

`Placement` is the one value the training loop asks: the state's shardings (every
per-worker leaf's leading axis on the mesh axis "workers", its largest divisible
dimension on "fsdp"), the placed batches of a chunk, the workers whose data this
process reads, and host copies of worker-sharded results from every process. Without
a mesh every answer is the one-device one (no shardings, plain arrays, every worker).
The axis itself, and how per-worker code is bound to it, is `loco.comm.axis`;
`initialize_distributed` starts a multi-host run's processes.
"""

import dataclasses
import functools
from typing import Any

import jax
from jax.experimental import mesh_utils, multihost_utils
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loco.comm.axis import WORKERS
from loco.errors import ConfigError

PyTree = Any
FSDP = 'fsdp'   # the mesh axis each worker's state and batch are sharded over


def _slice_of(device) -> int | None:
  return getattr(device, 'slice_index', None)


@functools.cache    # asked by the mesh and by the run's header
def arrange(num_devices: int, fsdp: int = 1, slices: int = 1) -> tuple[np.ndarray, str]:
  """The first `num_devices * fsdp` devices as a `num_devices` x `fsdp` array in the
  interconnect's order, and a sentence saying how they were chosen.

  One slice: `mesh_utils.create_device_mesh` (on TPUs the torus order; devices without
  known coordinates, CPU or most GPUs, keep their listing order). Several slices: the
  "workers" rows are split into `slices` groups, each one slice's devices, so that only
  the worker axis crosses the data-centre network and each fsdp row stays inside a slice
  (`mesh_utils.create_hybrid_device_mesh` when the devices carry `slice_index`; devices
  without it, simulated ones, are split into `slices` equal groups in listing order, each
  arranged by `create_device_mesh`: the same layout by an explicit reshape).
  """
  n = num_devices * fsdp
  devices = jax.devices()[:n]
  platform, model = devices[0].platform, devices[0].device_kind
  kind = platform if model.lower() == platform else f'{platform} {model}'
  if slices == 1:
    arranged = mesh_utils.create_device_mesh((num_devices, fsdp), devices)
    listed = np.array(devices).reshape(num_devices, fsdp)
    how = ('create_device_mesh: the interconnect\'s order of ' + kind
           if (arranged != listed).any() else
           f'create_device_mesh: listing order ({kind} devices carry no topology)')
    return arranged, f'one slice, {how}'
  if num_devices % slices:
    raise ConfigError(f'mesh.workers={num_devices} must be divisible by mesh.slices={slices}: '
                      'each slice holds whole rows of the worker axis.')
  per_slice = (num_devices // slices, fsdp)
  known = sorted({_slice_of(d) for d in devices} - {None})
  if len(known) == slices and all(_slice_of(d) is not None for d in devices):
    arranged = mesh_utils.create_hybrid_device_mesh(per_slice, (slices, 1), devices)
    return arranged, (f'{slices} slices, create_hybrid_device_mesh: workers across slices '
                      f'(data-centre network), {per_slice[0]} x {fsdp} inside each ({kind})')
  if known:
    raise ConfigError(f'mesh.slices={slices} but the {n} devices of the mesh belong to '
                      f'{len(known)} slices; set mesh.slices={len(known)}.')
  groups = np.array(devices).reshape(slices, -1)
  arranged = np.concatenate([mesh_utils.create_device_mesh(per_slice, list(g))
                             for g in groups])
  return arranged, (f'{slices} simulated slices of {n // slices} devices (listing order; '
                    f'{kind} devices carry no slice_index): workers across slices, '
                    f'{per_slice[0]} x {fsdp} inside each')


def slice_groups(mesh: Mesh, slices: int) -> list[set[int]]:
  """The positions in `mesh.devices.flat` (an SPMD program's partition ids) of each
  slice's devices, as `arrange` split them (by `slice_index` where devices carry it)."""
  flat = list(mesh.devices.flat)
  if all(_slice_of(d) is not None for d in flat):
    return [{i for i, d in enumerate(flat) if _slice_of(d) == s}
            for s in sorted({_slice_of(d) for d in flat})]
  rows = mesh.devices.reshape(slices, -1)
  return [{flat.index(d) for d in row} for row in rows]


def make_mesh(num_devices: int, num_workers: int, fsdp: int = 1,
              slices: int = 1) -> Mesh | None:
  """A `num_devices` x `fsdp` mesh of axes ("workers", "fsdp") ("workers" alone when
  `fsdp` is 1); None for one device. Devices are placed by `arrange` (the topology; with
  `slices` > 1 the worker axis spans the slices and each fsdp row stays in one).

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
  devices, _ = arrange(num_devices, fsdp, slices)
  if fsdp == 1:
    return Mesh(devices.reshape(-1), (WORKERS,), axis_types=(jax.sharding.AxisType.Auto,))
  return Mesh(devices, (WORKERS, FSDP), axis_types=(jax.sharding.AxisType.Auto,) * 2)


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
           batch_per_worker: int, slices: int = 1) -> 'Placement':
    """The placement of a `mesh_workers` x `fsdp` mesh over `slices` (`make_mesh`)."""
    return cls(make_mesh(mesh_workers, num_workers, fsdp, slices), num_workers,
               batch_per_worker)

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
