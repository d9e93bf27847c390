"""loco/colab.py: the notebook's install keeps a runtime's jax and jaxlib when they satisfy
loco, and installs the accelerator's build when they do not."""

import os
import subprocess
import sys
import sysconfig

import pytest

from loco import colab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRES = colab.Requirement('jax>=0.10')


def test_the_requirement_is_read_from_pyproject():
  assert str(colab.jax_requirement(REPO)).startswith('jax>=')


def test_jax_and_jaxlib_that_satisfy_loco_are_pinned():
  pins, extras, reason = colab.plan(REQUIRES, {'jax': '0.10.2', 'jaxlib': '0.10.1'}, 'tpu')
  assert pins == {'jax': '0.10.2', 'jaxlib': '0.10.1'} and extras == []
  assert 'kept' in reason


@pytest.mark.parametrize('installed,device,extras', [
    ({'jax': '0.4.30', 'jaxlib': '0.4.30'}, 'tpu', ['jax[tpu]>=0.10']),
    ({'jax': '0.4.30', 'jaxlib': '0.4.30'}, 'gpu', ['jax[cuda12]>=0.10']),
    ({'jax': None, 'jaxlib': None}, 'gpu', ['jax[cuda12]>=0.10']),
    ({'jax': '0.10.2', 'jaxlib': None}, 'tpu', ['jax[tpu]>=0.10']),   # no backend at all
    ({'jax': '0.4.30', 'jaxlib': '0.4.30'}, None, []),               # a CPU runtime: plain
])
def test_an_old_or_absent_jax_is_replaced_by_the_accelerators_build(installed, device, extras):
  pins, got, reason = colab.plan(REQUIRES, installed, device)
  assert pins == {} and got == extras
  assert 'does not satisfy' in reason


def test_the_dry_run_pins_this_environments_jax(capsys):
  assert colab.install(REPO, dry_run=True) == 0
  out = capsys.readouterr().out
  versions = colab.installed_versions()
  assert f"jax {versions['jax']} and jaxlib {versions['jaxlib']} satisfy loco" in out
  assert ' -c ' in out and '-e ' + REPO in out


def test_a_directory_that_is_not_a_checkout_is_one_line(tmp_path):
  out = subprocess.run([sys.executable, os.path.join(REPO, 'loco', 'colab.py'), str(tmp_path)],
                       capture_output=True, text=True, check=False)
  assert out.returncode == 2 and out.stderr.count('\n') == 1
  assert out.stderr.startswith('loco/colab.py: error: ') and 'not a loco checkout' in out.stderr


@pytest.mark.slow
def test_an_install_beside_an_installed_jax_keeps_it(tmp_path):
  # A new environment that already has jax (this one's packages, as a runtime's
  # preinstalled ones): the install adds loco and leaves jax where and as it was.
  env = tmp_path / 'env'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(env)], check=True)
  python = str(env / 'bin' / 'python')
  site = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                        capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(site, 'runtime.pth'), 'w') as f:
    f.write(sysconfig.get_paths()['purelib'] + '\n')
  probe = ('import importlib.metadata as m, jax; '
           'print(jax.__file__, m.version("jax"), m.version("jaxlib"))')
  before = subprocess.run([python, '-c', probe], capture_output=True, text=True,
                          check=True, cwd=tmp_path).stdout.split()
  out = subprocess.run([python, os.path.join(REPO, 'loco', 'colab.py'), REPO,
                        '--no_build_isolation'], capture_output=True, text=True, check=False,
                       env=dict(os.environ, PIP_NO_INDEX='1'))
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'kept, pinned while loco installs' in out.stdout
  after = subprocess.run([python, '-c', probe], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.split()
  assert after == before
  installed = subprocess.run([python, '-c', 'import importlib.metadata as m; '
                              'print(m.distribution("loco-sim").locate_file(""))'],
                             capture_output=True, text=True, check=True,
                             cwd=tmp_path).stdout.strip()
  assert installed.startswith(str(env))
  assert not any(p.name.startswith(('jax-', 'jaxlib-')) for p in os.scandir(site))
