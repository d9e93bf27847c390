"""Runs as an axis: R runs of one shape trained in one compiled program.

Workers are the state's leading axis; runs can be one above them. R runs whose shapes
agree (model, worker count, batch, H and schedule structure: everything but `RUN_KNOBS`
and the seed) are one program: the train chunk is mapped over runs with `jax.vmap`, and
each run's algorithm is built inside the map from its own knob values, traced, so one
compilation and one dispatch per chunk serve every run. Each run's numbers equal its
solo run's (tests/test_run_axis.py).

  exps = [parse_config(c) for c in configs]        # differ in seed and RUN_KNOBS only
  knobs = knobs_of(exps)                           # {'lr': [R], ...}
  chunk = make_batched_chunk(exps[0], graphdef)    # (knobs, states_R, batches_R, ...)

This module is the program; `scripts/bench_run_axis.py` measures it.
"""

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loco import algorithms
from loco.algorithms import optim
from loco.run import step as step_lib
from loco.core.engine import Algorithm, LocoState
from loco.errors import ConfigError
from loco.run.experiment import Experiment, for_network

# How a batched state is mapped: everything per run but the shared step counter.
STATE_AXES = LocoState(step=None, params=0, inner_state=0, anchor=0, outer_state=0, extra=0,
                       key=0)

# The knobs that may differ between batched runs (floats, traced): name -> where it lives.
RUN_KNOBS = {
    'lr': 'optimizer.lr',                    # the inner schedule's peak
    'weight_decay': 'optimizer.weight_decay',
    'outer_lr': 'algorithm.outer_lr',
    # Batched runs agree on whether it is > 0 (that decides whether a momentum exists).
    'outer_momentum': 'algorithm.outer_momentum',
    'gossip_step': 'algorithm.gossip_step',
    'error_decay': 'algorithm.error_decay',
    'merge_alpha': 'algorithm.merge_alpha',
}
_ALGORITHM_KNOBS = ('outer_lr', 'outer_momentum', 'gossip_step', 'error_decay',
                    'merge_alpha')


def _inner_knobs(exp: Experiment) -> dict[str, float]:
  return dict(lr=exp.inner.lr, weight_decay=exp.inner.weight_decay)


def shape_of(exp: Experiment) -> Experiment:
  """The experiment with its run knobs and seed blanked: what batched runs share (runs
  whose shapes are equal can train in one program)."""
  kwargs = {k: v for k, v in exp.algorithm_kwargs.items() if k not in _ALGORITHM_KNOBS}
  defaults = algorithms.settings_of(exp.algorithm_name, {})
  if 'outer_momentum' in defaults:
    kwargs['outer_momentum > 0'] = exp.algorithm_kwargs.get(
        'outer_momentum', defaults['outer_momentum']) > 0
  return dataclasses.replace(
      exp, run=dataclasses.replace(exp.run, seed=0),
      inner=dataclasses.replace(exp.inner, lr=0.0, weight_decay=0.0),
      algorithm_kwargs=kwargs)


def _first_difference(a: Any, b: Any, path: str = '') -> str | None:
  """The dotted path of the first field where `a` and `b` differ, or None."""
  if a == b:
    return None
  if dataclasses.is_dataclass(a) and type(a) is type(b):
    for f in dataclasses.fields(a):
      found = _first_difference(getattr(a, f.name), getattr(b, f.name),
                                f'{path}.{f.name}' if path else f.name)
      if found:
        return found
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      found = _first_difference(a.get(k), b.get(k), f'{path}.{k}' if path else str(k))
      if found:
        return found
  return path or 'the config'


def knobs_of(exps: Sequence[Experiment]) -> dict[str, np.ndarray]:
  """Each run knob's values, [R] float32; the runs must agree on everything else.

  Raises:
    ConfigError: one sentence naming the first setting two runs differ in that is not
      a run knob (they cannot share a program).
  """
  if not exps:
    raise ConfigError('no runs to batch.')
  first = shape_of(exps[0])
  for i, exp in enumerate(exps[1:], 1):
    field = _first_difference(first, shape_of(exp))
    if field is not None:
      raise ConfigError(f'run {i} differs from run 0 in {field}, which batched runs must '
                        f'share (they may differ in seed and {", ".join(RUN_KNOBS.values())}).')
  defaults = algorithms.settings_of(exps[0].algorithm_name, {})
  knobs = {k: [_inner_knobs(e)[k] for e in exps] for k in ('lr', 'weight_decay')}
  for name in _ALGORITHM_KNOBS:
    if name in defaults:
      knobs[name] = [e.algorithm_kwargs.get(name, defaults[name]) for e in exps]
  return {k: np.asarray(v, np.float32) for k, v in knobs.items()}


def algorithm_for(exp: Experiment, knobs: Mapping[str, Any], mesh=None) -> Algorithm:
  """The run's algorithm with its knobs' values (traced inside the map) substituted; the
  values were range-checked with each run's own config."""
  inner = optim.inner_optimizer(dataclasses.replace(
      exp.inner, lr=knobs['lr'], weight_decay=knobs['weight_decay']))
  kwargs = dict(exp.algorithm_kwargs)
  kwargs.update({k: knobs[k] for k in _ALGORITHM_KNOBS if k in knobs})
  return for_network(exp, algorithms.build(exp.algorithm_name, inner, mesh=mesh,
                                           diagnostics=exp.run.diagnostics, **kwargs))


def make_batched_chunk(exp: Experiment, graphdef):
  """The train chunk of R runs at once: `chunk(knobs, states, batches, contexts, valid)`
  with knobs {name: [R]}, states with a leading [R] axis but their shared step counter
  (`STATE_AXES`), batches [R, K, M, B, L+1], contexts and valid shared; returns (states,
  (losses [R, K, M], StepInfo [R, K, ...])). The states are donated."""
  def one_run(knobs, state, batches, contexts, valid):
    chunk = step_lib.chunk_fn(algorithm_for(exp, knobs), exp.model, graphdef,
                              grad_mode=exp.run.grad_mode)
    return chunk(state, batches, contexts, valid)
  # The step counter is shared: the runs' sync schedules agree, so a sync's `lax.cond`
  # stays a branch (a per-run counter would make it a select running both every step).
  axes = STATE_AXES
  return jax.jit(jax.vmap(one_run, in_axes=(0, axes, 0, None, None), out_axes=(axes, 0)),
                 donate_argnums=1)


def init_states(exp: Experiment, knobs: Mapping[str, np.ndarray], seeds: Sequence[int]):
  """(graphdef, states): each run's initial state (its own seed), stacked over runs."""
  probe = algorithm_for(exp, {k: float(v[0]) for k, v in knobs.items()})
  graphdef, init, _ = step_lib.init_state(exp, probe, jax.random.key(0))
  return graphdef, stack([init(jax.random.key(int(s))) for s in seeds])


def stack(states: Sequence[LocoState]) -> LocoState:
  """One state per run -> the batched state (their step counters must agree)."""
  steps = {int(s.step) for s in states}
  if len(steps) != 1:
    raise ValueError(f'batched runs must be at one step, got {sorted(steps)}.')
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  return stacked._replace(step=states[0].step)


def unstack(states: LocoState, i: int) -> LocoState:
  """Run `i`'s state out of the batched state (with the shared step counter)."""
  return jax.tree.map(lambda x: x[i], states._replace(step=None))._replace(step=states.step)
