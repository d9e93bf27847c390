"""The algorithm registry: name -> `AlgorithmSpec` (the factory and its facts).

A factory takes the inner optimizer first and the algorithm's own keys (papers'
defaults) as keyword arguments, and returns an `engine.Algorithm`; its spec, declared
beside it, gives its keys' types and ranges, a small example, its carrier collective and
its default inner optimizer (loco/algorithms/spec.py). To add one, write the factory and
its spec in a file of this package and add a line to `REGISTRY`: the config schema, the
checks and every test suite read it from there.
"""

from typing import Any, Callable

import optax

from loco.algorithms.ddp import DDP
from loco.algorithms.demo import DEMO
from loco.algorithms.diloco import DILOCO, LOCAL_SGD
from loco.algorithms.gasloc import GASLOC
from loco.algorithms.gossip_baselines import A2CID2, ADPSGD, DSGD, NOLOCO
from loco.algorithms.muloco import MULOCO
from loco.algorithms.sparseloco import SPARSELOCO
from loco.algorithms import spec as spec_lib
from loco.algorithms.spec import AlgorithmSpec, Key
from loco.algorithms.sparta import SPARTA, SPARTA_DILOCO
from loco.algorithms.streaming import STREAMING_DILOCO
from loco.core import engine
from loco.core.engine import Algorithm
from loco.errors import ConfigError

REGISTRY: dict[str, AlgorithmSpec] = {
    'ddp': DDP,
    'diloco': DILOCO,
    'local_sgd': LOCAL_SGD,
    'sparseloco': SPARSELOCO,
    'gasloc': GASLOC,
    'dsgd': DSGD,
    'adpsgd': ADPSGD,
    'a2cid2': A2CID2,
    'noloco': NOLOCO,
    'streaming_diloco': STREAMING_DILOCO,
    'demo': DEMO,
    'sparta': SPARTA,
    'sparta_diloco': SPARTA_DILOCO,
    'muloco': MULOCO,
}


def register(name: str, spec: AlgorithmSpec | Callable[..., Algorithm]) -> None:
  """Adds an algorithm to the registry (`algorithm.name` in configs).

  Nothing else is needed to time it on a simulated network: the clock reads what its
  steps report in `StepInfo.wire`.

  Args:
    name: the `algorithm.name` config value.
    spec: an `AlgorithmSpec`, or a bare `factory(inner, *, mesh=None, **keys) ->
      Algorithm` (then configs can set only its keys that `spec.COMMON_KEYS` declares,
      and the test suites have no example to run it with).
  """
  REGISTRY[name] = spec if isinstance(spec, AlgorithmSpec) else AlgorithmSpec(spec)


def spec_of(name: str) -> AlgorithmSpec:
  """The registered spec of `name`; an unknown name is a one-sentence ConfigError."""
  if name not in REGISTRY:
    raise ConfigError(f'algorithm.name must be one of {sorted(REGISTRY)}, got {name!r}.')
  return REGISTRY[name]


def settings_of(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
  """The algorithm's keys with their values: `kwargs` over the factory's defaults."""
  return {**spec_of(name).defaults(), **kwargs}


def keys_of(name: str) -> list[str]:
  """The keyword arguments the algorithm `name` accepts (besides inner and mesh)."""
  return spec_of(name).key_names()


def config_keys() -> dict[str, Key]:
  """Every registered algorithm's declared keys (the schema's `algorithm.*` section)."""
  out: dict[str, Key] = {}
  for name, spec in REGISTRY.items():
    for key, declared in spec.config_keys().items():
      known = out.setdefault(key, declared)
      if (known.kind, known.rule) != (declared.kind, declared.rule):
        raise ValueError(f'algorithm {name!r} declares algorithm.{key} as {declared}, '
                         f'another algorithm as {known}: one key, one type and rule.')
  shared = [k for k in spec_lib.COMMON_KEYS if k in out]
  return {k: out[k] for k in shared + [k for k in out if k not in shared]}


def check(name: str, kwargs: dict[str, Any]) -> None:
  """The one check of an algorithm's keys: known name, keys it takes, values in range.

  Raises:
    ConfigError: one sentence naming the algorithms, its keys, or the rule broken.
  """
  spec_of(name).check(name, kwargs)


def make(name: str, inner: optax.GradientTransformation, *, mesh=None,
         diagnostics: bool = True, **kwargs: Any) -> Algorithm:
  """Builds the registered algorithm `name` with the given keys, checked (`check`);
  the engine's keys (`spec.ENGINE_KEYS`) are applied to what the factory built.
  `diagnostics`: whether its syncs measure drift (`engine.diagnostics`; `StepInfo.drift`)."""
  check(name, kwargs)
  return build(name, inner, mesh=mesh, diagnostics=diagnostics, **kwargs)


def build(name: str, inner: optax.GradientTransformation, *, mesh=None,
          diagnostics: bool = True, **kwargs: Any) -> Algorithm:
  """`make` without the range checks: for keys already checked on their concrete
  values whose values are now traced (`loco.run.run_axis` maps runs' knobs)."""
  spec = spec_of(name)
  engine_keys = {k: kwargs.pop(k) for k in list(kwargs)
                 if k in spec_lib.ENGINE_KEYS and k not in spec.factory_keys()}
  with engine.diagnostics(diagnostics):
    algorithm = spec.factory(inner, mesh=mesh, **kwargs)
  if engine_keys.get('local_steps') is not None:
    algorithm = engine.with_local_steps(algorithm, engine_keys['local_steps'])
  return algorithm
