"""Hugging Face datasets and tokenizers as a source (loco/data/hf.py, HfTokenizer).

Everything is made here, offline: a dataset from real text (the standard library's email
package cut into documents) saved with `save_to_disk`, and a byte-level BPE tokenizer
trained on the same text with `tokenizers` and saved as tokenizer.json. conftest keeps
the Hugging Face libraries offline and their caches under the temporary HOME.
"""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

datasets = pytest.importorskip('datasets')
hf_tokenizers = pytest.importorskip('tokenizers')

import loco.data as ld  # noqa: E402
from loco import errors  # noqa: E402
from loco.run import experiment  # noqa: E402
from loco.run import train  # noqa: E402
from loco.data import hf  # noqa: E402
from loco.data import sources  # noqa: E402
from loco.files.metrics import TIMING_KEYS, read_metrics  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 512
EOS_TOKEN = '<|endoftext|>'
FRACTION = 0.2


def _documents():
  """About 200 documents of real text: the email package's files cut at blank lines into
  pieces of at least 1 KB (each piece is unique: it carries its file and number)."""
  docs = []
  stdlib = sysconfig.get_paths()['stdlib']
  for path in sorted(glob.glob(os.path.join(stdlib, 'email', '*.py'))):
    with open(path, encoding='utf-8') as f:
      text = f.read()
    piece = []
    for block in text.split('\n\n'):
      piece.append(block)
      if sum(map(len, piece)) >= 1024:
        docs.append(f'# {os.path.basename(path)} part {len(docs)}\n' + '\n\n'.join(piece))
        piece = []
  return docs


@pytest.fixture(scope='module')
def texts():
  return _documents()


def _train_tokenizer(texts, path, special=(EOS_TOKEN,)):
  tok = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
  tok.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = hf_tokenizers.decoders.ByteLevel()
  trainer = hf_tokenizers.trainers.BpeTrainer(
      vocab_size=VOCAB, special_tokens=list(special), show_progress=False,
      initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer)
  tok.save(str(path))
  return str(path)


@pytest.fixture(scope='module')
def tokenizer_json(tmp_path_factory, texts):
  return _train_tokenizer(texts, tmp_path_factory.mktemp('tok') / 'tokenizer.json')


@pytest.fixture(scope='module')
def saved(tmp_path_factory, texts):
  """The documents, two blank rows and an id column, as a save_to_disk folder."""
  path = str(tmp_path_factory.mktemp('hf') / 'email')
  rows = texts[:50] + ['', '  \n'] + texts[50:]
  datasets.Dataset.from_dict({'id': list(range(len(rows))), 'text': rows}).save_to_disk(path)
  return path


@pytest.fixture(scope='module')
def hf_data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('prepared'))


@pytest.fixture(scope='module')
def cfg(saved, tokenizer_json, hf_data_dir):
  return ld.DataConfig(source='hf', hf_dataset=saved, hf_eval_fraction=FRACTION,
                       tokenizer='hf', hf_tokenizer=tokenizer_json, data_dir=hf_data_dir)


def _in_validation(text, fraction=FRACTION):
  digest = hashlib.sha256(text.encode()).digest()
  return int.from_bytes(digest[:8], 'big') < int(fraction * 2**64)


def _texts(docs):
  return [docs[i].decode() for i in range(len(docs))]


# ----------------------------------------------------------- environment


def test_hugging_face_caches_are_under_the_temporary_home_and_offline():
  home = os.path.realpath(os.environ['HOME'])
  assert os.path.realpath(datasets.config.HF_DATASETS_CACHE).startswith(home)
  assert os.path.realpath(datasets.config.HF_CACHE_HOME).startswith(home)
  assert datasets.config.HF_HUB_OFFLINE


# ----------------------------------------------------------- the split


def test_rows_become_a_train_and_a_carved_validation_split(cfg, texts):
  train_docs = sources.open_documents(cfg, 'train')
  valid = sources.open_documents(cfg, 'validation')
  # Every non-blank row is one document, on the side its content hash says; the paths
  # name the row (the blank rows 50 and 51 are left out, so later rows keep their index).
  expected_valid = {t for t in texts if _in_validation(t)}
  assert set(_texts(valid)) == expected_valid
  assert set(_texts(train_docs)) == set(texts) - expected_valid
  assert len(train_docs) + len(valid) == len(texts)
  assert 0.1 < len(valid) / len(texts) < 0.3
  rows = texts[:50] + ['', ''] + texts[50:]
  for docs in (train_docs, valid):
    for i, path in enumerate(docs.paths):
      assert path.startswith('train/') and rows[int(path[6:])] == docs[i].decode()
  # Stored in content-hash order, so the halves are a fixed shuffle of the split.
  first = set(_texts(sources.open_documents(cfg, 'validation[:50%]')))
  second = set(_texts(sources.open_documents(cfg, 'validation[50%:]')))
  by_hash = sorted(expected_valid, key=lambda t: hashlib.sha256(t.encode()).digest())
  assert first == set(by_hash[:len(first)]) and second == set(by_hash[len(first):])
  fp = ld.dataset_fingerprint(cfg)
  assert fp['source'] == 'hf' and fp['dataset'] == cfg.hf_dataset
  assert fp['excluded'] == {'empty': {'files': 2, 'bytes': 0}}
  assert fp['splits']['validation']['docs'] == len(valid)
  assert fp['tokenizer']['name'] == 'hf' and fp['tokenizer']['vocab_size'] == VOCAB


def test_a_named_eval_split_and_max_docs(tmp_path, texts, tokenizer_json):
  path = str(tmp_path / 'dict')
  datasets.DatasetDict({
      'train': datasets.Dataset.from_dict({'text': texts[:150]}),
      'test': datasets.Dataset.from_dict({'text': texts[150:]}),
  }).save_to_disk(path)
  c = ld.DataConfig(source='hf', hf_dataset=path, hf_eval_split='test', hf_max_docs=100,
                    data_dir=str(tmp_path / 'data'))
  assert _texts(sources.open_documents(c, 'train')) == texts[:100]   # stored order
  held_out = texts[150:250]
  assert set(_texts(sources.open_documents(c, 'validation'))) == set(held_out)
  with pytest.raises(errors.DataError, match=r"no split 'dev' \(data.hf_eval_split\); "
                     'its splits are test, train'):
    sources.open_documents(ld.DataConfig(source='hf', hf_dataset=path, hf_eval_split='dev',
                                         data_dir=str(tmp_path / 'data')), 'validation')


def test_a_folder_of_files_read_as_a_stream_gives_the_same_documents(tmp_path, texts):
  folder = tmp_path / 'jsonl'
  folder.mkdir()
  with open(folder / 'train.jsonl', 'w') as f:
    for t in texts:
      f.write(json.dumps({'text': t, 'url': 'x'}) + '\n')
  docs = {}
  for streaming in (False, True):
    c = ld.DataConfig(source='hf', hf_dataset=str(folder), hf_streaming=streaming,
                      hf_max_docs=120, data_dir=str(tmp_path / 'data'))
    docs[streaming] = (_texts(sources.open_documents(c, 'train')),
                       _texts(sources.open_documents(c, 'validation')))
  assert docs[True] == docs[False]
  assert len(docs[True][0]) + len(docs[True][1]) == 120
  assert set(docs[True][0]) | set(docs[True][1]) == set(texts[:120])


def test_a_prepared_corpus_is_reused_without_reading_the_dataset_again(
    cfg, monkeypatch, tmp_path, texts):
  sources.open_documents(cfg, 'train')
  sources._DOCUMENTS.clear()   # a new process: only the prepared files remain
  sources._BUILDERS.clear()

  def no_reading(*args, **kwargs):
    raise AssertionError('the dataset was read again')

  monkeypatch.setattr(datasets, 'load_from_disk', no_reading)
  monkeypatch.setattr(datasets, 'load_dataset', no_reading)
  assert len(sources.open_documents(cfg, 'train')) + len(
      sources.open_documents(cfg, 'validation')) == len(texts)
  monkeypatch.undo()
  # A changed local dataset is another corpus.
  changed = str(tmp_path / 'changed')
  other = ld.DataConfig(source='hf', hf_dataset=changed, data_dir=cfg.data_dir)
  datasets.Dataset.from_dict({'text': texts[:40]}).save_to_disk(changed)
  before = hf.hf_spec(other).key
  assert len(sources.open_documents(other, 'train')) + len(
      sources.open_documents(other, 'validation')) == 40
  shutil.rmtree(changed)
  datasets.Dataset.from_dict({'text': texts[:41]}).save_to_disk(changed)
  assert hf.hf_spec(other).key != before
  assert len(sources.open_documents(other, 'train')) + len(
      sources.open_documents(other, 'validation')) == 41


# ----------------------------------------------------------- the tokenizer


def test_the_hf_tokenizer_sets_the_vocabulary_and_ends_documents_with_its_eos(
    tokenizer_json, tmp_path, texts, nano_config, saved, hf_data_dir):
  tok = ld.HfTokenizer(tokenizer_json)
  assert tok.vocab_size == VOCAB and tok.eos_id == 0 and tok.eos_token == EOS_TOKEN
  ids = tok.encode(texts[3])
  assert ids.dtype == np.int32 and ids.max() < VOCAB and tok.eos_id not in ids
  assert tok.decode(ids) == texts[3]
  from_folder = ld.HfTokenizer(os.path.dirname(tokenizer_json)).fingerprint()
  assert from_folder['sha256'] == tok.fingerprint()['sha256']
  # transformers' tokenizer_config.json names the EOS; without a known one, EOS gets an
  # id of its own after the vocabulary.
  folder = tmp_path / 'configured'
  _train_tokenizer(texts[:40], tmp_path / 'plain.json', special=('<s>', '<stop>'))
  folder.mkdir()
  shutil.copy(tmp_path / 'plain.json', folder / 'tokenizer.json')
  (folder / 'tokenizer_config.json').write_text(json.dumps({'eos_token': {'content': '<stop>'}}))
  configured = ld.HfTokenizer(str(folder))
  assert (configured.eos_token, configured.eos_id, configured.vocab_size) == ('<stop>', 1, VOCAB)
  plain = ld.HfTokenizer(str(tmp_path / 'plain.json'))
  assert (plain.eos_token, plain.eos_id, plain.vocab_size) == ('', VOCAB, VOCAB + 1)
  # The model's vocabulary follows the tokenizer's.
  nano_config.data.source = 'hf'
  nano_config.data.hf_dataset = saved
  nano_config.data.data_dir = hf_data_dir
  nano_config.data.tokenizer = 'hf'
  nano_config.data.hf_tokenizer = str(tmp_path / 'plain.json')
  assert experiment.parse_config(nano_config).model.vocab_size == VOCAB + 1
  nano_config.model.vocab_size = VOCAB
  with pytest.raises(errors.ConfigError, match='below the tokenizer'):
    experiment.check_vocabulary(experiment.parse_config(nano_config))


def test_a_sentencepiece_model_trains_on_an_hf_dataset(saved, tmp_path, capsys):
  from loco.data import tokenizers
  out = str(tmp_path / 'hf.model')
  assert tokenizers.main(['train', '--source=hf', f'--hf_dataset={saved}',
                          f'--data_dir={tmp_path / "data"}', '--vocab_size=400',
                          f'--output={out}']) == 0
  assert 'hf corpus' in capsys.readouterr().out
  assert ld.SentencePieceTokenizer(out).vocab_size == 400


# ----------------------------------------------------------- batches


def test_batches_are_windows_of_the_documents_and_deterministic_for_a_seed(cfg, texts):
  kwargs = dict(num_workers=3, batch_per_worker=4, seq_len=64)
  it = ld.make_train_iterator(cfg, seed=0, **kwargs)
  batches = [next(it) for _ in range(5)]
  assert all(b.shape == (3, 4, 65) and b.dtype == np.int32 for b in batches)
  stacked = np.stack(batches)
  assert stacked.min() >= 0 and stacked.max() < VOCAB
  again = ld.make_train_iterator(cfg, seed=0, **kwargs)
  for want in batches:
    np.testing.assert_array_equal(next(again), want)
  other = ld.make_train_iterator(cfg, seed=1, **kwargs)
  assert not np.array_equal(next(other), batches[0])
  # A row's text between EOS tokens is a piece of one training document.
  tok = ld.HfTokenizer(cfg.hf_tokenizer)
  training = '\0'.join(_texts(sources.open_documents(cfg, 'train')))
  checked = 0
  for row in stacked.reshape(-1, 65):
    for piece in np.split(row, np.flatnonzero(row == tok.eos_id)):
      piece = piece[piece != tok.eos_id]
      if len(piece) > 8:
        assert tok.decode(piece[1:-1]) in training
        checked += 1
  assert checked > 50


def test_the_iterator_resumes_exactly(cfg):
  kwargs = dict(num_workers=2, batch_per_worker=3, seq_len=48, seed=5)
  it = ld.make_train_iterator(cfg, **kwargs)
  for _ in range(40):   # past the end of a pool: an epoch is about 30 batches
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it) for _ in range(8)]
  resumed = ld.make_train_iterator(cfg, **kwargs)
  resumed.set_state(state)
  for want in expected:
    np.testing.assert_array_equal(next(resumed), want)
  bytes_cfg = ld.DataConfig(source='hf', hf_dataset=cfg.hf_dataset, data_dir=cfg.data_dir,
                            hf_eval_fraction=FRACTION)
  with pytest.raises(errors.DataError, match='another data setup'):
    ld.make_train_iterator(bytes_cfg, **kwargs).set_state(state)   # another tokenizer


def test_eval_windows_cover_the_validation_split_in_proportion_to_its_tokens(cfg):
  batch_size, seq_len, num_batches = 8, 32, 4
  w = ld.make_eval_windows(cfg, batch_size=batch_size, seq_len=seq_len,
                           num_batches=num_batches)
  assert w.tokens.shape == (num_batches, batch_size, seq_len + 1)
  valid = sources.open_documents(cfg, 'validation')
  assert w.split_documents == len(valid) == w.documents_read
  tok = ld.HfTokenizer(cfg.hf_tokenizer)
  sizes = np.array([len(tok.encode(valid[i])) + 1 for i in range(len(valid))])
  stratum = sizes.sum() / (num_batches * batch_size)
  counts = np.bincount(w.docs.ravel(), minlength=len(valid))
  assert np.all(np.abs(counts - sizes / stratum) <= 2), (counts, sizes / stratum)
  assert {i for i in range(len(valid)) if sizes[i] >= 2 * stratum} <= set(w.docs.ravel())
  again = ld.make_eval_windows(cfg, batch_size=batch_size, seq_len=seq_len,
                               num_batches=num_batches)
  np.testing.assert_array_equal(w.tokens, again.tokens)


# ----------------------------------------------------------- a run


def _comparable(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


@pytest.mark.slow
def test_a_nano_run_on_a_local_hf_dataset_and_tokenizer_resumes_exactly(
    nano_config, saved, tokenizer_json, hf_data_dir, tmp_path):
  c = nano_config
  c.data.source, c.data.hf_dataset, c.data.hf_eval_fraction = 'hf', saved, FRACTION
  c.data.tokenizer, c.data.hf_tokenizer = 'hf', tokenizer_json
  c.data.data_dir = hf_data_dir
  c.algorithm.name, c.algorithm.sync_every = 'diloco', 3
  full = str(tmp_path / 'full')
  train.run(c, full)
  records = read_metrics(full)
  assert [r['step'] for r in records] == [5, 10, 15, 20]
  assert all(np.isfinite(r['train_loss']) for r in records)
  assert records[0]['train_loss'] > records[-1]['train_loss']
  assert np.log(VOCAB) - 0.5 < records[0]['train_loss'] < np.log(VOCAB) + 0.5
  assert 'eval_loss' in records[1] and 'eval_loss' in records[3]
  with open(os.path.join(full, 'config.json')) as f:
    written = json.load(f)
  assert written['model']['vocab_size'] == VOCAB
  assert written['data_fingerprint']['source'] == 'hf'
  assert written['data_fingerprint']['tokenizer']['sha256']
  # Interrupted after the step-10 checkpoint: the resumed run writes the same records.
  resumed = str(tmp_path / 'resumed')
  shutil.copytree(full, resumed)
  shutil.rmtree(os.path.join(resumed, 'checkpoints', '20'))
  train.run(c, resumed)
  assert _comparable(read_metrics(resumed)) == _comparable(records)


# ----------------------------------------------------------- bad input


def _open(tmp_path, **kwargs):
  c = ld.DataConfig(source='hf', data_dir=str(tmp_path / 'data'), **kwargs)
  return sources.open_documents(c, 'train')


def test_bad_datasets_are_one_line_data_errors(tmp_path, saved):
  with pytest.raises(errors.DataError, match='no such file or folder'):
    _open(tmp_path, hf_dataset=str(tmp_path / 'nowhere'))
  with pytest.raises(errors.DataError, match=r"no column 'body' \(data.text_key\); its "
                     'columns are id, text'):
    _open(tmp_path, hf_dataset=saved, text_key='body')
  with pytest.raises(errors.DataError, match=r"column 'id' \(data.text_key\) holds int"):
    _open(tmp_path, hf_dataset=saved, text_key='id')
  empty = str(tmp_path / 'empty')
  datasets.Dataset.from_dict({'text': []}, features=datasets.Features(
      {'text': datasets.Value('string')})).save_to_disk(empty)
  with pytest.raises(errors.DataError, match='the dataset is empty'):
    _open(tmp_path, hf_dataset=empty)   # (datasets 5 cannot load an empty save: said too)
  blank = str(tmp_path / 'blank')
  datasets.Dataset.from_dict({'text': ['', ' ', None]}).save_to_disk(blank)
  with pytest.raises(errors.DataError, match='the dataset is empty or its texts are blank'):
    _open(tmp_path, hf_dataset=blank)
  tiny = str(tmp_path / 'tiny')
  datasets.Dataset.from_dict({'text': ['one document', 'another one']}).save_to_disk(tiny)
  with pytest.raises(errors.DataError, match='left validation empty'):
    _open(tmp_path, hf_dataset=tiny, hf_eval_fraction=0.01)
  # The Hub is not reachable here (offline): one line, not a hang or a traceback.
  with pytest.raises(errors.DataError, match='cannot be fetched from the Hugging Face Hub'):
    _open(tmp_path, hf_dataset='someone/no-such-dataset')
  # A failed preparation leaves nothing that reads as prepared: the next try says the same.
  with pytest.raises(errors.DataError, match='the dataset is empty or its texts are blank'):
    _open(tmp_path, hf_dataset=blank)


def test_bad_tokenizers_are_one_line_data_errors(tmp_path):
  with pytest.raises(errors.DataError, match='cannot be read'):
    ld.HfTokenizer(str(tmp_path / 'missing.json'))
  with pytest.raises(errors.DataError, match='holds no tokenizer.json'):
    ld.HfTokenizer(str(tmp_path))
  (tmp_path / 'bad.json').write_text('{"not": "a tokenizer"}')
  with pytest.raises(errors.DataError, match='is not a tokenizer.json'):
    ld.HfTokenizer(str(tmp_path / 'bad.json'))
  with pytest.raises(errors.ConfigError, match='data.hf_tokenizer is empty'):
    ld.DataConfig(tokenizer='hf')


@pytest.mark.parametrize('kwargs,match', [
    ({}, 'data.hf_dataset is empty'),
    ({'hf_dataset': 'x', 'hf_eval_split': 'train'}, 'both'),
    ({'hf_dataset': 'x', 'hf_eval_fraction': 1.0}, r'in \(0, 1\)'),
    ({'hf_dataset': 'x', 'hf_max_docs': -1}, '>= 0'),
])
def test_config_checks(kwargs, match):
  with pytest.raises(errors.ConfigError, match=match):
    ld.DataConfig(source='hf', **kwargs)


def test_without_the_extra_the_error_names_the_install_command(monkeypatch):
  monkeypatch.setitem(sys.modules, 'datasets', None)   # as if not installed
  with pytest.raises(errors.ConfigError, match=r"pip install -e '\.\[hf\]'"):
    ld.DataConfig(source='hf', hf_dataset='HuggingFaceFW/fineweb-edu')
  monkeypatch.setitem(sys.modules, 'tokenizers', None)
  with pytest.raises(errors.ConfigError, match=r"needs the 'tokenizers' package.*\[hf\]"):
    ld.DataConfig(tokenizer='hf', hf_tokenizer='tok.json')


def _cli(args, block=''):
  """`python -m loco.main ARGS`, with the packages in `block` made unimportable."""
  code = (f'import runpy, sys\nfor name in {block.split()!r}:\n  sys.modules[name] = None\n'
          f'sys.argv = ["loco.main", *{args!r}]\nrunpy.run_module("loco.main", '
          'run_name="__main__")\n')
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path, tokenizer_json):
  args = ['--config=experiments/hf_fineweb_edu.py', f'--workdir={tmp_path / "w"}',
          f'--config.data.data_dir={tmp_path / "data"}']
  missing = tmp_path / 'tokenizer.json'
  nowhere = tmp_path / 'nowhere'
  for extra, block, line in [
      ([f'--config.data.hf_tokenizer={missing}'], 'datasets',
       "data.source='hf' needs the 'datasets' package, which is not installed; install "
       "the Hugging Face extra: pip install -e '.[hf]'"),
      ([f'--config.data.hf_tokenizer={missing}'], '',
       f'Hugging Face tokenizer {missing} cannot be read (data.hf_tokenizer): No such '
       'file or directory.'),
      ([f'--config.data.hf_tokenizer={tokenizer_json}', f'--config.data.hf_dataset={nowhere}'],
       '', f"data.hf_dataset '{nowhere}': no such file or folder ({nowhere}); give the path "
       "of a local dataset or a Hugging Face Hub name such as 'HuggingFaceFW/fineweb-edu'."),
  ]:
    out = _cli([*args, *extra], block=block)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [f'loco: error: {line}']
  assert not os.path.exists(tmp_path / 'data' / 'loco_corpus')
