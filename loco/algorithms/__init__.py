"""The algorithm registry: name -> factory.

A factory takes the inner optimizer first and the algorithm's own keys (papers'
defaults) as keyword arguments, and returns an `engine.Algorithm`. To add one, write a
factory in a file of this package and add it to `REGISTRY`.
"""

import inspect
from typing import Any, Callable

import optax

from loco.algorithms.ddp import ddp
from loco.algorithms.diloco import diloco, local_sgd
from loco.algorithms.gasloc import gasloc
from loco.algorithms.gossip_baselines import a2cid2, adpsgd, dsgd, noloco
from loco.algorithms.sparseloco import sparseloco
from loco.algorithms.streaming import streaming_diloco
from loco.engine import Algorithm
from loco.errors import ConfigError

REGISTRY: dict[str, Callable[..., Algorithm]] = {
    'ddp': ddp,
    'diloco': diloco,
    'local_sgd': local_sgd,
    'sparseloco': sparseloco,
    'gasloc': gasloc,
    'dsgd': dsgd,
    'adpsgd': adpsgd,
    'a2cid2': a2cid2,
    'noloco': noloco,
    'streaming_diloco': streaming_diloco,
}


def register(name: str, factory: Callable[..., Algorithm]) -> None:
  """Adds an algorithm to the registry (`algorithm.name` in configs).

  Nothing else is needed to time it on a simulated network: the clock reads what its
  steps report in `StepInfo`.

  Args:
    name: the `algorithm.name` config value.
    factory: `factory(inner, *, mesh=None, **keys) -> Algorithm`.
  """
  REGISTRY[name] = factory


def settings_of(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
  """The algorithm's keys with their values: `kwargs` over the factory's defaults."""
  params = inspect.signature(REGISTRY[name]).parameters
  return {**{k: params[k].default for k in keys_of(name)}, **kwargs}


def keys_of(name: str) -> list[str]:
  """The keyword arguments the algorithm `name` accepts (besides inner and mesh)."""
  params = inspect.signature(REGISTRY[name]).parameters
  return [k for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in ('mesh', 'outer')]


def make(name: str, inner: optax.GradientTransformation, *, mesh=None, **kwargs: Any) -> Algorithm:
  """Builds the registered algorithm `name` with the given keys; unknown ones fail."""
  if name not in REGISTRY:
    raise ConfigError(f'algorithm.name must be one of {sorted(REGISTRY)}, got {name!r}.')
  allowed = keys_of(name)
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ConfigError(f'algorithm {name!r} does not take {", ".join(unknown)}; '
                      f'its keys are: {", ".join(allowed)}.')
  return REGISTRY[name](inner, mesh=mesh, **kwargs)
