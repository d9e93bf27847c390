"""The package: console scripts that resolve, dependencies declared for what loco imports,
and a wheel and source distribution that build and pass `twine check`."""

import ast
import importlib
import importlib.metadata
import os
import subprocess
import sys
import tomllib
import zipfile

import loco

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as _f:
  PROJECT = tomllib.load(_f)['project']


def _name(requirement: str) -> str:
  for stop in '<>=!~[; ':
    requirement = requirement.split(stop)[0]
  return requirement.lower().replace('_', '-')


def test_every_console_script_names_a_command_main():
  scripts = PROJECT['scripts']
  assert {'loco-train', 'loco-sweep', 'loco-report', 'loco-compare', 'loco-retime',
          'loco-evaluate'} <= set(scripts)
  for script, target in scripts.items():
    module, attribute = target.split(':')
    assert callable(getattr(importlib.import_module(module), attribute)), script


def _imports(path: str) -> set[str]:
  """Top-level names of the modules a file imports, outside try blocks (optional ones)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
             for b in t.body + t.handlers for n in ast.walk(b)}
  out = set()
  for node in ast.walk(tree):
    if id(node) in guarded:
      continue
    if isinstance(node, ast.Import):
      out |= {a.name.split('.')[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      out.add(node.module.split('.')[0])
  return out


def test_what_loco_imports_is_declared():
  imported = set()
  for folder, _, files in os.walk(os.path.join(REPO, 'loco')):
    imported |= {m for f in files if f.endswith('.py')
                 for m in _imports(os.path.join(folder, f))}
  third_party = imported - set(sys.stdlib_module_names) - {'loco', 'experiments'}
  declared = {_name(r) for r in PROJECT['dependencies']}
  declared |= {_name(r) for extra in PROJECT['optional-dependencies'].values() for r in extra}
  dists = importlib.metadata.packages_distributions()
  undeclared = sorted(m for m in third_party
                      if not {_name(d) for d in dists.get(m, [m])} & declared)
  assert undeclared == [], f'imported by loco but not in pyproject.toml: {undeclared}'


def test_the_wheel_and_sdist_build_and_pass_twine_check(tmp_path):
  built = subprocess.run([sys.executable, '-m', 'build', '--no-isolation', '--outdir',
                          str(tmp_path), REPO], capture_output=True, text=True, check=False)
  assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
  version = loco.__version__
  wheel = tmp_path / f'loco_sim-{version}-py3-none-any.whl'
  sdist = tmp_path / f'loco_sim-{version}.tar.gz'
  assert wheel.exists() and sdist.exists(), os.listdir(tmp_path)
  checked = subprocess.run([sys.executable, '-m', 'twine', 'check', '--strict', str(wheel),
                            str(sdist)], capture_output=True, text=True, check=False)
  assert checked.returncode == 0, checked.stdout + checked.stderr
  with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    metadata = z.read(f'loco_sim-{version}.dist-info/METADATA').decode()
    entry_points = z.read(f'loco_sim-{version}.dist-info/entry_points.txt').decode()
  assert 'loco/__init__.py' in names and 'experiments/tiny_gasloc.py' in names
  assert not any(n.startswith('tests/') for n in names)
  assert 'Name: loco-sim' in metadata and f'Version: {version}' in metadata
  for requirement in ('scipy', 'etils[epath]'):
    assert f'Requires-Dist: {requirement}' in metadata, requirement
  assert 'loco-train = loco.main:run' in entry_points
