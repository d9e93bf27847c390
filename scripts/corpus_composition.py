"""What the embedded corpus holds: each split's size and makeup, and what cleaning left out.

  python scripts/corpus_composition.py                    # the stdlib, a temporary data dir
  python scripts/corpus_composition.py --data_dir=~/.cache/loco/tfds
  python scripts/corpus_composition.py --text_glob='~/corpus/**/*.txt'

Opens the corpus the way a run does (`loco.data.sources.open_documents`, preparing
it first if needed) and prints two markdown tables: for train, validation,
validation[:50%] (where experiments tune) and validation[50%:] (where they report
finals), the documents, families, bytes, the share of bytes in test code (a path
component starting with 'test'), zlib's compressed size over the raw size (a
cheap proxy for how predictable the text is) and the largest document with its
share of the split's bytes; then the files cleaning left out, per reason
(loco.data.clean).
"""

import os
import sys
import tempfile
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from loco import cli  # noqa: E402  (after the repository is on the path)
from loco import errors  # noqa: E402
from loco.data import clean  # noqa: E402
from loco.data import config as config_lib  # noqa: E402
from loco.data import corpus  # noqa: E402
from loco.data import sources  # noqa: E402

SPLITS = ('train', 'validation', 'validation[:50%]', 'validation[50%:]')


def _is_test(path: str) -> bool:
  return any(part.startswith('test') for part in path.split('/'))


def _mb(n: int) -> str:
  return f'{n / 1e6:.2f} MB'


def composition(cfg: config_lib.DataConfig) -> str:
  """The two tables for `cfg`'s corpus, as markdown."""
  spec = (corpus.stdlib_spec() if cfg.source == 'stdlib'
          else corpus.text_spec(cfg.text_glob))
  lines = [f'{spec.description}, corpus version {corpus.VERSION}', '',
           '| split | documents | families | bytes | test code | zlib | largest document '
           '| its share |', '|---|---|---|---|---|---|---|---|']
  for split in SPLITS:
    try:
      docs = sources.open_documents(cfg, split)
    except errors.DataError:  # A half of a one-document validation split is empty.
      lines.append(f'| {split} | 0 | 0 | 0 | | | (empty) | |')
      continue
    sizes = [len(text) for text in docs.texts]
    total = sum(sizes)
    families = {corpus.family(path, spec.kind) for path in docs.paths}
    tests = sum(n for path, n in zip(docs.paths, sizes) if _is_test(path))
    packed = sum(len(zlib.compress(text, 9)) for text in docs.texts)
    largest = max(range(len(sizes)), key=lambda i: (sizes[i], docs.paths[i]))
    lines.append(
        f'| {split} | {len(docs)} | {len(families)} | {_mb(total)} '
        f'| {tests / total:.0%} | {packed / total:.3f} '
        f'| {docs.paths[largest]} ({sizes[largest] / 1e3:.0f} KB) '
        f'| {sizes[largest] / total:.1%} |')
  plan = corpus.plan(spec)
  listed = len(plan.sizes) + len(plan.excluded)
  listed_bytes = sum(plan.sizes.values()) + sum(plan.excluded_bytes.values())
  lines += ['', f'Left out by cleaning (of {listed} files, {_mb(listed_bytes)}):', '',
            '| reason | files | bytes | share of bytes | largest |',
            '|---|---|---|---|---|']
  for reason in clean.REASONS:
    rels = sorted((rel for rel, why in plan.excluded.items() if why == reason),
                  key=lambda r: (-plan.excluded_bytes[r], r))
    n = sum(plan.excluded_bytes[r] for r in rels)
    largest = ', '.join(rels[:3]) + (', ...' if len(rels) > 3 else '')
    lines.append(f'| {reason} | {len(rels)} | {_mb(n)} | {n / listed_bytes:.1%} '
                 f'| {largest} |')
  n = sum(plan.excluded_bytes.values())
  lines.append(f'| all | {len(plan.excluded)} | {_mb(n)} | {n / listed_bytes:.1%} | |')
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = cli.Parser(prog='corpus_composition', description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', default='',
                      help='where the corpus is prepared (default: a temporary dir)')
  parser.add_argument('--text_glob', default='',
                      help='describe these text files instead of the stdlib')
  args = parser.parse_args(argv)

  def body() -> int:
    with tempfile.TemporaryDirectory() as tmp:
      cfg = config_lib.DataConfig(
          source='text' if args.text_glob else 'stdlib', text_glob=args.text_glob,
          data_dir=os.path.expanduser(args.data_dir) if args.data_dir else tmp)
      print(composition(cfg))
    return 0

  return cli.run('corpus_composition', body)


if __name__ == '__main__':
  sys.exit(main())
