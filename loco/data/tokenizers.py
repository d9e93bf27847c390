"""Tokenizers: raw bytes (default), SentencePiece and Hugging Face's, plus a trainer CLI.

Every tokenizer has `vocab_size`, `eos_id`, `encode(text) -> int32 array`,
`decode(ids) -> str`. `encode` never adds EOS; the pipeline appends `eos_id`
after every document, so EOS separates packed documents.

Train a SentencePiece model on a loco source (here the embedded stdlib corpus; a
Hugging Face dataset with --source=hf --hf_dataset=NAME_OR_PATH, as data.hf_*):

  python -m loco.data.tokenizers train --source=stdlib --vocab_size=4096 \
      --output=/tmp/stdlib_4k.model
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import os
import sys
import time
from typing import Iterable, Iterator, Protocol

from etils import epath
import numpy as np
import sentencepiece as spm

from loco import cli
from loco import errors
from loco.data import config as config_lib


class Tokenizer(Protocol):
  """What the pipeline and the trainer need from a tokenizer."""

  name: str
  vocab_size: int
  eos_id: int

  def encode(self, text: str | bytes) -> np.ndarray:
    ...

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    ...

  def encode_document(self, data: str | bytes) -> np.ndarray:
    ...

  def fingerprint(self) -> dict[str, object]:
    ...


class ByteTokenizer:
  """UTF-8 bytes as tokens 0..255 and one extra token, EOS = 256 (vocab 257).

  EOS gets its own id rather than reusing byte 0 so that a document separator
  can never be confused with text.
  """

  name = 'bytes'
  vocab_size = 257
  eos_id = 256

  def encode(self, text: str | bytes) -> np.ndarray:
    return self.encode_document(text).astype(np.int32)

  def encode_document(self, data: str | bytes) -> np.ndarray:
    """Tokens of one document as a uint8 view (no copy); the packer widens."""
    return np.frombuffer(data.encode('utf-8') if isinstance(data, str) else bytes(data),
                         dtype=np.uint8)

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    # EOS (and anything out of byte range) is not text.
    return ids[(ids >= 0) & (ids < 256)].astype(np.uint8).tobytes().decode(
        'utf-8', errors='replace')

  def fingerprint(self) -> dict[str, object]:
    return {'name': self.name, 'vocab_size': self.vocab_size,
            'eos_id': self.eos_id}


class SentencePieceTokenizer:
  """A SentencePiece model loaded from a `.model` file (local or gs://)."""

  name = 'sentencepiece'

  def __init__(self, model_path: str):
    path = epath.Path(os.path.expanduser(model_path))
    try:
      proto = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
      raise errors.DataError(
          f'SentencePiece model {model_path} cannot be read (data.sp_model): '
          f'{e.__class__.__name__}.') from e
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError as e:
      raise errors.DataError(
          f'{model_path} is not a SentencePiece model (data.sp_model).') from e
    if self._sp.eos_id() < 0:
      raise errors.DataError(
          f'SentencePiece model {model_path} has no EOS piece; loco needs one '
          'to separate packed documents (train with eos_id >= 0).')
    self.model_path = model_path
    self.vocab_size = int(self._sp.get_piece_size())
    self.eos_id = int(self._sp.eos_id())
    self._sha256 = hashlib.sha256(proto).hexdigest()

  def encode(self, text: str | bytes) -> np.ndarray:
    return self.encode_document(text)

  def encode_document(self, data: str | bytes) -> np.ndarray:
    if isinstance(data, bytes):
      data = data.decode('utf-8', errors='replace')
    return np.asarray(self._sp.encode(data), dtype=np.int32)

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return self._sp.decode([int(i) for i in ids if 0 <= i < self.vocab_size])

  def fingerprint(self) -> dict[str, object]:
    return {'name': self.name, 'vocab_size': self.vocab_size,
            'eos_id': self.eos_id, 'model': self.model_path,
            'sha256': self._sha256}


# Tokens that end a document in common vocabularies, tried in this order when the
# tokenizer's folder has no tokenizer_config.json naming its eos_token.
HF_EOS_TOKENS = ('<|endoftext|>', '</s>', '<|end_of_text|>', '<eos>', '[EOS]', '<|eos|>')


class HfTokenizer:
  """A Hugging Face `tokenizers` tokenizer loaded from its tokenizer.json.

  EOS is the `eos_token` of a tokenizer_config.json beside the file (as `transformers`
  saves it), else the first of HF_EOS_TOKENS in the vocabulary, else a new id after the
  vocabulary (`vocab_size` then counts it). `encode` adds no special tokens (no BOS):
  the pipeline puts EOS after every document itself.
  """

  name = 'hf'

  def __init__(self, path: str):
    config_lib.require_hf('tokenizers', "data.tokenizer='hf'")
    lib = importlib.import_module('tokenizers')
    given = path
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
      path = os.path.join(path, 'tokenizer.json')
      if not os.path.isfile(path):
        raise errors.DataError(
            f'Hugging Face tokenizer folder {given} (data.hf_tokenizer) holds no '
            'tokenizer.json; give the file or the folder that holds it.')
    try:
      with open(path, 'rb') as f:
        data = f.read()
    except OSError as e:
      raise errors.DataError(
          f'Hugging Face tokenizer {given} cannot be read (data.hf_tokenizer): '
          f'{e.strerror or e.__class__.__name__}.') from None
    try:
      self._tok = lib.Tokenizer.from_str(data.decode('utf-8'))
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raises Exception)
      raise errors.DataError(
          f'{given} is not a tokenizer.json of the tokenizers library '
          f'(data.hf_tokenizer): {str(e)[:200]}.') from None
    vocab = self._tok.get_vocab(with_added_tokens=True)
    if not vocab:
      raise errors.DataError(f'Hugging Face tokenizer {given} has an empty vocabulary.')
    size = max(vocab.values()) + 1
    eos = _configured_eos(os.path.dirname(path))
    if eos is None or eos not in vocab:
      eos = next((t for t in HF_EOS_TOKENS if t in vocab), None)
    self.model_path = given
    self.eos_token = eos or ''    # '': EOS is an id of its own, after the vocabulary
    self.eos_id = vocab[eos] if eos else size
    self.vocab_size = size if eos else size + 1
    self._sha256 = hashlib.sha256(data).hexdigest()

  def encode(self, text: str | bytes) -> np.ndarray:
    return self.encode_document(text)

  def encode_document(self, data: str | bytes) -> np.ndarray:
    if isinstance(data, bytes):
      data = data.decode('utf-8', errors='replace')
    return np.asarray(self._tok.encode(data, add_special_tokens=False).ids, dtype=np.int32)

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return self._tok.decode([int(i) for i in ids
                             if 0 <= i < self.vocab_size and i != self.eos_id])

  def fingerprint(self) -> dict[str, object]:
    return {'name': self.name, 'vocab_size': self.vocab_size,
            'eos_id': self.eos_id, 'eos_token': self.eos_token,
            'model': self.model_path, 'sha256': self._sha256}


def _configured_eos(folder: str) -> str | None:
  """The eos_token of folder/tokenizer_config.json, if there is one."""
  try:
    with open(os.path.join(folder, 'tokenizer_config.json')) as f:
      eos = json.load(f).get('eos_token')
  except (OSError, ValueError, AttributeError):
    return None
  if isinstance(eos, dict):   # AddedToken form: {'content': '</s>', ...}
    eos = eos.get('content')
  return eos if isinstance(eos, str) and eos else None


def make_tokenizer(cfg: config_lib.DataConfig) -> Tokenizer:
  """Returns the tokenizer named by `cfg.tokenizer`."""
  if cfg.tokenizer == 'bytes':
    return ByteTokenizer()
  if cfg.tokenizer == 'hf':
    return HfTokenizer(cfg.hf_tokenizer)
  if (cfg.source == 'tfds' and config_lib.is_c4(cfg.tfds_name) and '://' not in cfg.sp_model
      and not os.path.exists(os.path.expanduser(cfg.sp_model))):
    raise errors.DataError(
        f'SentencePiece model {cfg.sp_model} (data.sp_model) does not exist; train one '
        f'on the prepared C4 with `{config_lib.C4_TOKENIZER_COMMAND}` '
        f"({config_lib.C4_README}) or give the path of T5's 32k C4 .model.")
  return SentencePieceTokenizer(cfg.sp_model)


def _chunks(texts: Iterable[str | bytes], max_bytes: int) -> Iterator[str]:
  """Documents cut at line ends into pieces SentencePiece accepts as sentences.

  Newlines stay inside the pieces so that the model learns them (code and
  prose are full of them) instead of byte-falling back on every line end.
  """
  total, chunk_chars = 0, 2048
  for text in texts:
    if isinstance(text, bytes):
      text = text.decode('utf-8', errors='replace')
    buf, size = [], 0
    for line in text.splitlines(keepends=True):
      line = line[:chunk_chars]
      if buf and size + len(line) > chunk_chars:
        yield ''.join(buf)
        buf, size = [], 0
      buf.append(line)
      size += len(line)
      total += len(line)
    if buf:
      yield ''.join(buf)
    if total >= max_bytes:
      return


def train_sentencepiece(
    texts: Iterable[str | bytes],
    *,
    vocab_size: int,
    output: str,
    model_type: str = 'bpe',
    max_bytes: int = 100_000_000,
    num_threads: int = 2,
) -> SentencePieceTokenizer:
  """Trains a lossless SentencePiece model on `texts` and writes it to `output`.

  Identity normalisation, kept whitespace and byte fallback make
  `decode(encode(text)) == text` for any text (indentation included).

  Args:
    texts: documents, str or UTF-8 bytes.
    vocab_size: number of pieces, at least 320 (256 byte pieces + specials).
    output: path of the `.model` file to write (written atomically).
    model_type: 'bpe' or 'unigram'.
    max_bytes: stop reading `texts` after about this many characters.
    num_threads: trainer threads.

  Returns:
    The trained tokenizer, loaded from `output`.
  """
  if vocab_size < 320:
    raise errors.ConfigError(
        f'vocab_size is {vocab_size}; a byte-fallback SentencePiece model '
        'needs at least 320 (256 byte pieces, specials and merges).')
  if model_type not in ('bpe', 'unigram'):
    raise errors.ConfigError(
        f"model_type is {model_type!r}; allowed values: bpe, unigram.")
  model = io.BytesIO()
  seen = [0]      # characters handed to the trainer

  def counted() -> Iterator[str]:
    for chunk in _chunks(texts, max_bytes):
      seen[0] += len(chunk)
      yield chunk

  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=counted(),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=True,
        normalization_rule_name='identity',
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        character_coverage=0.9995,
        max_sentence_length=4 * 2048,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=num_threads,
        minloglevel=2,
    )
  except RuntimeError as e:
    if not seen[0]:
      raise errors.DataError('the tokenizer sample holds no text (no documents, or only '
                             'empty ones): point it at a source with text.') from None
    raise errors.DataError(
        f'SentencePiece training failed for vocab_size {vocab_size}: {e}'
    ) from e
  out = epath.Path(os.path.expanduser(output))
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.parent / f'.{out.name}.tmp{os.getpid()}'
  tmp.write_bytes(model.getvalue())
  tmp.replace(out)  # Atomic: a reader never sees half a model.
  return SentencePieceTokenizer(os.fspath(out))


def train_on_documents(docs, *, vocab_size: int, output: str, model_type: str,
                       max_bytes: int, num_threads: int):
  """`train_sentencepiece` on documents `docs[0], docs[1], ...` in order, up to
  `max_bytes`; returns (the tokenizer, documents used, bytes used, seconds)."""
  used = [0, 0]

  def texts() -> Iterator[bytes]:
    for i in range(len(docs)):
      text = docs[i]
      used[0] += 1
      used[1] += len(text)
      yield text

  start = time.time()
  tok = train_sentencepiece(texts(), vocab_size=vocab_size, output=output,
                            model_type=model_type, max_bytes=max_bytes,
                            num_threads=num_threads)
  if used[0] < SMALL_SAMPLE_DOCS or used[1] < SMALL_SAMPLE_BYTES_PER_PIECE * vocab_size:
    print(f'note: the tokenizer was trained on only {used[0]:,} document(s), '
          f'{used[1]:,} bytes, for {vocab_size:,} pieces: its pieces fit that sample, not '
          f'a corpus (at least {SMALL_SAMPLE_DOCS} documents and '
          f'{SMALL_SAMPLE_BYTES_PER_PIECE * vocab_size:,} bytes are advised).',
          file=sys.stderr)
  return tok, used[0], used[1], time.time() - start


# Below these a trained vocabulary fits its sample rather than the corpus: say so.
SMALL_SAMPLE_DOCS = 100
SMALL_SAMPLE_BYTES_PER_PIECE = 100


def _train_main(args: argparse.Namespace) -> None:
  # Imported here: sources pull in tfds, which the tokenizer itself never needs.
  from loco.data import sources  # pylint: disable=g-import-not-at-top

  cfg = config_lib.DataConfig(
      source=args.source, tfds_name=args.tfds_name, data_dir=args.data_dir,
      text_glob=args.text_glob, text_key=args.text_key,
      hf_dataset=args.hf_dataset, hf_config=args.hf_config,
      hf_streaming=args.hf_streaming, hf_max_docs=args.hf_max_docs,
      # Only `split` is read; eval_split just has to differ from it.
      train_split=args.split,
      eval_split='validation' if args.split != 'validation' else 'train')
  docs = sources.open_documents(cfg, args.split)
  tok, n_docs, n_bytes, seconds = train_on_documents(
      docs, vocab_size=args.vocab_size, output=args.output, model_type=args.model_type,
      max_bytes=args.max_bytes, num_threads=args.num_threads)
  print(f'wrote {args.output}: vocab {tok.vocab_size}, eos {tok.eos_id}, '
        f'trained on {n_bytes / 1e6:.1f} MB from {n_docs} documents of '
        f'{docs.name} in {seconds:.1f} s')


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m loco.data.tokenizers')
  commands = parser.add_subparsers(dest='command', required=True)
  train = commands.add_parser('train', help='train a SentencePiece model')
  train.add_argument('--source', default='stdlib',
                     choices=config_lib.SOURCES)
  train.add_argument('--tfds_name', default='')
  train.add_argument('--data_dir', default='')
  train.add_argument('--text_glob', default='')
  train.add_argument('--text_key', default='text')
  train.add_argument('--hf_dataset', default='',
                     help="source hf: a Hub name or a local dataset (as data.hf_dataset)")
  train.add_argument('--hf_config', default='')
  train.add_argument('--hf_streaming', action='store_true')
  train.add_argument('--hf_max_docs', type=int, default=0)
  train.add_argument('--split', default='train')
  train.add_argument('--vocab_size', type=int, default=4096)
  train.add_argument('--model_type', default='bpe', choices=('bpe', 'unigram'))
  train.add_argument('--max_bytes', type=int, default=100_000_000)
  train.add_argument('--num_threads', type=int, default=2)
  train.add_argument('--output', required=True)
  args = parser.parse_args(argv)
  return cli.run('loco.data.tokenizers', lambda: _train_main(args))


if __name__ == '__main__':
  cli.exit(main())
