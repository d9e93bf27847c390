"""loco's data: the embedded stdlib corpus, own text files, TFDS or Hugging Face datasets;
tokenizers (bytes, SentencePiece, Hugging Face's);
per-worker (iid / non-iid) training batches whose every row is an independent packed
window of the worker's share (`sampling.py`), with exact resume; eval batches;
fingerprints for config.json.

  cfg = DataConfig()                      # the stdlib, bytes, iid
  it = make_train_iterator(cfg, num_workers=8, batch_per_worker=16,
                           seq_len=256, seed=0)
  batch = next(it)                        # int32 [8, 16, 257]
  state = it.get_state()                  # JSON; it.set_state(state) resumes
"""

import importlib
from typing import TYPE_CHECKING, Any

# Names are imported on first use so that `python -m loco.data.tokenizers`
# does not import the tokenizers module twice (once here, once as __main__).
_EXPORTS = {
    'DataConfig': 'loco.data.config',
    'EvalWindows': 'loco.data.pipeline',
    'TrainIterator': 'loco.data.pipeline',
    'dataset_fingerprint': 'loco.data.pipeline',
    'make_eval_windows': 'loco.data.pipeline',
    'make_train_iterator': 'loco.data.pipeline',
    'unigram_entropy_nats': 'loco.data.pipeline',
    'ByteTokenizer': 'loco.data.tokenizers',
    'HfTokenizer': 'loco.data.tokenizers',
    'SentencePieceTokenizer': 'loco.data.tokenizers',
    'Tokenizer': 'loco.data.tokenizers',
    'make_tokenizer': 'loco.data.tokenizers',
    'train_sentencepiece': 'loco.data.tokenizers',
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
  from loco.data.config import DataConfig
  from loco.data.pipeline import dataset_fingerprint
  from loco.data.pipeline import EvalWindows
  from loco.data.pipeline import make_eval_windows
  from loco.data.pipeline import make_train_iterator
  from loco.data.pipeline import TrainIterator
  from loco.data.pipeline import unigram_entropy_nats
  from loco.data.tokenizers import ByteTokenizer
  from loco.data.tokenizers import HfTokenizer
  from loco.data.tokenizers import make_tokenizer
  from loco.data.tokenizers import SentencePieceTokenizer
  from loco.data.tokenizers import Tokenizer
  from loco.data.tokenizers import train_sentencepiece


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(list(globals()) + __all__)
