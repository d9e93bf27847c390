"""Prepares C4 and its SentencePiece model from local files (nothing is downloaded).

  python -m loco.data.prepare c4 --source=C4_DIR --data_dir=DATA_DIR [--max_shards=N]
  python -m loco.data.prepare tokenizer --data_dir=DATA_DIR \\
      --output=DATA_DIR/c4_en_32k.model

`c4` writes the ArrayRecord dataset `loco_c4/en:1.0.0` that experiments/c4_*.py read
(loco.data.c4: the sources it takes, the layout, resume per shard). `tokenizer` trains a
SentencePiece model on the first `--sample_mb` MB of the prepared train split, in stored
order (the start of the first train shard), lossless with byte fallback
(loco.data.tokenizers.train_sentencepiece). An existing model such as T5's 32k C4
vocabulary needs no step: pass its path as --config.data.sp_model.
"""

from __future__ import annotations

import argparse
import sys

from loco import cli
from loco.data import config as config_lib

PROG = 'python -m loco.data.prepare'


def _c4(args: argparse.Namespace) -> int:
  from loco.data import c4  # pylint: disable=g-import-not-at-top
  cli.check_output_dir(args.data_dir, '--data_dir')
  report = c4.prepare(
      args.source, args.data_dir, max_shards=args.max_shards,
      validation_shards=args.validation_shards, progress=not args.no_progress,
      log=lambda line: print(line, flush=True))
  docs = ', '.join(f'{split} {n:,}' for split, n in report.docs.items())
  source_mb = sum(report.source_bytes.values()) / 1e6
  print(f'{report.path}: {len(report.written)} shard(s) written, '
        f'{len(report.skipped)} already there; documents: {docs}; '
        f'{source_mb:,.1f} MB of source text stored in {report.stored_bytes / 1e6:,.1f} MB; '
        f'{report.seconds:.1f} s. Read it with --config.data.data_dir={args.data_dir}')
  return 0


def _tokenizer(args: argparse.Namespace) -> int:
  # pylint: disable=g-import-not-at-top
  from loco.data import sources
  from loco.data import tokenizers
  cfg = config_lib.DataConfig(source='tfds', tfds_name=config_lib.C4_TFDS_NAME,
                              data_dir=args.data_dir)
  docs = sources.open_documents(cfg, 'train')
  tok, n_docs, n_bytes, seconds = tokenizers.train_on_documents(
      docs, vocab_size=args.vocab_size, output=args.output, model_type=args.model_type,
      max_bytes=int(args.sample_mb * 1e6), num_threads=args.num_threads)
  print(f'wrote {args.output}: vocab {tok.vocab_size}, eos {tok.eos_id}, trained on '
        f'{n_bytes / 1e6:.1f} MB from the first {n_docs:,} documents of the C4 train '
        f'split in {seconds:.1f} s. Use it with '
        f'--config.data.sp_model={args.output}')
  return 0


def _positive_float(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not a number') from None
  if not value > 0:
    raise argparse.ArgumentTypeError(f'{text!r} must be above 0')
  return value


def main(argv: list[str] | None = None) -> int:
  parser = cli.Parser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  commands = parser.add_subparsers(dest='command', required=True, parser_class=cli.Parser)
  c4 = commands.add_parser(
      'c4', help='C4 json.gz shards (or a TFDS c4 build) -> the ArrayRecord dataset '
      f'{config_lib.C4_TFDS_NAME}; resumable per shard',
      description='Writes DATA_DIR/loco_c4/en/1.0.0, one ArrayRecord file per source '
      'shard. Resumable per shard: run the same command again after Ctrl-C; finished '
      'shards are skipped, a half-written one is redone, and the dataset is readable '
      'only when all are done. Every line is checked (a damaged one is named with its '
      'file and line).')
  c4.add_argument('--source', required=True,
                  help='folder of c4-train.NNNNN-of-01024.json.gz and '
                  'c4-validation.NNNNN-of-00008.json.gz (allenai/c4 en), or of a TFDS '
                  'c4 build (holding its dataset_info.json)')
  c4.add_argument('--data_dir', required=True,
                  help='TFDS data dir to write into (--config.data.data_dir of the run); '
                  'the dataset goes to DATA_DIR/loco_c4/en/1.0.0')
  c4.add_argument('--max_shards', type=cli.positive_int, default=None,
                  help='use the first N train shards in sorted order (default: all)')
  c4.add_argument('--validation_shards', type=cli.positive_int, default=None,
                  help='use the first N validation shards (default: all)')
  c4.add_argument('--no_progress', action='store_true',
                  help='no progress bar (it is shown only when stderr is a terminal)')
  tok = commands.add_parser(
      'tokenizer', help='train a SentencePiece model on the prepared C4 train split',
      description='Trains a lossless SentencePiece model (BPE unless --model_type; byte '
      'fallback, identity normalisation, EOS id 2) on the first --sample_mb MB of the prepared C4 train '
      'split in stored order.')
  tok.add_argument('--data_dir', required=True, help='where `c4` prepared C4')
  tok.add_argument('--output', required=True, help='the .model file to write')
  tok.add_argument('--vocab_size', type=cli.positive_int, default=32_000,
                   help='pieces (default 32000, as T5\'s C4 vocabulary; >= 320)')
  tok.add_argument('--sample_mb', type=_positive_float, default=100.0,
                   help='train on the first this many MB of the train split, in '
                   'stored order (default 100: about 44k documents)')
  tok.add_argument('--model_type', default='bpe', choices=('bpe', 'unigram'))
  tok.add_argument('--num_threads', type=cli.positive_int, default=2)
  args = parser.parse_args(argv)
  body = {'c4': _c4, 'tokenizer': _tokenizer}[args.command]
  return cli.run(f'loco.data.prepare {args.command}', lambda: body(args))


if __name__ == '__main__':
  cli.exit(main())
