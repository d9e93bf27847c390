"""C4 from nothing: shards in the C4 format -> prepare -> SentencePiece -> a c4 config.

Shards are written in the exact format of allenai/c4 `en` (tests/c4_shards.py: gzip
JSON lines with text, timestamp and url), prepared with `python -m loco.data.prepare c4`
(as a function and once as the command), a small SentencePiece model is trained on
them, and experiments/c4_gasloc.py trains on them with the nano model for a few steps.
"""

import gzip
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from loco import configs
from loco import errors
from loco.run import experiment
from loco.run import train
from loco.data import c4
from loco.data import prepare as prepare_cli
from loco.data import sources
from loco.data import tokenizers
from tests.c4_shards import DOCS
from tests.c4_shards import write_c4_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """A prepared C4 (2 + 1 shards of 200 documents) and a 400-piece SentencePiece model."""
  root = tmp_path_factory.mktemp('c4')
  source, data_dir = str(root / 'c4_en'), str(root / 'tfds')
  texts = write_c4_shards(source)
  report = c4.prepare(source, data_dir, progress=False)
  docs = tfds.data_source(c4.TFDS_NAME, split='train', data_dir=data_dir)
  sp_model = str(root / 'c4_sp.model')
  tokenizers.train_sentencepiece((docs[i]['text'] for i in range(len(docs))),
                                 vocab_size=400, output=sp_model)
  return dict(source=source, data_dir=data_dir, texts=texts, report=report,
              sp_model=sp_model)


def test_prepare_keeps_every_document_in_order(prepared):
  report = prepared['report']
  assert report.docs == {'train': 2 * DOCS, 'validation': DOCS}
  assert len(report.written) == 3 and not report.skipped
  for split in ('train', 'validation'):
    source = tfds.data_source(c4.TFDS_NAME, split=split, data_dir=prepared['data_dir'])
    got = [source[i]['text'].decode() for i in range(len(source))]
    assert got == prepared['texts'][split]
  first = tfds.data_source(c4.TFDS_NAME, split='train', data_dir=prepared['data_dir'])[0]
  assert first['url'] == b'https://example.com/train/0/0'
  assert first['timestamp'] == b'2019-04-25T12:57:54Z'


def test_prepare_again_skips_finished_shards_and_redoes_a_half_written_one(
    prepared, tmp_path):
  again = c4.prepare(prepared['source'], prepared['data_dir'], progress=False)
  assert again.written == [] and len(again.skipped) == 3 and again.docs == prepared['report'].docs
  # An interrupted preparation: one shard never recorded, a temporary file left over.
  data_dir = str(tmp_path / 'tfds')
  c4.prepare(prepared['source'], data_dir, progress=False)
  path = c4.dataset_path(data_dir)
  state = json.load(open(os.path.join(path, c4.STATE_FILE)))
  del state['shards']['train/00001']
  json.dump(state, open(os.path.join(path, c4.STATE_FILE), 'w'))
  os.remove(os.path.join(path, 'dataset_info.json'))
  open(os.path.join(path, 'loco_c4-train.array_record-00001.tmp99'), 'wb').write(b'half')
  with pytest.raises(errors.DataError, match='only partly prepared.*run the same command'):
    sources.open_documents(experiment.parse_config(_c4_config(prepared, data_dir=data_dir)).data,
                           'train')
  resumed = c4.prepare(prepared['source'], data_dir, progress=False)
  assert resumed.written == ['train/00001'] and len(resumed.skipped) == 2
  assert not [n for n in os.listdir(path) if '.tmp' in n]
  assert resumed.docs == prepared['report'].docs
  # More train shards later: the finished ones are kept.
  more_dir = tmp_path / 'more'
  shutil.copytree(prepared['source'], more_dir)   # copy2 keeps the mtimes
  write_c4_shards(str(tmp_path / 'extra'), train_shards=3)
  name = 'c4-train.00002-of-01024.json.gz'
  shutil.copy2(tmp_path / 'extra' / name, more_dir / name)
  more = c4.prepare(str(more_dir), data_dir, progress=False, max_shards=3)
  assert more.written == ['train/00002'] and more.docs['train'] == 3 * DOCS
  # Fewer shards than are prepared would drop finished work: refused, one line.
  with pytest.raises(errors.DataError, match='already holds 1 prepared shard.*train/00002'):
    c4.prepare(str(more_dir), data_dir, progress=False, max_shards=2)
  assert c4.is_prepared(data_dir)


def test_the_command_prepares_and_skips(prepared, tmp_path):
  data_dir = str(tmp_path / 'tfds')
  command = [sys.executable, '-m', 'loco.data.prepare', 'c4', f'--source={prepared["source"]}',
             f'--data_dir={data_dir}', '--max_shards=1']
  first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
  assert first.returncode == 0, first.stderr
  assert 'train 1/1: c4-train.00000-of-01024.json.gz: 200 documents' in first.stdout
  assert '2 shard(s) written' in first.stdout and not first.stderr.strip()
  second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
  assert second.returncode == 0 and 'already prepared' in second.stdout
  source = tfds.data_source(c4.TFDS_NAME, split='train', data_dir=data_dir)
  assert len(source) == DOCS


def _c4_config(prepared, **data):
  overrides = {
      'model.preset': 'nano', 'model.vocab_size': 400, 'num_workers': 2, 'steps': 4,
      'batch_per_worker': 2, 'seq_len': 32, 'log_every': 2, 'eval.every': 2,
      'eval.batches': 2, 'eval.batch_size': 2, 'checkpoint.every': 4,
      'algorithm.sync_every': 2, 'progress': False,
      'data.data_dir': prepared['data_dir'], 'data.sp_model': prepared['sp_model']}
  overrides.update({f'data.{k}': v for k, v in data.items()})
  return configs.load(os.path.join(REPO, 'experiments', 'c4_gasloc.py'), overrides)


@pytest.mark.slow
def test_c4_gasloc_trains_on_the_prepared_shards(prepared, tmp_path):
  workdir = str(tmp_path / 'run')
  record = train.run(_c4_config(prepared), workdir)
  assert record['step'] == 4 and record['tokens'] == 4 * 2 * 2 * 32
  assert np.isfinite(record['eval_loss']) and 0 < record['eval_loss'] < np.log(400) + 1
  assert record['syncs'] == 2 and record['bytes_sent'] > 0
  run_config = json.load(open(os.path.join(workdir, 'config.json')))
  fingerprint = run_config['data_fingerprint']
  assert fingerprint['name'] == c4.TFDS_NAME
  assert fingerprint['splits']['train']['docs'] == 2 * DOCS


def test_missing_data_and_tokenizer_say_how_to_prepare_them(prepared, tmp_path):
  empty = str(tmp_path / 'empty')
  os.makedirs(empty)
  with pytest.raises(errors.DataError,
                     match=f'not prepared in {empty}.*python -m loco.data.prepare c4 '
                           f'--source=C4_DIR --data_dir={empty}.*Paper-scale runs'):
    train.run(_c4_config(prepared, data_dir=empty), str(tmp_path / 'run'))
  with pytest.raises(errors.ConfigError,
                     match='data.sp_model is empty.*prepare c4.*prepare tokenizer'):
    experiment.parse_config(_c4_config(prepared, sp_model=''))
  missing = str(tmp_path / 'nope.model')
  with pytest.raises(errors.DataError,
                     match=f'{missing} .*does not exist.*prepare tokenizer'):
    train.run(_c4_config(prepared, sp_model=missing), str(tmp_path / 'run2'))
  assert not os.path.exists(tmp_path / 'run2')


@pytest.mark.parametrize('content,match', [
    (b'{"text": "ok", "timestamp": "t", "url": "u"}\n{"text": "cut', 'line 2 is not JSON'),
    (b'{"text": "ok", "timestamp": "t", "url": "u"}\n{"body": "x"}\n',
     r"line 2 is not a C4 record.*got \['body'\]"),
])
def test_a_damaged_line_names_the_file_and_line(tmp_path, content, match):
  write_c4_shards(str(tmp_path / 'src'), train_shards=1, docs=3)
  bad = tmp_path / 'src' / 'c4-train.00001-of-01024.json.gz'
  bad.write_bytes(gzip.compress(content))
  with pytest.raises(errors.DataError, match=f'{bad} {match}'):
    c4.prepare(str(tmp_path / 'src'), str(tmp_path / 'tfds'), progress=False)
  assert not c4.is_prepared(str(tmp_path / 'tfds'))


def test_a_foreign_file_and_a_bad_source_are_one_line(tmp_path):
  write_c4_shards(str(tmp_path / 'src'), train_shards=1, docs=3)
  foreign = tmp_path / 'src' / 'c4-validation.00001-of-00008.json.gz'
  foreign.write_text('not gzip\n')
  result = subprocess.run(
      [sys.executable, '-m', 'loco.data.prepare', 'c4', f'--source={tmp_path / "src"}',
       f'--data_dir={tmp_path / "tfds"}'], cwd=REPO, capture_output=True, text=True,
      check=False)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('loco.data.prepare c4: error: ')
  assert f'{foreign} cannot be read as gzip' in lines[0]
  with pytest.raises(errors.DataError, match='has no C4 train shards'):
    c4.find_shards(str(tmp_path))


@pytest.mark.parametrize('where', ['write', 'close'])
def test_a_full_disk_while_writing_a_shard_is_one_line_and_leaves_no_part(
    tmp_path, monkeypatch, capsys, where):
  """The ArrayRecord writer reports a full disk as a C++ status (a RuntimeError): the
  command says so in one line naming the shard, and no half-written file is left."""
  from array_record.python import array_record_module
  real = array_record_module.ArrayRecordWriter

  class Full:
    def __init__(self, path, options):
      self._w = real(path, options)

    def write(self, record):
      if where == 'write':
        raise RuntimeError('INTERNAL: ... No space left on device; writing ...')
      self._w.write(record)

    def close(self):
      self._w.close()
      if where == 'close':
        raise RuntimeError('INTERNAL: flush failed: No space left on device')

  monkeypatch.setattr(array_record_module, 'ArrayRecordWriter', Full)
  write_c4_shards(str(tmp_path / 'src'), train_shards=1, docs=3)
  out = str(tmp_path / 'tfds')
  assert prepare_cli.main(['c4', f'--source={tmp_path / "src"}', f'--data_dir={out}']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'loco.data.prepare c4: error: {out}/loco_c4/en/1.0.0/'
                 'loco_c4-train.array_record-00000: the disk is full']
  leftovers = [n for _, _, files in os.walk(out) for n in files if '.tmp' in n]
  assert leftovers == []


def test_a_second_prepare_on_the_same_folder_is_refused(prepared, tmp_path):
  import fcntl
  data_dir = str(tmp_path / 'tfds')
  os.makedirs(c4.dataset_path(data_dir))
  with open(os.path.join(c4.dataset_path(data_dir), '.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # as a running `prepare c4` holds it
    with pytest.raises(errors.DataError, match='another `prepare c4` is writing'):
      c4.prepare(prepared['source'], data_dir, progress=False)


def _write_tfrecord_build(folder, texts):
  """A TFRecord TFDS c4 build as `tfds build c4` writes it (CRCs left zero)."""
  from tensorflow_datasets.proto import tf_example_pb2
  os.makedirs(folder)
  splits = []
  for split, docs in texts.items():
    with open(os.path.join(folder, f'c4-{split}.tfrecord-00000-of-00001'), 'wb') as f:
      for i, text in enumerate(docs):
        example = tf_example_pb2.Example()
        for key, value in (('text', text), ('url', f'u{i}'), ('timestamp', 't'),
                           ('content-type', 'text/plain')):
          example.features.feature[key].bytes_list.value.append(value.encode())
        data = example.SerializeToString()
        f.write(struct.pack('<Q', len(data)) + b'\0' * 4 + data + b'\0' * 4)
    splits.append({'name': split, 'shardLengths': [str(len(docs))]})
  with open(os.path.join(folder, 'dataset_info.json'), 'w') as f:
    json.dump({'name': 'c4', 'fileFormat': 'tfrecord', 'splits': splits}, f)


def test_prepare_reads_tfds_builds(prepared, tmp_path):
  # A TFRecord build (read without TensorFlow) and an ArrayRecord one (here, ours).
  texts = {'train': ['one doc', 'two docs'], 'validation': ['held out']}
  _write_tfrecord_build(str(tmp_path / 'tfrecord'), texts)
  report = c4.prepare(str(tmp_path / 'tfrecord'), str(tmp_path / 'a'), progress=False)
  assert report.docs == {'train': 2, 'validation': 1}
  source = tfds.data_source(c4.TFDS_NAME, split='train', data_dir=str(tmp_path / 'a'))
  assert [source[i]['text'] for i in range(2)] == [b'one doc', b'two docs']
  copy = c4.prepare(c4.dataset_path(prepared['data_dir']), str(tmp_path / 'b'),
                    progress=False)
  assert copy.docs == prepared['report'].docs


def test_help_documents_the_tokenizer_sample(capsys):
  with pytest.raises(SystemExit):
    prepare_cli.main(['tokenizer', '--help'])
  out = capsys.readouterr().out
  assert 'first this many MB of the train split' in out and '32000' in out
