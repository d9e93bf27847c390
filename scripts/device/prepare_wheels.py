"""Prepares what travels to a GPU host without network: the wheels loco imports at run
time that the host's image lacks, pinned, for its Python (3.12, manylinux x86-64), into
.whl/ (git-ignored); then checks that they and the working tree fit the 64 MiB that
travel with a call. Run it where pip reaches PyPI; the host then starts the study with
scripts/device/gpu_study.sh (README, "GPU").

  python scripts/device/prepare_wheels.py [--python-version=3.12] [--dest=.whl]

WHEELS is what loco.main, the data pipeline and the study import that IMAGE lacks, found
by running the study's dry run in a Python 3.11 venv holding only IMAGE's packages (and
their own dependencies) with these wheels installed by gpu_study.sh's line. The other
Requires-Dist of these packages (tfds's simple-parsing, termcolor, einops, ...) are
imported only on paths loco never takes, so they stay behind.
"""

import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from loco import cli  # noqa: E402  (one-line argument errors; imports nothing heavy)

PROG = 'prepare_wheels.py'
LIMIT = 64 * 2 ** 20   # bytes that travel with one call: the working tree and .whl/

# What the GPU image has (Python 3.12, jax 0.11.2 with CUDA 13): the pip names.
IMAGE = ('absl-py', 'attrs', 'chex', 'cloudpickle', 'etils', 'flax', 'fsspec', 'jax',
         'jaxlib', 'matplotlib', 'ml-dtypes', 'msgpack', 'numpy', 'optax',
         'orbax-checkpoint', 'protobuf', 'psutil', 'pyarrow', 'pyyaml', 'requests',
         'scipy', 'sentencepiece', 'simplejson', 'six', 'tensorstore', 'toolz', 'tqdm',
         'typing-extensions', 'wrapt', 'zipp')

WHEELS = {   # pip name -> (version, who imports it)
    'ml-collections': ('1.1.0', 'the configs (loco/configs, loco.main\'s flags)'),
    'tensorflow-datasets': ('4.9.10', 'the corpus, a TFDS ArrayRecord dataset (loco/data)'),
    'grain': ('0.2.18', 'the data pipeline (loco/data/pipeline.py)'),
    'array-record': ('0.8.6', 'grain\'s and tfds\'s file format'),
    'tensorboardX': ('2.6.5', 'the metrics\' TensorBoard sink (loco/files/metrics.py)'),
    'portpicker': ('1.6.0', 'grain'),
    'dm-tree': ('0.1.10', 'tfds'),
    'immutabledict': ('4.3.1', 'tfds'),
    'tensorflow-metadata': ('1.21.0', 'tfds (its protos need protobuf >= 6.31.1)'),
    'toml': ('0.10.2', 'tfds'),
    'promise': ('2.3', 'tfds; PyPI has no wheel of it, so it is built here (pure Python)'),
}
SDIST_ONLY = ('promise',)
# Installed on the host only if the image's protobuf is older than tensorflow-metadata's
# protos need (gpu_study.sh checks); in a subfolder, so that `.whl/*.whl` leaves it out.
FALLBACK = {'protobuf': '6.33.5'}
PLATFORMS = ('manylinux_2_28_x86_64', 'manylinux_2_27_x86_64', 'manylinux_2_17_x86_64',
             'manylinux2014_x86_64', 'manylinux1_x86_64')


def _pip(args: list[str]) -> None:
  out = subprocess.run([sys.executable, '-m', 'pip', *args], capture_output=True, text=True)
  if out.returncode:
    lines = [l for l in out.stderr.splitlines() if l.strip() and 'WARNING: Location' not in l]
    sys.exit(f'{PROG}: error: pip {args[0]} failed: {lines[-1] if lines else out.returncode}')


def download(dest: str, python_version: str, specs: list[str]) -> None:
  platforms = [a for p in PLATFORMS for a in ('--platform', p)]
  _pip(['download', '-q', '--no-deps', '--only-binary=:all:', '--python-version',
        python_version, '--implementation', 'cp', *platforms, '-d', dest, *specs])


def tree_bytes() -> int:
  """Bytes of the working tree that travels: tracked files and untracked ones git does not
  ignore."""
  files = subprocess.run(['git', 'ls-files', '-z', '-co', '--exclude-standard'], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split('\0')
  paths = (os.path.join(ROOT, f) for f in files if f)
  return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def main(argv: list[str]) -> int:
  parser = cli.Parser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument('--python-version', default='3.12')
  parser.add_argument('--dest', default=os.path.join(ROOT, '.whl'))
  args = parser.parse_args(argv)
  if not re.fullmatch(r'3\.\d+', args.python_version):
    parser.error(f'--python-version must look like 3.12, got {args.python_version!r}')
  fallback = os.path.join(args.dest, 'fallback')
  os.makedirs(fallback, exist_ok=True)
  for old in glob.glob(os.path.join(args.dest, '*.whl')) + glob.glob(
      os.path.join(fallback, '*.whl')):
    os.remove(old)
  download(args.dest, args.python_version,
           [f'{n}=={v}' for n, (v, _) in WHEELS.items() if n not in SDIST_ONLY])
  download(fallback, args.python_version, [f'{n}=={v}' for n, v in FALLBACK.items()])
  _pip(['wheel', '-q', '--no-deps', '-w', args.dest,
        *(f'{n}=={WHEELS[n][0]}' for n in SDIST_ONLY)])

  wheels = sorted(glob.glob(os.path.join(args.dest, '*.whl')))
  spare = sorted(glob.glob(os.path.join(fallback, '*.whl')))
  if len(wheels) != len(WHEELS):
    sys.exit(f'{PROG}: error: {len(wheels)} wheels in {args.dest}, {len(WHEELS)} expected.')
  mib = lambda n: f'{n / 2 ** 20:.1f} MiB'
  for w in wheels + spare:
    print(f'  {os.path.relpath(w, args.dest):74s} {os.path.getsize(w) / 2 ** 20:5.2f} MiB')
  size = lambda paths: sum(os.path.getsize(p) for p in paths)
  tree = tree_bytes()
  total = tree + size(wheels) + size(spare)
  print(f'wheels: {len(wheels)} in {args.dest}, {mib(size(wheels))} (and the fallback '
        f'{mib(size(spare))}); working tree: {mib(tree)}; together {mib(total)} of '
        f'{mib(LIMIT)}')
  if total > LIMIT:
    sys.exit(f'{PROG}: error: {mib(total)} is over the {mib(LIMIT)} that travel.')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
