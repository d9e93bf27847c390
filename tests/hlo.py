"""Reading a compiled program's collectives: the one HLO parser the tests share.

`jitted.lower(*args).compile().as_text()` is XLA's optimized HLO; each collective is a
line `%name = SHAPES KIND(...)` (or KIND-start for an asynchronous one), SHAPES a shape
such as `f32[8,5]{1,0}` or a tuple of them.
"""

import functools
import re

import numpy as np

KINDS = ('collective-permute', 'all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all')
_OP = re.compile(r'=\s*(\(?[^=]*?\)?)\s+(' + '|'.join(KINDS) + r')(?:-start)?\(')
_SHAPE = re.compile(r'(f64|f32|bf16|f16|s32|u32|pred|s8|u8)\[([\d,]*)\]')
_BYTES = {'f64': 8, 'f32': 4, 's32': 4, 'u32': 4, 'bf16': 2, 'f16': 2, 'pred': 1, 's8': 1,
          'u8': 1}
_FLOAT = ('f64', 'f32', 'bf16', 'f16')


def ops(hlo: str) -> list[tuple[str, str]]:
  """(kind, result shapes text) of each collective, in program order."""
  return [(kind, shapes) for shapes, kind in _OP.findall(re.sub(r'/\*.*?\*/', '', hlo))]


def kinds(hlo: str) -> set[str]:
  """The kinds of collective in the program."""
  return {kind for kind, _ in ops(hlo)}


def float_kinds(hlo: str) -> set[str]:
  """The kinds of collective that move floating-point data."""
  return {kind for kind, shapes in ops(hlo)
          if any(t in _FLOAT for t, _ in _SHAPE.findall(shapes))}


def collectives(hlo: str) -> list[tuple[str, int]]:
  """(kind, result bytes) of each collective."""
  return [(kind, sum(_BYTES[t] * int(np.prod([int(d) for d in dims.split(',') if d] or [1]))
                     for t, dims in _SHAPE.findall(shapes)))
          for kind, shapes in ops(hlo)]


_HEADER = re.compile(r'^(ENTRY )?%?([\w.\-]+) \(.*\{\s*$')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TWO_WAY = re.compile(r'true_computation=%?([\w.\-]+), false_computation=%?([\w.\-]+)')
_CALLED = re.compile(r'(?:calls|to_apply|body)=%?([\w.\-]+)')


def _computations(hlo: str) -> tuple[dict[str, str], str]:
  """{name: body text} of the program's computations, and the entry's name."""
  bodies, entry, name, lines = {}, None, None, []
  for line in re.sub(r'/\*.*?\*/', '', hlo).splitlines():
    header = _HEADER.match(line)
    if header and name is None:
      name, lines = header.group(2), []
      entry = name if header.group(1) else entry
    elif name is not None and line.startswith('}'):
      bodies[name], name = '\n'.join(lines), None
    elif name is not None:
      lines.append(line)
  return bodies, entry


def executed(hlo: str) -> list[tuple[str, int]]:
  """(kind, result bytes) of the collectives one execution runs at most: the entry's,
  what it calls, and of each conditional (`lax.cond`, `lax.switch`) only its heaviest
  branch, since one branch runs; `collectives` counts every branch."""
  bodies, entry = _computations(hlo)

  @functools.cache
  def run(name: str) -> tuple[tuple[str, int], ...]:
    body = bodies.get(name, '')
    out = list(collectives(body))
    for line in body.splitlines():
      branches = _BRANCHES.search(line)
      two_way = _TWO_WAY.search(line)
      names = ([b.strip().lstrip('%') for b in branches.group(1).split(',')] if branches
               else list(two_way.groups()) if two_way else [])
      if names:
        out += max((run(b) for b in names), key=lambda ops: sum(n for _, n in ops))
      for callee in _CALLED.findall(line):
        out += run(callee)
    return tuple(out)
  return list(run(entry))
