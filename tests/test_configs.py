"""Every experiment config loads, converts to typed settings and initialises abstractly.

Paper-scale configs cannot train here; `jax.eval_shape` of the model and algorithm
state, and a batch from mock data for TFDS ones, keep them from rotting.
"""

import dataclasses
import glob
import importlib
import os

import jax
import pytest

from loco import data as data_lib
from loco.run import experiment
from loco import model as model_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(os.path.splitext(os.path.basename(p))[0]
               for p in glob.glob(os.path.join(REPO, 'experiments', '*.py'))
               if not os.path.basename(p).startswith('__'))
# A file with VARIANTS takes one after ':' on the command line (--config=FILE.py:VARIANT).
CONFIGS = [f'{name}:{v}' if v else name for name in FILES
           for v in getattr(importlib.import_module(f'experiments.{name}'), 'VARIANTS', [None])]


def _get_config(name: str):
  module_name, _, variant = name.partition(':')
  module = importlib.import_module(f'experiments.{module_name}')
  return module, (module.get_config(variant) if variant else module.get_config())


def test_there_are_configs():
  assert {'tiny_ddp', 'c4_ddp', 'tiny_diloco:diloco', 'c4_diloco', 'tiny_gasloc',
          'c4_gasloc', 'tiny_gossip:noloco'} <= set(CONFIGS)


@pytest.fixture(scope='module')
def sp_model(tmp_path_factory, small_corpus_glob):
  """A small SentencePiece model standing in for the one the user passes (C4's)."""
  from loco.data import tokenizers
  path = str(tmp_path_factory.mktemp('sp') / 'user-supplied.model')
  texts = (open(p, 'rb').read() for p in sorted(glob.glob(small_corpus_glob)))
  tokenizers.train_sentencepiece(texts, vocab_size=400, output=path)
  return path


@pytest.fixture(scope='module')
def hf_tokenizer(tmp_path_factory, small_corpus_glob):
  """A small tokenizer.json standing in for the one the user points at (GPT-2's); ''
  without the [hf] extra (the configs that need it are then skipped)."""
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return ''
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  texts = (open(p).read() for p in sorted(glob.glob(small_corpus_glob)))
  tok.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
      vocab_size=400, special_tokens=['<|endoftext|>'], show_progress=False))
  path = str(tmp_path_factory.mktemp('hf') / 'tokenizer.json')
  tok.save(path)
  return path


@pytest.mark.parametrize('name', CONFIGS)
def test_config_initialises_abstractly(name, sp_model, hf_tokenizer):
  module, config = _get_config(name)
  assert module.__doc__ and 'python -m loco.main' in module.__doc__, (
      'a config file documents its command, runtime and expected result')
  if 'hf' in (config.data.source, config.data.tokenizer) and not _has_hf_extra():
    pytest.skip("needs the [hf] extra (pip install -e '.[hf]'; in [test])")
  exp = experiment.parse_config(_with_user_paths(config, sp_model, hf_tokenizer))
  algorithm = experiment.build_algorithm(exp)
  key = jax.random.PRNGKey(0)
  params = jax.eval_shape(lambda k: model_lib.init_params(exp.model, k)[1], key)
  state = jax.eval_shape(lambda p: algorithm.init(p, exp.run.num_workers, key), params)
  leaves = jax.tree.leaves(state.params)
  assert all(x.shape[0] == exp.run.num_workers for x in leaves)
  assert model_lib.flops_per_token(exp.model, exp.run.seq_len) > 0


def _has_hf_extra() -> bool:
  import importlib.util  # pylint: disable=g-import-not-at-top
  return all(importlib.util.find_spec(p) for p in ('datasets', 'tokenizers'))


def _with_user_paths(config, sp_model, hf_tokenizer=''):
  # Paper-scale configs leave the tokenizer's path to the user's command line.
  if config.data.tokenizer == 'sentencepiece' and not config.data.sp_model:
    config.data.sp_model = sp_model
  if config.data.tokenizer == 'hf' and not config.data.hf_tokenizer:
    config.data.hf_tokenizer = hf_tokenizer
  return config


TFDS_CONFIGS = [n for n in CONFIGS if _get_config(n)[1].data.source == 'tfds']


@pytest.mark.parametrize('name', TFDS_CONFIGS)
def test_tfds_config_reads_mock_data(name, tmp_path, sp_model):
  import tensorflow_datasets as tfds
  import loco.data.c4  # noqa: F401  (registers loco_c4, what the c4 configs read, for mocking)
  config = _with_user_paths(_get_config(name)[1], sp_model)
  exp = experiment.parse_config(config)
  # The real SentencePiece model is not shipped; bytes keep the pipeline testable.
  # mock_data serves the examples; the data dir only has to exist (never the user's).
  data_cfg = dataclasses.replace(exp.data, tokenizer='bytes', sp_model='',
                                 data_dir=str(tmp_path))
  with tfds.testing.mock_data(num_examples=64, policy=tfds.testing.MockPolicy.USE_CODE):
    it = data_lib.make_train_iterator(data_cfg, num_workers=exp.run.num_workers,
                                      batch_per_worker=2, seq_len=64, seed=0)
    batch = next(it)
    it.close()
  assert batch.shape == (exp.run.num_workers, 2, 65)
