"""One split of a source (stdlib, text files, TFDS, HF) as random-access documents.

A Hugging Face dataset (source 'hf') is first prepared as a local corpus
(loco.data.hf) and is read like one from then on. Local corpora (stdlib, text
files, HF rows) up to 2 GB are held in memory: the documents
of a split (or of a slice such as `validation[:50%]`, which TFDS takes in stored
order) are sorted by path and empty files are dropped; larger ones are read
lazily in their stored order (train: sorted paths; validation: the order that
makes its halves exchangeable, see loco.data.corpus). A TFDS dataset is read
lazily through `tfds.data_source` (ArrayRecord, no TensorFlow); loco never
downloads it, and prepares only C4, from local files, with `python -m
loco.data.prepare c4` (loco.data.c4), which its errors name.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any, Sequence

from etils import epath
import tensorflow_datasets as tfds

from loco import errors
from loco.data import config as config_lib
from loco.data import corpus
from loco.data import hf

# Local corpora up to this size are read into memory (sorted, empties dropped).
IN_MEMORY_MAX_BYTES = 2_000_000_000


class Documents:
  """One split as random-access documents: `docs[i]` is UTF-8 bytes."""

  name: str  # Says which dataset and split, for messages.
  identity: str  # Changes when the documents change (iterator-state checks).
  paths: Sequence[str] | None  # Relative path of each document, if any.
  in_memory: bool  # True when every document is already in memory.

  def __len__(self) -> int:
    raise NotImplementedError

  def __getitem__(self, index: int) -> bytes:
    raise NotImplementedError


class InMemoryDocuments(Documents):
  """Documents held as a list of bytes, in sorted-path order."""

  def __init__(self, name: str, identity: str, texts: list[bytes],
               paths: list[str]):
    self.name, self.identity = name, identity
    self.texts, self.paths = texts, paths
    self.in_memory = True

  def __len__(self) -> int:
    return len(self.texts)

  def __getitem__(self, index: int) -> bytes:
    return self.texts[index]


class TfdsDocuments(Documents):
  """The text feature of a TFDS ArrayRecord data source, read on demand."""

  def __init__(self, name: str, identity: str, source: Any, text_key: str):
    self.name, self.identity = name, identity
    self.source, self.text_key = source, text_key
    self.paths = None
    self.in_memory = False
    self._len = len(source)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> bytes:
    return _as_bytes(self.source[index][self.text_key])


# A run opens its data several times (train and eval splits, fingerprint, entropy);
# within one process each corpus is listed, prepared and read once. The standard
# library does not change while Python runs; text files are listed again each time
# (their listing, with sizes and mtimes, is the cache key).
_stdlib_spec = functools.cache(corpus.stdlib_spec)
_BUILDERS: dict[tuple[str, str], corpus.LocoCorpus] = {}
_DOCUMENTS: dict[tuple[str, str, str, int], Documents] = {}


def _corpus_spec(cfg: config_lib.DataConfig) -> corpus.CorpusSpec:
  if cfg.source == 'stdlib':
    return _stdlib_spec()
  if cfg.source == 'hf':
    return hf.hf_spec(cfg)
  return corpus.text_spec(cfg.text_glob)


def _prepared(spec: corpus.CorpusSpec, data_dir: str) -> corpus.LocoCorpus:
  key = (spec.key, data_dir)
  if key not in _BUILDERS or not os.path.isdir(_BUILDERS[key].data_path):
    _BUILDERS[key] = corpus.prepare(
        spec, data_dir, hf.HfCorpus if spec.kind == 'hf' else corpus.LocoCorpus)
  return _BUILDERS[key]


def _open_corpus(cfg: config_lib.DataConfig, split: str) -> Documents:
  spec = _corpus_spec(cfg)
  key = (spec.key, cfg.resolved_data_dir, split, IN_MEMORY_MAX_BYTES)
  builder = _prepared(spec, cfg.resolved_data_dir)
  if key not in _DOCUMENTS:
    _DOCUMENTS[key] = _read_corpus(cfg, spec, builder, split)
  return _DOCUMENTS[key]


def _read_corpus(cfg: config_lib.DataConfig, spec: corpus.CorpusSpec,
                 builder: corpus.LocoCorpus, split: str) -> Documents:
  fp = corpus.fingerprint(builder)
  try:
    source = builder.as_data_source(split)
  except (ValueError, KeyError) as e:
    raise errors.DataError(
        f'split {split!r} of the {cfg.source} corpus cannot be read; its '
        f'splits are train and validation (slices like train[:50%] work): {e}'
    ) from e
  name = f'{cfg.source} corpus ({spec.description}) split {split!r}'
  if fp['bytes'] > IN_MEMORY_MAX_BYTES:
    # Read lazily like any TFDS dataset, in stored order.
    return TfdsDocuments(name=name, identity=f'{fp["sha256"]}:{split}',
                         source=source, text_key='text')
  records = source.__getitems__(list(range(len(source))))
  docs = sorted((_as_str(r['path']), _as_bytes(r['text'])) for r in records)
  docs = [(path, text) for path, text in docs if text.strip()]
  if not docs:
    raise errors.DataError(f'{name} has no non-empty documents.')
  return InMemoryDocuments(
      name=name, identity=f'{fp["sha256"]}:{split}',
      texts=[text for _, text in docs], paths=[path for path, _ in docs])


def _as_str(value: Any) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def _as_bytes(value: Any) -> bytes:
  return value.encode('utf-8') if isinstance(value, str) else bytes(value)


def _build_command(name: str, data_dir: str) -> str:
  return f'`tfds build {name} --data_dir={data_dir} --file_format=array_record`'


def _not_prepared(name: str, data_dir: str, why: str) -> errors.DataError:
  return errors.DataError(
      f'TFDS dataset {name!r} is {why} in {data_dir} (data.data_dir) and loco '
      f'does not download datasets: prepare it once with '
      f'{_build_command(name, data_dir)} (needs TensorFlow) or copy an '
      'ArrayRecord build of it there.')


def _check_c4(name: str, data_dir: str) -> None:
  """Says how to prepare C4 when it is missing or half-prepared in `data_dir`."""
  from loco.data import c4  # pylint: disable=g-import-not-at-top
  if c4.is_prepared(data_dir):
    return
  command = config_lib.C4_PREPARE_COMMAND.replace('DATA_DIR', data_dir)
  if os.path.isdir(c4.dataset_path(data_dir)):
    raise errors.DataError(
        f'C4 ({name}) in {c4.dataset_path(data_dir)} is only partly prepared (the '
        'preparation was stopped); run the same command again, it resumes: '
        f'`{command}` ({config_lib.C4_README}).')
  raise errors.DataError(
      f'C4 ({name}) is not prepared in {data_dir} (data.data_dir); prepare it '
      f'with: `{command}` ({config_lib.C4_README}).')


def _open_tfds(cfg: config_lib.DataConfig, split: str) -> TfdsDocuments:
  name, data_dir = cfg.tfds_name, cfg.resolved_data_dir
  c4_here = config_lib.is_c4(name) and '://' not in data_dir
  if '://' not in data_dir and not os.path.isdir(data_dir):
    if c4_here:
      _check_c4(name, data_dir)
    raise errors.DataError(
        f'data dir {data_dir} (data.data_dir) does not exist; TFDS dataset '
        f'{name!r} must be prepared there as ArrayRecord: loco does not '
        f'download datasets (run {_build_command(name, data_dir)}).')
  try:
    try:
      source = tfds.data_source(name, split=split, data_dir=data_dir,
                                download=False)
    except Exception:  # pylint: disable=broad-except
      if c4_here:  # (Not before: tfds.testing.mock_data serves C4 without files.)
        _check_c4(name, data_dir)  # Missing or half-prepared: says how to prepare it.
      raise
  except errors.DataError:
    raise
  except tfds.core.registered.DatasetNotFoundError as e:
    raise _not_prepared(name, data_dir, 'not prepared') from e
  except NotImplementedError as e:
    # TFDS's message for "no ArrayRecord files": either nothing is there or
    # the dataset was prepared as TFRecord, which needs TensorFlow to read.
    raise _not_prepared(name, data_dir, _missing_or_tfrecord(name, data_dir)
                        ) from e
  except ValueError as e:
    if 'split' in str(e).lower():
      raise errors.DataError(
          f'TFDS dataset {name!r} in {data_dir} has no split {split!r} '
          f'(data.train_split / data.eval_split): {e}') from e
    raise errors.DataError(
        f'cannot open TFDS dataset {name!r} in {data_dir}: {e}') from e
  except Exception as e:  # pylint: disable=broad-except
    # E.g. a gs:// data dir without a GCS file system installed.
    raise errors.DataError(
        f'cannot open TFDS dataset {name!r} split {split!r} in {data_dir}: '
        f'{e.__class__.__name__}: {e}') from e
  if len(source) == 0:
    raise errors.DataError(
        f'split {split!r} of TFDS dataset {name!r} in {data_dir} is empty.')
  example = source[0]
  if cfg.text_key not in example:
    raise errors.DataError(
        f'TFDS dataset {name!r} has no feature {cfg.text_key!r} '
        f'(data.text_key); its features are {sorted(example)}.')
  full_name = getattr(getattr(source, 'dataset_info', None), 'full_name', name)
  return TfdsDocuments(
      name=f'TFDS dataset {name!r} split {split!r}',
      identity=f'{full_name}:{split}:{len(source)}',
      source=source, text_key=cfg.text_key)


def _missing_or_tfrecord(name: str, data_dir: str) -> str:
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared():
      return f'stored as {builder.info.file_format.value}, not array_record,'
  except Exception:  # pylint: disable=broad-except
    pass  # Any failure here means the same thing: nothing usable is there.
  return 'not prepared'


def open_documents(cfg: config_lib.DataConfig, split: str) -> Documents:
  """Opens `split` of `cfg`'s source; prepares a local corpus on first use."""
  if cfg.source == 'tfds':
    return _open_tfds(cfg, split)
  return _open_corpus(cfg, split)


def fingerprint(cfg: config_lib.DataConfig) -> dict[str, Any]:
  """Source name, document counts, bytes and a content hash for config.json."""
  docs = {split: open_documents(cfg, split) for split in (cfg.train_split, cfg.eval_split)}
  splits = {split: {'docs': len(d), **({'bytes': sum(map(len, d.texts))} if d.in_memory else {})}
            for split, d in docs.items()}
  if cfg.source == 'tfds':
    info = {'source': 'tfds', 'name': cfg.tfds_name,
            'data_dir': cfg.resolved_data_dir, 'text_key': cfg.text_key,
            'splits': splits}
    info['sha256'] = _tfds_info_hash(cfg, docs[cfg.train_split], info)
    return info
  builder = _prepared(_corpus_spec(cfg), cfg.resolved_data_dir)
  meta = corpus.fingerprint(builder)
  return {'source': cfg.source,
          'name': f'{corpus.BUILDER_NAME}/{builder.builder_config.name}:'
                  f'{corpus.VERSION}',
          'data_dir': cfg.resolved_data_dir,
          **{k: v for k, v in meta.items() if k != 'splits'},
          'file_splits': meta['splits'],
          'splits': splits}


def _tfds_info_hash(cfg: config_lib.DataConfig, docs: Documents,
                    info: dict[str, Any]) -> str:
  """sha256 of the dataset's dataset_info.json (sizes, shards), if readable."""
  dataset_info = getattr(getattr(docs, 'source', None), 'dataset_info', None)
  data_dir = getattr(dataset_info, 'data_dir', None)
  try:
    if data_dir:
      return hashlib.sha256(
          (epath.Path(data_dir) / 'dataset_info.json').read_bytes()).hexdigest()
  except OSError:
    pass  # Mocked or unusual storage: fall back to what we know.
  return hashlib.sha256(json.dumps(
      [cfg.tfds_name, info['splits']], sort_keys=True).encode()).hexdigest()
