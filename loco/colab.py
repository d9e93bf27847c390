"""Installs loco on a notebook runtime (Colab) without replacing the runtime's JAX.

  python loco/colab.py REPO_DIR [--dry_run] [--no_build_isolation]

A hosted runtime's jax and jaxlib are built for its accelerator (a TPU or a GPU); a plain
`pip install` of loco would replace them with the CPU build from the package index
whenever loco asks for a newer version. The rule:

  1. read the installed versions of jax and jaxlib;
  2. both installed and both satisfying loco's requirement on jax (pyproject.toml):
     install loco with a constraints file that pins them to those versions, so pip keeps
     them (and a dependency that would need another jax fails instead of swapping the
     backend);
  3. otherwise (absent or too old): install loco together with the jax extra of the
     accelerator found (`jax[tpu]` on a TPU runtime, `jax[cuda12]` with an NVIDIA GPU),
     so that the newer jax comes with its backend; on a CPU runtime, plain.

This file runs before loco is installed: it imports the standard library and
`packaging` only (present wherever pip is).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib

try:
  from packaging.requirements import Requirement
  from packaging.version import InvalidVersion, Version
except ImportError:  # pip's own copy
  from pip._vendor.packaging.requirements import Requirement  # type: ignore
  from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore

PROG = 'loco/colab.py'
KEPT = ('jax', 'jaxlib')
EXTRAS = {'tpu': 'jax[tpu]', 'gpu': 'jax[cuda12]'}


def jax_requirement(repo_dir: str) -> Requirement:
  """loco's requirement on jax, from the repository's pyproject.toml."""
  with open(os.path.join(repo_dir, 'pyproject.toml'), 'rb') as f:
    dependencies = tomllib.load(f)['project']['dependencies']
  for line in dependencies:
    requirement = Requirement(line)
    if requirement.name == 'jax':
      return requirement
  raise ValueError(f'{repo_dir}/pyproject.toml does not require jax')


def installed_versions(names=KEPT) -> dict[str, str | None]:
  """The installed version of each distribution (None where it is absent)."""
  out = {}
  for name in names:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def accelerator() -> str | None:
  """'tpu', 'gpu' or None (CPU), from what the runtime shows without importing JAX."""
  if (os.environ.get('COLAB_TPU_ADDR') or os.environ.get('TPU_ACCELERATOR_TYPE')
      or os.path.exists('/dev/accel0') or os.path.exists('/dev/vfio/0')):
    return 'tpu'
  if shutil.which('nvidia-smi') or os.path.exists('/dev/nvidia0'):
    return 'gpu'
  return None


def satisfies(requirement: Requirement, version: str | None) -> bool:
  if version is None:
    return False
  try:
    return requirement.specifier.contains(Version(version), prereleases=True)
  except InvalidVersion:
    return False


def plan(requirement: Requirement, installed: dict[str, str | None],
         device: str | None) -> tuple[dict[str, str], list[str], str]:
  """The rule: (pins for a constraints file, extra requirements, the reason in words).

  Args:
    requirement: loco's requirement on jax (`jax>=0.10`).
    installed: the installed versions of jax and jaxlib (None: absent).
    device: the runtime's accelerator, 'tpu', 'gpu' or None.
  """
  jax, jaxlib = installed.get('jax'), installed.get('jaxlib')
  if satisfies(requirement, jax) and jaxlib is not None and satisfies(requirement, jaxlib):
    return ({'jax': jax, 'jaxlib': jaxlib}, [],
            f'the installed jax {jax} and jaxlib {jaxlib} satisfy loco ({requirement}): '
            'kept, pinned while loco installs')
  have = f'jax {jax}' if jax else 'no jax'
  if device in EXTRAS:
    extra = f'{EXTRAS[device]}{requirement.specifier}'
    return ({}, [extra], f'{have} does not satisfy loco ({requirement}): installing '
                         f'{extra} for the {device.upper()} with loco')
  return {}, [], f'{have} does not satisfy loco ({requirement}): pip installs it with loco'


def install_command(repo_dir: str, constraints: str | None, extras: list[str],
                    no_build_isolation: bool = False) -> list[str]:
  command = [sys.executable, '-m', 'pip', 'install', '-q', '-e', repo_dir, *extras]
  if constraints:
    command += ['-c', constraints]
  if no_build_isolation:
    command.append('--no-build-isolation')
  return command


def install(repo_dir: str, dry_run: bool = False, no_build_isolation: bool = False,
            say=print) -> int:
  """Applies the rule to this Python's environment; returns pip's exit code."""
  pins, extras, reason = plan(jax_requirement(repo_dir), installed_versions(), accelerator())
  say(f'loco: {reason}.')
  with tempfile.TemporaryDirectory() as tmp:
    constraints = None
    if pins:
      constraints = os.path.join(tmp, 'constraints.txt')
      with open(constraints, 'w') as f:
        f.writelines(f'{name}=={version}\n' for name, version in pins.items())
    command = install_command(repo_dir, constraints, extras, no_build_isolation)
    if dry_run:
      say('loco: would run: ' + ' '.join(command))
      return 0
    return subprocess.call(command)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split('\n\n')[0])
  parser.add_argument('repo_dir', help='the loco checkout to install')
  parser.add_argument('--dry_run', action='store_true', help='print the rule and the pip '
                      'command, install nothing')
  parser.add_argument('--no_build_isolation', action='store_true', help="build with this "
                      "environment's setuptools (no network for the build)")
  args = parser.parse_args(argv)
  if not os.path.isfile(os.path.join(args.repo_dir, 'pyproject.toml')):
    print(f'{PROG}: error: {args.repo_dir} is not a loco checkout (no pyproject.toml).',
          file=sys.stderr)
    return 2
  try:
    code = install(args.repo_dir, args.dry_run, args.no_build_isolation)
  except KeyboardInterrupt:
    print(f'{PROG}: stopped: interrupted; run it again to finish the install.',
          file=sys.stderr)
    return 130
  except (OSError, ValueError, tomllib.TOMLDecodeError) as e:
    print(f'{PROG}: error: {e}', file=sys.stderr)
    return 1
  if code:
    print(f'{PROG}: error: pip install ended with exit code {code} (its message is above).',
          file=sys.stderr)
  return code


if __name__ == '__main__':
  sys.exit(main())
