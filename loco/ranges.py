"""Value rules of numeric keys ('>= 1', 'in [0, 1)', ...): one table, one sentence when broken.

Config keys name their rule in `loco.configs.CONSTRAINTS`, algorithm keys in their
`loco.algorithms.spec.Key`; both are checked here.
"""

from typing import Any

from loco.errors import ConfigError

RULES = {
    '>= 0': lambda x: x >= 0,
    '>= 1': lambda x: x >= 1,
    'positive': lambda x: x > 0,
    'in [0, 1]': lambda x: 0 <= x <= 1,
    'in [0, 1)': lambda x: 0 <= x < 1,
    'in (0, 1]': lambda x: 0 < x <= 1,
    'in (0, 1)': lambda x: 0 < x < 1,
    'in [0, 2**32)': lambda x: 0 <= x < 2**32,   # seeds: JAX keys take 32 bits
}


def check(key: str, rule: str | None, value: Any, why: str | None = None) -> None:
  """Raises a one-sentence ConfigError if the number `value` of `key` breaks `rule`
  (with `why`, what a value outside the rule would mean, after a colon).

  None (a key left to its default) and values that are not numbers pass: types are
  checked where the key's type is known.
  """
  if rule is None or value is None or isinstance(value, bool):
    return
  if isinstance(value, (int, float)) and not RULES[rule](value):
    raise ConfigError(f'{key} must be {rule}, got {value!r}' + (f': {why}' if why else '.'))
