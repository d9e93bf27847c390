"""Merge policies: how a fragment's outer step reaches the params (DESIGN §2, §4).

A policy is a value that `engine.local_updates` calls; it owns its state::

  init(anchor) -> state              a tuple of float32 trees shaped like the
                                     (worker-stacked) anchor, () for none; the engine
                                     hands each fragment's sync its part of each tree.
  at_sync(outer, params, anchor,     per worker, inside the worker map, when a fragment
          delta, outer_state, state, syncs: run the outer step and return (params,
          *, context, num_workers)   anchor, outer_state, state). Trees are the
                                     fragment's view: the model's structure with None
                                     outside the fragment.
  on_arrival(params, anchor, state)  elementwise, `delay` (tau) steps after the sync
                                     (at the end of the sync step itself when tau = 0):
                                     the new params of the fragment.

`delayed(tau, alpha)` is Streaming DiLoCo's merge, and with tau = 0, alpha = 0 DiLoCo's
`params <- anchor`; `eager(tau, alpha)` merges a local estimate at once and corrects it
on arrival.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco.errors import ConfigError

PyTree = Any


class Outer(NamedTuple):
  """The outer chain as the engine hands it to a policy.

  Attributes:
    link: the communication link (its output is the averaged pseudo-gradient), or None
      when it is part of `optimizer` (a policy that needs the average then refuses it).
    optimizer: the rest of the chain, which maps the link's output to anchor updates.
  """
  link: optax.GradientTransformationExtraArgs | None
  optimizer: optax.GradientTransformationExtraArgs

  def init(self, anchor: PyTree) -> Any:
    if self.link is None:
      return self.optimizer.init(anchor)
    return (self.link.init(anchor), self.optimizer.init(anchor))   # optax.chain's state

  def update(self, delta: PyTree, state: Any, anchor: PyTree,
             context: Any) -> tuple[PyTree, Any, PyTree | None]:
    """(anchor updates, new state, the link's output or None): `optax.chain(link,
    optimizer).update`, with the link's output kept."""
    if self.link is None:
      updates, state = self.optimizer.update(delta, state, anchor, context=context)
      return updates, state, None
    link_state, opt_state = state
    mean, link_state = self.link.update(delta, link_state, anchor, context=context)
    updates, opt_state = self.optimizer.update(mean, opt_state, anchor, context=context)
    return updates, (link_state, opt_state), mean


class Merge(NamedTuple):
  """A merge policy (see the module docstring).

  Attributes:
    delay: tau, steps between a fragment's sync and `on_arrival`.
    init: `init(anchor) -> state`.
    at_sync: `at_sync(outer, params, anchor, delta, outer_state, state, *, context,
      num_workers) -> (params, anchor, outer_state, state)`.
    on_arrival: `on_arrival(params, anchor, state) -> params`.
    needs_link: whether `at_sync` needs the outer chain split as `(link, optimizer)`.
  """
  delay: int
  init: Callable[[PyTree], tuple]
  at_sync: Callable[..., tuple]
  on_arrival: Callable[[PyTree, PyTree, tuple], PyTree]
  needs_link: bool = False


def _check(overlap_steps: int, merge_alpha: float) -> tuple[int, float]:
  if (not isinstance(overlap_steps, (int, np.integer)) or isinstance(overlap_steps, bool)
      or overlap_steps < 0):
    raise ConfigError(f'algorithm.overlap_steps must be an integer >= 0, got {overlap_steps!r}.')
  if isinstance(merge_alpha, jax.core.Tracer):    # a run knob (loco.run.run_axis), checked
    return int(overlap_steps), merge_alpha         # with each run's own config
  if not 0.0 <= merge_alpha <= 1.0:
    raise ConfigError(f'algorithm.merge_alpha must be in [0, 1], got {merge_alpha!r}.')
  return int(overlap_steps), float(merge_alpha)


def blend(params: PyTree, target: PyTree, alpha: float) -> PyTree:
  """`alpha params + (1 - alpha) target` in float32, in the params' dtype."""
  def one(p, g):
    if not isinstance(alpha, jax.core.Tracer) and alpha == 0.0:   # exact: adopt the target
      return g.astype(p.dtype)
    return (alpha * p.astype(jnp.float32) + (1.0 - alpha) * g).astype(p.dtype)
  return jax.tree.map(one, params, target)


def delayed(overlap_steps: int = 0, merge_alpha: float = 0.0) -> Merge:
  """The outer step's anchor arrives tau steps later: `params <- alpha params + (1 -
  alpha) anchor`.

  Args:
    overlap_steps: tau >= 0, steps between the sync and the merge (training goes on).
    merge_alpha: alpha in [0, 1], weight of the local params (0: adopt the anchor).

  Returns:
    A `Merge` without state. tau 0, alpha 0 is DiLoCo's `params <- anchor`.

  References:
    DiLoCo, arXiv 2311.08105; Streaming DiLoCo, arXiv 2501.18512 (§2.2-2.3).
  """
  tau, alpha = _check(overlap_steps, merge_alpha)

  def at_sync(outer, params, anchor, delta, outer_state, state, *, context, num_workers):
    del num_workers
    updates, outer_state, _ = outer.update(delta, outer_state, anchor, context)
    return params, optax.apply_updates(anchor, updates), outer_state, state

  return Merge(tau, init=lambda anchor: (), at_sync=at_sync,
               on_arrival=lambda params, anchor, state: blend(params, anchor, alpha))


class EagerState(NamedTuple):
  """Per-worker float32 buffers of eager updates (full trees; fragments are disjoint).

  Attributes:
    prev_mean: each fragment's last averaged pseudo-gradient (as received).
    prev_own: this worker's pseudo-gradient of each fragment's last sync.
    correction: `(1 - alpha) (anchor - theta_hat)` of the fragment in flight, added to
      the params when its average arrives.
  """
  prev_mean: PyTree
  prev_own: PyTree
  correction: PyTree


def eager(overlap_steps: int = 1, merge_alpha: float = 0.0) -> Merge:
  """Eager updates: merge a local estimate of the new anchor at once, correct on arrival.

  At the sync, the outer step also runs on `Delta_m / M + (1/M) sum_{m' != m}
  Delta_m'^prev` (this worker's fresh pseudo-gradient for its share of the average,
  the others' from the fragment's previous average; zero before the first), giving
  `theta_hat`; the params merge with it at once, and when the true anchor arrives tau
  steps later `params += (1 - alpha) (anchor - theta_hat)`. Costs three float32 copies
  of the params per worker; needs the outer chain as `(link, optimizer)`.

  Args:
    overlap_steps: tau >= 0, steps until the true anchor arrives.
    merge_alpha: alpha in [0, 1], weight of the local params in the merge.

  Returns:
    A `Merge` whose state is an `EagerState`. With tau 0 it equals `delayed(0, alpha)`.

  References:
    Kale et al., arXiv 2502.12996 (eager updates); Streaming DiLoCo, arXiv 2501.18512.
  """
  tau, alpha = _check(overlap_steps, merge_alpha)

  def init(anchor):
    return EagerState(*(jax.tree.map(jnp.zeros_like, anchor) for _ in range(3)))

  def at_sync(outer, params, anchor, delta, outer_state, state, *, context, num_workers):
    state = EagerState(*state)
    updates, new_outer_state, mean = outer.update(delta, outer_state, anchor, context)
    new_anchor = optax.apply_updates(anchor, updates)
    # Own fresh share + the others' shares of the last average (arXiv 2502.12996).
    estimate = jax.tree.map(lambda pm, d, po: pm + (d - po) / num_workers,
                            state.prev_mean, delta, state.prev_own)
    hat_updates, _ = outer.optimizer.update(estimate, outer_state[1], anchor,
                                            context=context)
    theta_hat = optax.apply_updates(anchor, hat_updates)
    correction = jax.tree.map(lambda g, h: (1.0 - alpha) * (g - h), new_anchor, theta_hat)
    mean = jax.tree.map(lambda m: m.astype(jnp.float32), mean)
    return (blend(params, theta_hat, alpha), new_anchor, new_outer_state,
            EagerState(mean, delta, correction))

  def on_arrival(params, anchor, state):
    del anchor     # swap the estimate for the true anchor: params += correction
    return jax.tree.map(lambda p, c: (p.astype(jnp.float32) + c).astype(p.dtype),
                        params, EagerState(*state).correction)

  return Merge(tau, init, at_sync, on_arrival, needs_link=True)
