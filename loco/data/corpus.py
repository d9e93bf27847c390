"""Local corpora as TFDS ArrayRecord datasets: the stdlib or own text files.

The default corpus is the `.py` source of the running Python's standard library
(about 1,800 files, 31 MB): real text that needs no download. A user's own text
files (`DataConfig.text_glob`) go through the same builder. Each file is one
document; 5% of the files, chosen by a hash of their relative path, form the
validation split, so the split is deterministic and disjoint by file.

A matched file whose first 8 KB hold a NUL byte or are not valid UTF-8 is binary:
it is skipped, with one warning line on stderr that counts the skipped files and
names the first; a glob that matches only binary files is a DataError.

A prepared corpus lives in `<data_dir>/loco_corpus/<kind>_<key>/<version>/`,
where `key` hashes the file list (names, sizes, modification times): a changed
file list gets a fresh dataset instead of silently reusing a stale one. Its
content fingerprint (file count, bytes, sha256 over path and content) is saved
with the dataset as TFDS metadata.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
from typing import Any, Iterator

import tensorflow_datasets as tfds

from loco import errors

VERSION = '1.0.0'  # Bump when the split rule or features change.
BUILDER_NAME = 'loco_corpus'
VALIDATION_PER_MILLE = 50  # 5% of the files go to the validation split.
SPLIT_RULE = ('validation iff int(sha256(relative path)[:8 bytes]) % 1000 < 50 '
              '(at least one file in each split)')
_SKIP_DIRS = ('site-packages', 'dist-packages', '__pycache__')


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Which files make a corpus; `key` names its prepared dataset."""

  kind: str  # 'stdlib' | 'text'.
  root: str  # Files are read from root/<relative path>.
  files: tuple[str, ...]  # Sorted relative paths.
  pattern: str  # The glob for 'text', '' for 'stdlib'.
  key: str  # sha256 of the file list with sizes and modification times.

  @property
  def config_name(self) -> str:
    return f'{self.kind}_{self.key[:16]}'

  @property
  def description(self) -> str:
    if self.kind == 'stdlib':
      return (f'Python {platform.python_version()} standard library '
              f'({self.root})')
    return f'text files {self.pattern!r}'


def _spec(kind: str, root: str, files: list[str], pattern: str) -> CorpusSpec:
  listing = []
  for rel in files:
    st = os.stat(os.path.join(root, rel))
    listing.append([rel, st.st_size, st.st_mtime_ns])
  key = hashlib.sha256(json.dumps(
      [VERSION, kind, root, pattern, listing]).encode()).hexdigest()
  return CorpusSpec(kind=kind, root=root, files=tuple(files), pattern=pattern,
                    key=key)


def stdlib_spec() -> CorpusSpec:
  """The `.py` files of the running Python's stdlib, without site-packages."""
  root = os.path.realpath(sysconfig.get_paths()['stdlib'])
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    for name in filenames:
      if name.endswith('.py'):
        files.append(os.path.relpath(os.path.join(dirpath, name), root))
  if not files:
    raise errors.DataError(
        f'found no .py files in the Python standard library at {root}.')
  return _spec('stdlib', root, sorted(files), '')


def text_spec(pattern: str) -> CorpusSpec:
  """The text files matching `pattern` (`**` recurses); each file is one document.

  Binary files among them (`_is_binary`) are skipped with one warning on stderr.

  Raises:
    DataError: the pattern matches no file, only binary files, or a single text file.
  """
  paths = sorted({
      os.path.abspath(p)
      for p in glob.glob(os.path.expanduser(pattern), recursive=True)
      if os.path.isfile(p)
  })
  if not paths:
    raise errors.DataError(f'data.text_glob {pattern!r} matches no files.')
  binary = [p for p in paths if _is_binary(p, pattern)]
  if len(binary) == len(paths):
    raise errors.DataError(
        f'data.text_glob {pattern!r} matches only binary files ({len(binary)}, e.g. '
        f'{binary[0]}: a NUL byte or invalid UTF-8 in the first 8 KB); give it UTF-8 '
        'text files.')
  if binary:
    if (pattern, tuple(binary)) not in _WARNED:   # once, not once per split
      _WARNED.add((pattern, tuple(binary)))
      print(f'loco: warning: data.text_glob {pattern!r}: skipped {len(binary)} binary '
            f'file(s) (a NUL byte or invalid UTF-8 in the first 8 KB), the first '
            f'{binary[0]}.', file=sys.stderr, flush=True)
    skipped = set(binary)
    paths = [p for p in paths if p not in skipped]
  if len(paths) < 2:
    raise errors.DataError(
        f'data.text_glob {pattern!r} matches only {paths[0]}; loco splits '
        'train/validation by file, so give it at least 2 files.')
  root = os.path.commonpath([os.path.dirname(p) for p in paths])
  return _spec('text', root, [os.path.relpath(p, root) for p in paths], pattern)


_SNIFF_BYTES = 8192
_SNIFFED: dict[tuple[str, int, int], bool] = {}   # (path, size, mtime) -> binary
_WARNED: set[tuple[str, tuple[str, ...]]] = set()


def _is_binary(path: str, pattern: str) -> bool:
  """A NUL byte or invalid UTF-8 in the first 8 KB (a character cut at 8 KB is fine)."""
  try:
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _SNIFFED:
      with open(path, 'rb') as f:
        head = f.read(_SNIFF_BYTES)
      try:
        codecs.getincrementaldecoder('utf-8')().decode(head, final=len(head) < _SNIFF_BYTES)
        _SNIFFED[key] = b'\0' in head
      except UnicodeDecodeError:
        _SNIFFED[key] = True
  except OSError as e:
    raise errors.DataError(f'data.text_glob {pattern!r} matches {path}, which cannot be '
                           f'read: {e.strerror or e}.') from None
  return _SNIFFED[key]


def _path_hash(rel: str) -> int:
  return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], 'big')


def split_files(files: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
  """Deterministic train/validation split by file (see SPLIT_RULE)."""
  hashes = {rel: _path_hash(rel) for rel in files}
  validation = [r for r in files if hashes[r] % 1000 < VALIDATION_PER_MILLE]
  # Few files can leave a split empty; move the extreme-hash file over so that
  # both exist and the rule stays a pure function of the file names.
  if not validation:
    validation = [min(files, key=lambda r: (hashes[r] % 1000, r))]
  if len(validation) == len(files):
    validation.remove(max(files, key=lambda r: (hashes[r] % 1000, r)))
  held_out = set(validation)
  return {'train': sorted(r for r in files if r not in held_out),
          'validation': sorted(validation)}


class LocoCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A list of local files as a TFDS dataset with `text` and `path` features.

  Not registered by name: it needs its file list to build, while a prepared
  copy is readable by name anyway (`tfds.data_source('loco_corpus/<config>',
  data_dir=...)` reads it from its files).
  """

  VERSION = tfds.core.Version(VERSION)
  RELEASE_NOTES = {str(VERSION): 'One document per file; split by path hash.'}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:
    # Nothing is downloaded, so there is no checksums file to find next to
    # the code; TFDS's lookup would also need the `importlib_resources` package.
    return None

  def __init__(self, *, spec: CorpusSpec, data_dir: str):
    self._spec = spec
    self._digests: dict[str, tuple[int, str]] = {}
    super().__init__(
        data_dir=data_dir,
        config=tfds.core.BuilderConfig(
            name=spec.config_name, description=spec.description),
        file_format='array_record')

  def _info(self) -> tfds.core.DatasetInfo:
    # Built directly: a builder outside the TFDS tree has no metadata folder.
    return tfds.core.DatasetInfo(
        builder=self,
        description='Local text files, one document per file.',
        features=tfds.features.FeaturesDict({
            'text': tfds.features.Text(),
            'path': tfds.features.Text(),
        }),
        metadata=tfds.core.MetadataDict(),
        # Keep files in sorted-path order so that a split reads like the tree.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[Any]]:
    del dl_manager  # Nothing is downloaded.
    return {name: self._generate_examples(rels)
            for name, rels in split_files(self._spec.files).items()}

  def _generate_examples(self, rels: list[str]) -> Iterator[tuple[str, dict]]:
    for rel in rels:
      path = os.path.join(self._spec.root, rel)
      try:
        with open(path, 'rb') as f:
          raw = f.read()
      except OSError as e:
        raise errors.DataError(
            f'cannot read {path} while preparing the corpus: {e}.') from e
      # Text features hold str; the few non-UTF-8 files get U+FFFD marks.
      text = raw.decode('utf-8', errors='replace')
      data = text.encode('utf-8')
      self._digests[rel] = (len(data), hashlib.sha256(data).hexdigest())
      yield rel, {'text': text, 'path': rel}

  def _log_download_bytes(self) -> None:
    pass  # TFDS would print 'Downloading and preparing'; nothing is downloaded.

  def _log_download_done(self) -> None:
    pass  # `prepare` logs its own line.

  def _download_and_prepare(self, dl_manager: Any,
                            download_config: Any) -> None:
    super()._download_and_prepare(
        dl_manager=dl_manager, download_config=download_config)
    # All examples are written now; record the content fingerprint, which
    # TFDS saves as metadata.json next to dataset_info.json.
    self.info.metadata.update(self._fingerprint())

  def _fingerprint(self) -> dict[str, Any]:
    manifest = hashlib.sha256()
    for rel in self._spec.files:  # Sorted: independent of the split.
      size, digest = self._digests[rel]
      manifest.update(f'{rel}\0{size}\0{digest}\n'.encode())
    splits = {name: {'files': len(rels), 'bytes': sum(self._digests[r][0] for r in rels)}
              for name, rels in split_files(self._spec.files).items()}
    return {
        'kind': self._spec.kind,
        'root': self._spec.root,
        'glob': self._spec.pattern,
        'python': platform.python_version(),
        'files': len(self._spec.files),
        'bytes': sum(size for size, _ in self._digests.values()),
        'sha256': manifest.hexdigest(),
        'split_rule': SPLIT_RULE,
        'splits': splits,
    }


class _HideExpectedWarnings(logging.Filter):
  """Drops TFDS's warnings about loco corpora that are expected, not problems.

  A loco corpus always uses a custom config, and its folder has no
  dataset_info.json until it is prepared.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno > logging.WARNING:
      return True
    message = record.getMessage()
    if message.startswith('Using custom data configuration'):
      return not any(f"name='{kind}_" in message for kind in ('stdlib', 'text'))
    if message.endswith('has no dataset_info.json'):
      return f'/{BUILDER_NAME}/' not in message
    return True


logging.getLogger('absl').addFilter(_HideExpectedWarnings())
_PROGRESS_BAR_LOCK = threading.Lock()


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
  """Hides TFDS's progress bars, which turn a 1-second step into screenfuls."""
  # TFDS's switch is global; the lock keeps concurrent preparations in this
  # process from restoring each other's setting in the wrong order.
  with _PROGRESS_BAR_LOCK:
    active = getattr(tfds.core.utils.tqdm_utils, '_active', True)
    tfds.display_progress_bar(False)
    try:
      yield
    finally:
      tfds.display_progress_bar(active)


def _download_and_prepare(builder: LocoCorpus) -> None:
  with _no_progress_bars(), tempfile.TemporaryDirectory() as downloads:
    # TFDS wants a download dir even when nothing is downloaded; keep it out
    # of the data dir.
    builder.download_and_prepare(download_dir=downloads)


def prepare(spec: CorpusSpec, data_dir: str) -> LocoCorpus:
  """Returns the builder of `spec`'s dataset, preparing it first if needed.

  TFDS writes into an `incomplete.*` folder and renames it into place, so a
  crash never leaves a dataset that looks prepared. A lock file serialises
  concurrent preparations of the same corpus (other processes wait, then reuse).
  """
  builder = LocoCorpus(spec=spec, data_dir=data_dir)
  if builder.is_prepared():
    return builder
  if '://' in data_dir:
    # No file locks on object stores; TFDS's rename still keeps it atomic.
    _download_and_prepare(builder)
    return LocoCorpus(spec=spec, data_dir=data_dir)
  config_dir = os.path.join(data_dir, BUILDER_NAME, spec.config_name)
  try:
    os.makedirs(config_dir, exist_ok=True)
  except OSError as e:
    raise errors.DataError(
        f'cannot create the data dir {config_dir} (data.data_dir): {e}.') from e
  with open(os.path.join(config_dir, '.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    builder = LocoCorpus(spec=spec, data_dir=data_dir)
    if not builder.is_prepared():  # Maybe another process did.
      # Leftovers of a preparation that was killed; we hold the lock.
      for name in os.listdir(config_dir):
        if name.startswith('incomplete.'):
          shutil.rmtree(os.path.join(config_dir, name), ignore_errors=True)
      start = time.time()
      try:
        _download_and_prepare(builder)
      except OSError as e:
        raise errors.DataError(
            f'cannot prepare {spec.description} in {config_dir}: {e}.') from e
      logging.info('Prepared %s (%d files) in %s in %.1f s.', spec.description,
                   len(spec.files), builder.data_path, time.time() - start)
  builder = LocoCorpus(spec=spec, data_dir=data_dir)
  if not builder.is_prepared():
    raise errors.DataError(
        f'{spec.description} was prepared in {builder.data_path} but is not '
        'readable; delete that folder and retry.')
  return builder


def fingerprint(builder: LocoCorpus) -> dict[str, Any]:
  """The content fingerprint saved with a prepared corpus (a plain dict)."""
  meta = dict(builder.info.metadata or {})
  if 'sha256' not in meta:
    raise errors.DataError(
        f'the corpus at {builder.data_path} has no fingerprint '
        '(metadata.json); delete that folder so that loco prepares it again.')
  return json.loads(json.dumps(meta))
