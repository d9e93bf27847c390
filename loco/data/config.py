"""DataConfig: the typed description of what the data loader reads and how."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

from loco import errors

SOURCES = ('stdlib', 'text', 'tfds', 'hf')
TOKENIZERS = ('bytes', 'sentencepiece', 'hf')
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

# What source 'hf' and tokenizer 'hf' import, and the line that says how to get them.
HF_EXTRA = "pip install -e '.[hf]'"


def is_c4(tfds_name: str) -> bool:
  """Whether `tfds_name` is the C4 dataset that loco prepares."""
  return tfds_name.split(':')[0] == C4_TFDS_NAME.split(':')[0]


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which corpus to read, how to tokenize it and how to split it over workers.

  `loco.run.experiment` builds it with `DataConfig(**config.data)`; every value is checked
  here so that a typo fails before any file is read.
  """

  source: str = 'stdlib'        # stdlib (embedded, no download) | text (own files) | tfds | hf
  tfds_name: str = ''           # e.g. C4_TFDS_NAME (loco.data.prepare c4) when source == 'tfds'
  data_dir: str = ''            # '' -> $LOCO_DATA_DIR or ~/.cache/loco/tfds; gs:// passes
  text_glob: str = ''           # files when source == 'text' ('**' recurses); one per document
  text_key: str = 'text'        # the feature (tfds) or column (hf) holding the text
  train_split: str = 'train'    # TFDS split syntax, slices allowed ('train[:10%]')
  eval_split: str = 'validation'  # must differ from train_split
  tokenizer: str = 'bytes'      # bytes (vocab 257, EOS 256) | sentencepiece | hf
  sp_model: str = ''            # SentencePiece .model path (tokenizer == 'sentencepiece')
  hf_tokenizer: str = ''        # tokenizer.json, or a folder holding it (tokenizer == 'hf')
  hf_dataset: str = ''          # source 'hf': a Hub name or a local path (loco.data.hf)
  hf_config: str = ''           # the HF dataset's configuration (e.g. 'sample-10BT'); '' none
  hf_train_split: str = 'train'  # the HF split the documents come from
  hf_eval_split: str = ''       # the HF split held out; '' carves hf_eval_fraction of train
  hf_eval_fraction: float = 0.05  # share of hf_train_split's rows carved out for validation
  hf_max_docs: int = 0          # rows read from each HF split, first in stored order; 0: all
  hf_streaming: bool = False    # read a Hub dataset as a stream (no full download first)
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
    if self.tokenizer == 'hf' and not self.hf_tokenizer:
      raise errors.ConfigError(
          "data.hf_tokenizer is empty; tokenizer 'hf' needs the path of a tokenizer.json "
          '(or of a folder holding one), as the tokenizers library saves it.')
    if self.source == 'hf':
      self._check_hf()
    if self.tokenizer == 'hf':
      require_hf('tokenizers', "data.tokenizer='hf'")
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

  def _check_hf(self) -> None:
    if not self.hf_dataset:
      raise errors.ConfigError(
          "data.hf_dataset is empty; source 'hf' needs a dataset: a Hugging Face Hub name "
          "such as 'HuggingFaceFW/fineweb-edu' or the path of a local dataset (a "
          'save_to_disk folder, or a folder of parquet / json / csv / txt files).')
    if not self.hf_train_split:
      raise errors.ConfigError(
          "data.hf_train_split is empty; name the Hugging Face split to train on "
          "(usually 'train').")
    if self.hf_eval_split == self.hf_train_split:
      raise errors.ConfigError(
          f'data.hf_eval_split and data.hf_train_split are both {self.hf_train_split!r}; '
          'name another split, or leave data.hf_eval_split empty to carve '
          'data.hf_eval_fraction of the rows out for validation.')
    if (isinstance(self.hf_eval_fraction, bool)
        or not isinstance(self.hf_eval_fraction, (int, float))
        or not 0 < self.hf_eval_fraction < 1):
      raise errors.ConfigError(
          f'data.hf_eval_fraction is {self.hf_eval_fraction!r}; use a number in (0, 1).')
    if (not isinstance(self.hf_max_docs, int) or isinstance(self.hf_max_docs, bool)
        or self.hf_max_docs < 0):
      raise errors.ConfigError(
          f'data.hf_max_docs is {self.hf_max_docs!r}; use an integer >= 0 (0: all rows).')
    require_hf('datasets', "data.source='hf'")

  @property
  def resolved_data_dir(self) -> str:
    """The data dir with its default applied and `~` expanded (gs:// passes)."""
    path = (self.data_dir or os.environ.get('LOCO_DATA_DIR', '')
            or _DEFAULT_DATA_DIR)
    if '://' in path:
      return path
    return os.path.abspath(os.path.expanduser(path))


def require_hf(package: str, what: str) -> None:
  """Raises a ConfigError naming the install command when an optional HF package is missing."""
  try:
    found = importlib.util.find_spec(package) is not None
  except (ImportError, ValueError):
    found = False
  if not found:
    raise errors.ConfigError(
        f'{what} needs the {package!r} package, which is not installed; install '
        f'the Hugging Face extra: {HF_EXTRA}')
