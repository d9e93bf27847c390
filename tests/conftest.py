"""Shared fixtures and the home-directory guard.

Tests never read or write the user's home: before anything imports loco, HOME points at
a fresh temporary directory and $LOCO_DATA_DIR is unset, so every default path (the
prepared-corpus cache `~/.cache/loco/tfds`, matplotlib's and Hugging Face's caches) lands
in a throw-away place, as on a new machine; Hugging Face's libraries are kept offline. A
guard fails the run if anything still touches the real `~/.cache/loco`: an audit hook
sees every Python-level file access under it, and its listing is compared before and
after the session (for C++ readers such as tensorstore).
JAX sees 8 CPU devices, so mesh tests run in-process. The in-process runs share one
persistent compilation cache with the loco.main runs the tests start (`~/.cache/loco/jax`
of the temporary HOME), so a program that many tests build compiles once per session.
"""

import os
import sys
import sysconfig
import tempfile

import pytest

_REAL_HOME = os.path.realpath(os.path.expanduser('~'))
_REAL_CACHE = os.path.join(_REAL_HOME, '.cache', 'loco')
_TEST_HOME = tempfile.mkdtemp(prefix='loco-test-home-')
os.environ['HOME'] = _TEST_HOME            # subprocesses started by tests inherit it
os.environ.pop('LOCO_DATA_DIR', None)
os.environ.setdefault('MPLCONFIGDIR', os.path.join(_TEST_HOME, '.config', 'matplotlib'))
# Hugging Face's caches under the temporary HOME too (HF_HOME, when set, would win over
# HOME), and its libraries never reach the network: tests make their datasets locally.
os.environ['HF_HOME'] = os.path.join(_TEST_HOME, '.cache', 'huggingface')
os.environ.pop('HF_DATASETS_CACHE', None)
os.environ['HF_HUB_OFFLINE'] = os.environ['HF_DATASETS_OFFLINE'] = '1'

_touched: list[tuple[str, str]] = []
_guard_listing = False   # the guard's own listing of the real cache is not a touch
_AUDITED = {'open', 'os.listdir', 'os.scandir', 'os.mkdir', 'os.rename', 'os.remove',
            'os.rmdir', 'os.chmod', 'os.utime', 'os.truncate', 'shutil.rmtree',
            'shutil.copytree', 'shutil.move', 'glob.glob'}


def _audit(event: str, args: tuple) -> None:
  if _guard_listing or event not in _AUDITED or not args:
    return
  path = args[0]
  if isinstance(path, bytes):
    path = path.decode(errors='replace')
  if isinstance(path, str) and os.path.abspath(path).startswith(_REAL_CACHE):
    _touched.append((event, path))


def _listing(root: str) -> list[tuple[str, int]]:
  out = []
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      try:
        out.append((path, os.stat(path).st_mtime_ns))
      except OSError:
        pass
  return sorted(out)


_BEFORE = _listing(_REAL_CACHE)
sys.addaudithook(_audit)

import chex  # noqa: E402  (after HOME is redirected)
from absl import logging  # noqa: E402

# Eight CPU devices for the mesh tests (chex sets XLA_FLAGS before JAX starts; unused
# devices cost nothing, and one-device code runs on the first). A subprocess that sets
# its own device count keeps it.
if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
  chex.set_n_cpu_devices(8)

logging.set_verbosity(logging.WARNING)

os.environ.pop('LOCO_JAX_CACHE', None)     # loco's default folder, under the temporary HOME
from loco.run import step  # noqa: E402

step.enable_compilation_cache()


def pytest_sessionfinish(session, exitstatus):
  """Fails the run if this process touched the real cache (the audit hook saw it). A
  change of its listing that the hook did not see is only reported: another process on
  the machine (a run in another terminal) may have written it, and a C++ reader of this
  process cannot get there without a path from Python, which the hook sees."""
  del exitstatus
  global _guard_listing
  _guard_listing = True
  if _touched:
    what = ', '.join(f'{event} {path}' for event, path in _touched[:5])
    sys.stderr.write(f'\nconftest guard: a test touched the real {_REAL_CACHE} ({what}); '
                     'tests must use temporary data dirs and workdirs.\n')
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
  elif _listing(_REAL_CACHE) != _BEFORE:
    sys.stderr.write(f'\nconftest guard: {_REAL_CACHE} changed while the tests ran, not '
                     'through this process (another process on the machine wrote it); '
                     'not a failure.\n')


@pytest.fixture(scope='session')
def small_corpus_glob() -> str:
  """About 400 KB of real text: the email package of the standard library."""
  stdlib = sysconfig.get_paths()['stdlib']
  return os.path.join(stdlib, 'email', '*.py')


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture
def in_repo():
  """The repository root as the working directory (config paths are relative to it)."""
  cwd = os.getcwd()
  os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  yield
  os.chdir(cwd)


@pytest.fixture
def nano_config(small_corpus_glob, data_dir):
  from tests.nano import make_nano_config
  return make_nano_config(small_corpus_glob, data_dir)


# The slow tier, rotated through the default run. `pytest` over the whole suite with no
# -m runs the fast tier plus one share of the slow tests (tests/tiers.py packs them by
# their measured times): the UTC day's number modulo the number of shares, so CI runs
# every slow test once every few days and a failure names the share that reproduces it.
# `-m slow` runs the whole tier, `-m "not slow"` none of it, `--slow-share=K/N` share K
# of N, `--slow-share=none` none; a run of chosen files or tests gets the fast tier.
_share_note: list[str] = []


def pytest_addoption(parser):
  parser.addoption('--slow-share', default='auto',
                   help="the share of the slow tests a run without -m adds: 'auto' (the "
                        "UTC day's), 'K/N' (share K of N) or 'none'")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  slow = [item for item in items if item.get_closest_marker('slow')]
  whole_suite = [os.path.normpath(a) for a in config.args] == config.getini('testpaths')
  if config.option.markexpr:          # an explicit -m decides alone
    return
  if not whole_suite:                 # a run of chosen files or tests: the fast tier
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if not item.get_closest_marker('slow')]
    return
  import datetime
  from tests import tiers
  choice = config.getoption('--slow-share')
  seconds = tiers.measured()
  shares = tiers.slow_shares([item.nodeid for item in slow], seconds)
  if choice == 'none':
    keep = set()
  else:
    if choice == 'auto':
      k, n = datetime.datetime.now(datetime.timezone.utc).toordinal() % len(shares), len(shares)
    else:
      try:
        k, n = (int(x) for x in choice.split('/'))
      except ValueError:
        raise pytest.UsageError(f"--slow-share takes 'auto', 'K/N' or 'none', got {choice!r}")
      if n != len(shares) or not 0 <= k < n:
        raise pytest.UsageError(f'--slow-share={choice}: the slow tier has {len(shares)} '
                                f'shares, numbered 0 to {len(shares) - 1}')
    keep = set(shares[k])
    if slow:
      _share_note.append(f'slow tier: share {k}/{n} ({len(keep)} of {len(slow)} slow tests; '
                         f'again with --slow-share={k}/{n}, all with -m slow)')
  deselected = [item for item in slow if item.nodeid not in keep]
  if deselected:
    config.hook.pytest_deselected(items=deselected)
    dropped = {id(item) for item in deselected}
    items[:] = [item for item in items if id(item) not in dropped]


def pytest_terminal_summary(terminalreporter):
  for line in _share_note:
    terminalreporter.write_line(line)


@pytest.fixture
def full_stdlib():
  """Skips a test that reads the size or make-up of a full standard library, saying
  why, on a Python whose library is partial (Debian's python3.11 without its test
  suite); loco warns on such a Python and trains on what is there."""
  from loco.data import corpus
  spec = corpus.stdlib_spec()
  if corpus.stdlib_is_partial(spec):
    pytest.skip(corpus.partial_stdlib_note(spec))

