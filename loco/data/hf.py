"""Hugging Face datasets as a loco corpus: the rows of a split, prepared once, read locally.

`data.source='hf'` (`pip install -e '.[hf]'`) names a dataset by `data.hf_dataset`:

- a local path: a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`
  (read with `datasets.load_from_disk`), a folder of data files or one data file
  (parquet, json / jsonl, csv, txt, arrow: read with `datasets.load_dataset`);
- otherwise a Hugging Face Hub name such as 'HuggingFaceFW/fineweb-edu' with its
  configuration `data.hf_config` ('sample-10BT'), read with `datasets.load_dataset`, as a
  stream (`data.hf_streaming`: no full download, only the rows read) or downloaded
  whole into the Hugging Face cache (`$HF_HOME`, default ~/.cache/huggingface).

Only a Hub name downloads anything, and only while the corpus is prepared.

The rows become the same prepared form as a folder of text files (loco.data.corpus):
a TFDS ArrayRecord dataset `<data_dir>/loco_corpus/hf_<key>/<version>/` with `text`
and `path` features and splits `train` and `validation`, which `data.train_split` and
`data.eval_split` name (slices such as `validation[:50%]` work) and which sharding,
sampling, resume and eval windows read as they read any local corpus. Each row is one
document; `path` is `<hf split>/<row index>` (zero-padded, so sorting keeps the stored
order). Rows whose text column is empty or blank are left out.

Splits (HF_SPLIT_RULE): train holds the first `data.hf_max_docs` rows (0: all) of
`data.hf_train_split` in stored order. Validation is `data.hf_eval_split`'s first
`hf_max_docs` rows, or, when that is empty, the rows of the train split whose content
hash (sha256 of the text, first 8 bytes) falls below `data.hf_eval_fraction` of the
hash range: a deterministic carve that keeps identical texts on one side. Validation is
stored in content-hash order, a fixed shuffle, so that its halves (`validation[:50%]`,
`validation[50%:]`) are exchangeable. Preparation reads the source once.

`key` hashes the settings above (dataset, configuration, splits, fraction, max_docs,
streaming, text column) and, for a local dataset, its file listing (names, sizes,
modification times): a changed local dataset gets a fresh corpus; a Hub dataset is
prepared once and reused (offline too) until its folder is deleted. The content
fingerprint (documents, bytes, sha256 over every document in stored order) is saved with
it, as for text files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import tempfile
from typing import Any, Iterator

from loco import errors
from loco.data import config as config_lib
from loco.data import corpus

_FORMAT = 1  # Bump when the split rule, the paths or the features of an hf corpus change.
HF_SPLIT_RULE = (
    'train: the first hf_max_docs rows (0: all) of hf_train_split, stored order; '
    'validation: the first hf_max_docs rows of hf_eval_split, or the train rows with '
    'int(sha256(text)[:8 bytes]) < hf_eval_fraction * 2**64; validation stored in that '
    'hash order; blank rows left out')
# A single data file: the `datasets` builder that reads it, by extension.
_FILE_BUILDERS = {'.parquet': 'parquet', '.json': 'json', '.jsonl': 'json',
                  '.csv': 'csv', '.txt': 'text', '.arrow': 'arrow'}
_COMPRESSIONS = ('.gz', '.bz2', '.xz', '.zst')
_BATCH = 1000  # rows per read from a dataset


@dataclasses.dataclass(frozen=True)
class HfSpec(corpus.CorpusSpec):
  """A Hugging Face dataset's rows as a corpus: where they come from and how they split."""

  dataset: str = ''         # the Hub name or the absolute local path
  local: bool = False       # a path on this machine (never downloads)
  saved: bool = False       # a save_to_disk folder (load_from_disk)
  hf_config: str = ''
  train_split: str = 'train'
  eval_split: str = ''      # '' -> carve eval_fraction of train_split
  eval_fraction: float = 0.05
  max_docs: int = 0
  streaming: bool = False
  text_key: str = 'text'

  @property
  def description(self) -> str:
    where = 'local dataset' if self.local else 'Hugging Face Hub dataset'
    config = f' ({self.hf_config})' if self.hf_config else ''
    return f'{where} {self.dataset!r}{config}'


def _listing(path: str) -> list[list[Any]]:
  if os.path.isfile(path):
    st = os.stat(path)
    return [[os.path.basename(path), st.st_size, st.st_mtime_ns]]
  out = []
  for dirpath, dirnames, filenames in os.walk(path):
    dirnames.sort()
    for name in sorted(filenames):
      full = os.path.join(dirpath, name)
      st = os.stat(full)
      out.append([os.path.relpath(full, path), st.st_size, st.st_mtime_ns])
  return out


def _looks_like_path(name: str) -> bool:
  # Hub names are 'name' or 'owner/name'; anything else that is not on disk was meant
  # as a path.
  return (name.startswith(('/', '.', '~')) or name.count('/') > 1
          or os.path.splitext(name)[1].lower() in _FILE_BUILDERS)


def _is_saved(path: str) -> bool:
  return os.path.isdir(path) and any(
      os.path.isfile(os.path.join(path, f)) for f in ('state.json', 'dataset_dict.json'))


def _saved_without_rows(path: str) -> bool:
  try:
    with open(os.path.join(path, 'state.json')) as f:
      return json.load(f).get('_data_files') == []
  except (OSError, ValueError, AttributeError):
    return False


def hf_spec(cfg: config_lib.DataConfig) -> HfSpec:
  """The corpus `cfg` names (`source='hf'`); lists a local dataset's files, reads nothing.

  Raises:
    DataError: a path that does not exist, or an empty folder.
  """
  name = cfg.hf_dataset
  path = os.path.abspath(os.path.expanduser(name))
  if os.path.exists(path):
    local, saved, listing = True, _is_saved(path), _listing(path)
    if not listing:
      raise errors.DataError(
          f'data.hf_dataset {name!r} is an empty folder ({path}); give a save_to_disk '
          'folder, a folder of data files or a Hub name.')
    dataset = path
  elif _looks_like_path(name):
    raise errors.DataError(
        f'data.hf_dataset {name!r}: no such file or folder ({path}); give the path of a '
        "local dataset or a Hugging Face Hub name such as 'HuggingFaceFW/fineweb-edu'.")
  else:
    local, saved, listing, dataset = False, False, [], name
  carve = not cfg.hf_eval_split
  settings = dict(
      dataset=dataset, local=local, saved=saved, hf_config=cfg.hf_config,
      train_split=cfg.hf_train_split, eval_split=cfg.hf_eval_split,
      eval_fraction=float(cfg.hf_eval_fraction) if carve else 0.0,
      max_docs=cfg.hf_max_docs, streaming=bool(cfg.hf_streaming) and not saved,
      text_key=cfg.text_key)
  key = hashlib.sha256(json.dumps(
      [corpus.VERSION, _FORMAT, 'hf', settings, listing], sort_keys=True).encode()
  ).hexdigest()
  return HfSpec(kind='hf', root=dataset, files=(), pattern='', key=key, **settings)


def datasets_module():
  """The `datasets` package, or a ConfigError naming the extra that installs it."""
  config_lib.require_hf('datasets', "data.source='hf'")
  return importlib.import_module('datasets')


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return text[0][:300] if text else type(e).__name__


def _open_split(spec: HfSpec, split: str):
  """The HF split as a `datasets.Dataset` or `IterableDataset` (nothing read yet)."""
  datasets = datasets_module()
  role = 'data.hf_train_split' if split == spec.train_split else 'data.hf_eval_split'
  if spec.saved:
    try:
      loaded = datasets.load_from_disk(spec.dataset)
    except Exception as e:  # pylint: disable=broad-except  (any damage to the folder)
      if _saved_without_rows(spec.dataset):   # `datasets` cannot load its own empty save
        raise errors.DataError(
            f'{spec.description} has no rows: the dataset is empty.') from None
      raise errors.DataError(
          f'{spec.description} cannot be read as a save_to_disk folder: '
          f'{type(e).__name__}: {_first_line(e)}') from None
    if isinstance(loaded, datasets.DatasetDict):
      if split not in loaded:
        raise errors.DataError(
            f'{spec.description} has no split {split!r} ({role}); its splits are '
            f'{", ".join(sorted(loaded))}.')
      return loaded[split]
    if split != spec.train_split:
      raise errors.DataError(
          f'{spec.description} holds a single split, so there is no {split!r} '
          f'({role}) to evaluate on; leave data.hf_eval_split empty to carve '
          'data.hf_eval_fraction of its rows out.')
    return loaded
  path, kwargs = spec.dataset, {}
  if spec.local and os.path.isfile(path):
    base = path.lower()
    for suffix in _COMPRESSIONS:
      base = base.removesuffix(suffix)
    builder = _FILE_BUILDERS.get(os.path.splitext(base)[1])
    if builder is None:
      raise errors.DataError(
          f'data.hf_dataset {path} is a file that `datasets` does not read by itself; '
          f'give a {", ".join(sorted(_FILE_BUILDERS))} file or a folder.')
    path, kwargs = builder, dict(data_files={spec.train_split: spec.dataset})
  try:
    return datasets.load_dataset(path, spec.hf_config or None, split=split,
                                 streaming=spec.streaming, **kwargs)
  except ConnectionError as e:
    raise errors.DataError(
        f'{spec.description} cannot be fetched from the Hugging Face Hub '
        f'({_first_line(e)}); on a machine without network, prepare it once where there '
        'is one and copy data.data_dir, or give a local dataset.') from None
  except FileNotFoundError as e:   # DatasetNotFoundError, no data files
    where = '' if spec.local else ' (and there is no local path of that name)'
    raise errors.DataError(
        f'{spec.description} is not found{where}: {_first_line(e)}') from None
  except ValueError as e:   # an unknown split or configuration
    raise errors.DataError(
        f'{spec.description} cannot be opened with configuration '
        f'{spec.hf_config or "(none)"} and split {split!r} (data.hf_config, {role}): '
        f'{_first_line(e)}') from None
  except Exception as e:  # pylint: disable=broad-except
    # `datasets` raises many kinds (gated datasets, bad files, scripts); each is the
    # user's to fix and says what it is.
    raise errors.DataError(
        f'{spec.description} cannot be opened: {type(e).__name__}: '
        f'{_first_line(e)}') from None


def _texts(spec: HfSpec, split: str) -> Iterator[tuple[int, Any]]:
  """(row index, text column value) of the split's first `max_docs` rows, in order."""
  ds = _open_split(spec, split)
  columns = ds.column_names
  if columns is not None and spec.text_key not in columns:
    raise errors.DataError(
        f'{spec.description} split {split!r} has no column {spec.text_key!r} '
        f'(data.text_key); its columns are {", ".join(columns)}.')
  if spec.max_docs:
    ds = (ds.select(range(min(spec.max_docs, len(ds))))
          if isinstance(ds, datasets_module().Dataset) else ds.take(spec.max_docs))
  index = 0
  try:
    if columns is None:   # a stream whose columns are known only from its rows
      for row in ds:
        if spec.text_key not in row:
          raise errors.DataError(
              f'{spec.description} split {split!r} has no column {spec.text_key!r} '
              f'(data.text_key); its columns are {", ".join(row)}.')
        yield index, row[spec.text_key]
        index += 1
      return
    for batch in ds.select_columns([spec.text_key]).iter(batch_size=_BATCH):
      for value in batch[spec.text_key]:
        yield index, value
        index += 1
  except errors.LocoError:
    raise
  except (OSError, ValueError) as e:   # a damaged file, a dropped connection
    raise errors.DataError(
        f'{spec.description} split {split!r} cannot be read after row {index}: '
        f'{type(e).__name__}: {_first_line(e)}') from None


class _Spill:
  """Validation rows held on disk until they are written in content-hash order."""

  def __init__(self):
    self._file = tempfile.TemporaryFile()
    self._rows: list[tuple[bytes, str, int, int]] = []   # (digest, path, offset, size)

  def add(self, digest: bytes, path: str, data: bytes) -> None:
    self._rows.append((digest, path, self._file.tell(), len(data)))
    self._file.write(data)

  def __len__(self) -> int:
    return len(self._rows)

  def __iter__(self) -> Iterator[tuple[str, bytes]]:
    for _, path, offset, size in sorted(self._rows):
      self._file.seek(offset)
      yield path, self._file.read(size)
    self._file.close()


class _Preparation:
  """One pass over the source: train rows written as read, validation rows spilled."""

  def __init__(self, spec: HfSpec):
    self.spec = spec
    self.manifest = hashlib.sha256()
    self.splits = {name: {'docs': 0, 'bytes': 0} for name in ('train', 'validation')}
    self.blank = 0
    self._spill: _Spill | None = None
    self._threshold = int(spec.eval_fraction * 2**64)

  def _rows(self, split: str) -> Iterator[tuple[str, bytes, bytes]]:
    """(path, UTF-8 text, sha256) of the split's non-blank rows."""
    for index, value in _texts(self.spec, split):
      if value is None:
        value = ''
      if not isinstance(value, str):
        raise errors.DataError(
            f'{self.spec.description} split {split!r} column {self.spec.text_key!r} '
            f'(data.text_key) holds {type(value).__name__} values, not text.')
      if not value.strip():
        self.blank += 1
        continue
      data = value.encode('utf-8')
      yield f'{split}/{index:012d}', data, hashlib.sha256(data).digest()

  def _written(self, split: str, path: str, data: bytes, digest: bytes):
    self.manifest.update(f'{split}\0{path}\0{len(data)}\0{digest.hex()}\n'.encode())
    self.splits[split]['docs'] += 1
    self.splits[split]['bytes'] += len(data)
    return path, {'text': data.decode('utf-8'), 'path': path}

  def train(self) -> Iterator[tuple[str, dict[str, str]]]:
    carve = not self.spec.eval_split
    if carve:
      self._spill = _Spill()
    for path, data, digest in self._rows(self.spec.train_split):
      if carve and int.from_bytes(digest[:8], 'big') < self._threshold:
        self._spill.add(digest, path, data)
      else:
        yield self._written('train', path, data, digest)
    if not self.splits['train']['docs']:
      raise errors.DataError(self._empty('train', self.spec.train_split))

  def validation(self) -> Iterator[tuple[str, dict[str, str]]]:
    if self.spec.eval_split:
      self._spill = _Spill()
      for path, data, digest in self._rows(self.spec.eval_split):
        self._spill.add(digest, path, data)
    elif self._spill is None:   # TFDS writes the splits in the order they are listed
      raise AssertionError('the train split is prepared before validation')
    if not len(self._spill):
      raise errors.DataError(self._empty('validation', self.spec.eval_split))
    for path, data in self._spill:
      yield self._written('validation', path, data, hashlib.sha256(data).digest())

  def _empty(self, split: str, hf_split: str) -> str:
    spec = self.spec
    limit = f' (the first {spec.max_docs}: data.hf_max_docs)' if spec.max_docs else ''
    if split == 'validation' and not spec.eval_split:
      return (f'carving {spec.eval_fraction:g} of the {self.splits["train"]["docs"]} '
              f'non-blank rows of {spec.description} split {spec.train_split!r}{limit} '
              'left validation empty; raise data.hf_eval_fraction or hf_max_docs, or name '
              'a held-out split in data.hf_eval_split.')
    if split == 'train' and not spec.eval_split and self._spill and len(self._spill):
      return (f'carving {spec.eval_fraction:g} of {spec.description} split '
              f'{hf_split!r}{limit} put all of its {len(self._spill)} non-blank rows in '
              'validation; lower data.hf_eval_fraction or give the dataset more rows.')
    return (f'{spec.description} split {hf_split!r}{limit} has no rows with text in '
            f'column {spec.text_key!r} (data.text_key): the dataset is empty or its '
            'texts are blank.')

  def fingerprint(self) -> dict[str, Any]:
    spec = self.spec
    return {
        'kind': 'hf',
        'dataset': spec.dataset,
        'hf_config': spec.hf_config,
        'hf_train_split': spec.train_split,
        'hf_eval_split': spec.eval_split,
        'hf_eval_fraction': spec.eval_fraction,
        'hf_max_docs': spec.max_docs,
        'streaming': spec.streaming,
        'text_key': spec.text_key,
        'files': sum(s['docs'] for s in self.splits.values()),   # documents, as for text
        'bytes': sum(s['bytes'] for s in self.splits.values()),
        'sha256': self.manifest.hexdigest(),
        'excluded': ({'empty': {'files': self.blank, 'bytes': 0}} if self.blank else {}),
        'split_rule': HF_SPLIT_RULE,
        'splits': {name: {'files': s['docs'], 'bytes': s['bytes']}
                   for name, s in self.splits.items()},
    }


class HfCorpus(corpus.LocoCorpus, skip_registration=True):
  """A Hugging Face dataset's rows as a loco corpus (`text`, `path`; train, validation)."""

  name = corpus.BUILDER_NAME   # the same folder and features as text corpora

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[Any]]:
    del dl_manager  # `datasets` fetches a Hub dataset itself.
    self._preparation = _Preparation(self._spec)
    # Listed train first: TFDS writes the splits in this order, and the carve fills
    # validation while train is read.
    return {'train': self._preparation.train(),
            'validation': self._preparation.validation()}

  def _fingerprint(self) -> dict[str, Any]:
    return self._preparation.fingerprint()

  def contents(self) -> str:
    meta = dict(self.info.metadata or {})
    return f'{meta.get("files", "?")} documents, {meta.get("bytes", 0) / 1e6:,.1f} MB'
