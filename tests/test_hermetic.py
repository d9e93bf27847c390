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
