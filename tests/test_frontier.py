"""loco.lab.frontier: the Pareto front against its definition, the step line, and curves read
from re-timed runs."""

import json
import math
import os

import pytest
from hypothesis import given, settings, strategies as st

from loco.lab import frontier
from loco.errors import RunFileError


def _dominated(p, q):
  """Whether q dominates p: no higher on both axes, lower on one."""
  return q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1])


def test_the_front_of_a_hand_made_set():
  pts = [(10.0, 2.0),   # 0: on the front
         (5.0, 2.5),    # 1: on the front (fewer bytes)
         (20.0, 2.0),   # 2: dominated by 0 (more bytes, same loss)
         (1.0, 3.0),    # 3: on the front
         (5.0, 2.7),    # 4: dominated by 1 (same bytes, higher loss)
         (50.0, 1.5),   # 5: on the front
         (10.0, 2.0),   # 6: equal to 0: the first is kept
         (math.nan, 0.1), (3.0, math.inf)]   # never
  assert frontier.pareto_front(pts) == [3, 1, 0, 5]
  assert frontier.pareto_front([]) == []
  xs, ys = frontier.front_steps(pts, [3, 1, 0, 5], right=80.0)
  assert (xs, ys) == ([1.0, 5.0, 10.0, 50.0, 80.0], [3.0, 2.5, 2.0, 1.5, 1.5])
  assert frontier.front_steps(pts, [3], right=0.5) == ([1.0], [3.0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=12))
def test_the_front_is_exactly_the_points_nothing_dominates(raw):
  pts = [(float(x), float(y)) for x, y in raw]
  front = frontier.pareto_front(pts)
  # One representative per undominated value, the first index of it, x ascending.
  expected = sorted({p for p in pts if not any(_dominated(p, q) for q in pts)})
  assert [pts[i] for i in front] == expected
  assert all(pts.index(pts[i]) == i for i in front)
  assert all(a[1] > b[1] for a, b in zip([pts[i] for i in front], [pts[i] for i in front[1:]]))


def _write_rows(path, rows):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'metrics.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in rows))


def test_a_retimed_curve_is_read_from_its_network_and_none_elsewhere(tmp_path):
  run = str(tmp_path / 'run')
  _write_rows(os.path.join(run, 'retimed', 'gbit1'), [
      {'step': 5, 'tokens': 10, 'sim_seconds': 1.5, 'bytes_sent': 4.0},
      {'step': 10, 'tokens': 20, 'sim_seconds': 3.0, 'eval_loss': 2.5, 'bytes_sent': 8.0},
      {'step': 20, 'tokens': 40, 'sim_seconds': 7.0, 'eval_loss': 2.0, 'bytes_sent': 16.0}])
  assert frontier.retimed_curve(run, 'gbit1') == [(3.0, 2.5), (7.0, 2.0)]
  assert frontier.retimed_curve(run, 'gbit10') is None
  rows = frontier.retimed_rows(run, 'gbit1')
  assert frontier.curve(rows, 'tokens') == [(20.0, 2.5), (40.0, 2.0)]
  assert frontier.value_at(rows, 'sim_seconds', 10) == 3.0        # a logged step: exact
  assert frontier.value_at(rows, 'sim_seconds', 15) == 5.0        # linear between
  assert frontier.value_at(rows, 'sim_seconds', 21) is None       # past the run
  assert frontier.value_at(rows, 'eval_loss', 5) is None          # no eval row there
  assert frontier.shift([(3.0, 2.5)], 10.0) == [(13.0, 2.5)]


def test_a_damaged_retimed_metrics_file_is_one_line_naming_it(tmp_path):
  path = tmp_path / 'run' / 'retimed' / 'gbit1'
  path.mkdir(parents=True)
  (path / 'metrics.jsonl').write_text('{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(RunFileError, match=r'retimed/gbit1/metrics.jsonl line 2 is not valid'):
    frontier.retimed_curve(str(tmp_path / 'run'), 'gbit1')
