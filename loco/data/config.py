"""DataConfig: the typed description of what the data loader reads and how."""

from __future__ import annotations

import dataclasses
import os

from loco import errors

SOURCES = ('stdlib', 'text', 'tfds')
TOKENIZERS = ('bytes', 'sentencepiece')
SHARDINGS = ('iid', 'noniid')
NONIID_BY = ('file', 'cluster')

_DEFAULT_DATA_DIR = os.path.join('~', '.cache', 'loco', 'tfds')


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise errors.ConfigError(
        f'data.{key} is {value!r}; allowed values: {", ".join(allowed)}.')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which corpus to read, how to tokenize it and how to split it over workers.

  `train.py` builds it with `DataConfig(**config.data)`; every value is checked
  here so that a typo fails before any file is read.
  """

  # 'stdlib' (embedded, no download) | 'text' (own files) | 'tfds'.
  source: str = 'stdlib'
  # e.g. 'c4/en:3.1.0' when source == 'tfds'.
  tfds_name: str = ''
  # '' -> $LOCO_DATA_DIR or ~/.cache/loco/tfds; a gs:// path is passed through.
  data_dir: str = ''
  # Files to read when source == 'text' ('**' recurses); one file, one document.
  text_glob: str = ''
  # Feature holding the text in a TFDS dataset.
  text_key: str = 'text'
  # TFDS split syntax, slices allowed ('train[:10%]').
  train_split: str = 'train'
  # Must differ from train_split.
  eval_split: str = 'validation'
  # 'bytes' (vocab 257, EOS 256) | 'sentencepiece'.
  tokenizer: str = 'bytes'
  # Path of a SentencePiece .model file (tokenizer == 'sentencepiece').
  sp_model: str = ''
  # 'iid' | 'noniid': how documents are split over workers.
  sharding: str = 'iid'
  # 'file' (contiguous ranges of paths) | 'cluster' (k-means, k = workers).
  noniid_by: str = 'file'
  # Threads per worker that read ahead in a TFDS source; 0 reads inline.
  read_threads: int = 2

  def __post_init__(self):
    _check_choice('source', self.source, SOURCES)
    _check_choice('tokenizer', self.tokenizer, TOKENIZERS)
    _check_choice('sharding', self.sharding, SHARDINGS)
    _check_choice('noniid_by', self.noniid_by, NONIID_BY)
    if self.source == 'tfds' and not self.tfds_name:
      raise errors.ConfigError(
          "data.tfds_name is empty; source 'tfds' needs a dataset name such as "
          "'c4/en:3.1.0'.")
    if self.source == 'text' and not self.text_glob:
      raise errors.ConfigError(
          "data.text_glob is empty; source 'text' needs a glob of text files "
          "such as '~/corpus/**/*.txt'.")
    if self.tokenizer == 'sentencepiece' and not self.sp_model:
      raise errors.ConfigError(
          "data.sp_model is empty; tokenizer 'sentencepiece' needs the path "
          'of a .model file (train one with `python -m loco.data.tokenizers '
          'train`).')
    if not self.text_key:
      raise errors.ConfigError('data.text_key is empty; name the text feature.')
    if not self.train_split or not self.eval_split:
      raise errors.ConfigError(
          'data.train_split and data.eval_split must both be set.')
    if self.train_split == self.eval_split:
      raise errors.ConfigError(
          'data.train_split and data.eval_split are both '
          f'{self.train_split!r}; evaluate on held-out data (e.g. slices '
          'train[:99%] / train[99%:]).')
    if not isinstance(self.read_threads, int) or self.read_threads < 0:
      raise errors.ConfigError(
          f'data.read_threads is {self.read_threads!r}; use an integer >= 0.')

  @property
  def resolved_data_dir(self) -> str:
    """The data dir with its default applied and `~` expanded (gs:// passes)."""
    path = (self.data_dir or os.environ.get('LOCO_DATA_DIR', '')
            or _DEFAULT_DATA_DIR)
    if '://' in path:
      return path
    return os.path.abspath(os.path.expanduser(path))
