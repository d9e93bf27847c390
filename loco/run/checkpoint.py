"""Checkpoints: the named train state, the data iterator and host counters (orbax).

Each checkpoint `<workdir>/checkpoints/<step>/` is an orbax Composite of three standard
items, readable with orbax alone:

  state   StandardSave of the train state as a nested dict named by its fields
          (`params/blocks/0/attn/qkv`, `inner_state/0/mu/...`, `anchor/...`): NamedTuple
          fields and dict keys keep their names, sequence items their index, and empty
          nodes (None, optax's EmptyState) are left out. A typed PRNG key (`key`) is
          stored as its raw uint32 data (`jax.random.key_data`) and wrapped back.
  data    JsonSave of the data iterator's state (loco.data.TrainIterator.get_state()).
  host    JsonSave of host-side counters (tokens, bytes, the clock).

  ocp.CheckpointManager(dir, item_names=('state', 'data', 'host')).restore(step)

Saves are asynchronous: `save` returns once the arrays are copied off the devices and
orbax writes and commits in the background (a step directory appears only when it is
complete). `wait()` blocks until the last save is committed and raises its error.

`warm_start` starts a run from another run's checkpoint (`init_from`);
`quiet_background_errors` keeps what orbax's background threads print about a failed
save off the terminal (the failure itself is re-raised, and reported, in the main thread).
"""

import contextlib
import logging
import os
import re
import sys
import threading
import traceback
from typing import Any, Callable

from absl import logging as absl_logging
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from loco.errors import CheckpointError, ConfigError
from loco.files import runs
from loco.files import storage
from loco.files.runs import CHECKPOINTS

# The leaves of a state that hold a model (the workers' params and anchors), by path.
_MODEL = re.compile(r'\.(params|anchor)\b')

PyTree = Any
ITEMS = ('state', 'data', 'host')


def _key_name(entry) -> str:
  return jax.tree_util.keystr((entry,), simple=True)


def named(tree: PyTree) -> dict[str, Any]:
  """The leaves of `tree` as a nested dict keyed by field names and indices."""
  out: dict[str, Any] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    node = out
    keys = [_key_name(p) for p in path]
    for key in keys[:-1]:
      node = node.setdefault(key, {})
    node[keys[-1]] = leaf
  return out


def _is_key(x) -> bool:
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _stored(x):
  # Orbax cannot write typed key arrays: their uint32 data is what a legacy key was.
  return jax.random.key_data(x) if _is_key(x) else x


def _abstract(x) -> jax.ShapeDtypeStruct:
  stored = jax.eval_shape(_stored, x) if _is_key(x) else x
  return jax.ShapeDtypeStruct(stored.shape, stored.dtype, sharding=getattr(x, 'sharding', None))


def _loaded(x, like):
  return jax.random.wrap_key_data(x, impl=jax.random.key_impl(like)) if _is_key(like) else x


def lookup(tree: dict[str, Any], path) -> Any:
  """The entry of a `named` dict at a pytree key path."""
  for entry in path:
    tree = tree[_key_name(entry)]
  return tree


def worker_means(saved: dict[str, Any], like, name: str = '') -> list[np.ndarray]:
  """The leaves of `like` (one worker's shapes and dtypes) from the `named` tree `saved`
  of a checkpoint, each the mean over its leading worker axis (an integer leaf: worker
  0's), in `like`'s dtypes.

  Raises:
    KeyError: `name` + the path of a leaf `saved` lacks.
    ValueError: (`name` + path, its saved shape, `like`'s) of a leaf whose shapes differ.
  """
  out = []
  for path, x in jax.tree_util.tree_flatten_with_path(like)[0]:
    where = f'{name}{jax.tree_util.keystr(path)}'
    try:
      value = np.asarray(lookup(saved, path))
    except (KeyError, TypeError):
      raise KeyError(where) from None
    if value.shape[1:] != tuple(x.shape):
      raise ValueError(where, value.shape[1:], tuple(x.shape))
    floating = np.issubdtype(value.dtype, np.floating)
    out.append((value.astype(np.float32).mean(0) if floating else value[0]).astype(x.dtype))
  return out


def read_named_state(path: str, what: str = 'init_from') -> tuple[str, dict[str, Any]]:
  """The train state of a checkpoint, as saved (`named`, host arrays), for a warm start.

  Args:
    path: a workdir (its latest checkpoint), its `checkpoints/` folder, or one
      `checkpoints/<step>/` folder.
    what: what the errors name the path by (the config key or the command).

  Returns:
    (the checkpoint's folder, its named state).
  """
  path = os.path.abspath(path)
  step = None
  if re.fullmatch(r'\d+', os.path.basename(path)) and os.path.isdir(path):
    path, step = os.path.dirname(path), int(os.path.basename(path))
  elif os.path.isdir(os.path.join(path, CHECKPOINTS)):
    path = os.path.join(path, CHECKPOINTS)
  if os.path.exists(path) and not os.path.isdir(path):
    raise CheckpointError(f'{what}: {path} is a file, not a run directory or a checkpoint '
                          'folder.')
  if not os.path.isdir(path):
    raise CheckpointError(f'{what}: {path} does not exist.')
  manager = ocp.CheckpointManager(path, item_names=ITEMS,
                                  options=ocp.CheckpointManagerOptions(create=False))
  try:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f'{what}: no finished checkpoint in {path}.')
    where = os.path.join(path, str(step))
    try:
      restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    except Exception as e:  # orbax raises many types for unreadable files.
      first = (str(e).strip().splitlines() or [''])[0][:200]
      raise CheckpointError(f'{what}: the checkpoint at {where} cannot be read '
                            f'({type(e).__name__}: {first}).') from e
    return where, restored['state']
  finally:
    manager.close()


def warm_start(init, key, like, source: str, inner_state: str,
               note: Callable[[str], None]):
  """A warm start: the initial state from another run's checkpoint (`init(key, params)`
  draws it; `like` is its abstract state). Every worker starts from the mean of the
  source's workers' params (the anchor too); the inner optimizer state is fresh, or the
  source's averaged over its workers ('carried'; step counts from its worker 0)."""
  where, saved = read_named_state(source)

  def averaged(field: str) -> list[np.ndarray]:
    one_worker = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                              getattr(like, field))
    try:
      return worker_means(saved[field], one_worker, field)
    except KeyError as e:
      # DDP's inner state is (its gradient all-reduce's state, the inner optimizer's):
      # the inner optimizer a local-update algorithm carries is one of its parts.
      parts = saved.get(field) if field == 'inner_state' else None
      parts = parts if isinstance(parts, dict) else {}
      for part in parts.values():
        try:
          return worker_means(part, one_worker, field)
        except (KeyError, ValueError):
          continue
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


INCOMPLETE = '.incomplete'
is_committed = runs.is_committed
committed_steps = runs.committed_in     # of a checkpoints folder


def set_aside_incomplete(directory: str) -> list[str]:
  """Renames step folders that are not committed checkpoints to `<step>.incomplete`, so
  that orbax neither resumes from nor overwrites them; returns the folders renamed."""
  moved = []
  if storage.is_url(directory):
    # Object storage has no rename (a copy of every object): an uncommitted step folder
    # there is removed instead, and named as removed.
    try:
      names = storage.listdir(directory)
    except FileNotFoundError:
      return moved
    for name in names:
      path = storage.join(directory, name)
      if name.isdigit() and not is_committed(path):
        storage.rmtree(path)
        moved.append(path + INCOMPLETE + ' (removed)')
    return moved
  try:
    names = sorted(os.listdir(directory))
  except FileNotFoundError:
    return moved
  for name in names:
    path = os.path.join(directory, name)
    if name.isdigit() and os.path.isdir(path) and not is_committed(path):
      target, k = path + INCOMPLETE, 1
      while os.path.exists(target):
        target, k = f'{path}{INCOMPLETE}{k}', k + 1
      os.rename(path, target)
      moved.append(target)
  return moved


class Checkpointer:
  """An orbax CheckpointManager over (named state, data iterator state, host state)."""

  def __init__(self, directory: str, keep: int = 2, note=None):
    """`note`: given in the process that owns the workdir, which sets aside step
    folders that are not complete checkpoints and says so through it."""
    self.directory = storage.absolute(directory)
    self._owner = note is not None
    for moved in set_aside_incomplete(self.directory) if note else ():
      note(f'{moved.rsplit(INCOMPLETE, 1)[0]} is not a complete checkpoint (no orbax '
           f'commit marker: an interrupted save or copy); set aside as {moved}.')
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=True)
    self._manager = ocp.CheckpointManager(storage.native(self.directory), options=options,
                                          item_names=ITEMS)

  def latest_step(self) -> int | None:
    """The newest committed step on disk. Not orbax's cached listing: that trusts any
    integer folder, and after a failed save it can miss the step still on disk."""
    steps = committed_steps(self.directory)
    return steps[-1] if steps else None

  def save(self, step: int, state: PyTree, data_state: dict, host_state: dict) -> None:
    """Starts saving checkpoint `step`; returns once the arrays are off the devices.

    Raises OSError (a full disk, ...) or CheckpointError if this save or the previous
    one (still in flight) failed; the last committed checkpoint stays as it was.
    """
    with self._saving():
      if self._owner:    # a URL workdir's run files reach it before the checkpoint
        storage.push_before_checkpoint(self.directory)
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(named(jax.tree.map(_stored, state))),
          data=ocp.args.JsonSave(data_state),
          host=ocp.args.JsonSave(host_state)))

  def wait(self) -> None:
    """Blocks until the last save is committed; raises its error if it failed."""
    with self._saving():
      self._manager.wait_until_finished()

  @contextlib.contextmanager
  def _saving(self):
    # Orbax reports a failed background write (tensorstore's ENOSPC, EROFS, ...) as a
    # ValueError with the OS error code in its text; give it back as an OSError.
    try:
      yield
    except CheckpointError:
      raise
    except OSError as e:
      raise OSError(e.errno, e.strerror, e.filename or self.directory) from e
    except Exception as e:  # pylint: disable=broad-except
      code = re.search(r"os_error_code='?(\d+)", str(e))
      if code:
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))),
                      self.directory) from e
      first = (str(e).strip().splitlines() or [''])[0][:300]
      raise CheckpointError(f'saving a checkpoint in {self.directory} failed '
                            f'({type(e).__name__}: {first}).') from e

  def restore(self, step: int, like: PyTree) -> tuple[PyTree, dict, dict]:
    """Restores checkpoint `step` into the structure (and shardings) of `like`."""
    path = storage.join(self.directory, str(step))
    abstract = named(jax.tree.map(_abstract, like))
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract),
          data=ocp.args.JsonRestore(),
          host=ocp.args.JsonRestore()))
      leaves = [_loaded(lookup(restored['state'], path), x)
                for path, x in jax.tree_util.tree_flatten_with_path(like)[0]]
    except Exception as e:  # orbax raises many types for unreadable or mismatched files.
      first = (str(e).strip().splitlines() or [''])[0][:200]
      raise CheckpointError(
          f'the checkpoint at {path} cannot be read into this run\'s state '
          f'({type(e).__name__}: {first}); move it away to resume from an earlier one, '
          'or use a new workdir.') from e
    if any(getattr(x, 'shape', None) != y.shape for x, y in zip(leaves, jax.tree.leaves(like))):
      raise CheckpointError(f'the checkpoint at {path} does not match this run\'s state '
                            '(model, algorithm or worker count differ); use a new workdir.')
    # A model saved while it was diverging would diverge again at once, and the message
    # would call it the last good checkpoint: refuse it here, naming it.
    flat = jax.tree_util.tree_flatten_with_path(like)[0]
    bad = [jax.tree_util.keystr(p) for (p, _), x in zip(flat, leaves)
           if _MODEL.search(jax.tree_util.keystr(p))
           and jnp.issubdtype(x.dtype, jnp.floating) and not bool(jnp.all(jnp.isfinite(x)))]
    if bad:
      raise CheckpointError(f'the checkpoint at {path} holds non-finite values ({bad[0]}'
                            f'{f" and {len(bad) - 1} more" if len(bad) > 1 else ""}): it '
                            'was saved from a diverging model; move it away to resume from '
                            'an earlier one, or use a new workdir.')
    state = jax.tree.unflatten(jax.tree.structure(like), leaves)
    return state, dict(restored['data']), dict(restored['host'])

  def close(self) -> None:
    """Waits for the last save, then releases orbax's threads."""
    try:
      self.wait()
    finally:
      self._manager.close()


def quiet_background_errors() -> None:
  """Orbax re-raises a failed background save in the main thread, which loco prints as
  one line; what its worker threads and event loops print and log first is noise."""
  def from_orbax(tb) -> bool:
    return '/orbax/' in ''.join(traceback.format_tb(tb))

  default_hook = threading.excepthook
  threading.excepthook = lambda args: (None if from_orbax(args.exc_traceback)
                                       else default_hook(args))
  default_unraisable = sys.unraisablehook

  def unraisable(args):   # tensorstore callbacks into orbax's closed event loop
    if not (isinstance(args.exc_value, RuntimeError)
            and 'Event loop is closed' in str(args.exc_value)):
      default_unraisable(args)

  sys.unraisablehook = unraisable

  def keep(record) -> bool:
    if record.levelno < logging.ERROR:
      return True
    exc = record.exc_info[1] if record.exc_info else None
    return not ('/orbax/' in record.pathname or 'orbax-checkpoint-tmp' in record.getMessage()
                or (exc is not None and from_orbax(exc.__traceback__)))

  absl_logging.get_absl_logger().addFilter(keep)
  logging.getLogger('asyncio').addFilter(keep)
