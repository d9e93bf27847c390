"""What a practitioner chooses a method by, from finished runs and without training:
the communication-loss Pareto front (final loss against bytes per worker) and the
learning curve against simulated wall-clock time on another network (a run re-timed by
`loco.retime`: WORKDIR/retimed/NAME).

  front = pareto_front([(bytes_sent, loss), ...])       # indices, by ascending bytes
  curve = retimed_curve('runs/x', 'gbit1_100ms')        # [(sim_seconds, eval_loss)]
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from loco.files import runs as runs_lib

Curve = list[tuple[float, float]]         # [(x, loss)] of one run


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
  """The indices of the points no other point dominates, by ascending x.

  Lower is better on both axes (bytes and loss): a point is dominated when another has
  x and y no higher and one of them lower. Of equal points the first is kept; a point
  with a non-finite coordinate is never on the front.

  Args:
    points: (x, y) pairs, e.g. (bytes sent per worker, final loss).

  Returns:
    The front's indices into `points`, x ascending (so y strictly descending).
  """
  finite = [i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)]
  front, best = [], math.inf
  for i in sorted(finite, key=lambda i: (points[i][0], points[i][1], i)):
    if points[i][1] < best:
      front.append(i)
      best = points[i][1]
  return front


def front_steps(points: Sequence[tuple[float, float]], front: Sequence[int],
                right: float | None = None) -> tuple[list[float], list[float]]:
  """The front as a step line (xs, ys): at each x, the lowest y reachable with at most
  that x; drawn with `where='post'`, carried on to `right` (if past the last point)."""
  xs = [points[i][0] for i in front]
  ys = [points[i][1] for i in front]
  if xs and right is not None and right > xs[-1]:
    xs, ys = xs + [right], ys + [ys[-1]]
  return xs, ys


def retimed_rows(workdir: str, network: str) -> list[dict[str, Any]] | None:
  """The metrics rows of `workdir` re-timed on `network` (`loco.retime`), None if it
  was not re-timed there.

  Raises:
    RunFileError: the re-timed metrics.jsonl is damaged (one line naming it).
  """
  path = os.path.join(workdir, runs_lib.RETIMED, network)
  if not os.path.isfile(os.path.join(path, runs_lib.METRICS)):
    return None
  return runs_lib.read_metrics(path).rows


def curve(rows: Sequence[Mapping[str, Any]], x: str = 'sim_seconds') -> Curve:
  """(row[x], eval loss) at every row with a finite eval loss."""
  return [(float(r.get(x) or 0.0), float(r['eval_loss'])) for r in rows
          if runs_lib.is_number(r.get('eval_loss')) and math.isfinite(r['eval_loss'])]


def retimed_curve(workdir: str, network: str) -> Curve | None:
  """(simulated seconds on `network`, eval loss) at each eval of the run in `workdir`,
  None if it was not re-timed there."""
  rows = retimed_rows(workdir, network)
  return None if rows is None else curve(rows)


def value_at(rows: Sequence[Mapping[str, Any]], key: str, step: float) -> float | None:
  """rows' `key` at `step`, linear between the rows around it (exact at a logged step);
  None if `step` is outside the rows' steps or no row has the key."""
  pts = [(r['step'], float(r[key])) for r in rows if runs_lib.is_number(r.get(key))]
  if not pts or not pts[0][0] <= step <= pts[-1][0]:
    return None
  return float(np.interp(step, [s for s, _ in pts], [v for _, v in pts]))


def shift(c: Curve, dx: float) -> Curve:
  """The curve moved right by `dx` (a warm start's tokens or seconds before it)."""
  return [(x + dx, y) for x, y in c]
