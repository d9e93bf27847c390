"""Tests run as on a new machine: a temporary HOME, and a guard on the real home cache."""

import os
import shutil

import pytest

from loco import data as data_lib

pytest_plugins = ('pytester',)
_CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'conftest.py')


def test_home_and_default_data_dir_are_temporary():
  home = os.path.expanduser('~')
  assert os.path.basename(home).startswith('loco-test-home-')
  assert 'LOCO_DATA_DIR' not in os.environ
  assert data_lib.DataConfig().resolved_data_dir.startswith(home)


@pytest.mark.slow
@pytest.mark.parametrize('where,fails', [('.cache/loco/tfds', True), ('.cache/other', False)])
def test_guard_fails_the_run_that_touches_the_home_cache(pytester, where, fails):
  # The inner session's real home is this session's temporary one.
  path = os.path.join(os.path.expanduser('~'), where)
  shutil.copy(_CONFTEST, pytester.path / 'conftest.py')
  pytester.makepyfile(test_touch=f'import os\n\ndef test_touch():\n'
                                 f'  os.makedirs({path!r}, exist_ok=True)\n')
  result = pytester.runpytest_subprocess('-p', 'no:cacheprovider')
  assert (result.ret != 0) == fails, result.stderr.str()
  assert ('conftest guard' in result.stderr.str()) == fails


@pytest.mark.slow
def test_guard_does_not_fail_for_another_process_writing_the_home_cache(pytester):
  """A run in another terminal that writes ~/.cache/loco while the tests run (here a
  subprocess, which the audit hook of the test process does not see) is reported, not a
  failure; the same write by the test process itself fails the run."""
  cache = os.path.join(os.path.expanduser('~'), '.cache', 'loco')
  os.makedirs(cache, exist_ok=True)
  shutil.copy(_CONFTEST, pytester.path / 'conftest.py')
  target = os.path.join(cache, 'written-by-another-process.txt')
  pytester.makepyfile(test_other=(
      'import subprocess, sys\n\ndef test_other():\n'
      f'  subprocess.run([sys.executable, "-c", "open({target!r}, \'w\').write(\'x\')"], '
      'check=True)\n'))
  result = pytester.runpytest_subprocess('-p', 'no:cacheprovider')
  assert result.ret == 0, result.stderr.str()
  assert 'not through this process' in result.stderr.str()
  assert os.path.exists(target)
  pytester.makepyfile(test_other=f'def test_other():\n  open({target!r}, "a").write("y")\n')
  result = pytester.runpytest_subprocess('-p', 'no:cacheprovider')
  assert result.ret != 0 and 'a test touched the real' in result.stderr.str()
