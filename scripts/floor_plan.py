"""The floor plan of the code: its import graph, read from the sources (nothing imported).

  python scripts/floor_plan.py [--rooms=folders|files] [--long=80]

A room is a module of loco/ (with --rooms=folders, the default, a sub-package of loco/
and each of experiments/, launch/ and scripts/ is one room; with --rooms=files every
file is a room). An arrow is "room A imports room B" (imports inside functions
included, and counted apart). A room stands one floor above the highest room it
imports; the ground floor imports nothing of the project. A circle is a set of rooms
that import each other around a loop (its rooms share a floor). Prints the measures a
newcomer feels: rooms, floors, arrows, circles, the longest way down, top-level modules
of loco/, the functions longer than --long lines, in-function imports, and calls into
train.py's private helpers from outside it.
"""

import argparse
import ast
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ('loco', 'experiments', 'launch', 'scripts')


def sources(root: str = ROOT) -> list[str]:
  """The project's Python files, relative to root (tests and notebooks excluded)."""
  out = []
  for top in TOP:
    for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
      dirnames[:] = sorted(d for d in dirnames if not d.startswith(('.', '__')))
      out += [os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(files)
              if f.endswith('.py')]
  return out


def module_of(path: str) -> str:
  """'loco/data/c4.py' -> 'loco.data.c4'; a package's __init__ is the package."""
  parts = path[:-3].split(os.sep)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def room_of(module: str, rooms: str) -> str:
  parts = module.split('.')
  if rooms == 'files':
    return module
  if parts[0] != 'loco':
    return parts[0] + '/'
  if len(parts) >= 2 and parts[1] in _PACKAGES:
    return f'loco.{parts[1]}/'
  return module


_PACKAGES: set[str] = set()


def _imported(tree: ast.AST, module: str, is_package: bool, known: set[str]):
  """Yields (imported project module, inside a function?) for each import of `tree`."""
  package = module if is_package else module.rpartition('.')[0]

  def resolve(name: str) -> str | None:
    while name and name not in known:
      name = name.rpartition('.')[0]
    return name or None

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
      if isinstance(child, ast.Import):
        for alias in child.names:
          if resolve(alias.name):
            yield resolve(alias.name), inside
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ''
        if child.level:
          up = package.split('.')[:len(package.split('.')) - child.level + 1]
          base = '.'.join(up + ([base] if base else []))
        for alias in child.names:
          target = resolve(f'{base}.{alias.name}') or resolve(base)
          if target:
            yield target, inside
      else:
        yield from visit(child, inside)

  yield from visit(tree, False)


def graph(rooms: str = 'folders', root: str = ROOT):
  """(arrows {room: set of rooms}, lazy count, the parsed trees by path)."""
  paths = sources(root)
  _PACKAGES.clear()
  _PACKAGES.update(p.split(os.sep)[1] for p in paths
                   if p.startswith('loco' + os.sep) and p.count(os.sep) >= 2)
  known = {module_of(p) for p in paths}
  arrows = collections.defaultdict(set)
  lazy = collections.Counter()
  trees = {}
  for path in paths:
    with open(os.path.join(root, path)) as f:
      trees[path] = tree = ast.parse(f.read(), path)
    module = module_of(path)
    here = room_of(module, rooms)
    arrows[here]
    for target, inside in _imported(tree, module, path.endswith('__init__.py'), known):
      there = room_of(target, rooms)
      if there != here:
        arrows[here].add(there)
      if inside and target.startswith('loco'):
        lazy[path] += 1
  return dict(arrows), lazy, trees


def circles(arrows) -> list[list[str]]:
  """The strongly connected sets of more than one room (Tarjan's algorithm)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def connect(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(arrows.get(v, ())):
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = []
      while True:
        w = stack.pop()
        on.discard(w)
        group.append(w)
        if w == v:
          break
      if len(group) > 1:
        out.append(sorted(group))

  sys.setrecursionlimit(10000)
  for v in sorted(arrows):
    if v not in index:
      connect(v)
  return out


def floors(arrows) -> tuple[dict[str, int], list[str]]:
  """({room: floor}, the longest way down); rooms of a circle share a floor."""
  group = {v: v for v in arrows}
  for c in circles(arrows):
    for v in c:
      group[v] = c[0]
  down = collections.defaultdict(set)
  for v, ws in arrows.items():
    for w in ws:
      if group[v] != group[w]:
        down[group[v]].add(group[w])
  floor, below = {}, {}

  def height(g):
    if g not in floor:
      floor[g], below[g] = 1, None
      for w in sorted(down[g]):
        if height(w) + 1 > floor[g]:
          floor[g], below[g] = floor[w] + 1, w
    return floor[g]

  for g in set(group.values()):
    height(g)
  top = max(floor, key=lambda g: (floor[g], g))
  path = [top]
  while below[path[-1]] is not None:
    path.append(below[path[-1]])
  return {v: floor[group[v]] for v in arrows}, path


def long_functions(trees, limit: int) -> list[tuple[int, str]]:
  out = []
  for path, tree in trees.items():
    if not path.startswith('loco'):
      continue
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        if length > limit:
          out.append((length, f'{path}:{node.lineno} {node.name}'))
  return sorted(out, reverse=True)


def private_train_calls(trees) -> list[str]:
  """Uses of train.py's private names (`train._x`) outside loco/run/train.py."""
  out = []
  for path, tree in trees.items():
    if path == os.path.join('loco', 'run', 'train.py'):
      continue
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id == 'train' and node.attr.startswith('_')):
        out.append(f'{path}:{node.lineno} train.{node.attr}')
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='scripts/floor_plan.py', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--rooms', choices=('folders', 'files'), default='folders')
  parser.add_argument('--long', type=int, default=80, help='a long function has more lines')
  args = parser.parse_args(argv)
  arrows, lazy, trees = graph(args.rooms)
  floor, way = floors(arrows)
  top_level = [p for p in trees if p.startswith('loco' + os.sep) and p.count(os.sep) == 1
               and not p.endswith('__init__.py')]
  longs = long_functions(trees, args.long)
  private = private_train_calls(trees)
  print(f'rooms {len(arrows)} ({args.rooms}), floors {max(floor.values())}, arrows '
        f'{sum(len(w) for w in arrows.values())}, circles {len(circles(arrows))}')
  for c in circles(arrows):
    print('  circle: ' + ' -> '.join(c))
  print('longest way down: ' + ' -> '.join(way))
  for level in range(max(floor.values()), 0, -1):
    print(f'  floor {level:2d}: ' + ', '.join(sorted(r for r in floor if floor[r] == level)))
  print(f'top-level modules of loco/: {len(top_level)}; files of loco/: '
        f'{sum(p.startswith("loco" + os.sep) for p in trees)}; lines of loco/: '
        f'{sum(open(os.path.join(ROOT, p)).read().count(chr(10)) for p in trees if p.startswith("loco" + os.sep)):,}')
  print(f'in-function imports of loco modules: {sum(lazy.values())} '
        f'({", ".join(f"{p} {n}" for p, n in lazy.most_common(4))})')
  print(f'functions of loco/ longer than {args.long} lines: {len(longs)}')
  for length, where in longs:
    print(f'  {length:4d}  {where}')
  print(f"uses of train.py's private helpers outside it: {len(private)}")
  for where in private[:20]:
    print(f'  {where}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
