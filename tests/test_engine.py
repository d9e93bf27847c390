"""The engine and every registered algorithm: conformance, oracles, byte accounting."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco.comm import axis
from loco import configs
from loco import comm
from loco.core import merge
from loco import model as model_lib
from loco.algorithms import optim
from loco.run import step as step_lib
from loco.algorithms import spec as spec_lib
from loco.core.engine import StepContext, local_updates
from loco.core.participation import Participation
from loco.errors import ConfigError

M = 4


def _example(name):
  """The registry's example keys of `name` (they sync within 4 steps)."""
  return dict(algorithms.REGISTRY[name].example)


def _lacks(name, spec) -> list[str]:
  """What the test suites need from a registry entry and `spec` does not give."""
  lacks = []
  if spec.example is None:
    lacks.append('an example (conformance, mesh, golden and loop tests build it with it)')
  else:
    for case, keys in spec.examples(name).items():
      extra = sorted(set(keys) - set(spec.key_names()))
      if extra:
        lacks.append(f'example {case!r} sets keys the factory does not take: {extra}')
  if spec.carrier not in spec_lib.CARRIERS:
    lacks.append(f'a carrier collective, one of {spec_lib.CARRIERS} (tests/test_mesh.py)')
  if spec.inner not in optim.INNER_OPTIMIZERS:
    lacks.append(f'a default inner optimizer, one of {optim.INNER_OPTIMIZERS}')
  undeclared = sorted(set(spec.key_names()) - set(spec.config_keys()))
  if undeclared:
    lacks.append(f'a Key (type, rule, doc) for {undeclared} (the config schema)')
  return lacks


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_every_registry_entry_has_what_the_suites_need(name):
  """The suites read every per-algorithm fact from the registry: an entry without one
  would silently drop out of them."""
  assert not _lacks(name, algorithms.REGISTRY[name]), (
      f'the spec of {name!r} lacks: {"; ".join(_lacks(name, algorithms.REGISTRY[name]))} '
      '(loco/algorithms/spec.py).')


def test_a_bare_factory_lacks_what_the_suites_need():
  algorithms.register('bare_ddp', algorithms.REGISTRY['ddp'].factory)
  try:
    assert len(_lacks('bare_ddp', algorithms.REGISTRY['bare_ddp'])) == 2   # example, carrier
    assert algorithms.make('bare_ddp', optax.sgd(0.1)).init is not None
  finally:
    del algorithms.REGISTRY['bare_ddp']


def test_registering_an_algorithm_with_a_new_key_puts_it_in_the_schema():
  """The schema's algorithm section follows the registry with no call to clear a cache
  (configs stands above the algorithms; they do not import it back)."""
  spec = algorithms.REGISTRY['ddp']
  assert 'algorithm.loudness' not in configs.schema()

  def factory(inner, *, mesh=None, loudness: float = 1.0):
    del loudness
    return spec.factory(inner, mesh=mesh)

  algorithms.register('loud_ddp', algorithms.AlgorithmSpec(
      factory, keys={'loudness': algorithms.Key(float, 'how loud', 'positive')}))
  try:
    assert configs.schema()['algorithm.loudness'] == (float, True)
  finally:
    del algorithms.REGISTRY['loud_ddp']
  assert 'algorithm.loudness' not in configs.schema()


def _quadratic_setup(key=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(key))
  params = {'w': jax.random.normal(k1, (6, 3)),
            'b': jnp.zeros((3,), jnp.bfloat16)}
  target = {'w': jax.random.normal(k2, (6, 3)), 'b': jnp.ones((3,), jnp.bfloat16)}
  def loss(p):
    return sum(0.5 * jnp.sum((p[k].astype(jnp.float32) - target[k].astype(jnp.float32)) ** 2)
               for k in p)
  return params, target, loss


def _distance(params_MxP, target):
  return float(sum(jnp.sum((x.astype(jnp.float32) - t.astype(jnp.float32)[None]) ** 2)
                   for x, t in zip(jax.tree.leaves(params_MxP), jax.tree.leaves(target))))


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_conformance(name):
  """Every registered algorithm: no retrace, finite state, dtypes kept, converges."""
  params, target, loss = _quadratic_setup()
  alg = algorithms.make(name, optax.sgd(0.1), **_example(name))
  state = alg.init(params, M, jax.random.PRNGKey(1))
  traces = []

  def step(state):
    traces.append(1)
    grads = jax.vmap(jax.grad(loss))(state.params)
    return alg.step(state, grads)

  step = jax.jit(step)
  start = _distance(state.params, target)
  for _ in range(100):
    state, info = step(state)
  assert len(traces) == 1, 'the step was traced more than once (recompilation)'
  assert info.wire.sent.shape == (M,)
  for leaf in jax.tree.leaves(state):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
    assert got.dtype == want.dtype and got.shape == (M,) + want.shape
  assert _distance(state.params, target) < 0.05 * start


@pytest.mark.parametrize('name', sorted(algorithms.REGISTRY))
def test_the_anchor_and_outer_state_are_float32_under_bfloat16_params(name):
  """One policy for every algorithm with an outer chain: its anchor and the outer
  state's float arrays are float32 whatever the params' dtype (the outer step
  accumulates small updates). Algorithms without an anchor are skipped, saying so."""
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _quadratic_setup()[0])
  alg = algorithms.make(name, optax.sgd(0.1), **_example(name))
  state = alg.init(params, M, jax.random.PRNGKey(1))
  if state.anchor is None:
    pytest.skip(f'{name} keeps no anchor (no outer chain): its params are its only state')
  state, _ = jax.jit(alg.step)(state, jax.tree.map(jnp.ones_like, state.params))
  assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.bfloat16)}
  assert {leaf.dtype for leaf in jax.tree.leaves(state.anchor)} == {jnp.dtype(jnp.float32)}
  outer = [leaf.dtype for leaf in jax.tree.leaves(state.outer_state)
           if jnp.issubdtype(leaf.dtype, jnp.floating)]
  assert all(d == jnp.float32 for d in outer), (name, set(outer))


def _blocks_setup():
  """A quadratic over a tree with two transformer-like blocks (Streaming: 3 fragments)."""
  keys = jax.random.split(jax.random.PRNGKey(3), 4)
  params = {'embed': jax.random.normal(keys[0], (5, 3)),
            'blocks': [{'w': jax.random.normal(keys[1], (3, 3))},
                       {'w': jax.random.normal(keys[2], (3, 3)),
                        'scale': jnp.ones((3,), jnp.bfloat16)}]}
  target = jax.tree.map(lambda x: jnp.zeros_like(x) + 0.5, params)
  def loss(p):
    return sum(0.5 * jnp.sum((a.astype(jnp.float32) - b.astype(jnp.float32)) ** 2)
               for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(target)))
  return params, loss


# The examples sync within SILENT_STEPS steps, with silent steps between the syncs.
SILENT_STEPS = 8
# Algorithms that mix workers on a step they report as silent (a real bug): name -> why.
_MIXES_ON_SILENT_STEPS: dict[str, str] = {}


def _per_worker_leaves(state):
  """(path, leaf) of every per-worker field of a LocoState (all but step and key); a
  transform's own PRNG keys as their key data."""
  fields = {k: v for k, v in state._asdict().items() if k not in ('step', 'key')}
  as_array = lambda x: (jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
                        else x)
  return [(jax.tree_util.keystr(path), as_array(leaf))
          for path, leaf in jax.tree_util.tree_flatten_with_path(fields)[0]]


@pytest.mark.parametrize('name', [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=_MIXES_ON_SILENT_STEPS[n]))
    if n in _MIXES_ON_SILENT_STEPS else n for n in sorted(algorithms.REGISTRY)])
def test_silent_steps_do_not_mix_workers(name):
  """A step that reports no communication leaves the other workers' state unaffected.

  Along one trajectory through several sync rounds, every step is also taken from the
  same state with worker 1's input changed: its gradient, then its gradient and its
  params. On a step whose StepInfo reports no communication (no events, no bytes),
  every other worker's state (params, inner, anchor, outer and extra state) must come
  out bitwise the same; on any step, so must the state of a worker that received
  nothing. On communicating steps the change may spread, and for every algorithm it
  must on some step: otherwise this check could not see mixing at all.
  """
  params, loss = _blocks_setup()
  keys = _example(name)
  alg = algorithms.make(name, optax.adam(0.05), **keys)
  state = alg.init(params, M, jax.random.PRNGKey(1))
  step = jax.jit(alg.step)
  grad = jax.jit(jax.vmap(jax.grad(loss)))
  poke = jax.jit(lambda tree: jax.tree.map(lambda x: x.at[1].set(-7.0 * x[1] + 0.3), tree))
  others = np.arange(M) != 1
  silent_steps, spread_steps, round_steps, quiet_between = [], [], 0, 0
  for t in range(1, SILENT_STEPS + 1):
    grads = grad(state.params)
    plain, info = step(state, grads)
    comms, sent, received = (np.asarray(x) for x in
                             (info.wire.events, info.wire.sent, info.wire.received))
    silent = not comms.any() and not sent.any() and not received.any()
    round_steps += bool(info.synced)
    quiet_between += not info.synced and not sent.any()
    deaf = others & (comms == 0) & (received == 0)   # other workers that received nothing
    if silent:
      silent_steps.append(t)
    for what, (s, g) in {'gradient': (state, poke(grads)),
                         'gradient and params': (state._replace(params=poke(state.params)),
                                                 poke(grads))}.items():
      changed, info_changed = step(s, g)
      # What goes on the wire follows shapes and the schedule, not values.
      np.testing.assert_array_equal(info_changed.wire.events, comms)
      np.testing.assert_array_equal(info_changed.wire.sent, sent)
      for (path, a), (_, b) in zip(_per_worker_leaves(plain), _per_worker_leaves(changed)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert a.shape[0] == M, f'{path} has no leading worker axis'
        for w in np.flatnonzero(deaf):
          assert np.array_equal(a[w], b[w], equal_nan=True), (
              f'{name}, step {t}, reported {"silent" if silent else "nothing received"} '
              f'for worker {w}: its {path} changed when only worker 1\'s {what} did.')
        if any(not np.array_equal(a[w], b[w], equal_nan=True)
               for w in np.flatnonzero(others)):
          spread_steps.append(t)
    state = plain
  assert spread_steps, f'{name}: a change of worker 1 never reached another worker'
  if 'sync_every' in keys:   # the window has round steps and steps between rounds
    assert 0 < round_steps < SILENT_STEPS, round_steps
    # A step between rounds that sends nothing is silent (and was checked above); one
    # that sends is a per-step link riding along (SPARTA's averaging in SPARTA-DiLoCo).
    assert len(silent_steps) == quiet_between, (silent_steps, quiet_between)


@pytest.mark.slow
def test_a_user_loop_drives_an_algorithm():
  """The public contract: a hand-written loop with vmapped grads and alg.step."""
  w_true = jnp.linspace(-1.0, 1.0, 8)

  def loss(params, batch_BxD):
    return jnp.mean((batch_BxD @ (params['w'] - w_true)) ** 2)

  alg = algorithms.make('diloco', optax.adamw(1e-2), sync_every=5, outer_lr=0.5)
  state = alg.init({'w': jnp.zeros((8,))}, 3, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  data = jax.random.normal(jax.random.PRNGKey(1), (40, 3, 16, 8))
  first = float(jax.vmap(loss)(state.params, data[0]).mean())
  syncs = 0
  for t in range(40):
    grads = jax.vmap(jax.grad(loss))(state.params, data[t])
    state, info = step(state, grads)
    syncs += int(info.synced)
  assert syncs == 8
  assert float(jax.vmap(loss)(state.params, data[0]).mean()) < 0.5 * first


def _toy_regression(seed=0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  params = {'w': jax.random.normal(k1, (5, 2)) * 0.1, 'b': jnp.zeros((2,))}
  x = jax.random.normal(k2, (12, 8, 5))       # [steps, batch, features]
  y = jnp.tanh(x @ jnp.ones((5, 2)))
  def loss(p, xb, yb):
    return jnp.mean((jnp.tanh(xb @ p['w'] + p['b']) - yb) ** 2)
  return params, x, y, loss


@pytest.mark.slow
def test_ddp_equals_one_worker_at_m_times_the_batch():
  params, x, y, loss = _toy_regression()
  inner = optim.inner_optimizer(optim.InnerConfig(lr=0.05, warmup_steps=2, decay_steps=10))
  ddp = algorithms.make('ddp', inner)
  single = algorithms.make('ddp', inner)
  s_m = ddp.init(params, M, jax.random.PRNGKey(0))
  s_1 = single.init(params, 1, jax.random.PRNGKey(0))
  for t in range(x.shape[0]):
    xb, yb = x[t].reshape(M, -1, 5), y[t].reshape(M, -1, 2)   # M workers x batch 2
    s_m, _ = ddp.step(s_m, jax.vmap(jax.grad(loss))(s_m.params, xb, yb))
    s_1, _ = single.step(s_1, jax.vmap(jax.grad(loss))(s_1.params, x[t][None], y[t][None]))
  for a, b in zip(jax.tree.leaves(s_m.params), jax.tree.leaves(s_1.params)):
    for worker in range(M):
      np.testing.assert_allclose(a[worker], b[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_diloco_one_worker_outer_sgd_lr1_equals_adamw():
  params, x, y, loss = _toy_regression(1)
  inner = optim.inner_optimizer(optim.InnerConfig(lr=0.05, warmup_steps=2, decay_steps=10))
  alg = algorithms.make('diloco', inner, sync_every=3, outer_optimizer='sgd',
                        outer_lr=1.0, outer_momentum=0.0)
  state = alg.init(params, 1, jax.random.PRNGKey(0))
  plain, opt_state = params, inner.init(params)
  for t in range(x.shape[0]):
    state, info = alg.step(state, jax.vmap(jax.grad(loss))(state.params, x[t][None],
                                                           y[t][None]))
    updates, opt_state = inner.update(jax.grad(loss)(plain, x[t], y[t]), opt_state, plain)
    plain = optax.apply_updates(plain, updates)
    assert float(info.wire.sent[0]) == 0.0       # one worker sends nothing
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(plain)):
    np.testing.assert_allclose(a[0], b, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize('dtype,itemsize', [('float32', 4), ('bfloat16', 2)])
def test_all_reduce_bytes_match_hand_count(dtype, itemsize):
  params = {'a': jnp.zeros((10, 7)), 'b': jnp.zeros((3,))}        # 73 parameters
  alg = algorithms.make('diloco', optax.sgd(0.1), sync_every=2, transport_dtype=dtype)
  state = alg.init(params, 5, jax.random.PRNGKey(0))
  grads = jax.tree.map(jnp.ones_like, state.params)
  state, info = alg.step(state, grads)
  assert not bool(info.synced) and float(info.wire.sent.sum()) == 0.0
  state, info = alg.step(state, grads)
  want = 2 * (5 - 1) / 5 * 73 * itemsize
  np.testing.assert_allclose(info.wire.sent, want, rtol=1e-7)
  np.testing.assert_allclose(info.wire.received, want, rtol=1e-7)
  np.testing.assert_array_equal(info.wire.events, 1)
  ddp = algorithms.make('ddp', optax.sgd(0.1), transport_dtype=dtype)
  _, info = ddp.step(ddp.init(params, 5, jax.random.PRNGKey(0)), grads)
  np.testing.assert_allclose(info.wire.sent, want, rtol=1e-7)


@pytest.mark.slow
def test_bfloat16_transport_rounds_the_mean():
  params = {'w': jnp.zeros((4,))}
  alg = algorithms.make('ddp', optax.sgd(1.0), transport_dtype='bfloat16')
  state = alg.init(params, 2, jax.random.PRNGKey(0))
  grads = {'w': jnp.array([[1.0 + 2 ** -10] * 4, [1.0] * 4])}
  state, _ = alg.step(state, grads)
  np.testing.assert_array_equal(state.params['w'], -1.0)    # 1 + 2^-10 rounds to 1 in bf16


def test_dead_workers_are_left_out_and_adopt_the_mean():
  params = {'w': jnp.zeros((2,))}
  alg = algorithms.make('diloco', optax.sgd(1.0), sync_every=1, outer_optimizer='sgd',
                        outer_lr=1.0, outer_momentum=0.0)
  state = alg.init(params, 3, jax.random.PRNGKey(0))
  grads = {'w': jnp.array([[1.0, 1.0], [2.0, 2.0], [30.0, 30.0]])}
  ctx = StepContext(alive=jnp.array([True, True, False]))
  state, info = alg.step(state, grads, ctx)
  np.testing.assert_allclose(state.params['w'], -1.5)       # mean of the alive two
  size = 2 * 4
  # 2(m-1)/m S with m = 2, plus half of the S bytes the absent worker downloads.
  np.testing.assert_allclose(info.wire.sent, [size + size / 2, size + size / 2, 0.0])
  np.testing.assert_allclose(info.wire.received, [size, size, size])


def test_inactive_workers_do_not_step():
  params = {'w': jnp.zeros((2,))}
  alg = algorithms.make('local_sgd', optax.sgd(1.0), sync_every=10)
  state = alg.init(params, 2, jax.random.PRNGKey(0))
  grads = {'w': jnp.ones((2, 2))}
  state, _ = alg.step(state, grads, StepContext(active=jnp.array([True, False])))
  np.testing.assert_array_equal(state.params['w'], [[-1.0, -1.0], [0.0, 0.0]])
  ddp = algorithms.make('ddp', optax.sgd(1.0))
  _, info = ddp.step(ddp.init(params, 2, jax.random.PRNGKey(0)), grads,
                     StepContext(active=jnp.array([True, False])))
  np.testing.assert_array_equal(info.wire.sent, [8.0, 0.0])   # the idle worker sends nothing


def _counting(calls):
  """An identity transform that counts the updates it takes (per worker, at run time)."""
  def update(updates, state, params=None):
    jax.debug.callback(lambda: calls.append(1))
    return updates, state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def test_a_per_worker_sync_mask_syncs_only_those_workers_and_only_then():
  """The asynchronous replay's [M] sync mask: the masked-out workers keep their state
  and send nothing, the others match a full sync under the same mixing matrix, and a
  tick with no exchange does not run the outer step at all."""
  calls = []
  params = {'w': jnp.arange(3.0)}
  mixer = comm.gossip('matching', 'models', pairwise=True)
  alg = local_updates(optax.sgd(0.1), optax.chain(_counting(calls), mixer,
                                                  optax.sgd(0.7, momentum=0.5)), 50)
  state = alg.init(params, M, jax.random.PRNGKey(0))
  grads = {'w': jnp.arange(M * 3.0).reshape(M, 3)}
  pairs = np.eye(M, dtype=np.float32)
  pairs[:2, :2] = 0.5                        # workers 0 and 1 exchange, 2 and 3 do not
  step = jax.jit(alg.step)
  quiet, info = step(state, grads, StepContext(
      participation=Participation(sync=np.zeros(M, bool)), mixing=pairs))
  jax.effects_barrier()
  assert not calls and not bool(info.synced)
  mask = np.array([True, True, False, False])
  got, info = step(state, grads, StepContext(participation=Participation(sync=mask), mixing=pairs))
  full, _ = step(state, grads, StepContext(
      participation=Participation(sync=np.ones(M, bool)), mixing=pairs))
  jax.effects_barrier()
  assert calls and bool(info.synced)
  np.testing.assert_array_equal(info.wire.sent > 0, mask)
  for field in ('params', 'anchor', 'outer_state'):
    for g, f, q in zip(*(jax.tree.leaves(getattr(s, field)) for s in (got, full, quiet))):
      np.testing.assert_array_equal(g[:2], f[:2])
      np.testing.assert_array_equal(g[2:], q[2:])


@pytest.mark.parametrize('mode', ['map', 'vmap'])
def test_map_workers_skips_inactive_workers_under_map(mode):
  calls = []
  def fn(x):
    jax.debug.callback(lambda: calls.append(1))
    return 2.0 * x
  mapped = jax.jit(axis.map_workers(fn, mode))
  x = jnp.arange(1.0, 4.0)
  out = mapped(x, active=jnp.array([True, False, True]))
  jax.effects_barrier()
  if mode == 'map':            # the inactive worker's fn did not run: zeros
    assert len(calls) == 2
    np.testing.assert_array_equal(out, [2.0, 0.0, 6.0])
  else:                        # a batched computation cannot skip a member
    np.testing.assert_array_equal(out, [2.0, 4.0, 6.0])


@pytest.mark.slow
def test_train_chunk_skips_inactive_workers_and_reports_the_steppers_loss():
  cfg = model_lib.model_config('nano', vocab_size=64, max_seq_len=16)
  graphdef, params = model_lib.init_params(cfg, jax.random.PRNGKey(0))
  alg = algorithms.make('diloco', optax.adamw(1e-2), sync_every=5)
  chunk = step_lib.make_train_chunk(alg, cfg, graphdef, grad_mode='map')
  state = alg.init(params, 3, jax.random.PRNGKey(1))
  before = jax.tree.map(np.asarray, state.params)
  batches = np.random.default_rng(0).integers(0, 64, (2, 3, 2, 17), dtype=np.int32)
  active = np.array([[True, False, True], [False, False, False]])
  state, (losses, _) = chunk(state, jnp.asarray(batches), StepContext(active=active),
                             np.ones(2, bool))
  losses = np.asarray(losses)
  assert np.all(np.isfinite(losses)) and np.all(losses > 0)
  np.testing.assert_allclose(losses[0, 1], losses[0, [0, 2]].mean(), rtol=1e-6)
  np.testing.assert_array_equal(losses[1], losses[1, 0])   # nobody steps: worker 0 measures
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)):
    np.testing.assert_array_equal(a[1], b[1])               # worker 1 never stepped


def test_bad_input():
  with pytest.raises(ConfigError, match='sync_every'):
    local_updates(optax.sgd(1.0), optax.sgd(1.0), 0)
  with pytest.raises(ConfigError, match='eager updates'):
    local_updates(optax.sgd(1.0), optax.sgd(1.0), 2, merge=merge.eager(1, 0.5))
  with pytest.raises(ConfigError, match='merge_alpha'):
    local_updates(optax.sgd(1.0), optax.sgd(1.0), 2, merge=merge.delayed(0, 2.0))
  with pytest.raises(ConfigError, match='needs an outer chain'):
    local_updates(optax.sgd(1.0), None, 1, merge=merge.delayed(1, 0.5))
  with pytest.raises(ConfigError, match='algorithm.name'):
    algorithms.make('dilocco', optax.sgd(1.0))
  with pytest.raises(ConfigError, match='outer_optimizer'):
    algorithms.make('diloco', optax.sgd(1.0), outer_optimizer='lamb')
  with pytest.raises(ConfigError, match='does not take'):
    algorithms.make('ddp', optax.sgd(1.0), sync_every=5)
  with pytest.raises(ConfigError, match='transport dtype'):
    comm.all_reduce_mean('int8')
