"""Drift diagnostics of a sync: how far the workers went apart, measured over the worker
axis at the sync (the engine measures every sync of an algorithm with rounds:
`measure_stacked` on one device, `measure` inside the worker map on a mesh).

Definitions, for the n workers that take part in the sync (alive, and in the sync's
own [M] mask where the schedule has one) and the params of the fragment that syncs
(the whole model without fragments):

  Delta_m             worker m's pseudo-gradient, anchor_m - params_m in float32: the
                      engine's own quantity, what the outer chain consumes (before any
                      communication, compression or error feedback)
  pg_norm             sqrt(mean_m ||Delta_m||^2), the RMS over workers of the norm
  pg_mean_norm        ||mean_m Delta_m||, the norm of the averaged pseudo-gradient (for
                      DiLoCo without compression, what the outer optimizer receives)
  pg_cosine           the mean over pairs m != n of cos(Delta_m, Delta_n), in closed form:
                      with u_m = Delta_m / ||Delta_m||, (||sum_m u_m||^2 - k) / (k (k - 1))
                      over the k workers whose Delta_m is not zero (defined for k >= 2)
  consensus_distance  sqrt(mean_m ||x_m - mean_n x_n||^2) of the params x_m just before
                      the sync, after the round's inner steps: the drift the sync removes
                      (for an all-reduce algorithm, whose anchors are one value, it is the
                      spread of the Delta_m: consensus_distance^2 = pg_norm^2 -
                      pg_mean_norm^2)

On one device they come from two [M, M] Gram matrices of the stacked leaves
(`measure_stacked`); on a mesh, inside the worker map (`measure`), they are all-reduces
over the worker axis of three fragment-sized trees (and a few scalars), which a real
deployment would not run: `loco.core.engine.diagnostics(False)` builds algorithms without
them (the tests that count a program's collectives do).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from loco.comm import axis as comm_axis
from loco.comm.axis import WORKERS

PyTree = Any

# The diagnostics' names in a StepInfo's `drift` and in metrics.jsonl rows.
KEYS = ('pg_norm', 'pg_mean_norm', 'pg_cosine', 'consensus_distance')


class Drift(NamedTuple):
  """One sync's diagnostics (module docstring), the same value on every worker.

  Leaves are float32 scalars per worker inside the worker map, [M] per step in
  `StepInfo.drift`, [K, M] per chunk; zero on a step without a sync.

  Attributes:
    pg_norm: RMS over the workers of ||Delta_m||.
    pg_mean_norm: ||mean_m Delta_m||.
    pg_cosine: mean pairwise cosine of the Delta_m (0 when `pairs` is below 2).
    consensus_distance: RMS distance of the params to their mean, before the sync.
    pairs: the number k of workers the cosine is over (taking part, Delta_m not zero);
      the cosine means something for k >= 2.
  """
  pg_norm: Any
  pg_mean_norm: Any
  pg_cosine: Any
  consensus_distance: Any
  pairs: Any


def zeros() -> Drift:
  """No sync: every field zero (a scalar per worker)."""
  return Drift(*(jnp.zeros((), jnp.float32) for _ in Drift._fields))


def _sq(tree: PyTree) -> jax.Array:
  return sum((jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)),
             jnp.zeros((), jnp.float32))


def measure(params: PyTree, anchor: PyTree, taking_part: jax.Array,
            axis_name: str = WORKERS) -> Drift:
  """This worker's view of the sync's `Drift`, inside the per-worker map (the engine's
  form on a mesh).

  Args:
    params: this worker's params of the fragment that syncs, before the sync.
    anchor: its anchor of that fragment (float32).
    taking_part: bool scalar, whether this worker takes part in the sync.
    axis_name: the worker axis name.

  Returns:
    The `Drift` over the workers taking part (the same on each worker).
  """
  w = jnp.asarray(taking_part, bool)
  x = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  delta = jax.tree.map(lambda a, p: a - p, anchor, x)
  sq = _sq(delta)
  nonzero = w & (sq > 0)
  unit = jax.tree.map(lambda d: jnp.where(nonzero, d / jnp.where(nonzero, jnp.sqrt(sq), 1.0),
                                          0.0), delta)
  wf = w.astype(jnp.float32)
  n, k, delta_sum, x_sum, unit_sum = comm_axis.psum(
      (wf, nonzero.astype(jnp.float32), jax.tree.map(lambda d: wf * d, delta),
       jax.tree.map(lambda v: wf * v, x), unit), axis_name)
  per = jnp.maximum(n, 1.0)
  x_mean = jax.tree.map(lambda s: s / per, x_sum)
  spread = _sq(jax.tree.map(lambda v, m: v - m, x, x_mean))
  pg_sq, spread_sum = comm_axis.psum((wf * sq, wf * spread), axis_name)
  pairs = jnp.maximum(k * (k - 1.0), 1.0)
  return Drift(pg_norm=jnp.sqrt(pg_sq / per),
               pg_mean_norm=jnp.sqrt(_sq(delta_sum)) / per,
               pg_cosine=jnp.where(k >= 2, (_sq(unit_sum) - k) / pairs, 0.0),
               consensus_distance=jnp.sqrt(spread_sum / per),
               pairs=k)


def _gram(rows: list[jax.Array]) -> jax.Array:
  """[M, M] float32 inner products of the workers' rows (each leaf [M, ...] flattened)."""
  return sum(jnp.dot(r.reshape(r.shape[0], -1), r.reshape(r.shape[0], -1).T,
                     precision=jax.lax.Precision.HIGHEST) for r in rows)


def measure_stacked(params_M: list[jax.Array], anchor_M: list[jax.Array],
                    taking_part_M: jax.Array) -> Drift:
  """`measure` on one device, from the stacked leaves of the fragment that syncs: the
  same definitions, from two [M, M] Gram matrices (of the pseudo-gradients, and of the
  params less worker 0's, which leaves their spread unchanged and keeps the large
  common part out of the float32 sums). A matmul: XLA:CPU reduces a small leading
  axis (the psum of `measure` under vmap) about ten times slower.

  Args:
    params_M: the workers' params of the fragment, [M, ...] leaves, before the sync.
    anchor_M: their anchors of that fragment (float32), [M, ...] leaves.
    taking_part_M: [M] bool, the workers taking part in the sync.

  Returns:
    The `Drift`, each leaf [M] (the same value for every worker).
  """
  x = [p.astype(jnp.float32) for p in params_M]
  g = _gram([a - v for a, v in zip(anchor_M, x)])
  spread = _gram([v - v[:1] for v in x])
  w = jnp.asarray(taking_part_M, bool)
  wf = w.astype(jnp.float32)
  n = jnp.sum(wf)
  per = jnp.maximum(n, 1.0)
  sq = jnp.diagonal(g)
  nonzero = w & (sq > 0)
  k = jnp.sum(nonzero.astype(jnp.float32))
  inv = jnp.where(nonzero, 1.0 / jnp.sqrt(jnp.where(nonzero, sq, 1.0)), 0.0)
  unit_sq = inv @ g @ inv                 # ||sum_m u_m||^2
  mean_sq = wf @ g @ wf / per ** 2        # ||mean_m Delta_m||^2
  spread_sq = jnp.sum(wf * jnp.diagonal(spread)) / per - wf @ spread @ wf / per ** 2
  out = Drift(pg_norm=jnp.sqrt(jnp.sum(wf * sq) / per),
              pg_mean_norm=jnp.sqrt(jnp.maximum(mean_sq, 0.0)),
              pg_cosine=jnp.where(k >= 2, (unit_sq - k) / jnp.maximum(k * (k - 1.0), 1.0),
                                  0.0),
              consensus_distance=jnp.sqrt(jnp.maximum(spread_sq, 0.0)),
              pairs=k)
  return jax.tree.map(lambda v: jnp.broadcast_to(v, w.shape), out)


def summary(drift_KxM, synced_K) -> dict[str, float]:
  """A row's diagnostics from a chunk's host copies: each key's mean over the chunk's
  syncs ({} without a sync; pg_cosine over the syncs with two or more workers).

  Args:
    drift_KxM: a `Drift` of [K, M] numpy arrays (or None: an algorithm without rounds,
      or built without diagnostics).
    synced_K: [K] bool, the steps whose outer step ran.

  Returns:
    {key of `KEYS`: float}, finite values only.
  """
  if drift_KxM is None:
    return {}
  synced = np.asarray(synced_K, bool)
  column = {f: np.asarray(v, np.float64)[:, 0] for f, v in drift_KxM._asdict().items()}
  out = {}
  for key in KEYS:
    use = synced & (column['pairs'] >= 2) if key == 'pg_cosine' else synced
    values = column[key][use]
    if values.size and np.all(np.isfinite(values)):
      out[key] = float(values.mean())
  return out
