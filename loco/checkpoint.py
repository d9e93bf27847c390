"""Checkpoints of the train state, the data iterator and host-side counters (orbax).

The train state is saved as its flat list of leaves and restored into the tree of a
freshly initialised state, so any algorithm's state (NamedTuples, optax states, None
fields) round-trips without orbax knowing its structure, and a config change that
alters the state's shape is caught with a clear message.
"""

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from loco.errors import CheckpointError

PyTree = Any


class Checkpointer:
  """An orbax CheckpointManager over (state leaves, data iterator state, host state)."""

  def __init__(self, directory: str, keep: int = 2):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max(1, keep), create=True)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=('state', 'data', 'host'))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: PyTree, data_state: dict, host_state: dict) -> None:
    leaves = {f'{i:05d}': x for i, x in enumerate(jax.tree.leaves(state))}
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(leaves),
        data=ocp.args.JsonSave(data_state),
        host=ocp.args.JsonSave(host_state)))
    self._manager.wait_until_finished()

  def restore(self, step: int, like: PyTree) -> tuple[PyTree, dict, dict]:
    """Restores checkpoint `step` into the structure (and shardings) of `like`."""
    leaves, treedef = jax.tree.flatten(like)
    abstract = {f'{i:05d}': jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                  sharding=getattr(x, 'sharding', None))
                for i, x in enumerate(leaves)}
    path = os.path.join(self.directory, str(step))
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract),
          data=ocp.args.JsonRestore(),
          host=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for unreadable files.
      raise CheckpointError(
          f'the checkpoint at {path} cannot be read ({type(e).__name__}: '
          f'{str(e).splitlines()[0][:200]}); move it away to resume from an earlier '
          'one, or use a new workdir.') from e
    got = restored['state']
    if len(got) != len(leaves) or any(
        np.shape(got[k]) != a.shape for k, a in abstract.items()):
      raise CheckpointError(
          f'the checkpoint at {path} does not match this config (different model, '
          'algorithm or worker count); use a new workdir.')
    state = jax.tree.unflatten(treedef, [got[f'{i:05d}'] for i in range(len(leaves))])
    return state, dict(restored['data']), dict(restored['host'])

  def close(self) -> None:
    self._manager.close()
