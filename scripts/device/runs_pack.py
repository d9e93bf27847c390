"""Moves a study's ended runs between this machine and a GPU host, without checkpoints.

  python scripts/device/runs_pack.py pack --runs=runs/claims70 --dest=.whl/claims_from.tgz
  python scripts/device/runs_pack.py merge --runs=runs/claims70 --src OUT/claims_runs*.tgz
  python scripts/device/runs_pack.py pack --runs=runs/claims70 --dest=results/claims70
  python scripts/device/runs_pack.py merge --runs=runs/claims70 --src results/claims70

A run travels when it has ended: finished, or diverged (diverged.json). A finished run
under a `final/` folder travels only once `loco.evaluate` has scored its last step (its
model stays behind, so it could not be scored where it lands). Checkpoints, event files
and locks never travel. `pack --newer=FILE` packs only the runs whose status.json is
newer than FILE (what a lease trained). `merge` unpacks into --runs every packed run that
has not ended there, replacing an unfinished copy (its checkpoints included: they belong
to a run that the packed one supersedes), and keeps the runs that ended there. A pack
past --part_mb MB goes on in DEST-2.tgz, DEST-3.tgz, ... (a host returns files up to a
size); merge takes them all. A DEST or SRC that does not end in .tgz is a plain folder of
the same files instead: `results/claims70` keeps a study's ended runs in the repository,
so a fresh checkout merges them and goes on where the last machine stopped (each pack
copies only the runs that are new there).

Stop the study (`launch.claims`) before a merge: it must not train a run being replaced.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
from typing import Sequence

from loco.errors import LocoError
from loco.files import runs as runs_lib

PROG = 'runs_pack.py'
SKIP = ('checkpoints', 'tensorboard', '.lock')
FINALS = 'final'
# Plain files and folders inside the destination only (tarfile's 'data' filter).
SAFE = {'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}


def _last_step(workdir: str) -> int | None:
  rows = runs_lib.read_metrics(workdir).rows
  return rows[-1]['step'] if rows else None


def ended(workdir: str, rel: str) -> bool:
  """Whether the run at `workdir` (`rel` inside the study) may travel."""
  if runs_lib.read_diverged(workdir) is not None:
    return True
  if (runs_lib.read_status(workdir) or {}).get('state') != 'finished':
    return False
  if FINALS not in rel.split(os.sep):
    return True
  evals = os.path.join(workdir, 'evals')
  step = _last_step(workdir)
  return os.path.isdir(evals) and step is not None and any(
      (runs_lib.read_json_object(os.path.join(evals, f)) or {}).get('step') == step
      for f in os.listdir(evals) if f.endswith('.json'))


def workdirs(root: str) -> list[str]:
  """Every run folder (one with a status.json) under `root`, relative to it."""
  found = []
  for here, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.endswith('.part'))
    if runs_lib.STATUS in files:     # a run: what is inside it travels with it
      found.append(os.path.relpath(here, root))
      dirs[:] = []
  return found


def part_path(dest: str, i: int) -> str:
  """The i-th archive (from 1) of a pack: DEST, then DEST's stem with -2, -3, ..."""
  if i == 1:
    return dest
  stem, ext = (dest[:-4], '.tgz') if dest.endswith('.tgz') else (dest, '')
  return f'{stem}-{i}{ext}'


def archive(path: str) -> bool:
  """Whether `path` names a gzip tar archive (else a plain folder)."""
  return path.endswith(('.tgz', '.tar.gz'))


def _ignore(_, names):
  return [n for n in names if n in SKIP]


def copy_run(src: str, dest: str) -> None:
  """Copies the run folder `src` to `dest` without its models, replacing any copy there
  only once the new one is whole."""
  tmp = dest.rstrip(os.sep) + '.part'
  if os.path.isdir(tmp):
    shutil.rmtree(tmp)
  shutil.copytree(src, tmp, ignore=_ignore)
  if os.path.isdir(dest):
    shutil.rmtree(dest)
  os.replace(tmp, dest)


def copy_runs(src: str, rels: Sequence[str], dest: str) -> tuple[int, int, int]:
  """Copies each run `rels` of folder `src` into folder `dest` unless it has ended there;
  returns (added, replaced, kept)."""
  added = replaced = kept = 0
  for rel in rels:
    target = os.path.join(dest, rel)
    if os.path.isdir(target) and ended(target, rel):
      kept += 1
      continue
    replaced += os.path.isdir(target)
    added += not os.path.isdir(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    copy_run(os.path.join(src, rel), target)
  return added, replaced, kept


def pack(runs: str, dest: str, newer: str | None = None, part_mb: float = 15.0
         ) -> tuple[int, list[str]]:
  """Packs the ended runs under `runs` into `dest`, starting another archive
  (`part_path`) once one passes `part_mb` MB compressed (a host returns files up to a
  size); returns (runs packed, the archives). A `dest` that is not a .tgz is a folder:
  the runs not already ended there are copied into it."""
  since = os.path.getmtime(newer) if newer else None
  chosen = [rel for rel in workdirs(runs) if ended(os.path.join(runs, rel), rel) and (
      since is None or os.path.getmtime(os.path.join(runs, rel, runs_lib.STATUS)) > since)]
  if not archive(dest):
    copy_runs(runs, chosen, dest)
    return len(chosen), [dest]
  os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
  parts: list[str] = []

  def start():
    parts.append(part_path(dest, len(parts) + 1))
    raw = open(parts[-1] + '.part', 'wb')
    return raw, tarfile.open(fileobj=raw, mode='w:gz')

  raw, tar = start()
  held = 0            # runs in the current archive
  for rel in chosen:
    if held and raw.tell() > part_mb * 1e6:
      tar.close()
      raw.close()
      raw, tar = start()
      held = 0
    held += 1
    tar.add(os.path.join(runs, rel), arcname=rel,
            filter=lambda t: None if os.path.basename(t.name) in SKIP else t)
  tar.close()
  raw.close()
  for i in range(len(parts) + 1, len(parts) + 100):     # a smaller earlier pack's parts
    if os.path.exists(part_path(dest, i)):
      os.remove(part_path(dest, i))
  for p in parts:
    os.replace(p + '.part', p)
  return len(chosen), parts


def merge(runs: str, src: str) -> tuple[int, int, int]:
  """Unpacks into `runs` the packed runs that have not ended there; returns (added,
  replaced, kept). A `src` that is not a .tgz is a folder (`pack` into a folder)."""
  if not archive(src):
    return copy_runs(src, workdirs(src), runs)
  with tarfile.open(src) as tar:
    members = tar.getmembers()
    for m in members:
      parts = m.name.split('/')
      if m.name.startswith('/') or '..' in parts or not (m.isfile() or m.isdir()):
        raise ValueError(f'{src} holds {m.name!r}, which is not a plain path inside it.')
    packed = sorted({os.path.dirname(m.name) for m in members
                     if os.path.basename(m.name) == runs_lib.STATUS})
    packed = [p for p in packed if not any(p.startswith(q + '/') for q in packed if q != p)]
    added = replaced = kept = 0
    for rel in packed:
      target = os.path.join(runs, rel)
      if os.path.isdir(target) and ended(target, rel):
        kept += 1
        continue
      if os.path.isdir(target):
        shutil.rmtree(target)
        replaced += 1
      else:
        added += 1
      for m in members:
        if m.name == rel or m.name.startswith(rel + '/'):
          tar.extract(m, runs, **SAFE)
  return added, replaced, kept


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='what', required=True)
  p = sub.add_parser('pack')
  p.add_argument('--runs', required=True)
  p.add_argument('--dest', required=True, help='a .tgz archive, or else a folder')
  p.add_argument('--newer', help='only runs whose status.json is newer than this file')
  p.add_argument('--part_mb', type=float, default=15.0,
                 help='start another archive (DEST-2.tgz, ...) past this many MB')
  m = sub.add_parser('merge')
  m.add_argument('--runs', required=True)
  m.add_argument('--src', required=True, nargs='+',
                 help='one archive or more (parts), or a folder')
  args = parser.parse_args(argv)
  try:
    if args.what == 'merge':
      for src in args.src:
        if archive(src) and not os.path.isfile(src):
          raise ValueError(f'--src {src} is not a file.')
        if not archive(src) and not os.path.isdir(src):
          raise ValueError(f'--src {src} is neither a .tgz archive nor a directory.')
      os.makedirs(args.runs, exist_ok=True)
    if not os.path.isdir(args.runs):
      raise ValueError(f'--runs {args.runs} is not a directory.')
    folders = [f for f in (args.src if args.what == 'merge' else [args.dest])
               if not archive(f)]
    for f in folders:
      a, b = os.path.realpath(f), os.path.realpath(args.runs)
      if os.path.commonpath([a, b]) in (a, b):
        raise ValueError(f'{f} and --runs {args.runs} overlap: the kept runs go in a '
                         'folder of their own.')
    if args.what == 'pack':
      if args.newer and not os.path.exists(args.newer):
        raise ValueError(f'--newer {args.newer} does not exist.')
      if not args.part_mb > 0:
        raise ValueError(f'--part_mb must be positive, got {args.part_mb}.')
      n, parts = pack(args.runs, args.dest, args.newer, args.part_mb)
      print(f'{PROG}: packed {n} ended runs of {args.runs} into {", ".join(parts)}')
    else:
      for src in args.src:
        args.current = src
        added, replaced, kept = merge(args.runs, src)
        print(f'{PROG}: {src}: {added} runs added to {args.runs}, {replaced} unfinished '
              f'ones replaced, {kept} kept (they had ended here)')
  except tarfile.TarError as e:     # its message spans lines
    print(f'{PROG}: error: {getattr(args, "current", args.runs)} is not a readable gzip '
          f'tar archive ({type(e).__name__}).', file=sys.stderr)
    return 1
  except (ValueError, OSError, LocoError) as e:     # LocoError: a damaged run file
    print(f'{PROG}: error: {e}', file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(f'{PROG}: error: interrupted.', file=sys.stderr)
    return 130
  return 0


if __name__ == '__main__':
  sys.exit(main())
