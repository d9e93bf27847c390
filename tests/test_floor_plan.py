"""scripts/floor_plan.py: the import graph's floors, circles and arrows, read by hand."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'scripts'))
import floor_plan  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def test_floors_circles_and_the_longest_way_down_of_a_small_graph():
  # a -> b -> c -> d, b <-> e (a circle), a -> d
  arrows = {'a': {'b', 'd'}, 'b': {'c', 'e'}, 'c': {'d'}, 'd': set(), 'e': {'b'}}
  assert floor_plan.circles(arrows) == [['b', 'e']]
  floor, way = floor_plan.floors(arrows)
  assert floor == {'a': 4, 'b': 3, 'e': 3, 'c': 2, 'd': 1}
  assert way == ['a', 'b', 'c', 'd']


def _write(root, path, text):
  path = os.path.join(root, path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def test_the_graph_of_a_small_tree_counts_lazy_and_relative_imports(tmp_path):
  root = str(tmp_path)
  _write(root, 'loco/__init__.py', '')
  _write(root, 'loco/errors.py', 'import os\n')
  _write(root, 'loco/train.py', 'from loco import errors\ndef _x():\n  pass\n')
  _write(root, 'loco/data/__init__.py', 'from .text import read\n')
  _write(root, 'loco/data/text.py', 'from ..errors import E\ndef read():\n  pass\n')
  _write(root, 'loco/batched.py', 'from loco import train\n'
         'def go():\n  from loco.data import text\n  return train._x()\n')
  _write(root, 'scripts/s.py', 'import loco.batched\n')
  arrows, lazy, trees = floor_plan.graph('folders', root)
  assert arrows == {'loco': set(), 'loco.errors': set(), 'loco.train': {'loco.errors'},
                    'loco.data/': {'loco.errors'},
                    'loco.batched': {'loco.train', 'loco.data/'},
                    'scripts/': {'loco.batched'}}
  assert dict(lazy) == {os.path.join('loco', 'batched.py'): 1}
  assert floor_plan.private_train_calls(trees) == [
      f'{os.path.join("loco", "batched.py")}:4 train._x']
  files, _, _ = floor_plan.graph('files', root)
  assert files['loco.data'] == {'loco.data.text'}
  assert files['loco.data.text'] == {'loco.errors'}


def test_the_repository_has_no_circle_it_does_not_report(capsys):
  assert floor_plan.main([]) == 0
  out = capsys.readouterr().out
  arrows, _, _ = floor_plan.graph()
  assert out.startswith(f'rooms {len(arrows)} (folders), floors ')
  assert out.count('  circle: ') == len(floor_plan.circles(arrows))
