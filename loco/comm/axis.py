"""The two-level worker axis: its names, how per-worker code is bound to it, and the
collectives over it (DESIGN §1).

Every per-worker pytree has a leading axis of size M named "workers". On one device
per-worker code is `jax.vmap(..., axis_name=WORKERS)` (`vmap`, `map_workers`). On a
mesh with a "workers" axis of D devices the axis has two levels: `jax.shard_map` over
the mesh axis "workers" gives each device a block of B = M / D workers, and a
`jax.vmap` named `BLOCK` runs inside the block (drjax's placement, made explicit);
worker i is the pair (device i // B, slot i % B). Other mesh axes (`fsdp`) stay
automatic inside the map and shard each worker's state (`loco.run.placement`).

The collectives take the worker axis's name and mean the same at both levels, so
nothing is left to the partitioner to guess:

  psum / pmax / axis_index / axis_size   JAX reduces over both names at once (a local
                                         sum inside the block, a psum between devices)
  all_gather                             the block gathered locally, then the blocks
                                         gathered between devices
  ppermute                               a static permutation of workers: for each
                                         distinct device shift, one `lax.ppermute`
                                         between devices of only the rows that cross
                                         (spread over the block's slots), then a local
                                         gather; moves inside a device are local

so a ring gossip is a shift inside the block plus a collective-permute of the boundary
workers between devices, and an all-reduce is a local sum plus an all-reduce.
"""


import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec
import numpy as np

from loco.errors import ConfigError

PyTree = Any
WORKERS = 'workers'
BLOCK = 'worker_block'   # the vmap axis of the workers one device holds, on a mesh


def _bound(name: str) -> bool:
  try:
    jax.lax.axis_size(name)
    return True
  except NameError:
    return False


def names(axis_name: str = WORKERS) -> tuple[str, ...]:
  """The axis names that make up the worker axis here: (axis_name,) or (axis_name, BLOCK)."""
  return (axis_name, BLOCK) if _bound(BLOCK) else (axis_name,)


def on_mesh() -> bool:
  """Whether the worker axis spans devices (a shard_map block is bound here)."""
  return _bound(BLOCK)


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
  on_devices = _on_mesh(lambda args, active: block(args, active), 0, mesh)
  return lambda *args, active=None: on_devices(args, active)


def num_workers_of(tree: PyTree) -> int:
  return jax.tree.leaves(tree)[0].shape[0]


def axis_size(axis_name: str = WORKERS) -> int:
  """M, the number of workers (static)."""
  return math.prod(jax.lax.axis_size(n) for n in names(axis_name))


def axis_index(axis_name: str = WORKERS) -> jax.Array:
  """This worker's index in 0 .. M - 1."""
  return jax.lax.axis_index(names(axis_name))


def psum(x: PyTree, axis_name: str = WORKERS) -> PyTree:
  return jax.lax.psum(x, names(axis_name))


def pmax(x: PyTree, axis_name: str = WORKERS) -> PyTree:
  return jax.lax.pmax(x, names(axis_name))


def all_gather(x: PyTree, axis_name: str = WORKERS) -> PyTree:
  """Every worker's `x`, stacked on a new leading axis of size M."""
  if len(names(axis_name)) == 1:
    return jax.lax.all_gather(x, axis_name)
  block = jax.lax.all_gather(x, BLOCK)                  # [B, ...], inside the device
  everyone = jax.lax.all_gather(block, axis_name)       # [D, B, ...]
  return jax.tree.map(lambda g: g.reshape((-1,) + g.shape[2:]), everyone)


def ppermute(x: PyTree, axis_name: str, perm: Sequence[tuple[int, int]]) -> PyTree:
  """`lax.ppermute` of a static permutation of workers (pairs (src, dst)); workers that
  receive nothing get zeros."""
  if len(names(axis_name)) == 1:
    return jax.lax.ppermute(x, axis_name, perm)
  b, d = jax.lax.axis_size(BLOCK), jax.lax.axis_size(axis_name)
  me = axis_index(axis_name)
  out = jax.tree.map(jnp.zeros_like, x)
  by_shift: dict[int, list[tuple[int, int]]] = {}
  for src, dst in perm:
    by_shift.setdefault((dst // b - src // b) % d, []).append((src, dst))
  for shift, pairs in sorted(by_shift.items()):
    got, ok = _shifted(x, pairs, shift, b, d, me, axis_name)
    out = jax.tree.map(lambda o, g: jnp.where(ok, g, o), out, got)
  return out


def _shifted(x, pairs, shift, b, d, me, axis_name):
  """The values of `pairs` (all crossing `shift` devices), at their destinations."""
  m = b * d
  # Rows each source device sends: slot indices, padded to the most any device sends.
  rows = [[s % b for s, _ in pairs if s // b == dev] for dev in range(d)]
  k = max(len(r) for r in rows)
  send = np.zeros((d, k), np.int32)
  for dev, r in enumerate(rows):
    send[dev, :len(r)] = r
  # Where each destination worker finds its value in the received [k] rows.
  where_from = np.zeros(m, np.int32)
  receives = np.zeros(m, bool)
  for s, t in pairs:
    where_from[t] = rows[s // b].index(s % b)
    receives[t] = True
  dev, slot = me // b, me % b
  block = jax.lax.all_gather(x, BLOCK)                            # [B, ...] local
  if shift == 0:
    picked = jax.tree.map(lambda g: g[jnp.asarray(send)[dev][jnp.asarray(where_from)[me]]],
                          block)
    return picked, jnp.asarray(receives)[me]

  def leaf(g):
    # The k crossing rows, flattened and cut into B equal pieces: each slot sends one,
    # so the devices exchange exactly k rows, not the whole block.
    rows_x = g[jnp.asarray(send)[dev]].reshape(-1)                 # [k * n]
    size = rows_x.shape[0]
    piece = -(-size // b)
    rows_x = jnp.pad(rows_x, (0, piece * b - size))
    mine = jax.lax.dynamic_slice(rows_x, (slot * piece,), (piece,))
    moved = jax.lax.ppermute(mine, axis_name, [(i, (i + shift) % d) for i in range(d)])
    whole = jax.lax.all_gather(moved, BLOCK).reshape(-1)[:size]
    return whole.reshape((k,) + g.shape[1:])[jnp.asarray(where_from)[me]]

  return jax.tree.map(leaf, block), jnp.asarray(receives)[me]
