"""The config reference: every key's type, default, range and meaning, from where each is
declared (the comments of loco/configs/default.py, `configs.CONSTRAINTS`, and the
algorithm specs' `Key`s). The documentation site's config page is `markdown()`.
"""

import dataclasses
import inspect
import io
import re
import tokenize
from typing import Any

from ml_collections import config_dict

_ASSIGNMENT = re.compile(r'^(\s*)c\.([\w.]+)\s*=')


@dataclasses.dataclass(frozen=True)
class KeyDoc:
  key: str            # the dotted path, e.g. 'optimizer.lr'
  kind: str           # int | float | str | bool | list
  default: str        # the base config's value, or each algorithm's default
  rule: str           # the value rule of loco.ranges ('>= 1', 'in [0, 1)'), '' if none
  doc: str            # its meaning ('' if undocumented: tests/test_docs.py fails then)


def comments() -> dict[str, str]:
  """The comment of each key that default.py assigns: on its line and the comment lines
  that continue it (no blank line between; indented past the statement or hanging,
  `#   ...`), or else the comment block right above it."""
  from loco.configs import default  # pylint: disable=g-import-not-at-top
  source = inspect.getsource(default)
  lines = source.splitlines()
  trailing: dict[int, str] = {}
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      trailing[token.start[0]] = token.string
  out: dict[str, str] = {}
  for number, line in enumerate(lines, start=1):
    match = _ASSIGNMENT.match(line)
    if not match or 'ConfigDict()' in line:
      continue
    indent = len(match.group(1))
    parts = []
    if number in trailing and not line.lstrip().startswith('#'):
      parts.append(trailing[number])
      below = number + 1
      while below <= len(lines) and lines[below - 1].lstrip().startswith('#'):
        text = lines[below - 1]
        column = len(text) - len(text.lstrip())
        if column <= indent and not text.lstrip().startswith('#  '):
          break
        parts.append(text.strip())
        below += 1
    else:
      above = number - 1
      while above >= 1 and lines[above - 1].lstrip().startswith('#'):
        parts.insert(0, lines[above - 1].strip())
        above -= 1
    text = ' '.join(p.lstrip('#').strip() for p in parts)
    out[match.group(2)] = re.sub(r'\s+', ' ', text).strip()
  return out


def _kind(kind: type) -> str:
  return getattr(kind, '__name__', str(kind))


def _shown(value: Any) -> str:
  return repr(value) if isinstance(value, str) else str(value)


def keys() -> list[KeyDoc]:
  """Every key of the config schema, in the base config's order."""
  from loco import algorithms, configs  # pylint: disable=g-import-not-at-top
  from loco.configs import default  # pylint: disable=g-import-not-at-top
  docs = comments()
  declared = algorithms.config_keys()
  base = default.get_config()
  order = list(docs)
  after_name = order.index('algorithm.name') + 0.5   # the algorithms' keys follow its name
  out = []
  for key, (kind, _) in sorted(configs.schema().items(),
                               key=lambda item: order.index(item[0]) if item[0] in order
                               else after_name):
    section, _, name = key.partition('.')
    if section == 'algorithm' and name in declared:
      spec_key = declared[name]
      by_value: dict[str, list[str]] = {}
      for algorithm, spec in algorithms.REGISTRY.items():
        defaults = spec.defaults()
        if name in defaults:
          by_value.setdefault(_shown(defaults[name]), []).append(algorithm)
      default_text = '; '.join(f'{value} ({", ".join(names)})'
                               for value, names in by_value.items())
      out.append(KeyDoc(key, _kind(spec_key.kind), default_text, spec_key.rule or '',
                        spec_key.doc))
      continue
    value = base
    for part in key.split('.'):
      value = value[part]
    out.append(KeyDoc(key, _kind(kind), _shown(value), configs.CONSTRAINTS.get(key, ''),
                      docs.get(key, '')))
  return out


def _code(text: str) -> str:
  """A code span in a table cell (only its pipes need escaping)."""
  return '`' + text.replace('|', r'\|') + '`'


def _cell(text: str) -> str:
  for c in '\\|<>':   # a pipe ends a cell; <x> would read as HTML
    text = text.replace(c, '\\' + c)
  return text.replace('\n', ' ')


def markdown() -> str:
  """The reference as Markdown tables, one per section of the config."""
  sections: dict[str, list[KeyDoc]] = {}
  for k in keys():
    section = k.key.split('.')[0] if '.' in k.key else ''
    sections.setdefault(section, []).append(k)
  out = []
  for section, rows in sections.items():
    out.append(f'## `{section}`' if section else '## Top-level keys')
    out.append('')
    if section == 'algorithm':
      out.append('Each algorithm takes only its own keys (`loco.algorithms.keys_of`); a '
                 'key left unset takes the default of the algorithm that runs, listed '
                 'here per algorithm (the papers\' values, from the factories).')
      out.append('')
    out.append('| key | type | default | range | meaning |')
    out.append('|---|---|---|---|---|')
    for k in rows:
      rule = _code(k.rule) if k.rule else ''
      out.append(f'| `{k.key}` | {k.kind} | {_code(k.default)} | {rule} | {_cell(k.doc)} |'
                 if section != 'algorithm' else
                 f'| `{k.key}` | {k.kind} | {_cell(k.default)} | {rule} | {_cell(k.doc)} |')
    out.append('')
  return '\n'.join(out)
