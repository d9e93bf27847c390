"""The engine's drift diagnostics at a sync (loco/comm/drift.py): their values against
numpy, where they are measured (the fragment that syncs, the workers taking part), the
rows they reach, and the switch that keeps them out of a program."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco.files import runs
from loco.comm import drift as drift_lib
from loco.core.engine import StepContext, local_updates

M = 4
LR = 0.1      # the inner SGD's: the test redoes a sync step's inner step in numpy


def _params():
  return {'blocks': {0: {'w': jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)},
                     1: {'w': jnp.linspace(0.5, -0.5, 5)}}}


def _grads(params, t):
  """Per-worker gradients that disagree (each worker its own slope and noise)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.fold_in(jax.random.key(7), t), len(leaves))
  m = leaves[0].shape[0]
  scale = lambda x: (1.0 + jnp.arange(m, dtype=jnp.float32)).reshape((m,) + (1,) * (x.ndim - 1))
  return tree.unflatten([scale(x) * (x - 0.2) + 0.3 * jax.random.normal(k, x.shape)
                         for k, x in zip(keys, leaves)])


def _flat(leaves) -> np.ndarray:
  """[M, P] float64: each worker's leaves, flattened and concatenated."""
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1) for x in leaves],
                        axis=1)


def _numpy_drift(x_MxP: np.ndarray, anchor_MxP: np.ndarray,
                 taking_part=None) -> dict[str, float]:
  """The definitions, the long way: the full M x M cosine matrix, explicit means."""
  keep = np.ones(len(x_MxP), bool) if taking_part is None else np.asarray(taking_part)
  x, delta = x_MxP[keep], (anchor_MxP - x_MxP)[keep]
  norms = np.linalg.norm(delta, axis=1)
  unit = delta / norms[:, None]
  cosines = unit @ unit.T
  k = len(delta)
  return dict(pg_norm=np.sqrt(np.mean(norms ** 2)),
              pg_mean_norm=np.linalg.norm(delta.mean(axis=0)),
              pg_cosine=(cosines.sum() - np.trace(cosines)) / (k * (k - 1)),
              consensus_distance=np.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1))))


def _measured(info) -> dict[str, float]:
  """The step's diagnostics, checked to be one value on every worker."""
  out = {}
  for key in drift_lib.KEYS:
    values = np.asarray(getattr(info.drift, key))
    assert values.shape == (M,) and np.all(values == values[0]), (key, values)
    out[key] = float(values[0])
  return out


def _check_syncs(alg, rounds: int, leaves_of=jax.tree.leaves, taking_part=None, ctx=None):
  """Runs `alg`; at every sync, its diagnostics against numpy on the params the
  step's inner SGD left (`leaves_of`: the leaves of the fragment that syncs, by the
  step's `fragment`). Returns how many syncs were checked."""
  state = alg.init(_params(), M, jax.random.key(1))
  step = jax.jit(alg.step)
  checked = 0
  for t in range(rounds):
    grads = _grads(state.params, t)
    # The sync sees the params after this step's inner step: SGD, redone in numpy.
    x = jax.tree.map(lambda p, g: np.asarray(p, np.float64) - LR * np.asarray(g, np.float64),
                     state.params, grads)
    anchor = state.anchor
    state, info = step(state, grads, ctx)
    if not bool(info.synced):
      np.testing.assert_array_equal(np.asarray(info.drift.pg_norm), 0.0)
      continue
    fragment = None if info.wire.fragment is None else int(info.wire.fragment[0])
    want = _numpy_drift(_flat(leaves_of(x, fragment)), _flat(leaves_of(anchor, fragment)),
                        taking_part)
    got = _measured(info)
    for key in drift_lib.KEYS:
      np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=1e-6, err_msg=key)
    checked += 1
  return checked


def test_diloco_diagnostics_equal_numpy_at_every_sync():
  alg = algorithms.make('diloco', optax.sgd(LR), sync_every=2)
  assert _check_syncs(alg, 6) == 3


def test_diloco_consensus_distance_is_the_spread_of_the_pseudo_gradients():
  """One anchor for every worker: the params' spread is the Delta_m's, so
  consensus_distance^2 = pg_norm^2 - pg_mean_norm^2."""
  alg = algorithms.make('diloco', optax.sgd(LR), sync_every=3)
  state, step = alg.init(_params(), M, jax.random.key(1)), jax.jit(alg.step)
  for t in range(3):
    state, info = step(state, _grads(state.params, t))
  d = _measured(info)
  assert d['consensus_distance'] > 0.01
  np.testing.assert_allclose(d['consensus_distance'] ** 2,
                             d['pg_norm'] ** 2 - d['pg_mean_norm'] ** 2, rtol=1e-4)


def test_gasloc_diagnostics_equal_numpy_with_each_workers_own_anchor():
  """Gossip: the anchors differ after the first round, so the consensus distance is
  measured on the params themselves."""
  alg = algorithms.make('gasloc', optax.sgd(LR), sync_every=2, topology='ring')
  assert _check_syncs(alg, 6) == 3
  state, step = alg.init(_params(), M, jax.random.key(1)), jax.jit(alg.step)
  for t in range(4):
    state, _ = step(state, _grads(state.params, t))
  anchors = _flat(jax.tree.leaves(state.anchor))
  assert np.ptp(anchors, axis=0).max() > 1e-3      # the anchors are each worker's own


def test_streaming_measures_the_fragment_that_syncs():
  """Blocks 0 and 1 are fragments 0 and 1: block 1 syncs at step 4, block 0 at step 8
  (tau 1), and each sync's diagnostics are over its own fragment's leaves only."""
  alg = algorithms.make('streaming_diloco', optax.sgd(LR), sync_every=8, num_fragments=2,
                        overlap_steps=1, compression='none')
  leaves_of = lambda tree, f: jax.tree.leaves(tree['blocks'][f])
  assert _check_syncs(alg, 16, leaves_of) == 4


def test_only_the_workers_taking_part_are_measured():
  """A worker that is not alive at the sync is left out of every diagnostic."""
  alive = np.array([True, False, True, True])
  alg = algorithms.make('diloco', optax.sgd(LR), sync_every=2)
  ctx = StepContext(alive=jnp.asarray(alive))
  assert _check_syncs(alg, 4, taking_part=alive, ctx=ctx) == 2


def test_identical_workers_have_cosine_one_and_no_consensus_distance():
  """Every worker sees the same batch (one worker's gradient replicated): the workers
  stay identical, so their pseudo-gradients point the same way and the sync has no
  drift to remove."""
  alg = algorithms.make('diloco', optax.sgd(LR), sync_every=2)
  state, step = alg.init(_params(), M, jax.random.key(1)), jax.jit(alg.step)
  for t in range(4):
    one = jax.tree.map(lambda g: jnp.broadcast_to(g[:1], g.shape), _grads(state.params, t))
    state, info = step(state, one)
    if bool(info.synced):
      d = _measured(info)
      np.testing.assert_allclose(d['pg_cosine'], 1.0, rtol=1e-6)
      assert d['consensus_distance'] == 0.0
      np.testing.assert_allclose(d['pg_mean_norm'], d['pg_norm'], rtol=1e-6)
      assert d['pg_norm'] > 0


def test_diagnostics_leave_the_trajectory_and_bytes_unchanged():
  """Measuring reads the state: on and off give the same params and wire, bitwise."""
  finals = []
  for on in (True, False):
    alg = algorithms.make('diloco', optax.adam(0.05), sync_every=2, diagnostics=on)
    state = alg.init(_params(), M, jax.random.key(1))
    step = jax.jit(alg.step)
    sent = []
    for t in range(5):
      state, info = step(state, _grads(state.params, t))
      sent.append(np.asarray(info.wire.sent))
    assert (info.drift is None) == (not on)
    finals.append((jax.device_get(state.params), sent))
  for a, b in zip(jax.tree.leaves(finals[0]), jax.tree.leaves(finals[1])):
    np.testing.assert_array_equal(a, b)


def test_algorithms_without_rounds_have_no_diagnostics():
  for name in ('ddp', 'adpsgd'):
    alg = algorithms.make(name, optax.sgd(LR), **algorithms.REGISTRY[name].example)
    state = alg.init(_params(), M, jax.random.key(1))
    assert jax.eval_shape(alg.step, state, _grads(state.params, 0))[1].drift is None, name
  direct = local_updates(optax.sgd(LR), optax.sgd(1.0), 2, diagnostics=False)
  state = direct.init(_params(), M, jax.random.key(1))
  assert jax.eval_shape(direct.step, state, _grads(state.params, 0))[1].drift is None


def test_the_per_worker_form_equals_the_stacked_one():
  """`measure` (inside the worker map: the mesh's form, here under vmap) and
  `measure_stacked` (one device's) give the same values, one worker left out."""
  leaves = jax.tree.leaves(_params())
  keys = jax.random.split(jax.random.key(3), 2 * len(leaves))
  x = [jnp.stack([v + 0.05 * (i + 1) * jax.random.normal(k, v.shape) for i in range(M)])
       for v, k in zip(leaves, keys[:len(leaves)])]
  a = [jnp.broadcast_to(v, (M,) + v.shape) + 0.01 * jax.random.normal(k, (M,) + v.shape)
       for v, k in zip(leaves, keys[len(leaves):])]
  part = jnp.array([True, True, False, True])
  mapped = jax.jit(jax.vmap(drift_lib.measure, axis_name='workers'))(x, a, part)
  stacked = jax.jit(drift_lib.measure_stacked)(x, a, part)
  for key in drift_lib.Drift._fields:
    np.testing.assert_allclose(getattr(mapped, key), getattr(stacked, key), rtol=2e-5,
                               err_msg=key)
  want = _numpy_drift(_flat(x), _flat(a), np.asarray(part))
  for key in drift_lib.KEYS:
    np.testing.assert_allclose(float(stacked._asdict()[key][0]), want[key], rtol=2e-5,
                               err_msg=key)


def test_a_rows_diagnostics_are_the_mean_over_its_syncs():
  """Four steps, syncs at steps 1 and 3; the cosine of the second sync is over one
  worker only (left out); a chunk without a sync, or without diagnostics, has none."""
  def drift(**columns):
    return drift_lib.Drift(**{f: np.repeat(np.asarray(columns[f], np.float32)[:, None], 3, 1)
                              for f in drift_lib.Drift._fields})
  d = drift(pg_norm=[0, 2, 0, 4], pg_mean_norm=[0, 1, 0, 3], pg_cosine=[0, 0.5, 0, 0],
            consensus_distance=[0, 1, 0, 2], pairs=[0, 3, 0, 1])
  synced = np.array([False, True, False, True])
  assert drift_lib.summary(d, synced) == dict(pg_norm=3.0, pg_mean_norm=2.0, pg_cosine=0.5,
                                              consensus_distance=1.5)
  assert drift_lib.summary(d, np.zeros(4, bool)) == {}
  assert drift_lib.summary(None, synced) == {}
  # A non-finite value (a run diverging) never reaches a row: the key is left out.
  bad = d._replace(pg_norm=np.where(np.arange(4)[:, None] == 3, np.nan, d.pg_norm))
  assert 'pg_norm' not in drift_lib.summary(bad, synced)
  assert runs.DRIFT_KEYS == drift_lib.KEYS and set(runs.DRIFT_KEYS) <= set(runs.NUMBER_KEYS)


@pytest.mark.slow     # 9 s
def test_on_a_mesh_the_diagnostics_equal_the_one_device_ones():
  """8 workers on 8 devices (the worker axis sharded): the same values as under vmap."""
  from loco.run.placement import make_mesh, state_shardings
  m, got = 8, []
  for mesh in (None, make_mesh(8, 8)):
    alg = algorithms.make('diloco', optax.sgd(LR), sync_every=2, mesh=mesh)
    state = alg.init(_params(), m, jax.random.key(1))
    if mesh is not None:
      state = jax.device_put(state, state_shardings(state, mesh))
    step = jax.jit(alg.step)
    for t in range(2):
      grads = _grads(state.params, t)
      if mesh is not None:
        grads = jax.device_put(grads, state_shardings(state, mesh).params)
      state, info = step(state, grads)
    got.append(jax.device_get(info.drift))
  for a, b in zip(got[0], got[1]):
    np.testing.assert_allclose(a, b, rtol=1e-5)
  assert float(got[0].pg_norm[0]) > 0
