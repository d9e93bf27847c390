"""What a step's batch reads: distinct documents, and rows continuing the step before.

  python scripts/batch_documents.py [--shapes=1x32,2x16,8x4] [--steps=200] [--seq_len=128]
      [--samplings=stream,windows] [--source=stdlib|stdlib_tfds|c4_synthetic]
      [--data KEY=VALUE ...]

For each layout (`data.sampling`) and each M x B (workers x rows per worker), reads
`--steps` batches of `loco.data.make_train_iterator` (seed 0) and prints:

- documents per step: distinct documents the step's M x B rows read (any token);
- per worker-step: distinct documents one worker's B rows read;
- continuing: the share of rows whose first document the same worker read at the step
  before (for independent windows this is about B x the token-weighted mean document's
  share of the worker's share of the corpus, not 0: a long document is drawn often);
- worker's longest stay: the most consecutive steps one worker's first row spent in one
  document (the mean over workers).

Sources: `stdlib` is the embedded corpus, held in memory; `stdlib_tfds` the same
documents read on demand through its TFDS ArrayRecord dataset (the path every TFDS
source takes: grain reader threads); `c4_synthetic` C4-format word salad (short
documents, as C4's), written and prepared by loco.data.prepare into a temporary folder.
`--data KEY=VALUE` sets any other DataConfig field (e.g. `--data source=tfds
--data tfds_name=loco_c4/en:1.0.0 --data data_dir=/data --data tokenizer=sentencepiece
--data sp_model=/data/c4_en_32k.model` for real C4).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

from loco import cli
from loco import data as data_lib
from loco.data import config as config_lib
from loco.errors import LocoError

PROG = 'scripts/batch_documents.py'


def measure(cfg: data_lib.DataConfig, workers: int, batch: int, steps: int,
            seq_len: int) -> dict[str, float]:
  """The measures above for one layout and shape."""
  it = data_lib.make_train_iterator(cfg, num_workers=workers, batch_per_worker=batch,
                                    seq_len=seq_len, seed=0)
  per_step, per_worker, continued = [], [], []
  previous = [set() for _ in range(workers)]
  stay = np.zeros(workers, int)
  longest = np.zeros(workers, int)
  first_doc = [None] * workers
  start = time.perf_counter()
  try:
    for step in range(steps):
      _, docs = it.next_with_documents()
      read_by_all = set()
      for w, rows in enumerate(docs):
        read = set()
        for row in rows:
          read.update(row.tolist())
        if step:
          continued += [int(row[0]) in previous[w] for row in rows]
        first = int(rows[0][0])
        stay[w] = stay[w] + 1 if first == first_doc[w] else 1
        longest[w] = max(longest[w], stay[w])
        first_doc[w] = first
        previous[w] = read
        per_worker.append(len(read))
        read_by_all |= read
      per_step.append(len(read_by_all))
  finally:
    it.close()
  return dict(per_step=float(np.mean(per_step)), per_worker=float(np.mean(per_worker)),
              continued=float(np.mean(continued)) if continued else 0.0,
              longest=float(np.mean(longest)),
              ms_per_step=1e3 * (time.perf_counter() - start) / steps)


def _synthetic_c4(folder: str, shards: int, docs: int) -> data_lib.DataConfig:
  """C4-format shards written and prepared in `folder` (reused when already there)."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from loco.data import c4  # pylint: disable=g-import-not-at-top
  from tests import c4_shards  # pylint: disable=g-import-not-at-top
  data_dir = os.path.join(folder, 'tfds')
  if not os.path.isdir(os.path.join(data_dir, 'loco_c4')):
    source = os.path.join(folder, 'c4')
    c4_shards.write_c4_shards(source, train_shards=shards, validation_shards=1, docs=docs)
    c4.prepare(source, data_dir, progress=False)
  return data_lib.DataConfig(source='tfds', tfds_name=config_lib.C4_TFDS_NAME,
                             data_dir=data_dir)


def _stdlib_tfds(cfg: data_lib.DataConfig) -> data_lib.DataConfig:
  """The embedded corpus, read through its TFDS ArrayRecord dataset."""
  from loco.data import corpus  # pylint: disable=g-import-not-at-top
  spec = corpus.stdlib_spec()
  corpus.prepare(spec, cfg.resolved_data_dir)
  return dataclasses.replace(
      cfg, source='tfds',
      tfds_name=f'{corpus.BUILDER_NAME}/{spec.config_name}:{corpus.VERSION}')


def _data_overrides(pairs: list[str]) -> dict[str, object]:
  fields = {f.name: f for f in dataclasses.fields(data_lib.DataConfig)}
  out = {}
  for pair in pairs:
    key, sep, value = pair.partition('=')
    if not sep or key not in fields:
      raise LocoError(f'--data {pair!r}: give KEY=VALUE with KEY one of '
                      f'{", ".join(sorted(fields))}.')
    kind = type(fields[key].default)
    try:
      out[key] = kind(value)
    except ValueError:
      raise LocoError(f'--data {pair!r}: {key} takes a value of type {kind.__name__}.') from None
  return out


def _shapes(text: str) -> list[tuple[int, int]]:
  try:
    shapes = [tuple(int(v) for v in s.split('x')) for s in text.split(',')]
  except ValueError:
    shapes = []
  if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
    raise argparse.ArgumentTypeError(f'{text!r} is not a list like 1x32,8x4')
  return shapes


def main(argv: list[str] | None = None) -> int:
  parser = cli.Parser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--shapes', type=_shapes, default=_shapes('1x32,2x16,8x4'))
  parser.add_argument('--steps', type=cli.positive_int, default=200)
  parser.add_argument('--seq_len', type=cli.positive_int, default=128)
  parser.add_argument('--samplings', default='stream,windows')
  parser.add_argument('--source', default='stdlib',
                      choices=('stdlib', 'stdlib_tfds', 'c4_synthetic'))
  parser.add_argument('--c4_shards', type=cli.positive_int, default=4,
                      help='c4_synthetic: train shards (default 4)')
  parser.add_argument('--c4_docs', type=cli.positive_int, default=2000,
                      help='c4_synthetic: documents per shard (default 2000)')
  parser.add_argument('--data', action='append', default=[], metavar='KEY=VALUE')
  args = parser.parse_args(argv)
  samplings = args.samplings.split(',')
  if not set(samplings) <= set(config_lib.SAMPLINGS):
    parser.error(f'--samplings {args.samplings!r}: choose from '
                 f'{",".join(config_lib.SAMPLINGS)}')

  def body() -> int:
    with tempfile.TemporaryDirectory(prefix='loco-batch-documents-') as tmp:
      cfg = data_lib.DataConfig(**_data_overrides(args.data))
      if args.source == 'stdlib_tfds':
        cfg = _stdlib_tfds(cfg)
      elif args.source == 'c4_synthetic':
        cfg = _synthetic_c4(tmp, args.c4_shards, args.c4_docs)
      print(f'source: {args.source} ({cfg.source}{", " + cfg.tfds_name if cfg.tfds_name else ""}); '
            f'{args.steps} steps of windows of {args.seq_len + 1} tokens, seed 0')
      print('| layout | M x B | documents per step | per worker-step | rows continuing '
            'the step before | worker\'s longest stay (steps) | ms per step |')
      print('|---|---|---|---|---|---|---|')
      for sampling in samplings:
        for m, b in args.shapes:
          r = measure(dataclasses.replace(cfg, sampling=sampling), m, b, args.steps,
                      args.seq_len)
          print(f'| {sampling} | {m} x {b} | {r["per_step"]:.1f} | {r["per_worker"]:.1f} | '
                f'{r["continued"]:.1%} | {r["longest"]:.0f} | {r["ms_per_step"]:.1f} |',
                flush=True)
    return 0

  return cli.run(PROG, body)


if __name__ == '__main__':
  sys.exit(main())
