"""What loco knows about an algorithm besides its factory: one `AlgorithmSpec` per entry.

An algorithm's spec is the one table every other part reads: the config schema takes
its keys (`loco/configs/default.py`: the union over the registry), `algorithms.make`
checks their ranges, train.py picks its default inner optimizer, and the test suites
(conformance, mesh, golden, the training loop) build it from its example and check the
collective that carries its sync in the compiled program. A spec lives beside its
factory:

  DILOCO = AlgorithmSpec(diloco, example=dict(sync_every=2), carrier='all-reduce')

Defaults are the factory's keyword defaults (the papers'); a key shared by several
algorithms is declared once in `COMMON_KEYS`, a key of one algorithm in its spec's
`keys`.
"""

import dataclasses
import inspect
from typing import Any, Callable, Mapping

from loco import ranges
from loco.core.engine import Algorithm
from loco.errors import ConfigError

# Collective kinds as the compiled program names them (what carries a sync on a mesh).
CARRIERS = ('all-reduce', 'all-gather', 'collective-permute')
# Factory arguments that are not config keys: the device mesh, and an optax chain that
# replaces the named outer optimizer (a library user's choice).
NOT_KEYS = ('mesh', 'outer')


@dataclasses.dataclass(frozen=True)
class Key:
  """One algorithm key: its type in configs, its value rule, and its meaning."""
  kind: type            # int | float | str | bool | list (the config's type)
  doc: str              # the comment of `algorithm.KEY` in the config schema
  rule: str | None = None   # a rule of `loco.ranges.RULES` for numbers
  why: str | None = None    # what a value outside the rule would mean (said when refused)


COMMON_KEYS = {
    'sync_every': Key(int, 'H: inner steps per round', '>= 1'),
    'outer_optimizer': Key(str, 'sgd | nesterov | heavy_ball | adam'),
    'outer_lr': Key(float, 'outer learning rate', 'positive'),
    'outer_momentum': Key(float, 'outer momentum (Adam: b1)', 'in [0, 1)'),
    'transport_dtype': Key(str, 'float32 | bfloat16 | float16 on the wire'),
    'compression': Key(str, 'value codec: none | 2bit | int8 | int4 | e4m3 | e3m0'),
    'topology': Key(str, 'gossip graph: ring | matching | ... (TOPOLOGIES)'),
    'weights': Key(str, 'gossip weights: metropolis | uniform'),
    'gossip_step': Key(float, 'gossip step size in (0, 1]', 'in (0, 1]'),
    'seed': Key(int, 'seed of an erdos_renyi gossip graph', 'in [0, 2**32)'),
}


# Keys the engine adds to every algorithm (not factory arguments): `algorithms.make`
# applies them to what the factory built.
ENGINE_KEYS = {
    'local_steps': Key(list, 'per-worker H_i in [1, H], one per worker: worker i steps '
                             'only in the first H_i steps of each round, then waits '
                             '(any algorithm with rounds)'),
}


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """A registry entry: the factory and the facts configs, tools and tests need about it.

  Attributes:
    factory: `factory(inner, *, mesh=None, **keys) -> Algorithm`; its keyword-only
      arguments (but `mesh` and `outer`) are the algorithm's config keys, their
      defaults the algorithm's defaults.
    keys: the `Key` of each of its keys that `COMMON_KEYS` does not declare.
    example: small keys that sync within 4 steps on a few workers: what the
      conformance, mesh, golden and training-loop tests build it with.
    variants: further named examples, keys over `example` (e.g. another topology);
      the golden and mesh tests run each as `<name>_<variant>`.
    carrier: the collective kind (of `CARRIERS`) that moves the model or its
      pseudo-gradient in the compiled program on a mesh.
    inner: its default inner optimizer (a name of `loco.algorithms.optim.INNER_OPTIMIZERS`), used
      when the config leaves `optimizer.name` None.
    simulated_as: {example name (`examples`): how its compiled program moves the
      message otherwise than a deployment would}, for the examples whose program moves
      more bytes than the wire record counts (a compressed message simulated densely, a
      random choice of partner simulated as every candidate shift). Every other example
      moves exactly what it counts: tests/test_mesh.py holds each registered example to
      that, and these to moving no less.
  """
  factory: Callable[..., Algorithm]
  keys: Mapping[str, Key] = dataclasses.field(default_factory=dict)
  example: Mapping[str, Any] | None = None
  variants: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  carrier: str | None = None
  inner: str = 'adamw'
  simulated_as: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def factory_keys(self) -> list[str]:
    """The factory's keyword-only arguments that are config keys, in its order."""
    params = inspect.signature(self.factory).parameters
    return [k for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in NOT_KEYS]

  def key_names(self) -> list[str]:
    """Its config keys: the factory's, then the engine's (`ENGINE_KEYS`)."""
    own = self.factory_keys()
    return own + [k for k in ENGINE_KEYS if k not in own]

  def defaults(self) -> dict[str, Any]:
    params = inspect.signature(self.factory).parameters
    return {k: params[k].default if k in params else None for k in self.key_names()}

  def config_keys(self) -> dict[str, Key]:
    """Its keys with their `Key` (own, common or the engine's); undeclared ones are
    left out."""
    declared = {**ENGINE_KEYS, **COMMON_KEYS, **self.keys}
    return {k: declared[k] for k in self.key_names() if k in declared}

  def examples(self, name: str) -> dict[str, dict[str, Any]]:
    """`{name: example, name_variant: example + variant, ...}` (empty without example)."""
    if self.example is None:
      return {}
    out = {name: dict(self.example)}
    out.update({f'{name}_{v}': {**self.example, **keys} for v, keys in self.variants.items()})
    return out

  def check(self, name: str, kwargs: Mapping[str, Any]) -> None:
    """Raises a one-sentence ConfigError for a key it does not take or a value out of range."""
    allowed = self.key_names()
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
      raise ConfigError(f'algorithm {name!r} does not take {", ".join(unknown)}; '
                        f'its keys are: {", ".join(allowed)}.')
    declared = self.config_keys()
    for key, value in kwargs.items():
      if key in declared:
        ranges.check(f'algorithm.{key}', declared[key].rule, value, declared[key].why)
