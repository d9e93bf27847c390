"""A run's workdir: one run at a time, what may change on resume, how the run ended.

  runs/x/.lock           held (fcntl) by the loco process training in runs/x
  runs/x/config.json     the config the checkpoints were trained with
  runs/x/diverged.json   written when the run diverged: step, loss, message

A workdir may be a URL on object storage (`gs://bucket/runs/x`): its checkpoints are
written there, its run files in a local mirror copied there before each checkpoint and
at the end, and a lease file takes the lock's place (`loco.files.storage`).

A resumed run must mean the same as the run that wrote the checkpoints: every config
key but the ones in `MAY_CHANGE` (how the run is executed or logged, not what it
computes) must be equal, and `steps` may only grow.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from typing import Any

from loco.errors import WorkdirError
from loco.files.metrics import read_metrics
from loco.files import runs as runs_lib
from loco.files import storage
from loco.files.runs import CONFIG, DIVERGED, LOCK  # noqa: F401  (they live in loco.files.runs)

# Keys (or prefixes ending in '.') whose change does not alter what a run computes.
MAY_CHANGE = ('progress', 'log_every', 'eval.every', 'eval.per_worker', 'checkpoint.',
              'mesh.', 'grad_mode', 'data.read_threads', 'data.data_dir', 'metrics.')


_SAMPLING_KEYS = ('data.sampling', 'data.window_pool_tokens')


def flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'a': {'b': 1}} -> {'a.b': 1}."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def _may_change(key: str) -> bool:
  return any(key == k or (k.endswith('.') and key.startswith(k)) for k in MAY_CHANGE)


def write_json(path: str, data: Any) -> None:
  """Writes JSON through a temporary file and a rename: a crash leaves old or new."""
  runs_lib.write_atomic(path, json.dumps(data, indent=2, default=str))


def read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


class Workdir:
  """Creates and locks a workdir for one run (`with Workdir(path) as wd:`).

  If the directory was created here and the run fails before writing anything but the
  lock, it is removed again: a bad config leaves no empty workdir behind.
  """

  def __init__(self, path: str, lock: bool = True):
    # A URL workdir: `url` where it lives, `path` its local mirror (loco.files.storage).
    self.url = storage.absolute(path) if storage.is_url(path) else None
    self.path = storage.staging(path) if self.url else path
    self._lock = lock
    self._lock_file = None
    self._created = False
    self._lease = None
    self._mirror = None

  def __enter__(self) -> Workdir:
    if self.url:
      return self._enter_url()
    if os.path.exists(self.path) and not os.path.isdir(self.path):
      raise WorkdirError(f'the workdir {self.path} is a file, not a directory; pick '
                         'another --workdir.')
    self._created = not os.path.exists(self.path)
    self._refuse_links()
    try:
      os.makedirs(self.path, exist_ok=True)
      if self._lock:
        self._take_lock()
    except OSError as e:
      self._remove_if_created()
      raise WorkdirError(f'cannot use the workdir {self.path}: {e.strerror or e}.') from e
    return self

  def _enter_url(self) -> Workdir:
    try:
      if self._lock:
        lease = storage.Lease(self.url)
        lease.take()
        self._lease = lease
      os.makedirs(self.path, exist_ok=True)
      pulled = storage.pull(self.url, self.path)
      self._mirror = storage.Mirror(self.path, self.url)
      self._mirror.mark_synced()
    except WorkdirError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (each filesystem raises its own)
      self._release()
      first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
      raise WorkdirError(f'cannot use the workdir {self.url}: {first}.') from None
    if self._lock:
      storage.register(self._mirror)
      print(f'loco: note: workdir {self.url}: checkpoints there; run files in {self.path}, '
            f'copied there before each checkpoint and at the end'
            f'{f" ({len(pulled)} pulled from it)" if pulled else ""}.',
            file=sys.stderr, flush=True)
    return self

  def _release(self) -> None:
    if self._mirror is not None:
      storage.unregister(self.url)
    if self._lease is not None:
      self._lease.release()
      self._lease = None

  def _exit_url(self, exc_type) -> None:
    try:
      if self._lock and self._mirror is not None:
        self._mirror.push()
    except Exception as e:  # pylint: disable=broad-except
      if exc_type is None:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise WorkdirError(f'copying the run files to {self.url} failed ({first}); they '
                           f'are in {self.path}.') from None
    finally:
      self._release()

  def file(self, name: str) -> str:
    """A file or folder of the run: checkpoints at the URL of a URL workdir, the rest
    (run files) in its local mirror."""
    if self.url and name == runs_lib.CHECKPOINTS:
      return storage.join(self.url, name)
    return os.path.join(self.path, name)

  def _refuse_links(self) -> None:
    """The rule for links: a workdir may itself be a link (it is followed, and the lock
    is taken on its target), but nothing inside it may be: loco writes, replaces and
    prunes only inside a run's own directory, which its lock covers, so a link there
    (a `checkpoints/` into another run) is refused."""
    if not os.path.isdir(self.path):
      return
    links = sorted(name for name in os.listdir(self.path)
                   if os.path.islink(os.path.join(self.path, name)))
    if links:
      where = os.path.join(self.path, links[0])
      raise WorkdirError(f'the workdir {self.path} holds a link, {links[0]} -> '
                         f'{os.readlink(where)}; loco writes only inside a run\'s own '
                         'directory: replace the link by the files, or use another workdir.')

  def _take_lock(self) -> None:
    f = open(os.path.join(self.path, LOCK), 'a+')
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip() or 'unknown'
      f.close()
      if holder == str(os.getpid()):
        raise WorkdirError(f'the workdir {self.path} is already a workdir of this process: '
                           'two runs of one batch reach the same directory (one through a '
                           'link); give each run its own workdir.') from None
      raise WorkdirError(f'the workdir {self.path} is in use by another loco run '
                         f'(process {holder}); wait for it to end or pick another '
                         '--workdir.') from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    self._lock_file = f

  def __exit__(self, exc_type, exc, tb) -> None:
    if self.url:
      self._exit_url(exc_type)
      return
    if exc_type is not None:
      self._remove_if_created()
    if self._lock_file is not None:
      self._lock_file.close()     # releases the lock
      self._lock_file = None

  def _remove_if_created(self) -> None:
    # Only if no file but the lock was written (empty folders do not count).
    if self._created and os.path.isdir(self.path) and all(
        root == self.path and name == LOCK for root, _, files in os.walk(self.path)
        for name in files):
      shutil.rmtree(self.path, ignore_errors=True)

  # What the workdir holds.

  def diverged(self) -> dict[str, Any] | None:
    return read_json(self.file(DIVERGED))

  def mark_diverged(self, step: int, message: str) -> None:
    write_json(self.file(DIVERGED), dict(step=step, message=message))

  def last_record(self) -> dict[str, Any]:
    try:
      records = read_metrics(self.path)
    except OSError:
      return {}
    return records[-1] if records else {}

  def check_resume(self, config: dict[str, Any], checkpoint_step: int,
                   defaults: dict[str, Any] | None = None) -> list[str]:
    """Raises WorkdirError unless `config` may resume the stored run; returns notes.

    `defaults` (the base config, nested like `config`): a key the stored run lacks (it
    was added to loco after the run began) that holds its default now is the same run,
    as a key added with its default must keep what runs did before it existed."""
    stored = (read_json(self.file(CONFIG)) or {}).get('config')
    if stored is None:
      return [f'{self.file(CONFIG)} is missing; resuming the checkpoint at step '
              f'{checkpoint_step} with this config.']
    # Compare through JSON, as the stored config was written.
    old, new = flatten(stored), flatten(json.loads(json.dumps(config, default=str)))
    default = flatten(json.loads(json.dumps(defaults or {}, default=str)))
    # Asynchronous runs made before network.overlap existed used the blocking replay:
    # they resume with overlap='none' (the key's default, 'compute', is another run).
    before_overlap = old.get('network.mode') == 'async' and 'network.overlap' not in old
    if before_overlap and new.get('network.overlap') is None:
      raise WorkdirError(
          f'the run in {self.path} was simulated with the blocking asynchronous replay '
          "(before network.overlap existed): resume it with network.overlap='none'.")
    # Runs made before data.sampling existed read the stream layout: they resume with
    # sampling='stream' (the default, 'windows', reads other batches).
    before_sampling = 'data.sampling' not in old
    if before_sampling and new.get('data.sampling') != 'stream':
      raise WorkdirError(
          f'the run in {self.path} was trained on the stream batch layout (before '
          "data.sampling existed): resume it with --config.data.sampling=stream, or train "
          'a new run in another workdir.')
    changed = [k for k in sorted(set(old) | set(new))
               if k != 'steps' and not _may_change(k) and old.get(k) != new.get(k)
               and not (k not in old and new.get(k) is None)
               and not (k not in old and k in default and new.get(k) == default[k])
               and not (k == 'network.overlap' and before_overlap)
               and not (k in _SAMPLING_KEYS and before_sampling)]
    if changed:
      shown = ', '.join(f'{k} ({old.get(k)!r} -> {new.get(k)!r})' for k in changed[:6])
      more = f' and {len(changed) - 6} more' if len(changed) > 6 else ''
      raise WorkdirError(
          f'the workdir {self.path} holds a run with another config: {shown}{more}; '
          'a resumed run must be the same run (only steps may grow): use a new workdir.')
    if new['steps'] < old['steps']:
      raise WorkdirError(
          f'steps={new["steps"]} is below the {old["steps"]} steps of the run in '
          f'{self.path} (checkpoint at step {checkpoint_step}); steps may only grow on '
          'resume.')
    if new['steps'] > old['steps'] and new.get('network.mode') == 'async':
      # The event schedule is simulated for the run's length: a longer run has another
      # schedule, which the checkpoint's tick does not index.
      raise WorkdirError(
          f'steps cannot grow on resume in network.mode=\'async\' (the run in {self.path} '
          f'has {old["steps"]}): its event schedule depends on its length; train the '
          'longer run in a new workdir.')
    if new['steps'] > old['steps']:
      note = f'steps grows from {old["steps"]} to {new["steps"]}'
      if new.get('optimizer.decay_steps') is None:
        note += (' (optimizer.decay_steps is unset, so the learning-rate schedule now '
                 f'spans {new["steps"]} steps from step {checkpoint_step} on)')
      return [note + '.']
    return []
