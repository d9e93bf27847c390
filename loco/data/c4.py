"""C4 from local files as the TFDS ArrayRecord dataset the c4 configs read.

Sources (nothing is downloaded):
- the `c4/en` JSON-lines release as people hold it, a folder of
  `c4-train.NNNNN-of-01024.json.gz` and `c4-validation.NNNNN-of-00008.json.gz`
  shards, one JSON object per line with string fields `text`, `url` and
  `timestamp`;
- an existing TFDS build of c4 (a folder holding its `dataset_info.json`, e.g.
  `~/tensorflow_datasets/c4/en/3.1.0`), TFRecord or ArrayRecord: its records are
  read without TensorFlow and keep their `text`, `url` and `timestamp`.

The result is `<data_dir>/loco_c4/en/1.0.0/` (TFDS_NAME = 'loco_c4/en:1.0.0'):
one ArrayRecord file per source shard (`loco_c4-train.array_record-00000`, in
the sorted order of the source shards, documents in their stored order),
`features.json` and, written last, `dataset_info.json`, which is what makes it
readable (`tfds.data_source(TFDS_NAME, data_dir=...)`, loco's `source='tfds'`).

Resume is per shard: each shard is written to a temporary name and renamed into
place, then recorded (with its source's name, size and mtime, its document
count and bytes) in `prepare_state.json`. A re-run skips the recorded shards
whose source is unchanged and whose file still holds its recorded bytes, and
writes the others; a half-written shard (Ctrl-C, a kill) is never recorded, so it
is written again. `dataset_info.json` is removed before any shard is written and
written again only when every shard of both splits is done, so a half-prepared
dataset is never readable.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import gzip
import json
import logging
import os
import re
import struct
import sys
import time
import zlib
from typing import Any, Callable, Iterator

import tensorflow_datasets as tfds

from loco import errors
from loco.files import runs
from loco.data import config as config_lib

NAME, CONFIG, VERSION = 'loco_c4', 'en', '1.0.0'
TFDS_NAME = config_lib.C4_TFDS_NAME
assert TFDS_NAME == f'{NAME}/{CONFIG}:{VERSION}'
SPLITS = ('train', 'validation')
FIELDS = ('text', 'url', 'timestamp')
# Shard names independent of how many there are, so that preparing more shards
# later keeps the finished ones.
FILENAME_TEMPLATE = '{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}'
STATE_FILE = 'prepare_state.json'
_SHARD = re.compile(r'^c4-(train|validation)\.(\d{5})-of-(\d{5})\.json\.gz$')


class _HideUnpreparedWarning(logging.Filter):
  """TFDS warns about an unprepared loco_c4 folder; loco's error says what to do."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.endswith('has no dataset_info.json') and f'/{NAME}/' in message)


logging.getLogger('absl').addFilter(_HideUnpreparedWarning())


class LocoC4(tfds.core.GeneratorBasedBuilder):
  """C4 `en` documents with `text`, `url` and `timestamp` (written by `prepare`).

  Registered under NAME so that `tfds.testing.mock_data` can serve it; a prepared
  copy is readable by name without importing this module too (from its files).
  """

  VERSION = tfds.core.Version(VERSION)
  RELEASE_NOTES = {'1.0.0': 'C4 en from its json.gz shards or a TFDS c4 build.'}
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=CONFIG, description='C4 en')]

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:
    return None  # Nothing to download, so no checksums file next to the code.

  def __init__(self, **kwargs: Any):
    kwargs.setdefault('file_format', 'array_record')
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='C4 en (allenai/c4 json.gz shards or a TFDS c4 build), '
                    'one ArrayRecord file per source shard, stored order kept.',
        features=tfds.features.FeaturesDict(
            {key: tfds.features.Text() for key in FIELDS}),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
    raise errors.DataError(
        f'{TFDS_NAME} is prepared from local files only: '
        f'{config_lib.C4_PREPARE_COMMAND}.')

  def _generate_examples(self) -> Iterator[Any]:
    raise NotImplementedError  # `prepare` writes the files itself.


@dataclasses.dataclass(frozen=True)
class Shard:
  """One source file of one split."""

  split: str
  path: str
  kind: str  # 'json' | 'tfrecord' | 'array_record'

  @property
  def identity(self) -> dict[str, Any]:
    st = os.stat(self.path)
    return {'source': os.path.basename(self.path), 'size': st.st_size,
            'mtime_ns': st.st_mtime_ns}


def find_shards(source: str, max_shards: int | None = None,
                validation_shards: int | None = None) -> dict[str, list[Shard]]:
  """The source shards of each split, sorted; the first `max_shards` of train.

  Raises:
    DataError: `source` is not a folder, or holds no C4 shards of a split.
  """
  if not os.path.isdir(source):
    raise errors.DataError(
        f'--source {source} is not a folder; give the folder of the C4 '
        'c4-train.*.json.gz / c4-validation.*.json.gz shards or of a TFDS c4 build.')
  if os.path.isfile(os.path.join(source, 'dataset_info.json')):
    shards = _tfds_build_shards(source)
  else:
    shards = {split: [] for split in SPLITS}
    for name in sorted(os.listdir(source)):
      m = _SHARD.match(name)
      if m:
        shards[m.group(1)].append(Shard(m.group(1), os.path.join(source, name), 'json'))
  for split in SPLITS:
    if not shards[split]:
      raise errors.DataError(
          f'--source {source} has no C4 {split} shards (c4-{split}.NNNNN-of-NNNNN'
          '.json.gz, as in allenai/c4 en, or a TFDS c4 build with its '
          'dataset_info.json); put at least one there.')
  if max_shards:
    shards['train'] = shards['train'][:max_shards]
  if validation_shards:
    shards['validation'] = shards['validation'][:validation_shards]
  return shards


def _tfds_build_shards(source: str) -> dict[str, list[Shard]]:
  path = os.path.join(source, 'dataset_info.json')
  try:
    with open(path) as f:
      info = json.load(f)
    kind = info.get('fileFormat', 'tfrecord')
    names = {s['name']: s for s in info.get('splits', [])}
  except (OSError, ValueError, AttributeError, TypeError, KeyError) as e:
    raise errors.DataError(f'{path} is not a TFDS dataset_info.json: {e}.') from e
  if kind not in ('tfrecord', 'array_record'):
    raise errors.DataError(f'{path}: file format {kind!r} is not tfrecord or array_record.')
  shards = {}
  for split in SPLITS:
    found = sorted(p for p in os.listdir(source)
                   if re.fullmatch(rf'.+-{split}\.{kind}-\d{{5}}(-of-\d{{5}})?', p))
    expected = len(names.get(split, {}).get('shardLengths', found))
    if len(found) != expected:
      raise errors.DataError(
          f'the TFDS build in {source} lists {expected} {split} shards but holds '
          f'{len(found)}; copy all of them there.')
    shards[split] = [Shard(split, os.path.join(source, p), kind) for p in found]
  return shards


def read_json_shard(path: str) -> Iterator[tuple[dict[str, str], int]]:
  """Yields (record, uncompressed bytes of its line) of a C4 json.gz shard.

  Raises:
    DataError: the file is not gzip, or a line is not a C4 record; the message
      names the file and line.
  """
  line_no = 0
  try:
    with gzip.open(path, 'rb') as f:
      for line_no, line in enumerate(f, 1):
        try:
          record = json.loads(line)
        except ValueError as e:
          raise errors.DataError(
              f'{path} line {line_no} is not JSON ({e}); a C4 shard holds one JSON '
              'object per line: download the shard again.') from None
        if (not isinstance(record, dict)
            or not all(isinstance(record.get(k), str) for k in FIELDS)):
          got = sorted(record) if isinstance(record, dict) else type(record).__name__
          raise errors.DataError(
              f'{path} line {line_no} is not a C4 record (string fields text, url, '
              f'timestamp; got {got}): is this a C4 en shard?')
        yield {k: record[k] for k in FIELDS}, len(line)
  except (OSError, EOFError, zlib.error) as e:
    where = f' after line {line_no}' if line_no else ''
    raise errors.DataError(
        f'{path} cannot be read as gzip{where} ({e}): the file is damaged, cut '
        'short or not a C4 json.gz shard; download it again.') from None


def _read_tfds_shard(path: str, kind: str) -> Iterator[tuple[dict[str, str], int]]:
  from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top
  if kind == 'array_record':
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
    reader = array_record_module.ArrayRecordReader(path)
    records = (reader.read([i])[0] for i in range(reader.num_records()))
  else:
    records = _tfrecords(path)
  for n, data in enumerate(records, 1):
    try:
      feature = tf_example_pb2.Example.FromString(data).features.feature
      record = {k: feature[k].bytes_list.value[0].decode('utf-8') for k in FIELDS}
    except Exception as e:  # pylint: disable=broad-except
      raise errors.DataError(
          f'{path} record {n} is not a c4 example with text, url and timestamp '
          f'({e.__class__.__name__}: {e}).') from None
    yield record, len(data)


def _tfrecords(path: str) -> Iterator[bytes]:
  # TFRecord framing: uint64 length, uint32 crc of it, data, uint32 crc of it.
  # The CRCs are not checked (crc32c is not in the standard library); a cut
  # file still fails on its length.
  with open(path, 'rb') as f:
    n = 0
    while header := f.read(12):
      n += 1
      if len(header) < 12:
        raise errors.DataError(f'{path} is cut short in record {n}; copy it again.')
      (length,) = struct.unpack('<Q', header[:8])
      data = f.read(length)
      if len(data) < length or len(f.read(4)) < 4:
        raise errors.DataError(f'{path} is cut short in record {n}; copy it again.')
      yield data


def read_shard(shard: Shard) -> Iterator[tuple[dict[str, str], int]]:
  """Yields (record, source bytes) of any kind of shard."""
  if shard.kind == 'json':
    return read_json_shard(shard.path)
  return _read_tfds_shard(shard.path, shard.kind)


class Progress:
  """One status line on stderr: shards, documents, MB and their rates.

  Off (no output at all) when stderr is not a terminal or `enabled` is False;
  `prepare` then prints one line per shard instead.
  """

  def __init__(self, total_shards: int, enabled: bool = True):
    self.on = enabled and sys.stderr.isatty()
    self.total, self.done = total_shards, 0
    self.docs, self.bytes = 0, 0
    self.start = self.last = time.time()

  def update(self, docs: int, nbytes: int, label: str) -> None:
    self.docs += docs
    self.bytes += nbytes
    now = time.time()
    if self.on and now - self.last > 0.2:
      self.last = now
      dt = max(now - self.start, 1e-9)
      sys.stderr.write(
          f'\r{label}  shard {self.done + 1}/{self.total}  {self.docs:,} docs  '
          f'{self.bytes / 1e6:,.0f} MB  {self.docs / dt:,.0f} docs/s  '
          f'{self.bytes / 1e6 / dt:,.1f} MB/s   ')
      sys.stderr.flush()

  def clear(self) -> None:
    """Erases the status line, so that a log line printed next starts clean."""
    if self.on:
      sys.stderr.write('\r\033[K')
      sys.stderr.flush()

  def close(self) -> None:
    self.clear()


@dataclasses.dataclass
class Report:
  """What `prepare` did: shards written and skipped, documents, bytes, seconds."""

  path: str
  written: list[str]
  skipped: list[str]
  docs: dict[str, int]
  source_bytes: dict[str, int]
  stored_bytes: int
  seconds: float


def dataset_path(data_dir: str) -> str:
  """Where the prepared dataset lives: `<data_dir>/loco_c4/en/1.0.0`."""
  return os.path.join(data_dir, NAME, CONFIG, VERSION)


def is_prepared(data_dir: str) -> bool:
  return os.path.isfile(os.path.join(dataset_path(data_dir), 'dataset_info.json'))


def _shard_file(path: str, key: str) -> str:
  split, index = key.split('/')   # key: 'train/00003'
  return os.path.join(path, f'{NAME}-{split}.array_record-{index}')


def _is_whole(out: str, entry: dict[str, Any]) -> bool:
  """Whether a recorded shard's file is there with the bytes it was written with (a
  copy of the folder cut short leaves a file that reads as fewer documents or none)."""
  try:
    return os.path.isfile(out) and os.path.getsize(out) == entry.get('stored_bytes')
  except OSError:
    return False


def _read_state(path: str) -> dict[str, Any]:
  try:
    with open(os.path.join(path, STATE_FILE)) as f:
      state = json.load(f)
    return state if isinstance(state, dict) else {}
  except (OSError, ValueError):
    return {}  # No state (or a damaged one): every shard is written again.


def _write_json(path: str, value: Any) -> None:
  runs.write_atomic(path, json.dumps(value, indent=1, sort_keys=True))


def _writer_error(e: Exception, out: str) -> Exception:
  """An ArrayRecord writer's failure (a C++ status as RuntimeError or ValueError) as an
  OSError naming the shard: ENOSPC for a full disk, so that it reads as one line."""
  text = str(e)
  if 'No space left' in text or 'ENOSPC' in text:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), out)
  if 'Read-only file system' in text:
    return OSError(errno.EROFS, os.strerror(errno.EROFS), out)
  first = (text.strip().splitlines() or [type(e).__name__])[0][:200]
  return OSError(errno.EIO, f'writing the shard failed ({first})', out)


def prepare(source: str, data_dir: str, *, max_shards: int | None = None,
            validation_shards: int | None = None, progress: bool = True,
            log: Callable[[str], None] | None = None) -> Report:
  """Writes (or completes) the C4 ArrayRecord dataset in `data_dir` from `source`.

  Args:
    source: a folder of C4 json.gz shards or of a TFDS c4 build.
    data_dir: the TFDS data dir (`data.data_dir`); the dataset goes to
      `dataset_path(data_dir)`.
    max_shards: use the first this many train shards (sorted); None: all.
    validation_shards: the same for validation; None: all.
    progress: show the status line (only on a terminal).
    log: called with one line per shard written or skipped.

  Returns:
    A Report. A second call with the same arguments writes nothing.

  Raises:
    DataError: a missing or damaged source (naming the file and line).
  """
  log = log or (lambda line: None)
  start = time.time()
  shards = find_shards(source, max_shards, validation_shards)
  path = dataset_path(data_dir)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, '.lock'), 'w') as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      raise errors.DataError(
          f'another `prepare c4` is writing {path}; let it finish (or stop it) and run '
          'this command again.') from None
    return _prepare_locked(shards, path, LocoC4(data_dir=data_dir), log, progress, start)


def _prepare_locked(shards: dict[str, list[Shard]], path: str, builder: LocoC4,
                    log: Callable[[str], None], progress: bool, start: float) -> Report:
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  state = _read_state(path)
  features = builder.info.features
  want = {f'{s.split}/{i:05d}': dict(s.identity, split=s.split)
          for split in SPLITS for i, s in enumerate(shards[split])}
  done = {key: entry for key, entry in state.get('shards', {}).items()
          if key in want and {k: entry.get(k) for k in want[key]} == want[key]
          and _is_whole(_shard_file(path, key), entry)}
  extra = sorted(key for key in state.get('shards', {}) if key not in want)
  if extra:
    # Never throw away finished work silently (64 shards are half an hour).
    raise errors.DataError(
        f'{path} already holds {len(extra)} prepared shard(s) that this command does not '
        f'ask for ({", ".join(extra[:3])}{", ..." if len(extra) > 3 else ""}); to keep '
        'them, raise --max_shards / --validation_shards (and keep their source files); '
        f'to drop them, delete {path} first.')
  info_file = os.path.join(path, 'dataset_info.json')
  if len(done) == len(want) and os.path.isfile(info_file):
    report = Report(path, [], sorted(done), *_totals(done), time.time() - start)
    log(f'{path} is already prepared from these {len(want)} shards; nothing to do.')
    return report
  # From here on the dataset is incomplete; it must not read as prepared.
  if os.path.exists(info_file):
    os.remove(info_file)
  state = {'shards': dict(done)}
  _write_json(os.path.join(path, STATE_FILE), state)
  keep = {_shard_file(path, key) for key in done}
  for name in os.listdir(path):   # leftovers of an interrupted run or a changed source
    full = os.path.join(path, name)
    if name.startswith(f'{NAME}-') and full not in keep:
      os.remove(full)
  bar = Progress(len(want) - len(done), enabled=progress)
  written = []
  try:
    for split in SPLITS:
      for i, shard in enumerate(shards[split]):
        key = f'{split}/{i:05d}'
        name = os.path.basename(shard.path)
        if key in done:
          bar.clear()
          log(f'{split} {i + 1}/{len(shards[split])}: {name} already prepared, skipped.')
          continue
        out = _shard_file(path, key)
        tmp = f'{out}.tmp{os.getpid()}'
        if os.path.lexists(tmp):    # whatever sits at the name (a planted link): gone
          os.remove(tmp)
        t0 = time.time()
        docs = nbytes = shown = 0
        try:
          writer = array_record_module.ArrayRecordWriter(tmp, 'group_size:1')
        except (RuntimeError, ValueError) as e:
          raise _writer_error(e, out) from None
        try:
          for record, size in read_shard(shard):
            try:
              writer.write(features.serialize_example(record))
            except (RuntimeError, ValueError) as e:
              raise _writer_error(e, out) from None
            docs += 1
            nbytes += size
            if docs % 1000 == 0:
              bar.update(1000, nbytes - shown, f'{split} {name}')
              shown = nbytes
        except BaseException:
          try:
            writer.close()
          except (RuntimeError, ValueError):   # the error on its way out is the one
            pass
          raise
        try:
          writer.close()
        except (RuntimeError, ValueError) as e:
          raise _writer_error(e, out) from None
        bar.update(docs % 1000, nbytes - shown, f'{split} {name}')
        if not docs:
          os.remove(tmp)
          raise errors.DataError(f'{shard.path} holds no documents; a C4 shard is never '
                                 'empty: download it again.')
        os.replace(tmp, out)
        state['shards'][key] = dict(want[key], docs=docs, source_bytes=nbytes,
                                    stored_bytes=os.path.getsize(out))
        _write_json(os.path.join(path, STATE_FILE), state)
        bar.done += 1
        written.append(key)
        dt = time.time() - t0
        bar.clear()
        log(f'{split} {i + 1}/{len(shards[split])}: {name}: {docs:,} documents, '
            f'{nbytes / 1e6:,.1f} MB in {dt:.1f} s ({docs / max(dt, 1e-9):,.0f} docs/s, '
            f'{nbytes / 1e6 / max(dt, 1e-9):,.1f} MB/s).')
  finally:
    bar.close()
    for name in os.listdir(path):
      if '.tmp' in name and name.startswith(f'{NAME}-'):
        os.remove(os.path.join(path, name))
  _write_info(builder, path, shards, state['shards'])
  entries = state['shards']
  return Report(path, written, sorted(done), *_totals(entries), time.time() - start)


def _totals(entries: dict[str, dict[str, Any]]) -> tuple[dict[str, int], dict[str, int], int]:
  docs = {s: sum(e['docs'] for k, e in entries.items() if k.startswith(s + '/'))
          for s in SPLITS}
  source = {s: sum(e['source_bytes'] for k, e in entries.items()
                   if k.startswith(s + '/')) for s in SPLITS}
  return docs, source, sum(e['stored_bytes'] for e in entries.values())


def _write_info(builder: LocoC4, path: str, shards: dict[str, list[Shard]],
                entries: dict[str, dict[str, Any]]) -> None:
  split_infos = []
  for split in SPLITS:
    keys = [f'{split}/{i:05d}' for i in range(len(shards[split]))]
    split_infos.append(tfds.core.SplitInfo(
        name=split,
        shard_lengths=[entries[k]['docs'] for k in keys],
        num_bytes=sum(entries[k]['stored_bytes'] for k in keys),
        filename_template=tfds.core.ShardedFileTemplate(
            data_dir=tfds.core.Path(path), template=FILENAME_TEMPLATE,
            dataset_name=NAME, split=split, filetype_suffix='array_record')))
  builder.info.set_splits(tfds.core.SplitDict(split_infos))
  tmp = os.path.join(path, f'.info.tmp{os.getpid()}')
  os.makedirs(tmp, exist_ok=True)
  builder.info.write_to_directory(tmp)
  for name in sorted(os.listdir(tmp), key=lambda n: n == 'dataset_info.json'):
    os.replace(os.path.join(tmp, name), os.path.join(path, name))  # dataset_info.json last
  os.rmdir(tmp)
