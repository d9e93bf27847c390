"""Streaming DiLoCo: fragments, schedule, delayed merge, per-fragment state, bytes, eager."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import model as model_lib
from loco.algorithms import optim
from loco.run import step as step_lib
from loco.core.engine import StepContext
from loco.core.participation import Participation
from loco.errors import ConfigError


def _blocks_tree(num_blocks=2, width=3, embed=(2, 4)):
  """A small tree with block-indexed keys, like loco.model's params."""
  key = jax.random.PRNGKey(7)
  tree = {'embed': jax.random.normal(key, embed), 'final_norm': {'scale': jnp.ones(4)},
          'blocks': {}}
  for i in range(num_blocks):
    key, k1 = jax.random.split(key)
    tree['blocks'][i] = {'w': jax.random.normal(k1, (4, width)), 'b': jnp.zeros(width)}
  return tree


def _make(inner=None, **kwargs):
  return algorithms.make('streaming_diloco', inner or optax.sgd(1.0), **kwargs)


def _per_worker_grads(params_MxP, scale=(1.0, -2.0, 0.5)):
  # Constant, distinct gradients per worker: params move linearly and visibly.
  s = jnp.asarray(scale)
  return jax.tree.map(lambda x: s.reshape((-1,) + (1,) * (x.ndim - 1)) * jnp.ones_like(x),
                      params_MxP)


@pytest.mark.slow
def test_one_fragment_no_overlap_alpha0_equals_diloco():
  """Oracle: P 1, tau 0, alpha 0, no quantization is DiLoCo, step for step."""
  params = _blocks_tree(num_blocks=2)
  inner = optim.inner_optimizer(optim.InnerConfig(lr=0.05, warmup_steps=2, decay_steps=12))
  diloco = algorithms.make('diloco', inner, sync_every=3, outer_lr=0.7, outer_momentum=0.9)
  stream = _make(inner, sync_every=3, num_fragments=1, non_block='first',
                 overlap_steps=0, merge_alpha=0.0, compression='none', outer_lr=0.7,
                 outer_momentum=0.9)
  s_d = diloco.init(params, 3, jax.random.PRNGKey(0))
  s_s = stream.init(params, 3, jax.random.PRNGKey(0))
  target = jax.tree.map(lambda x: jnp.full_like(x, 0.3), params)
  loss = lambda p, k: sum(jnp.sum((x - t) ** 2 * (1.0 + k)) for x, t in
                          zip(jax.tree.leaves(p), jax.tree.leaves(target)))
  grad = jax.vmap(jax.grad(loss))
  scales = jnp.array([0.0, 1.0, 2.0])
  step_d, step_s = jax.jit(diloco.step), jax.jit(stream.step)
  for _ in range(12):                                          # four rounds
    s_d, i_d = step_d(s_d, grad(s_d.params, scales))
    s_s, i_s = step_s(s_s, grad(s_s.params, scales))
    np.testing.assert_array_equal(i_d.wire.sent, i_s.wire.sent)
    assert bool(i_d.synced) == bool(i_s.synced)
  for a, b in zip(jax.tree.leaves(s_d.params), jax.tree.leaves(s_s.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  for a, b in zip(jax.tree.leaves(s_d.anchor), jax.tree.leaves(s_s.anchor)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('tau,alpha', [(1, 0.0), (2, 0.25), (0, 0.5)])
def test_update_synced_at_t_is_merged_at_t_plus_tau(tau, alpha):
  # Blocks 0 and 1, no other leaves: fragment 1 (block 1) syncs at s = 4, fragment 0 at 8.
  params = {'blocks': {0: {'w': jnp.zeros(2)}, 1: {'w': jnp.zeros(2)}}}
  alg = _make(sync_every=8, num_fragments=2, overlap_steps=tau, merge_alpha=alpha,
              compression='none', outer_optimizer='sgd', outer_lr=1.0, outer_momentum=0.0)
  state = alg.init(params, 3, jax.random.PRNGKey(0))
  g = np.array([1.0, -2.0, 0.5])[:, None]
  step = jax.jit(alg.step)
  for s in range(1, 4 + tau + 1):
    state, info = step(state, _per_worker_grads(state.params))
    block1 = np.asarray(state.params['blocks'][1]['w'])
    local = -s * g * np.ones((1, 2))                          # inner SGD lr 1, no merge yet
    np.testing.assert_array_equal(info.wire.fragment, [1 if s == 4 else -1] * 3)
    np.testing.assert_array_equal(info.wire.overlap, [tau if s == 4 else 0] * 3)
    assert (float(info.wire.sent.sum()) > 0) == (s == 4)
    if s < 4 + tau:
      np.testing.assert_allclose(block1, local, atol=1e-6)    # still in flight
  global_1 = -4 * g.mean() * np.ones((1, 2))                   # outer SGD lr 1: the mean
  np.testing.assert_allclose(state.anchor['blocks'][1]['w'], np.broadcast_to(global_1, (3, 2)))
  np.testing.assert_allclose(block1, alpha * local + (1 - alpha) * global_1, atol=1e-6)
  # Block 0 has not synced: untouched local params, untouched anchor.
  np.testing.assert_allclose(state.params['blocks'][0]['w'], local, atol=1e-6)
  np.testing.assert_array_equal(state.anchor['blocks'][0]['w'], 0.0)


def test_fragments_that_do_not_sync_keep_their_momentum_bitwise():
  params = {'blocks': {0: {'w': jnp.zeros(3)}, 1: {'w': jnp.zeros(3)}}}
  alg = _make(sync_every=8, num_fragments=2, compression='none')   # Nesterov 0.4 / 0.9
  state = alg.init(params, 3, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  snapshots = {}
  for s in range(1, 13):
    state, _ = step(state, _per_worker_grads(state.params))
    snapshots[s] = jax.tree.map(np.asarray, state.outer_state)
  momentum = lambda snap, f: jax.tree.leaves(snap[f][1])
  assert all(np.any(m != 0) for m in momentum(snapshots[8], 0))   # fragment 0 synced at 8
  for a, b in zip(momentum(snapshots[8], 0), momentum(snapshots[12], 0)):
    np.testing.assert_array_equal(a, b)                 # fragment 1 synced at 12
  for a, b in zip(momentum(snapshots[4], 1), momentum(snapshots[11], 1)):
    np.testing.assert_array_equal(a, b)                 # fragment 0 synced at 8
  assert any(np.any(a != b) for a, b in zip(momentum(snapshots[11], 1),
                                            momentum(snapshots[12], 1)))


@pytest.mark.parametrize('compression', ['e3m0', 'none'])
def test_peak_bytes_are_the_largest_fragment_payload(compression):
  # Fragments (P 2 strided, non-block own): 0 = embed (2x4) + final_norm (4): 12 values
  # in 2 tensors; 1 = blocks 0 and 2: 2 x (4x3 + 3) = 30 values in 4 tensors;
  # 2 = block 1: 15 values in 2 tensors.
  params = _blocks_tree(num_blocks=3)
  alg = _make(sync_every=6, num_fragments=2, compression=compression)
  num_workers = 4
  state = alg.init(params, num_workers, jax.random.PRNGKey(0))
  step = jax.jit(alg.step)
  per_step = []
  for _ in range(6):
    state, info = step(state, jax.tree.map(jnp.ones_like, state.params))
    per_step.append(np.asarray(info.wire.sent))
  if compression == 'e3m0':       # 4 bits a value + one float32 scale a tensor
    payload = {0: 12 * 4 / 8 + 2 * 4, 1: 30 * 4 / 8 + 4 * 4, 2: 15 * 4 / 8 + 2 * 4}
  else:
    payload = {0: 12 * 4, 1: 30 * 4, 2: 15 * 4}
  ring = 2 * (num_workers - 1) / num_workers
  # Offsets (f * 6) // 3: fragment 1 at s = 2, fragment 2 at s = 4, fragment 0 at s = 6.
  want = [0, ring * payload[1], 0, ring * payload[2], 0, ring * payload[0]]
  np.testing.assert_allclose(np.stack(per_step), np.repeat(np.array(want)[:, None],
                                                           num_workers, 1), rtol=1e-6)
  assert max(want) == ring * payload[1] == np.stack(per_step).max()


def test_eager_merges_an_estimate_at_once_and_corrects_on_arrival():
  params = {'blocks': {0: {'w': jnp.zeros(2)}, 1: {'w': jnp.zeros(2)}}}
  alg = _make(sync_every=8, num_fragments=2, overlap_steps=1, merge_alpha=0.0,
              compression='none', outer_optimizer='sgd', outer_lr=1.0,
              outer_momentum=0.0, eager=True)
  state = alg.init(params, 3, jax.random.PRNGKey(0))
  g = np.array([1.0, -2.0, 0.5])[:, None] * np.ones((1, 2))
  step = jax.jit(alg.step)
  for _ in range(4):
    state, _ = step(state, _per_worker_grads(state.params))
  # First sync of block 1 (s = 4): no previous average, so Delta_hat_m = Delta_m / M.
  delta = 4 * g
  theta_hat = -delta / 3
  np.testing.assert_allclose(state.params['blocks'][1]['w'], theta_hat, atol=1e-6)
  state, _ = step(state, _per_worker_grads(state.params))
  # On arrival the estimate is swapped for the true anchor; the tau local steps stay.
  true_anchor = -delta.mean(axis=0, keepdims=True)
  np.testing.assert_allclose(state.params['blocks'][1]['w'], true_anchor - g, atol=1e-6)
  # Second sync of block 1 (s = 12): others' shares come from the last average.
  for _ in range(6):
    state, _ = step(state, _per_worker_grads(state.params))
  phi = np.asarray(state.params['blocks'][1]['w']) - g      # after step 12's inner step
  anchor = np.asarray(state.anchor['blocks'][1]['w'])
  estimate = delta.mean(axis=0, keepdims=True) + ((anchor - phi) - delta) / 3
  state, _ = step(state, _per_worker_grads(state.params))
  np.testing.assert_allclose(state.params['blocks'][1]['w'], anchor - estimate, atol=1e-5)


def test_eager_without_overlap_equals_the_plain_merge():
  params = _blocks_tree(num_blocks=2)
  kwargs = dict(sync_every=6, num_fragments=2, overlap_steps=0, merge_alpha=0.5,
                compression='none')
  plain, eager = _make(**kwargs), _make(eager=True, **kwargs)
  s_p = plain.init(params, 3, jax.random.PRNGKey(0))
  s_e = eager.init(params, 3, jax.random.PRNGKey(0))
  step_p, step_e = jax.jit(plain.step), jax.jit(eager.step)
  for _ in range(13):
    s_p, _ = step_p(s_p, _per_worker_grads(s_p.params))
    s_e, _ = step_e(s_e, _per_worker_grads(s_e.params))
  for a, b in zip(jax.tree.leaves(s_p.params), jax.tree.leaves(s_e.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_runs_in_the_train_chunk_on_the_model():
  cfg = model_lib.model_config('nano', vocab_size=64, max_seq_len=16)
  graphdef, params = model_lib.init_params(cfg, jax.random.PRNGKey(0))
  alg = _make(optax.adamw(1e-2), sync_every=6)     # 3 fragments: offsets 0, 2, 4
  chunk = step_lib.make_train_chunk(alg, cfg, graphdef)
  state = alg.init(params, 2, jax.random.PRNGKey(1))
  batches = np.random.default_rng(0).integers(0, 64, (6, 2, 2, 17), dtype=np.int32)
  state, (losses, info) = chunk(state, jnp.asarray(batches), None, np.ones(6, bool))
  assert np.all(np.isfinite(np.asarray(losses)))
  np.testing.assert_array_equal(info.wire.fragment[:, 0], [-1, 1, -1, 2, -1, 0])
  sent = np.asarray(info.wire.sent)[:, 0]
  assert sent[5] > 0 and sent[1] > 0 and sent[1] == sent[3]   # the two blocks match


def test_bad_input():
  params = _blocks_tree(num_blocks=2)
  with pytest.raises(ConfigError, match='num_fragments=3 is larger than the number'):
    _make(sync_every=30, num_fragments=3).init(params, 2, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match='overlap_steps=5 must be <'):
    _make(sync_every=10, num_fragments=2, overlap_steps=5)
  with pytest.raises(ConfigError, match='overlap_steps=3 must be <'):
    # 2 block fragments + the non-block one: spacing 10 // 3 = 3.
    _make(sync_every=10, num_fragments=2, overlap_steps=3).init(
        params, 2, jax.random.PRNGKey(0))
  for alpha in (-0.1, 1.5):
    with pytest.raises(ConfigError, match='merge_alpha'):
      _make(merge_alpha=alpha)
  with pytest.raises(ConfigError, match=r'merge_alpha must be in \[0, 1\), got 1.0: alpha '
                     'weighs the local parameters in the merge, so alpha = 1 never adopts'):
    _make(merge_alpha=1.0)
  with pytest.raises(ConfigError, match='fragment_pattern'):
    _make(fragment_pattern='random')
  with pytest.raises(ConfigError, match='non_block'):
    _make(non_block='last')
  with pytest.raises(ConfigError, match='not both'):
    _make(num_fragments=2, layers_per_fragment=1)
  with pytest.raises(ConfigError, match='layers_per_fragment=3 must divide'):
    _make(layers_per_fragment=3).init(params, 2, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match='no transformer blocks'):
    _make(num_fragments=2).init({'w': jnp.ones(2)}, 2, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match='sync_every=2 must be >='):
    _make(sync_every=2, overlap_steps=0).init(params, 2, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match='compression'):
    _make(compression='e2m1')
  alg = _make(sync_every=6)
  state = alg.init(params, 2, jax.random.PRNGKey(0))
  with pytest.raises(ConfigError, match='Participation.sync'):
    alg.step(state, state.params, StepContext(participation=Participation(sync=jnp.array(True))))
