"""What the eval windows read: documents touched and the largest document's share.

  python scripts/eval_coverage.py [--batches=32,512] [--batch_size=16] [--seq_len=64]

For each validation half and each number of batches, prints how many of the half's
documents the windows of `loco.data.make_eval_windows` touch and the share of windows
that the most-read document holds (the windows are drawn across the whole split, so
that share follows the document's share of the split's tokens).
"""

import argparse
import collections

from loco import data as data_lib

SPLITS = ('validation[:50%]', 'validation[50%:]')


def coverage(cfg, split: str, batches: int, batch_size: int, seq_len: int) -> dict:
  w = data_lib.make_eval_windows(cfg, batch_size=batch_size, seq_len=seq_len,
                                 num_batches=batches, split=split)
  counts = collections.Counter(w.docs.ravel().tolist())
  return dict(split=split, batches=batches, touched=len(counts),
              documents=w.split_documents, largest=max(counts.values()) / w.docs.size)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--batches', default='32,512')
  parser.add_argument('--batch_size', type=int, default=16)
  parser.add_argument('--seq_len', type=int, default=64)
  args = parser.parse_args()
  cfg = data_lib.DataConfig()
  print('| split | batches x windows | documents touched | largest document\'s share |')
  print('|---|---|---|---|')
  for split in SPLITS:
    for batches in (int(b) for b in args.batches.split(',')):
      c = coverage(cfg, split, batches, args.batch_size, args.seq_len)
      print(f'| {split} | {batches} x {args.batch_size} | {c["touched"]} of '
            f'{c["documents"]} | {c["largest"]:.1%} |')


if __name__ == '__main__':
  main()
