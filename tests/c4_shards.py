"""Synthetic shards in the exact C4 `en` format, for tests and for trying the C4 path.

  python -m tests.c4_shards DIR     # 2 train + 1 validation shards of 200 documents

Files are named and written as allenai/c4 ships them: `c4-train.00000-of-01024.json.gz`,
`c4-validation.00000-of-00008.json.gz`, gzip JSON lines with `text`, `timestamp` and
`url`. The text is seeded word salad (a few hundred characters a document), not real
C4. Importable without side effects (no pytest), as tests/nano.py.
"""

import gzip
import json
import os
import random
import sys

DOCS = 200   # per shard
_WORDS = ('the a of and to in is for on that with as was it by at from this be are '
          'or have an which one new more first time people year can data water city '
          'food music game school house river garden market light').split()


def write_c4_shards(folder: str, train_shards: int = 2, validation_shards: int = 1,
                    docs: int = DOCS, seed: int = 0) -> dict[str, list[str]]:
  """Writes the shards into `folder`; returns each split's texts in stored order."""
  os.makedirs(folder, exist_ok=True)
  rng = random.Random(seed)
  texts = {}
  for split, count, total in (('train', train_shards, 1024),
                              ('validation', validation_shards, 8)):
    for s in range(count):
      name = f'c4-{split}.{s:05d}-of-{total:05d}.json.gz'
      with gzip.open(os.path.join(folder, name), 'wt', encoding='utf-8') as f:
        for i in range(docs):
          text = '\n'.join(' '.join(rng.choices(_WORDS, k=rng.randint(8, 40))).capitalize()
                           + '.' for _ in range(rng.randint(1, 6)))
          texts.setdefault(split, []).append(text)
          f.write(json.dumps({'text': text, 'timestamp': '2019-04-25T12:57:54Z',
                              'url': f'https://example.com/{split}/{s}/{i}'}) + '\n')
  return texts


if __name__ == '__main__':
  if len(sys.argv) != 2:
    sys.exit('usage: python -m tests.c4_shards DIR')
  write_c4_shards(sys.argv[1])
  print(f'wrote 2 train and 1 validation shards of {DOCS} documents in the C4 format '
        f'to {sys.argv[1]}')
