"""Local corpora as TFDS ArrayRecord datasets: the stdlib or own text files.

The default corpus is the `.py` source of the running Python's standard library
(about 1,800 files, 31 MB): real text that needs no download. A user's own text
files (`DataConfig.text_glob`) go through the same builder. Each file is one
document.

Cleaning (`loco.data.clean`): the stdlib corpus leaves out empty files,
machine-generated files and near-duplicates (the charmap codec tables,
`pydoc_data/topics.py`, 2to3's test inputs, ...: 2.5 MB, 8% of the bytes), so
that a model is not rewarded for memorising generated text. A text corpus is
cleaned only when asked (`text_spec(pattern, clean=True)`); it always leaves
out empty files.

Split (`split_files`, SPLIT_RULE): train and validation are split by *family*,
so that related files never straddle the split. In the stdlib a family is a
top-level package (`email/...`), a top-level module (`turtle.py`), or, inside
the `test` package, which holds 54% of the bytes and would otherwise be one
family, a test module or test package (`test/test_email/...`). In a text corpus
each file is its own family. Families are drawn in the order of a hash of their
name until validation holds 5% of the bytes. In the stdlib only families up to
MAX_VALIDATION_FAMILY_BYTES (64 KB) are drawn: the halves of validation hold
about 0.7 MB each, and one 300 KB test module would be 40% of one half; with
the cap no document is more than about 8% of a half. Larger families (idlelib,
unittest, test_typing.py, ...) are always trained on.

Validation order: experiments tune on `validation[:50%]` and report finals on
`validation[50%:]` (TFDS slices by document index), so the stored order makes
the halves exchangeable: whole families, each half filled to TFDS's boundary
(round(n / 2) documents), dealt in hash order (families with more documents
first) to the half with fewer bytes of the family's stratum so far (stdlib:
tests or library code). So the halves are disjoint sets of whole families with
about the same bytes of tests and of library code; the order is a pure
function of the file list. The training split is stored in sorted-path order.

A matched file whose first 8 KB hold a NUL byte or are not valid UTF-8 is binary:
it is skipped, with one warning line on stderr that counts the skipped files and
names the first; a glob that matches only binary files is a DataError.

A prepared corpus lives in `<data_dir>/loco_corpus/<kind>_<key>/<version>/`,
where `key` hashes the version, the cleaning switch and the file list (names,
sizes, modification times): a changed file list or rule gets a fresh dataset
instead of silently reusing a stale one. Its content fingerprint (file count,
bytes, sha256 over path and content of the kept files, what cleaning excluded,
the split's sizes) is saved with the dataset as TFDS metadata.

Version 2.0.0 (cleaning, the family split, the validation order) changed the
documents of both splits: losses measured on 1.x corpora do not compare with
losses measured on 2.x corpora.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import dataclasses
import fcntl
import functools
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
from loco.data import clean as clean_lib

VERSION = '2.0.0'  # Bump when the cleaning, the split rule or the features change.
BUILDER_NAME = 'loco_corpus'
VALIDATION_SHARE = 0.05  # Of the kept bytes.
MAX_VALIDATION_FAMILY_BYTES = 64 * 1024  # Stdlib families above this stay in train.
SPLIT_RULE = (
    'family = top-level package or module (stdlib; inside test/, the test module or '
    'package) or the file (text); families with <= 64 KB (stdlib) drawn in '
    'int(sha256(family)[:8 bytes]) order into validation until it holds 5% of the '
    'bytes (at least one family in each split); validation stored as two halves of '
    'whole families, the first round(n/2) documents: families (most documents first, '
    'then hash order) dealt to the half with fewer bytes of their stratum (stdlib: '
    'test/ or library) that has room; train sorted by path')
_SKIP_DIRS = ('site-packages', 'dist-packages', '__pycache__')
STDLIB_ENV = 'LOCO_STDLIB'   # another stdlib's folder to read as the embedded corpus


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Which files make a corpus; `key` names its prepared dataset."""

  kind: str  # 'stdlib' | 'text'.
  root: str  # Files are read from root/<relative path>.
  files: tuple[str, ...]  # Sorted relative paths.
  pattern: str  # The glob for 'text', '' for 'stdlib'.
  key: str  # sha256 of the version, `clean` and the file list with sizes and mtimes.
  clean: bool = False  # Leave out generated and near-duplicate files (loco.data.clean).

  @property
  def config_name(self) -> str:
    return f'{self.kind}_{self.key[:16]}'

  @property
  def description(self) -> str:
    if self.kind == 'stdlib':
      return (f'Python {platform.python_version()} standard library '
              f'({self.root})')
    return f'text files {self.pattern!r}'


def _spec(kind: str, root: str, files: list[str], pattern: str,
          clean: bool) -> CorpusSpec:
  listing = []
  for rel in files:
    st = os.stat(os.path.join(root, rel))
    listing.append([rel, st.st_size, st.st_mtime_ns])
  key = hashlib.sha256(json.dumps(
      [VERSION, kind, root, pattern, clean, listing]).encode()).hexdigest()
  return CorpusSpec(kind=kind, root=root, files=tuple(files), pattern=pattern,
                    key=key, clean=clean)


# A full CPython 3.11 standard library holds about 1,790 source files (31.5 MB), 820 of
# them its own test suite; fewer than this is a partial installation (Debian's and
# Ubuntu's python3.11 ship the test suite as a separate package).
FULL_STDLIB_FILES = 1500


def stdlib_is_partial(spec: 'CorpusSpec | None' = None) -> bool:
  """Whether the running Python's standard library lacks what a full one holds."""
  return len((spec or stdlib_spec()).files) < FULL_STDLIB_FILES


def partial_stdlib_note(spec: 'CorpusSpec') -> str:
  """One sentence on a partial standard library and what makes it whole."""
  version = f'{sys.version_info.major}.{sys.version_info.minor}'
  return (f'the standard library of this Python ({spec.root}) holds {len(spec.files)} '
          f'source files where a full CPython {version} holds about 1,790 (31.5 MB), so '
          'the embedded corpus is smaller than the one loco\'s published numbers use; '
          f'on Debian or Ubuntu, apt install libpython{version}-testsuite completes it '
          '(or use a python.org, pyenv or uv build).')


def stdlib_spec() -> CorpusSpec:
  """The `.py` files of the running Python's stdlib, without site-packages; a partial
  library (`stdlib_is_partial`) is used all the same, with one warning on stderr.

  The environment variable LOCO_STDLIB names another standard library's folder to read
  instead (a copy of CPython 3.11's, say, on a host whose Python is 3.12, so that its runs
  train on the corpus the published pages use).
  """
  root = os.path.realpath(os.environ.get(STDLIB_ENV) or sysconfig.get_paths()['stdlib'])
  if not os.path.isdir(root):
    raise errors.DataError(f'{STDLIB_ENV}={root!r} is not a folder.')
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    for name in filenames:
      if name.endswith('.py'):
        files.append(os.path.relpath(os.path.join(dirpath, name), root))
  if not files:
    raise errors.DataError(
        f'found no .py files in the Python standard library at {root}.')
  spec = _spec('stdlib', root, sorted(files), '', clean=True)
  if stdlib_is_partial(spec) and ('stdlib', (root,)) not in _WARNED:
    _WARNED.add(('stdlib', (root,)))
    print(f'loco: warning: {partial_stdlib_note(spec)}', file=sys.stderr, flush=True)
  return spec


def text_spec(pattern: str, clean: bool = False) -> CorpusSpec:
  """The text files matching `pattern` (`**` recurses); each file is one document.

  Binary files among them (`_is_binary`) are skipped with one warning on stderr.
  With `clean`, machine-generated tables and near-duplicates are left out too
  (`loco.data.clean`; its list of known stdlib files does not apply).

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
  return _spec('text', root, [os.path.relpath(p, root) for p in paths], pattern,
               clean=clean)


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


def _hash(name: str) -> int:
  return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], 'big')


def family(rel: str, kind: str) -> str:
  """The family of a file: what the split keeps on one side (see the module docstring)."""
  if kind != 'stdlib':
    return rel
  parts = rel.split('/')
  if parts[0] == 'test' and len(parts) > 1:
    return 'test/' + parts[1].removesuffix('.py')
  return parts[0].removesuffix('.py')


def _stratum(family_name: str, kind: str) -> str:
  # Tests and library code differ in loss (tests repeat themselves more), so the
  # validation halves balance the bytes of each.
  return 'test' if kind == 'stdlib' and family_name.startswith('test/') else ''


def split_files(sizes: dict[str, int], kind: str) -> dict[str, list[str]]:
  """Deterministic train/validation split by family (see SPLIT_RULE).

  Args:
    sizes: relative path -> bytes of every kept file.
    kind: 'stdlib' or 'text' (how files group into families, whether the
      family size cap applies).

  Returns:
    {'train': paths sorted, 'validation': paths in their stored order}.
  """
  members = collections.defaultdict(list)
  for rel in sorted(sizes):
    members[family(rel, kind)].append(rel)
  weight = {f: sum(sizes[r] for r in rels) for f, rels in members.items()}
  cap = MAX_VALIDATION_FAMILY_BYTES if kind == 'stdlib' else None
  by_hash = sorted(members, key=lambda f: (_hash(f), f))
  drawable = [f for f in by_hash if cap is None or weight[f] <= cap] or by_hash
  target = VALIDATION_SHARE * sum(weight.values())
  chosen, held = [], 0
  for f in drawable:
    if chosen and held >= target:
      break
    chosen.append(f)
    held += weight[f]
  if len(chosen) == len(members):  # Few families: leave one for training.
    chosen.pop()
  # The halves `validation[:50%]` and `validation[50%:]` get whole families:
  # dealt the families with most documents first, then in hash order, each to
  # the half with fewer bytes of its stratum (stdlib: tests or library code)
  # so far that still has room for its documents up to TFDS's boundary of
  # `[:50%]` (its 'closest' rounding). So the halves hold about the same bytes
  # of tests and of library code, and which family lands where follows the hash.
  count = sum(len(members[f]) for f in chosen)
  room = [int(round(50 * count / 100.0))]
  room.append(count - room[0])
  halves = ([], [])
  held_bytes = collections.defaultdict(lambda: [0, 0])  # Stratum -> per half.
  for f in sorted(chosen, key=lambda f: (-len(members[f]), _hash(f), f)):
    stratum = held_bytes[_stratum(f, kind)]
    order = sorted((0, 1), key=lambda h: (stratum[h], h))
    fits = [h for h in order if len(members[f]) <= room[h]]
    h = fits[0] if fits else order[0]  # Fits nowhere: the boundary cuts it.
    halves[h].append(f)
    stratum[h] += weight[f]
    room[h] -= len(members[f])
  held_out = set(chosen)
  return {'train': sorted(r for r in sizes if family(r, kind) not in held_out),
          'validation': [r for f in halves[0] + halves[1] for r in members[f]]}


@dataclasses.dataclass(frozen=True)
class CorpusPlan:
  """What a corpus keeps, what it leaves out and why, and its split."""

  kind: str  # As CorpusSpec.kind.
  sizes: dict[str, int]  # Kept file -> bytes (UTF-8, as stored).
  excluded: dict[str, str]  # Left-out file -> reason (loco.data.clean.REASONS).
  excluded_bytes: dict[str, int]  # Left-out file -> bytes.
  splits: dict[str, list[str]]  # As split_files returns.

  def families(self, rels: list[str]) -> list[str]:
    """The families of `rels`, each once, in the order they first occur."""
    return list(dict.fromkeys(family(r, self.kind) for r in rels))


def _read_text(root: str, rel: str) -> str:
  path = os.path.join(root, rel)
  try:
    with open(path, 'rb') as f:
      raw = f.read()
  except OSError as e:
    raise errors.DataError(
        f'cannot read {path} while preparing the corpus: {e}.') from e
  # Text features hold str; the few non-UTF-8 files get U+FFFD marks.
  return raw.decode('utf-8', errors='replace')


@functools.lru_cache(maxsize=8)
def plan(spec: CorpusSpec) -> CorpusPlan:
  """Applies the cleaning and the split rule to `spec`'s files.

  A cleaned corpus reads every file (about 2 s for the stdlib); otherwise only
  the file sizes are looked at and empty (0-byte) files left out.

  Raises:
    DataError: fewer than two files remain, so one split would be empty.
  """
  if spec.clean:
    texts = {rel: _read_text(spec.root, rel) for rel in spec.files}
    sizes = {rel: len(text.encode('utf-8')) for rel, text in texts.items()}
    excluded = clean_lib.exclusions(texts, stdlib=spec.kind == 'stdlib')
  else:
    sizes = {rel: os.path.getsize(os.path.join(spec.root, rel)) for rel in spec.files}
    excluded = {rel: clean_lib.EMPTY for rel, size in sizes.items() if not size}
  kept = {rel: size for rel, size in sizes.items() if rel not in excluded}
  if len(kept) < 2:
    raise errors.DataError(
        f'{spec.description} keeps {len(kept)} file(s) once empty and generated ones '
        'are left out; loco '
        'splits train/validation by file, so it needs at least 2.')
  return CorpusPlan(kind=spec.kind, sizes=kept, excluded=excluded,
                    excluded_bytes={rel: sizes[rel] for rel in excluded},
                    splits=split_files(kept, spec.kind))


class LocoCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A list of local files as a TFDS dataset with `text` and `path` features.

  Not registered by name: it needs its file list to build, while a prepared
  copy is readable by name anyway (`tfds.data_source('loco_corpus/<config>',
  data_dir=...)` reads it from its files).
  """

  VERSION = tfds.core.Version(VERSION)
  RELEASE_NOTES = {
      '1.0.0': 'One document per file; split by path hash.',
      '2.0.0': 'Generated and near-duplicate files left out (stdlib); split by '
               'family; validation ordered so that its halves are exchangeable.',
  }

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
        # Keep the order split_files gives: sorted paths for train, so that it
        # reads like the tree; for validation, the order that makes its halves
        # exchangeable.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[Any]]:
    del dl_manager  # Nothing is downloaded.
    return {name: self._generate_examples(rels)
            for name, rels in plan(self._spec).splits.items()}

  def _generate_examples(self, rels: list[str]) -> Iterator[tuple[str, dict]]:
    for rel in rels:
      text = _read_text(self._spec.root, rel)
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

  def contents(self) -> str:
    """What the prepared corpus holds, for the log line."""
    corpus_plan = plan(self._spec)
    return f'{len(corpus_plan.sizes)} files, {len(corpus_plan.excluded)} left out'

  def _fingerprint(self) -> dict[str, Any]:
    corpus_plan = plan(self._spec)
    manifest = hashlib.sha256()
    for rel in sorted(corpus_plan.sizes):  # Independent of the split.
      size, digest = self._digests[rel]
      manifest.update(f'{rel}\0{size}\0{digest}\n'.encode())
    splits = {name: {'files': len(rels), 'families': len(corpus_plan.families(rels)),
                     'bytes': sum(self._digests[r][0] for r in rels)}
              for name, rels in corpus_plan.splits.items()}
    excluded = {}
    for rel, reason in corpus_plan.excluded.items():
      entry = excluded.setdefault(reason, {'files': 0, 'bytes': 0})
      entry['files'] += 1
      entry['bytes'] += corpus_plan.excluded_bytes[rel]
    return {
        'kind': self._spec.kind,
        'root': self._spec.root,
        'glob': self._spec.pattern,
        'python': platform.python_version(),
        'files': len(corpus_plan.sizes),
        'bytes': sum(size for size, _ in self._digests.values()),
        'sha256': manifest.hexdigest(),
        'clean': self._spec.clean,
        'excluded': excluded,
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
      return not any(f"name='{kind}_" in message for kind in ('stdlib', 'text', 'hf'))
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


def prepare(spec: CorpusSpec, data_dir: str,
            builder_cls: type[LocoCorpus] | None = None) -> LocoCorpus:
  """Returns the builder of `spec`'s dataset, preparing it first if needed.

  TFDS writes into an `incomplete.*` folder and renames it into place, so a
  crash never leaves a dataset that looks prepared. A lock file serialises
  concurrent preparations of the same corpus (other processes wait, then reuse).
  `builder_cls` writes the documents: LocoCorpus (files) by default, or a subclass
  with another source of rows (loco.data.hf).
  """
  make = builder_cls or LocoCorpus
  if make(spec=spec, data_dir=data_dir).is_prepared():
    # A new builder: one made before another thread or process finished preparing
    # holds the empty metadata it read then.
    return make(spec=spec, data_dir=data_dir)
  builder = make(spec=spec, data_dir=data_dir)
  if '://' in data_dir:
    # No file locks on object stores; TFDS's rename still keeps it atomic.
    _download_and_prepare(builder)
    return make(spec=spec, data_dir=data_dir)
  config_dir = os.path.join(data_dir, BUILDER_NAME, spec.config_name)
  try:
    os.makedirs(config_dir, exist_ok=True)
  except OSError as e:
    raise errors.DataError(
        f'cannot create the data dir {config_dir} (data.data_dir): {e}.') from e
  with open(os.path.join(config_dir, '.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    builder = make(spec=spec, data_dir=data_dir)
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
      logging.info('Prepared %s (%s) in %s in %.1f s.', spec.description,
                   builder.contents(), builder.data_path, time.time() - start)
  builder = make(spec=spec, data_dir=data_dir)
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
