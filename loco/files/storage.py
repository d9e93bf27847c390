"""Where a run's files live: a local directory, or a URL on object storage (`gs://`,
`s3://`, any filesystem `etils.epath` and orbax write).

The one path layer of a workdir. A local workdir is a directory, as ever. A workdir
given as a URL keeps its checkpoints there (orbax writes them directly, step by step,
each committed by its marker), and its run files (config.json, metrics.jsonl,
comms.jsonl, diverged.json, tensorboard/) in a local mirror, `staging(url)`, which is
filled from the URL when the run starts (`pull`) and copied back before every
checkpoint and at the end (`push`): object storage has no appends and no renames, and
a row is cheap to lose only after the checkpoint that covers it exists. Because the
files are copied before each checkpoint is started, the URL always holds every row up
to its newest committed checkpoint; a resumed run cuts rows past it, as on a local
disk.

Object storage has no lock either: a URL workdir is held by a lease, `.lease`, a JSON
object naming the run (a random id), its host, its process and when it was renewed; the
holder renews it every `LEASE_SECONDS / 4` and deletes it at the end. A second run
refuses the workdir while the lease is fresh; a lease is free once `LEASE_SECONDS` pass
without renewal, or at once when its process is gone from this very host (a run killed
here resumes without waiting). Taking a lease writes it and reads it back a moment
later, so of two runs that start together the one whose write came last wins and the
other refuses; object stores that cannot order two writes within that moment could let
both start (a conditional create would close that gap; epath has none).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import uuid
from typing import Any

from etils import epath

from loco.errors import WorkdirError

LEASE = '.lease'
LEASE_SECONDS = 120.0      # a lease not renewed for this long is free
_SETTLE_SECONDS = 1.0      # between writing a lease and reading it back
STAGING_ENV = 'LOCO_STAGING_DIR'
_URL = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*://')


def native(path: str) -> str:
  """The path epath and orbax are given: a `file://` URL as its local path (a stand-in
  for object storage that runs the URL workdir's code on a local disk), others as they
  are."""
  path = os.fspath(path)
  return path[len('file://'):] if path.startswith('file://') else path


def is_url(path: str | os.PathLike) -> bool:
  """Whether `path` names object storage (`scheme://...`) rather than a local path."""
  return bool(_URL.match(os.fspath(path)))


def absolute(path: str) -> str:
  """A local path made absolute; a URL as it is."""
  return path.rstrip('/') if is_url(path) else os.path.abspath(path)


def join(path: str, *names: str) -> str:
  """`os.path.join` for local paths and URLs alike."""
  if not is_url(path):
    return os.path.join(path, *names)
  return '/'.join([path.rstrip('/'), *names])


def _fresh(path: str) -> epath.Path:
  """`path` as an epath, its listing not served from an earlier cached one (orbax writes
  through tensorstore, which fsspec's listing cache does not see)."""
  p = epath.Path(native(path))
  if is_url(native(path)):
    fs = getattr(p._backend, 'fs', None)   # pylint: disable=protected-access
    if fs is not None:
      fs(path).invalidate_cache()
  return p


def exists(path: str) -> bool:
  return _fresh(path).exists()


def isdir(path: str) -> bool:
  return _fresh(path).is_dir()


def isfile(path: str) -> bool:
  p = _fresh(path)
  return p.exists() and not p.is_dir()


def listdir(path: str) -> list[str]:
  """The names in a directory (a URL's prefix); FileNotFoundError if there is none."""
  p = _fresh(path)
  if not p.is_dir():
    raise FileNotFoundError(2, 'No such file or directory', path)
  return sorted(child.name for child in p.iterdir())


def rmtree(path: str) -> None:
  epath.Path(native(path)).rmtree()


def staging(url: str) -> str:
  """The local mirror of a URL workdir's run files: `$LOCO_STAGING_DIR` (default
  `~/.cache/loco/staging`) / scheme / the rest of the URL; a process of a multi-host run
  other than process 0 has its own (`.process-I` appended)."""
  import jax  # pylint: disable=g-import-not-at-top  (the process index; jax is loaded by now)
  root = os.environ.get(STAGING_ENV) or os.path.join(
      os.path.expanduser('~'), '.cache', 'loco', 'staging')
  scheme, rest = absolute(url).split('://', 1)
  local = os.path.join(root, scheme, *[p for p in rest.split('/') if p not in ('', '.', '..')])
  index = jax.process_index()
  return local + (f'.process-{index}' if index else '')


def _files(root: str) -> dict[str, str]:
  """{relative name: full path} of the files under `root` (a URL or a directory)."""
  out = {}
  top = _fresh(root)
  if not top.is_dir():
    return out
  stack = [(top, '')]
  while stack:
    folder, prefix = stack.pop()
    for child in folder.iterdir():
      name = prefix + child.name
      if child.is_dir():
        stack.append((child, name + '/'))
      else:
        out[name] = os.fspath(child)
  return out


def _mirrored(name: str) -> bool:
  first = name.split('/', 1)[0]
  return first not in ('checkpoints', LEASE) and not name.endswith('.tmp')


def pull(url: str, local: str) -> list[str]:
  """Makes `local` a copy of the run files at `url` (not its checkpoints or lease):
  files it holds that `url` does not are removed. Returns the names copied."""
  remote = {n: p for n, p in _files(url).items() if _mirrored(n)}
  os.makedirs(local, exist_ok=True)
  for name in set(_files(local)) - set(remote):
    os.remove(os.path.join(local, name))
  for name, path in sorted(remote.items()):
    target = os.path.join(local, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    data = epath.Path(native(path)).read_bytes()
    tmp = f'{target}.{uuid.uuid4().hex}.tmp'
    with open(tmp, 'wb') as f:
      f.write(data)
    os.replace(tmp, target)
  return sorted(remote)


class Mirror:
  """Copies a local directory's run files to a URL, each file only when it changed."""

  def __init__(self, local: str, url: str):
    self.local, self.url = local, url
    self._sent: dict[str, tuple[int, int]] = {}
    self._guard = threading.Lock()

  def mark_synced(self) -> None:
    """Counts the local files as already at the URL (just pulled from it)."""
    with self._guard:
      self._sent = {n: _signature(p) for n, p in _files(self.local).items() if _mirrored(n)}

  def push(self) -> list[str]:
    """Uploads the files that changed since the last push; returns their names."""
    with self._guard:
      sent = []
      for name, path in sorted(_files(self.local).items()):
        signature = _signature(path)
        if not _mirrored(name) or self._sent.get(name) == signature:
          continue
        with open(path, 'rb') as f:
          data = f.read()
        target = epath.Path(native(join(self.url, name)))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)    # one object put: whole or not at all
        self._sent[name] = signature
        sent.append(name)
      return sent


def _signature(path: str) -> tuple[int, int]:
  stat = os.stat(path)
  return stat.st_size, stat.st_mtime_ns


# The mirror of each URL workdir this process holds, for the checkpointer's push.
_MIRRORS: dict[str, Mirror] = {}


def register(mirror: Mirror) -> None:
  _MIRRORS[absolute(mirror.url)] = mirror


def unregister(url: str) -> None:
  _MIRRORS.pop(absolute(url), None)


def push_before_checkpoint(checkpoints: str) -> None:
  """Copies the run files of the workdir whose `checkpoints` folder this is to its URL
  (nothing for a local workdir, or a process that does not hold its mirror)."""
  mirror = _MIRRORS.get(absolute(checkpoints).rsplit('/', 1)[0])
  if mirror is not None:
    mirror.push()


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Lease:
  """The single-writer rule of a URL workdir (module docstring): `take()`, then
  `release()`; a thread renews it while held."""

  def __init__(self, url: str):
    self.url = absolute(url)
    self.path = join(self.url, LEASE)
    self.mine = dict(run=uuid.uuid4().hex, host=socket.gethostname(), pid=os.getpid())
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _read(self) -> dict[str, Any] | None:
    try:
      text = epath.Path(native(self.path)).read_text()
    except FileNotFoundError:
      return None
    try:
      lease = json.loads(text)
      return lease if isinstance(lease, dict) else {}
    except ValueError:
      return {}     # a damaged lease holds nothing: it is free

  def _write(self) -> None:
    p = epath.Path(native(self.path))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dict(self.mine, renewed=time.time())))

  def holder(self) -> dict[str, Any] | None:
    """The lease of another run that still holds the workdir, or None."""
    lease = self._read()
    if not lease or lease.get('run') == self.mine['run']:
      return None
    age = time.time() - float(lease.get('renewed', 0) or 0)
    if age > LEASE_SECONDS:
      return None
    if lease.get('host') == self.mine['host'] and isinstance(lease.get('pid'), int) \
        and not _alive(lease['pid']):
      return None
    return dict(lease, age=age)

  def _refuse(self, lease: dict[str, Any]) -> None:
    raise WorkdirError(
        f'the workdir {self.url} is in use by another loco run (host {lease.get("host")}, '
        f'process {lease.get("pid")}, its lease {LEASE} renewed {lease["age"]:.0f} s ago); '
        f'wait for it to end (a lease not renewed for {LEASE_SECONDS:.0f} s is free) or '
        'pick another --workdir.')

  def take(self) -> None:
    lease = self.holder()
    if lease is not None:
      self._refuse(lease)
    self._write()
    time.sleep(_SETTLE_SECONDS)
    lease = self.holder()
    if lease is not None:     # another run wrote after us: it holds the workdir
      self._refuse(lease)
    self._thread = threading.Thread(target=self._renew, name='loco-lease', daemon=True)
    self._thread.start()

  def _renew(self) -> None:
    while not self._stop.wait(LEASE_SECONDS / 4):
      try:
        self._write()
      except Exception:  # pylint: disable=broad-except  (a failed renewal is retried)
        pass

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    lease = self._read()
    if lease and lease.get('run') == self.mine['run']:
      epath.Path(native(self.path)).unlink(missing_ok=True)
