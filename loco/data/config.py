"""DataConfig: the typed description of what the data loader reads and how."""

from __future__ import annotations

import dataclasses
import os

from loco import errors

SOURCES = ('stdlib', 'text', 'tfds')
TOKENIZERS = ('bytes', 'sentencepiece')
SHARDINGS = ('iid', 'noniid')
NONIID_BY = ('file', 'cluster')
SAMPLINGS = ('windows', 'stream')

_DEFAULT_DATA_DIR = os.path.join('~', '.cache', 'loco', 'tfds')

# C4 as `python -m loco.data.prepare c4` writes it (loco.data.c4), and the commands
# that errors give when it or its tokenizer is missing.
C4_TFDS_NAME = 'loco_c4/en:1.0.0'
C4_PREPARE_COMMAND = (
    'python -m loco.data.prepare c4 --source=C4_DIR --data_dir=DATA_DIR')
C4_TOKENIZER_COMMAND = (
    'python -m loco.data.prepare tokenizer --data_dir=DATA_DIR '
    '--output=DATA_DIR/c4_en_32k.model')
C4_README = 'README, "Paper-scale runs (C4)"'


def is_c4(tfds_name: str) -> bool:
  """Whether `tfds_name` is the C4 dataset that loco prepares."""
  return tfds_name.split(':')[0] == C4_TFDS_NAME.split(':')[0]


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which corpus to read, how to tokenize it and how to split it over workers.

  `loco.experiment` builds it with `DataConfig(**config.data)`; every value is checked
  here so that a typo fails before any file is read.
  """

  source: str = 'stdlib'        # stdlib (embedded, no download) | text (own files) | tfds
  tfds_name: str = ''           # e.g. C4_TFDS_NAME (loco.data.prepare c4) when source == 'tfds'
  data_dir: str = ''            # '' -> $LOCO_DATA_DIR or ~/.cache/loco/tfds; gs:// passes
  text_glob: str = ''           # files when source == 'text' ('**' recurses); one per document
  text_key: str = 'text'        # the feature holding the text in a TFDS dataset
  train_split: str = 'train'    # TFDS split syntax, slices allowed ('train[:10%]')
  eval_split: str = 'validation'  # must differ from train_split
  tokenizer: str = 'bytes'      # bytes (vocab 257, EOS 256) | sentencepiece
  sp_model: str = ''            # SentencePiece .model path (tokenizer == 'sentencepiece')
  sharding: str = 'iid'         # iid | noniid: how documents are split over workers
  noniid_by: str = 'file'       # file (contiguous ranges of paths) | cluster (k-means, k = M)
  read_threads: int = 2         # threads per worker reading a TFDS source ahead; 0: inline
  sampling: str = 'windows'     # windows (every row an independent window) | stream (old)
  window_pool_tokens: int = 2**25  # windows: tokens per pool whose windows are permuted

  def __post_init__(self):
    for key, allowed in (('source', SOURCES), ('tokenizer', TOKENIZERS),
                         ('sharding', SHARDINGS), ('noniid_by', NONIID_BY),
                         ('sampling', SAMPLINGS)):
      if getattr(self, key) not in allowed:
        raise errors.ConfigError(f'data.{key} is {getattr(self, key)!r}; allowed values: '
                                 f'{", ".join(allowed)}.')
    if self.source == 'tfds' and not self.tfds_name:
      raise errors.ConfigError(
          "data.tfds_name is empty; source 'tfds' needs a dataset name such as "
          "'c4/en:3.1.0'.")
    if self.source == 'text' and not self.text_glob:
      raise errors.ConfigError(
          "data.text_glob is empty; source 'text' needs a glob of text files "
          "such as '~/corpus/**/*.txt'.")
    if (self.tokenizer == 'sentencepiece' and not self.sp_model
        and self.source == 'tfds' and is_c4(self.tfds_name)):
      raise errors.ConfigError(
          'data.sp_model is empty; the C4 configs need a SentencePiece model: '
          f'prepare C4 and its tokenizer with `{C4_PREPARE_COMMAND}` and '
          f'`{C4_TOKENIZER_COMMAND}` ({C4_README}), then pass '
          '--config.data.data_dir=DATA_DIR '
          '--config.data.sp_model=DATA_DIR/c4_en_32k.model (or the path of '
          "T5's 32k C4 .model).")
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
    if (not isinstance(self.window_pool_tokens, int)
        or isinstance(self.window_pool_tokens, bool) or self.window_pool_tokens < 1):
      raise errors.ConfigError(
          f'data.window_pool_tokens is {self.window_pool_tokens!r}; use an integer >= 1.')
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
