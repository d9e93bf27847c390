"""loco's data: embedded stdlib corpus, own text files or TFDS; tokenizers;
packed, per-worker (iid / non-iid) training streams with exact resume; eval
batches; fingerprints for config.json.

  cfg = DataConfig()                      # the stdlib, bytes, iid
  it = make_train_iterator(cfg, num_workers=8, batch_per_worker=16,
                           seq_len=256, seed=0)
  batch = next(it)                        # int32 [8, 16, 257]
  state = it.get_state()                  # JSON; it.set_state(state) resumes
"""

from loco.data.config import DataConfig
from loco.data.pipeline import dataset_fingerprint
from loco.data.pipeline import make_eval_batches
from loco.data.pipeline import make_train_iterator
from loco.data.pipeline import TrainIterator
from loco.data.pipeline import unigram_entropy_nats
from loco.data.tokenizers import ByteTokenizer
from loco.data.tokenizers import make_tokenizer
from loco.data.tokenizers import SentencePieceTokenizer
from loco.data.tokenizers import Tokenizer
from loco.data.tokenizers import train_sentencepiece

__all__ = [
    'ByteTokenizer',
    'DataConfig',
    'SentencePieceTokenizer',
    'Tokenizer',
    'TrainIterator',
    'dataset_fingerprint',
    'make_eval_batches',
    'make_tokenizer',
    'make_train_iterator',
    'train_sentencepiece',
    'unigram_entropy_nats',
]
