"""Reading a compiled program's collectives: the one HLO parser the tests share.

`jitted.lower(*args).compile().as_text()` is XLA's optimized HLO; each collective is a
line `%name = SHAPES KIND(...)` (or KIND-start for an asynchronous one), SHAPES a shape
such as `f32[8,5]{1,0}` or a tuple of them.
"""

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
