"""Config files and overrides: loading them, and checking every key and value.

  config = configs.load('experiments/tiny_diloco.py:local_sgd', {'steps': 20})
  configs.validate(config)

`load` builds the locked ConfigDict that `python -m loco.main --config=FILE[:VARIANT]
--config.KEY=VALUE ...` trains; `validate` checks it against loco/configs/default.py,
the schema: every key must be one of default.get_config()'s (a misspelled one, from the
command line or set inside a config file, is named with its nearest valid keys), every
value must have its key's type (no silent coercion: 2.5 is not an integer, 1 is not
True), and a number must satisfy its rule: `CONSTRAINTS` for the run's keys, the
algorithm's spec for `algorithm.*` (`loco.algorithms.check`, which also refuses a key
the chosen algorithm does not take). Each mistake is one `ConfigError` sentence.

On the command line a value is read by its key's type: integers, numbers, `true` /
`false`, strings as written, and lists (`network.speeds`, `network.churn`, the link
matrices) as Python literals, `--config.network.speeds='[1,2,1,1]'`.
"""

import ast
import difflib
import functools
import importlib.machinery
import importlib.util
import math
import os
import re
import traceback
from typing import Any, Mapping, Sequence

from ml_collections import config_dict

from loco.sim import network as network_lib
from loco import ranges
from loco.errors import ConfigError
from loco.files.metrics import WANDB_MODES

# Single-key rules on numbers (`loco.ranges`), applied by `validate` to the whole config
# (a key left None, "the preset's / the paper's default", is not checked); the
# algorithm's keys carry theirs in its spec. Rules between keys stay
# where the keys meet: eval.every and checkpoint.every are multiples of log_every
# (`_check_cadence`), seq_len <= model.max_seq_len, topk <= chunk_size (loco.comm.compress),
# slow_workers <= num_workers (loco.sim.network).
CONSTRAINTS = {
    'seed': 'in [0, 2**32)',
    'num_workers': '>= 1',
    'steps': '>= 1',
    'batch_per_worker': '>= 1',
    'seq_len': '>= 1',
    'log_every': '>= 1',
    'eval.every': '>= 0',
    'checkpoint.every': '>= 0',
    'model.vocab_size': '>= 1',
    'model.d_model': '>= 1',
    'model.num_layers': '>= 1',
    'model.num_heads': '>= 1',
    'model.d_ff': '>= 1',
    'model.max_seq_len': '>= 1',
    'model.z_loss': '>= 0',
    'data.read_threads': '>= 0',
    'data.window_pool_tokens': '>= 1',
    'data.hf_eval_fraction': 'in (0, 1)',
    'data.hf_max_docs': '>= 0',
    'optimizer.lr': 'positive',
    'optimizer.warmup_steps': '>= 0',
    'optimizer.decay_steps': '>= 1',
    'optimizer.final_lr_frac': 'in [0, 1]',
    'optimizer.b1': 'in [0, 1)',
    'optimizer.b2': 'in [0, 1)',
    'optimizer.eps': 'positive',
    'optimizer.weight_decay': '>= 0',
    'optimizer.clip_norm': '>= 0',
    **{f'network.{key}': rule for key, rule in network_lib.RANGES.items()},
    'eval.batches': '>= 1',
    'eval.batch_size': '>= 1',
    'checkpoint.keep': '>= 1',
    'mesh.workers': '>= 1',
    'mesh.fsdp': '>= 1',
    'mesh.slices': '>= 1',
}

_KINDS = {int: 'an integer', float: 'a number', bool: 'true or false', str: 'a string',
          list: 'a list'}
_LIST_EXAMPLE = {'network.speeds': '[1, 2, 1, 1]', 'network.churn': '[[0, 10, 20]]',
                 'network.bandwidth_matrix': '[[0, 1e9], [1e9, 0]]',
                 'network.latency_matrix': '[[0, 0.01], [0.01, 0]]',
                 'algorithm.local_steps': '[50, 50, 25, 25]'}
_OVERRIDE = re.compile(r'^--?(no)?config\.([^=]*)(=(.*))?$', re.DOTALL)
_CONFIG_FLAG = re.compile(r'^--?config(=(.*))?$', re.DOTALL)


def schema() -> dict[str, tuple[type, bool]]:
  """Every key of loco/configs/default.py: dotted path -> (type, whether None is allowed).

  Cached per state of the algorithm registry: the schema's algorithm section is the
  registered algorithms' keys, so `algorithms.register` makes a new schema."""
  return _schema(_registry_key())


def _registry_key() -> tuple[tuple[str, int], ...]:
  from loco import algorithms   # configs stands above the algorithms: their keys are its section
  return tuple((name, id(spec)) for name, spec in algorithms.REGISTRY.items())


@functools.lru_cache(maxsize=4)
def _schema(registry_key) -> dict[str, tuple[type, bool]]:
  del registry_key   # the cache's key only
  from loco.configs import default
  out = {}

  def walk(c, prefix):
    for key in c.keys():
      value = c[key]
      if isinstance(value, config_dict.ConfigDict):
        walk(value, f'{prefix}{key}.')
      else:
        out[prefix + key] = (c.get_type(key), value is None)

  walk(default.get_config(), '')
  unknown = sorted(set(CONSTRAINTS) - set(out))
  assert not unknown, f'CONSTRAINTS names keys that default.py lacks: {unknown}'
  return out


def _sections() -> frozenset[str]:
  return _sections_of(_registry_key())


@functools.lru_cache(maxsize=4)
def _sections_of(registry_key) -> frozenset[str]:
  del registry_key   # the cache's key only
  parts = [k.split('.') for k in schema()]
  return frozenset('.'.join(p[:i]) for p in parts for i in range(1, len(p)))


def _children(section: str) -> list[str]:
  prefix = f'{section}.' if section else ''
  return sorted({k[len(prefix):].split('.')[0] for k in schema() if k.startswith(prefix)})


def _initials(name: str) -> str:
  return ''.join(word[0] for word in name.split('_') if word)


def _unknown(key: str) -> ConfigError:
  """The error for a key that loco/configs/default.py does not define, with the nearest ones."""
  parts = key.split('.')
  i = 0   # the first part that is not a valid section
  while i < len(parts) - 1 and '.'.join(parts[:i + 1]) in _sections():
    i += 1
  section = '.'.join(parts[:i])
  if i < len(parts) - 1 and '.'.join(parts[:i + 1]) in schema():
    return ConfigError(f'unknown config key {key}: {".".join(parts[:i + 1])} is a value, '
                       'not a group of keys')
  siblings = _children(section)
  names = difflib.get_close_matches(parts[i], siblings, n=3, cutoff=0.6)
  # Abbreviations difflib misses: learning_rate -> lr, wd -> weight_decay.
  names += [s for s in siblings
            if _initials(parts[i]) == s or (len(parts[i]) >= 2 and parts[i] == _initials(s))]
  tail = parts[i + 1:]
  # The same name in another section first (`sync_every` -> algorithm.sync_every).
  found = [k for k in schema() if k.rsplit('.', 1)[-1] == parts[-1]]
  for name in names:
    candidate = '.'.join([*parts[:i], name, *tail])
    if candidate in schema() or (not tail and candidate in _sections()):
      found.append(candidate)
  found = found or difflib.get_close_matches(key, list(schema()), n=3, cutoff=0.75)
  found = list(dict.fromkeys(found))[:3]
  if found:
    return ConfigError(f'unknown config key {key} (did you mean {" or ".join(found)}?)')
  where = f'under {section}' if section else 'at the top level'
  return ConfigError(f'unknown config key {key} (the keys {where} are: '
                     f'{", ".join(siblings)})')


def _check_key(key: str) -> None:
  if key in schema():
    return
  if key in _sections():
    raise ConfigError(f'config key {key} is a group of keys; set one of them, e.g. '
                      f'{key}.{_children(key)[0]}.')
  raise _unknown(key)


def _kind_error(key: str, value: Any) -> ConfigError:
  kind = schema()[key][0]
  if kind is list and key in _LIST_EXAMPLE:
    return ConfigError(f'{key} must be a list such as {_LIST_EXAMPLE[key]}, got {value!r}.')
  return ConfigError(f'{key} must be {_KINDS.get(kind, kind.__name__)}, got {value!r}.')


def _check_type(key: str, value: Any) -> None:
  kind, nullable = schema()[key]
  if value is None:
    if not nullable:
      raise _kind_error(key, value)
    return
  if kind is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and not math.isfinite(value):
      raise ConfigError(f'{key} must be a finite number, got {value!r}.')
  elif kind is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif kind is list:
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in _leaves(value))
  else:
    ok = isinstance(value, kind)
  if not ok:
    raise _kind_error(key, value)


def _leaves(value):
  for x in value:
    if isinstance(x, (list, tuple)):
      yield from _leaves(x)
    else:
      yield x


def parse_value(key: str, text: str) -> Any:
  """A command-line value of `key` (as after `--config.KEY=`), read by the key's type.

  Raises:
    ConfigError: `key` is unknown, or `text` is not a value of its type.
  """
  _check_key(key)
  kind = schema()[key][0]
  try:
    if kind is bool:
      if text.lower() not in ('true', 'false'):
        raise ValueError(text)
      return text.lower() == 'true'
    if kind is int:
      return int(text, 10)
    if kind is float:
      return float(text)
    if kind is list:
      value = ast.literal_eval(text)
      if not isinstance(value, (list, tuple)):
        raise ValueError(text)
      return _as_lists(value)
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    raise _kind_error(key, text) from None
  return text


def _as_lists(value):
  return [_as_lists(x) if isinstance(x, (list, tuple)) else x for x in value]


def split_argv(argv: Sequence[str]) -> tuple[str | None, dict[str, Any]]:
  """(config file, overrides) of a `loco.main` command line; other flags are left out.

  Args:
    argv: the arguments, `['--config=experiments/x.py', '--config.steps=20', ...]`
      (a leading program name is ignored).

  Returns:
    The `--config` value (None if absent) and `{key: text}` for every
    `--config.KEY=VALUE` (the last one wins); `--config.KEY` alone is True and
    `--noconfig.KEY` False, for true/false keys.

  Raises:
    ConfigError: an override names an unknown key or has no value.
  """
  spec, overrides, _ = split_command_line(argv)
  return spec, overrides


def split_command_line(argv: Sequence[str]
                       ) -> tuple[str | None, dict[str, Any], list[str]]:
  """`split_argv`, plus the arguments that are neither --config nor an override."""
  spec, overrides, rest = None, {}, []
  args = list(argv)
  i = 0
  while i < len(args):
    arg = args[i]
    i += 1
    if arg == '--':
      rest += args[i - 1:]
      break
    match = _CONFIG_FLAG.match(arg)
    if match:
      if match.group(1) is None and i < len(args):
        spec, i = args[i], i + 1
      else:
        spec = match.group(2)
      continue
    match = _OVERRIDE.match(arg)
    if not match:
      rest.append(arg)
      continue
    negated, key, has_value, text = match.groups()
    _check_key(key)
    is_bool = schema()[key][0] is bool
    if negated:
      if has_value or not is_bool:
        raise ConfigError(f'--noconfig.{key} is only for a true/false key, without a value; '
                          f'use --config.{key}=VALUE.')
      overrides[key] = False
    elif has_value:
      overrides[key] = text
    elif is_bool:
      overrides[key] = True
    elif i < len(args):
      overrides[key], i = args[i], i + 1
    else:
      raise ConfigError(f'--config.{key} needs a value: --config.{key}=VALUE.')
  return spec, overrides, rest


def load(spec: str, overrides: Mapping[str, Any] | None = None) -> config_dict.ConfigDict:
  """The locked config of `python -m loco.main --config=SPEC --config.KEY=VALUE ...`.

  Args:
    spec: a config file, `experiments/x.py`, or `experiments/x.py:variant` (the part
      after ':' is passed to its `get_config`).
    overrides: `{key: value}` applied after `get_config()`; a string is read as on the
      command line (by the key's type), anything else is used as it is.

  Returns:
    The config, locked. `validate` checks it (keys set by the file, value ranges).

  Raises:
    ConfigError: the file is missing, does not parse or raises; an override names an
      unknown key or has a value of the wrong type.
  """
  config = _run_config_file(spec)
  for key, value in (overrides or {}).items():
    if isinstance(value, str):
      value = parse_value(key, value)
    else:
      _check_key(key)
      if isinstance(value, tuple):
        value = _as_lists(value)
      _check_type(key, value)
    *sections, leaf = key.split('.')
    node = config
    try:
      for name in sections:
        node = node[name]
      node[leaf] = value
    except (KeyError, AttributeError):
      raise _unknown(key) from None
    except TypeError:   # the config file gave the key another type
      raise _kind_error(key, value) from None
  config.lock()
  return config


class _SourceOnly(importlib.machinery.SourceFileLoader):
  """Runs a config file from its source, never from cached bytecode: Python's cache
  is valid for a source of the same size and modification second, so an edit made
  within the second that keeps the size (`steps = 10` -> `steps = 20`) would run the
  old config. Nothing is written beside the file either."""

  def get_code(self, fullname):
    return self.source_to_code(self.get_data(self.path), self.path)


def _run_config_file(spec: str) -> config_dict.ConfigDict:
  path, *variant = spec.split(':', 1)
  if not os.path.isfile(path):
    raise ConfigError(f'no such config file: {path}')
  loader = _SourceOnly('loco_config_file', path)
  module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
  try:
    loader.exec_module(module)
    if not callable(getattr(module, 'get_config', None)):
      raise ConfigError(f'{path} does not define get_config().')
    config = module.get_config(*variant)
  except ConfigError:
    raise
  except SyntaxError as e:
    raise ConfigError(f'{_shown(e.filename or path)} line {e.lineno}: {e.msg}') from None
  except Exception as e:  # the config file's own error, as one line
    raise ConfigError(_raised(path, e)) from None
  if not isinstance(config, config_dict.ConfigDict):
    raise ConfigError(f'get_config() of {path} must return a ConfigDict (start from '
                      f'loco.configs.default), got {type(config).__name__}.')
  return config


def _shown(path: str) -> str:
  rel = os.path.relpath(path)
  return path if rel.startswith('..') else rel


def _raised(path: str, e: Exception) -> str:
  """`FILE line N: Type: message` for an exception raised by a config file."""
  line = ''
  for frame in traceback.extract_tb(e.__traceback__):
    if os.path.abspath(frame.filename) == os.path.abspath(path):
      line = f' line {frame.lineno}'
  message = ' '.join(part.strip() for part in str(e).splitlines() if part.strip())
  return f'{path}{line}: {type(e).__name__}' + (f': {message}' if message else '')


def validate(config: config_dict.ConfigDict) -> None:
  """Checks every key and value of `config` against loco/configs/default.py, its rules
  (`CONSTRAINTS`) and the algorithm's spec.

  Raises:
    ConfigError: one sentence for the first unknown key (with the nearest valid ones),
      missing key, value of the wrong type, number outside its rule, algorithm key the
      algorithm does not take, unknown inner optimizer, or W&B setting that cannot work
      (an unknown metrics.wandb_mode, wandb not installed).
  """
  present = {}

  def walk(c, prefix):
    for key in c.keys():
      value = c[key]
      path = prefix + key
      if isinstance(value, config_dict.ConfigDict) and path not in schema():
        if path not in _sections():
          raise _unknown(path)
        walk(value, path + '.')
      elif path in _sections():
        raise ConfigError(f'config key {path} must be a group of keys, got {value!r}.')
      elif path not in schema():
        raise _unknown(path)
      else:
        present[path] = value

  walk(config, '')
  for key in schema():
    if key not in present:
      raise ConfigError(f'config key {key} is missing; start the config from '
                        'loco.configs.default, which defines every key.')
    _check_type(key, present[key])
    ranges.check(key, CONSTRAINTS.get(key), present[key])
  _check_algorithm(present)
  _check_sinks(present)
  _check_cadence(present)


def _check_cadence(present: Mapping[str, Any]) -> None:
  """Evaluations and checkpoints fall on logged steps (multiples of log_every)."""
  every = present['log_every']
  for key in ('eval.every', 'checkpoint.every'):
    if present[key] % every:
      raise ConfigError(f'{key} must be a multiple of log_every={every}, '
                        f'got {present[key]}.')


def _check_algorithm(present: Mapping[str, Any]) -> None:
  """The algorithm's own keys and ranges (its spec), and the inner optimizer's name."""
  from loco import algorithms
  from loco.algorithms import optim
  prefix = 'algorithm.'
  keys = {k[len(prefix):]: v for k, v in present.items()
          if k.startswith(prefix) and k != 'algorithm.name' and v is not None}
  algorithms.check(present['algorithm.name'], keys)
  optim.check_name(present['optimizer.name'])


def _check_sinks(present: Mapping[str, Any]) -> None:
  """metrics.*: a known W&B mode, and wandb installed when a run will log to it.

  Checked here rather than when the sink opens so that `loco.main` and a sweep refuse
  the config before any training starts.
  """
  mode = present['metrics.wandb_mode']
  if mode is not None and mode not in WANDB_MODES:
    raise ConfigError(f'metrics.wandb_mode must be one of {", ".join(WANDB_MODES)}, '
                      f'got {mode!r}.')
  if (present['metrics.wandb_project'] and mode != 'disabled'
      and importlib.util.find_spec('wandb') is None):
    raise ConfigError("metrics.wandb_project is set but wandb is not installed: "
                      "pip install -e '.[wandb]'")
