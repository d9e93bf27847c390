"""The participation policy on its own: what each mode does to a tiny fragment.

A toy sync (each worker's anchor moves by the alive workers' mean pseudo-gradient, its
params follow, its momentum adds the mean, its merge state counts syncs) on 4 workers
with 3 params, run through `participation.policy(...).sync`: each mode must leave each
worker with exactly the state its definition says, and the catch-up's bytes on the wire.
"""

import ast
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loco.comm import axis
from loco import comm
from loco.core import participation as participation_lib
from loco.core import sync_plan
from loco import wire as wire_lib
from loco.errors import ConfigError
from loco.core.participation import Participation

M, N = 4, 3
BYTES = 4.0      # what the toy sync says each alive worker sent (and received)
# What a catch-up copies: the anchor, the momentum, the snapshot and the merge state, 3
# float32 each (the link state is each worker's own).
HELD_BYTES = 4 * N * 4
PHASES = []      # the phases the toy sync was traced with


def _vmap(f, in_axes):
  return axis.vmap(f, in_axes=in_axes)


def _operands():
  """(params, anchor, outer state, merge state): every worker's values distinct."""
  params = [jnp.arange(M * N, dtype=jnp.float32).reshape(M, N)]
  anchor = [jnp.arange(M, dtype=jnp.float32)[:, None] * jnp.ones((M, N)) - 3.0]
  outer = {'mom': jnp.arange(M, dtype=jnp.float32)[:, None] * jnp.full((M, N), 0.5),
           'snap': jnp.zeros((M, N)),
           'link': axis.replicate(wire_lib.empty(M), M)}
  merge_state = ([jnp.arange(M, dtype=jnp.float32)[:, None] + jnp.zeros((M, N))],)
  return params, anchor, outer, merge_state


def _toy_sync(params, anchor, outer, merge_state, active, alive, adopt, phase=None):
  """One worker's sync: the anchor moves by the alive workers' mean pseudo-gradient."""
  del active
  PHASES.append(phase)
  if phase == 'send':     # only the snapshot of what is sent is kept
    return ((params, anchor, {**outer, 'snap': params[0] * 10.0}, merge_state),
            wire_lib.empty(M))
  delta = [a - p for a, p in zip(anchor, params)]
  mean = comm.worker_mean(delta, alive.astype(jnp.float32))
  new_anchor = [a - d for a, d in zip(anchor, mean)]
  wire = wire_lib.empty(M)._replace(
      sent=jnp.where(alive, BYTES, 0.0), received=jnp.where(alive | adopt, BYTES, 0.0),
      events=jnp.int32(1))
  new_outer = {'mom': outer['mom'] + mean[0], 'snap': outer['snap'], 'link': wire}
  return ((new_anchor, new_anchor, new_outer, tuple([x + 1.0 for x in m] for m in merge_state)),
          wire)


def _everyone(alive=None):
  """The toy sync of every worker, with no participation around it."""
  alive = jnp.ones(M, bool) if alive is None else jnp.asarray(alive)
  ones = jnp.ones(M, bool)
  return _vmap(_toy_sync, 0)(*_operands(), ones, alive, ones)


def _policy(participation, alive=None, step=2, delay=0, shared_anchor=True):
  schedule = sync_plan.every(2).schedule({'w': jnp.zeros(N)}, delay)
  alive = jnp.ones(M, bool) if alive is None else jnp.asarray(alive)
  return participation_lib.policy(participation, schedule, jnp.asarray(step),
                                  jnp.ones(M, bool), alive, shared_anchor=shared_anchor,
                                  vmap=_vmap)


def _rows(tree, rows):
  return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def _assert_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_without_participation_every_worker_takes_the_sync_on_the_plan():
  syncing, policy = _policy(None, step=2)
  assert int(syncing) == 0
  assert int(_policy(None, step=3)[0]) == -1
  assert policy.who is None and policy.phase is None
  new, wire = policy.sync(_toy_sync, _operands())
  expected, expected_wire = _everyone()
  _assert_equal(new, expected)
  _assert_equal(wire, expected_wire)
  # The toy really moved every worker (the test below would pass on a no-op otherwise).
  assert not np.array_equal(np.asarray(new[1][0]), np.asarray(_operands()[1][0]))


def test_a_sync_mask_leaves_the_other_workers_as_they_were():
  mask = np.array([True, False, True, False])
  syncing, policy = _policy(Participation(sync=mask), step=3)    # off the plan
  assert int(syncing) == 0
  new, wire = policy.sync(_toy_sync, _operands())
  expected, _ = _everyone()
  _assert_equal(_rows(new, mask), _rows(expected, mask))
  _assert_equal(_rows(new, ~mask), _rows(_operands(), ~mask))
  np.testing.assert_array_equal(np.asarray(wire.sent), np.where(mask, BYTES, 0.0))
  np.testing.assert_array_equal(np.asarray(policy.taking_part), mask)
  assert int(_policy(Participation(sync=np.zeros(M, bool)), step=2)[0]) == -1
  assert int(_policy(Participation(sync=jnp.asarray(True)), step=3)[0]) == 0
  assert int(_policy(Participation(sync=jnp.asarray(False)), step=2)[0]) == -1


def test_keep_local_absent_workers_keep_their_params_and_adopt_the_rest():
  alive = np.array([True, True, False, True])
  _, policy = _policy(Participation(keep=np.ones(M, bool)), alive)
  new, _ = policy.sync(_toy_sync, _operands())
  expected, _ = _everyone(alive)
  params, anchor, outer, merge_state = _operands()
  np.testing.assert_array_equal(np.asarray(new[0][0])[2], np.asarray(params[0])[2])
  _assert_equal(_rows(new[0], alive), _rows(expected[0], alive))
  _assert_equal(new[1:], expected[1:])       # anchor, outer and merge state: adopted
  np.testing.assert_array_equal(np.asarray(policy.adopt), np.ones(M, bool))


def test_offline_absent_workers_keep_their_whole_state_and_send_nothing():
  alive = np.array([True, True, False, True])
  ones = np.ones(M, bool)
  _, policy = _policy(Participation(keep=ones, isolate=ones), alive)
  # Nobody isolated downloads a result (adopt is read by the absent only).
  np.testing.assert_array_equal(np.asarray(policy.adopt), np.zeros(M, bool))
  np.testing.assert_array_equal(np.asarray(policy.who), alive)
  new, wire = policy.sync(_toy_sync, _operands())
  expected, _ = _everyone(alive)
  _assert_equal(_rows(new, ~alive), _rows(_operands(), ~alive))
  _assert_equal(_rows(new, alive), _rows(expected, alive))
  assert float(wire.sent[2]) == float(wire.received[2]) == 0.0
  assert int(wire.events[2]) == 0


def test_rejoining_workers_copy_a_fresh_workers_state_after_the_sync():
  alive = np.array([False, True, True, True])
  rejoin = np.array([False, True, False, True])     # 1 and 3 are stale; 2 is the donor
  ones = np.ones(M, bool)
  _, policy = _policy(Participation(keep=ones, isolate=ones, rejoin=rejoin), alive)
  # The merge reaches the params after the catch-up: the rejoining take the donor's.
  arrive = lambda new: (new[1], *new[1:])
  new, wire = policy.sync(_toy_sync, _operands(), arrive)
  expected, _ = _everyone(alive)
  params, anchor, outer, merge_state = new
  for i in (1, 3):
    np.testing.assert_array_equal(np.asarray(params[0])[i], np.asarray(expected[1][0])[2])
    _assert_equal(_rows((anchor, outer['mom'], outer['snap'], merge_state), i),
                  _rows((expected[1], expected[2]['mom'], expected[2]['snap'],
                         expected[3]), 2))
    # Each worker keeps its own link state.
    _assert_equal(_rows(outer['link'], i), _rows(expected[2]['link'], i))
  _assert_equal(_rows(new, [0]), _rows(_operands(), [0]))   # offline: untouched
  _assert_equal(_rows(new, [2]), _rows((expected[1], *expected[1:]), [2]))
  np.testing.assert_array_equal(np.asarray(wire.sent),
                                [0.0, BYTES, BYTES + 2 * HELD_BYTES, BYTES])
  np.testing.assert_array_equal(np.asarray(wire.received),
                                [0.0, BYTES + HELD_BYTES, BYTES, BYTES + HELD_BYTES])
  np.testing.assert_array_equal(np.asarray(wire.peers)[2], rejoin)
  np.testing.assert_array_equal(np.asarray(wire.peers)[[1, 3]][:, 2], [True, True])


def test_when_every_alive_worker_rejoins_the_lowest_index_one_wins():
  alive = np.array([False, True, True, False])
  ones = np.ones(M, bool)
  _, policy = _policy(Participation(keep=ones, isolate=ones, rejoin=alive), alive)
  new, _ = policy.sync(_toy_sync, _operands())
  expected, _ = _everyone(alive)
  held = lambda state: (state[1], state[2]['mom'], state[2]['snap'], state[3])
  _assert_equal(_rows(held(new), 1), _rows(held(expected), 1))
  _assert_equal(_rows(held(new), 2), _rows(held(expected), 1))   # 2 copies 1
  assert not np.array_equal(np.asarray(expected[1][0])[1], np.asarray(expected[1][0])[2])
  _assert_equal(_rows(new, [0, 3]), _rows(_operands(), [0, 3]))


def test_rejoin_is_ignored_where_anchors_are_each_workers_own():
  alive = np.array([False, True, True, True])
  ones = np.ones(M, bool)
  part = Participation(keep=ones, isolate=ones, rejoin=np.array([False, True, False, True]))
  _, policy = _policy(part, alive, shared_anchor=False)
  assert policy.rejoin is None
  _, plain = _policy(Participation(keep=ones, isolate=ones), alive)
  _assert_equal(policy.sync(_toy_sync, _operands()), plain.sync(_toy_sync, _operands()))


def test_keep_local_needs_the_merge_at_the_sync():
  with pytest.raises(ConfigError, match='keep-local dropout needs a merge at the sync'):
    _policy(Participation(keep=np.ones(M, bool)), delay=1)
  _policy(Participation(isolate=np.ones(M, bool)), delay=1)    # isolate alone: no keep


def test_senders_store_their_snapshot_and_the_sync_merges_snapshots():
  send = np.array([True, False, False, True])
  _, policy = _policy(Participation(send=send))
  assert policy.phase == 'merge'
  PHASES.clear()
  policy.sync(_toy_sync, _operands())
  assert PHASES == ['merge']
  operands = _operands()
  outer = policy.snapshots(_toy_sync, operands)
  assert 'send' in PHASES
  np.testing.assert_array_equal(np.asarray(outer['snap']),
                                np.where(send[:, None], np.asarray(operands[0][0]) * 10.0, 0.0))
  np.testing.assert_array_equal(np.asarray(outer['mom']), np.asarray(operands[2]['mom']))
  _, quiet = _policy(Participation(send=np.zeros(M, bool)))
  _assert_equal(quiet.snapshots(_toy_sync, operands), operands[2])
  _, none = _policy(None)
  assert none.snapshots(_toy_sync, operands) is operands[2]


def test_catch_up_copies_every_dtype_from_the_donor():
  held = {'x': jnp.arange(M * 2, dtype=jnp.float32).reshape(M, 2),
          'flag': jnp.array([False, True, False, False]),
          'count': jnp.arange(M, dtype=jnp.int32)}
  alive = jnp.array([True, True, True, False])
  rejoin = jnp.array([True, False, True, True])
  got, wire = jax.vmap(comm.catch_up, axis_name=axis.WORKERS)(held, alive, rejoin)
  # Worker 1 is the one fresh alive worker: 0 and 2 copy it; 3 is absent and waits.
  for i, want in ((0, 1), (1, 1), (2, 1), (3, 3)):
    _assert_equal(_rows(got, i), _rows(held, want))
  np.testing.assert_array_equal(np.asarray(wire.sent), [0.0, 16.0, 0.0, 0.0])
  np.testing.assert_array_equal(np.asarray(wire.received), [8.0, 0.0, 8.0, 0.0])
  np.testing.assert_array_equal(np.asarray(wire.events), [1, 1, 1, 0])


def test_collectives_live_in_loco_comm():
  """Only loco/comm (and loco/axis, which defines them) calls the worker collectives."""
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'loco')
  collectives = {'psum', 'pmax', 'pmin', 'pmean', 'all_gather', 'ppermute', 'all_to_all'}
  found = []
  for dirpath, _, files in os.walk(root):
    rel = os.path.relpath(dirpath, root)
    if rel == 'comm' or rel.startswith('comm' + os.sep):
      continue
    for name in files:
      if not name.endswith('.py') or (rel == '.' and name == 'axis.py'):
        continue
      path = os.path.join(dirpath, name)
      with open(path) as f:
        tree = ast.parse(f.read())
      found += [f'{os.path.relpath(path, root)}:{node.lineno}' for node in ast.walk(tree)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in collectives]
  assert not found, f'collectives outside loco/comm: {found}'
