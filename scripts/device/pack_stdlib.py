"""Packs this Python's standard library, the embedded corpus, for a GPU host whose Python
differs (the image's is 3.12; the published pages train on CPython 3.11's): the `.py`
files that `loco.data.corpus.stdlib_spec` reads, as DEST/stdlib.tar.xz, and the corpus's
fingerprint (loco.data.dataset_fingerprint) as DEST/stdlib.json. On the host,
scripts/device/claims.sh unpacks it, points LOCO_STDLIB at it and refuses to train if the
fingerprint there differs.

  python scripts/device/pack_stdlib.py [--dest=.whl]
"""

import json
import os
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from loco import cli  # noqa: E402

PROG = 'pack_stdlib.py'


def main(argv: list[str]) -> int:
  parser = cli.Parser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument('--dest', default=os.path.join(ROOT, '.whl'))
  args = parser.parse_args(argv)
  import loco.data as ld   # the data stack, only once the arguments are read
  from loco.data import corpus
  from loco.data import config as data_config
  spec = corpus.stdlib_spec()
  os.makedirs(args.dest, exist_ok=True)
  archive = os.path.join(args.dest, 'stdlib.tar.xz')
  with tarfile.open(archive, 'w:xz') as tar:
    for rel in spec.files:
      tar.add(os.path.join(spec.root, rel), arcname=os.path.join('stdlib', rel))
  fp = ld.dataset_fingerprint(data_config.DataConfig())
  record = {'python': '.'.join(map(str, sys.version_info[:3])), 'root': spec.root,
            'files': len(spec.files), 'sha256': fp['sha256'], 'bytes': fp['bytes']}
  with open(os.path.join(args.dest, 'stdlib.json'), 'w') as f:
    json.dump(record, f, indent=1)
  print(f'{archive}: {len(spec.files)} files of Python {record["python"]}\'s stdlib, '
        f'{os.path.getsize(archive) / 2 ** 20:.1f} MiB; corpus sha256 {fp["sha256"][:16]}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
