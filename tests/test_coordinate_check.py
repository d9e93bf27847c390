"""scripts/coordinate_check.py: which settings it checks, and its bad-input lines."""

import importlib.util
import os

from launch import claims
from loco.lab import study

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    'coordinate_check', os.path.join(REPO, 'scripts', 'coordinate_check.py'))
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

OUTER = 'algorithm.outer_lr'


def _tried(first, lrs, knob_values, at_lr):
  """The protocol's order: every inner lr at the knob's first value, then the knob."""
  return ([({study.LR: lr, OUTER: first}, 2.0) for lr in lrs] +
          [({study.LR: at_lr, OUTER: k}, 2.0) for k in knob_values if k != first])


def test_each_pick_is_checked_at_its_knob_over_every_inner_lr_the_method_tried():
  s = claims.SCALES['full']
  b = s.budget
  m = {x.name: x for x in claims.methods(s)}['diloco_sgd']
  # The inner lr extended past its low edge at the picked knob, as the protocol does.
  tried = _tried(2.0, b.inner_lrs, (1.0, 4.0), 1.5e-3) + [({study.LR: 7.5e-4, OUTER: 1.0}, 2.1)]
  assert m.knob.values[1] == 2.0        # step 1's knob: the middle of SGD's effective steps
  picks = {m.name: {'tried': tried, 'setting': {study.LR: 1.5e-3, OUTER: 1.0}}}
  [(method, key, k0, setting, lrs, checks)] = check.plan(picks, [m])
  assert (method, key, k0) == (m, OUTER, 2.0)
  assert lrs == sorted(b.inner_lrs + (7.5e-4,))
  assert checks == [{study.LR: lr, OUTER: 1.0} for lr in lrs]
  # Two of them (the pick's own lr, and 7.5e-4) were tried on the way: the check trains
  # the others.
  seen = {study.label(x) for x, _ in tried}
  assert [c[study.LR] for c in checks if study.label(c) not in seen] == [3e-3, 6e-3]


def test_bad_input_is_one_line(tmp_path, capsys):
  assert check.main([f'--out={tmp_path}', '--methods=diloco_nope']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'diloco_nope not among the claims page' in err[0]
  assert check.main([f'--out={tmp_path / "none"}']) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'tune does not exist' in err[0]
