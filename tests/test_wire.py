"""The one wire record (loco/wire.py): merge, where, collect by hand, and the round trip
of a step's record through a comms.jsonl row."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from loco.sim import commlog
from loco import wire as wire_lib
from loco.wire import ALL_GATHER, ALL_REDUCE, GOSSIP, KINDS, NO_COMM, Wire


def _wire(sent, received, kind, payload, peers, **fields):
  return Wire(jnp.float32(sent), jnp.float32(received), jnp.int32(kind > 0), jnp.int32(kind),
              jnp.float32(payload), jnp.asarray(peers, bool), **fields)


def test_kinds():
  assert KINDS == ('none', 'all_reduce', 'all_gather', 'gossip')
  assert (NO_COMM, ALL_REDUCE, ALL_GATHER, GOSSIP) == (0, 1, 2, 3)


def test_merge_adds_bytes_takes_the_widest_kind_and_joins_peers():
  a = _wire(10.0, 4.0, ALL_REDUCE, 8.0, [False, True, False])
  b = _wire(3.0, 5.0, GOSSIP, 2.0, [False, False, True], fragment=jnp.int32(1),
            overlap=jnp.int32(2))
  got = a.merge(b)
  assert (float(got.sent), float(got.received)) == (13.0, 9.0)
  assert int(got.events) == 2 and int(got.kind) == GOSSIP and float(got.payload) == 8.0
  np.testing.assert_array_equal(got.peers, [False, True, True])
  assert int(got.fragment) == 1 and int(got.overlap) == 2    # from the one that has them
  assert a.merge(a).fragment is None and a.merge(a).overlap is None   # None kept


def test_where_keeps_the_record_or_nothing():
  a = _wire(10.0, 4.0, ALL_REDUCE, 8.0, [False, True, False], fragment=jnp.int32(0))
  kept = a.where(jnp.bool_(True))
  for x, y in zip(kept[:6], a[:6]):
    np.testing.assert_array_equal(x, y)
  off = a.where(jnp.bool_(False))
  assert float(off.sent) == float(off.received) == float(off.payload) == 0.0
  assert int(off.events) == int(off.kind) == NO_COMM and not np.asarray(off.peers).any()
  assert int(off.fragment) == 0 and off.overlap is None     # the step's, kept


def test_empty_and_collect():
  empty = wire_lib.empty(3)
  assert float(empty.sent) == 0.0 and empty.peers.shape == (3,) and empty.fragment is None
  a = _wire(10.0, 4.0, ALL_REDUCE, 8.0, [False, True, False])
  b = _wire(3.0, 5.0, ALL_GATHER, 2.0, [True, False, False])
  state = ((jnp.zeros(4), a), {'link': (b, jnp.ones(2))})    # a chain state holding two
  got = wire_lib.collect(state)
  assert (float(got.sent), int(got.events), int(got.kind)) == (13.0, 2, ALL_GATHER)
  np.testing.assert_array_equal(got.peers, [True, True, False])
  nothing = wire_lib.collect((jnp.zeros(2),), num_workers=3)
  assert float(nothing.sent) == 0.0 and nothing.peers.shape == (3,)


def test_a_step_record_survives_a_comms_row():
  """step -> (active, host Wire) -> comms.jsonl row -> (active, Wire): equal, with
  overlap, active and received (a catch-up) set."""
  m = 3
  wire = Wire(sent=np.array([900.0, 400.0, 0.0]), received=np.array([400.0, 400.0, 500.0]),
              events=np.array([1, 1, 1]), kind=np.array([ALL_REDUCE] * 3),
              payload=np.array([300.0, 300.0, 300.0]),
              peers=np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]], bool),
              overlap=np.full(m, 2))
  active = np.array([True, False, True])
  row = commlog._row(7, active, wire)
  assert set(row) == {'step', 'kind', 'sent', 'payload', 'peers', 'overlap', 'active',
                      'received'}
  assert row['overlap'] == 2 and row['active'] == [1, 0, 1]
  back_active, back = commlog._wire(row, m)
  np.testing.assert_array_equal(back_active, active)
  assert back._fields == wire._fields
  for name, x, y in zip(wire._fields, back, wire):
    if y is None:
      assert x is None, name
    else:
      np.testing.assert_array_equal(x, y, err_msg=name)


def test_wire_imports_nothing_from_loco():
  code = ('import sys, loco.wire; '
          'print(sorted(m for m in sys.modules if m.startswith("loco") and m != "loco.wire"))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       check=True).stdout
  assert out.strip() == "['loco']", out      # the package itself, nothing under it
