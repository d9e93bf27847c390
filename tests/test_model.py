"""Tests for loco/model.py: shapes, causality, RoPE, losses, counts, configs."""

import dataclasses
import functools
import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import model as model_lib
from loco.errors import ConfigError


NANO = model_lib.model_config('nano')


def _tokens(cfg, shape, seed=1):
  return jax.random.randint(jax.random.key(seed), shape, 0, cfg.vocab_size,
                            jnp.int32)


@functools.cache
def _init(cfg, seed=0):
  return model_lib.init_params(cfg, jax.random.key(seed))


@functools.cache
def _jit_apply(cfg):
  graphdef, _ = _init(cfg)
  return jax.jit(functools.partial(model_lib.apply, cfg, graphdef))


@functools.cache
def _jit_loss_and_grad(cfg):
  graphdef, _ = _init(cfg)
  return jax.jit(jax.value_and_grad(
      functools.partial(model_lib.loss_fn, cfg, graphdef), has_aux=True))


@pytest.mark.slow
def test_shapes_and_dtypes():
  graphdef, params = _init(NANO)
  logits = _jit_apply(NANO)(params, _tokens(NANO, (3, 16)))
  assert logits.shape == (3, 16, NANO.vocab_size)
  assert logits.dtype == jnp.float32
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  # Plain nested dicts (int keys for blocks), so they stack and checkpoint.
  assert type(params) is dict and type(params['blocks']) is dict
  assert sorted(params['blocks']) == list(range(NANO.num_layers))
  assert params['embed'].shape == (NANO.vocab_size, NANO.d_model)
  assert isinstance(nnx.merge(graphdef, params), model_lib.Transformer)


def test_causality_is_exact():
  _, params = _init(NANO)
  tokens = _tokens(NANO, (2, 24))
  t = 13
  changed = tokens.at[:, t].set((tokens[:, t] + 7) % NANO.vocab_size)
  apply = _jit_apply(NANO)
  before, after = apply(params, tokens), apply(params, changed)
  np.testing.assert_array_equal(before[:, :t], after[:, :t])
  assert not np.allclose(before[:, t:], after[:, t:])


def test_rope_depends_only_on_relative_position():
  q = jax.random.normal(jax.random.key(0), (1, 1, 1, 16))
  k = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))

  def score(i, j):
    qi = model_lib.rope(q, jnp.array([i]), 10000.0)
    kj = model_lib.rope(k, jnp.array([j]), 10000.0)
    return float(jnp.sum(qi * kj))

  for i, j, shift in [(5, 2, 11), (0, 0, 40), (9, 30, 100)]:
    assert score(i, j) == pytest.approx(score(i + shift, j + shift),
                                        rel=1e-4, abs=1e-5)
  assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)
  # Position 0 is the identity and every rotation preserves the norm.
  np.testing.assert_allclose(model_lib.rope(q, jnp.array([0]), 1e4), q,
                             atol=1e-6)
  np.testing.assert_allclose(
      jnp.linalg.norm(model_lib.rope(q, jnp.array([77]), 1e4)),
      jnp.linalg.norm(q), rtol=1e-5)


def test_tied_and_untied_counts_differ_by_vocab_times_d():
  untied = dataclasses.replace(NANO, tie_embeddings=False)
  assert (model_lib.param_count(untied) - model_lib.param_count(NANO)
          == NANO.vocab_size * NANO.d_model)
  _, params = model_lib.init_params(untied, jax.random.key(0))
  assert params['head'].shape == (NANO.d_model, NANO.vocab_size)
  assert 'head' not in _init(NANO)[1]


def test_param_counts_of_presets():
  counts = {p: model_lib.param_count(model_lib.model_config(p))
            for p in ('tiny', '60m', '150m', '400m')}
  print('param counts:', {p: f'{n:,}' for p, n in counts.items()})
  assert 3.1e6 < counts['tiny'] < 3.4e6
  assert 50e6 < counts['60m'] < 70e6
  assert 135e6 < counts['150m'] < 165e6
  assert 350e6 < counts['400m'] < 450e6
  tiny = model_lib.model_config('tiny')
  # 4 layers x (4 d^2 attention + 2 d d_ff MLP + 2 norms) + embedding + norm.
  assert counts['tiny'] == (4 * (4 * 256**2 + 2 * 256 * 1024 + 2 * 256)
                            + 256 * 256 + 256)
  assert (model_lib.param_count(tiny, non_embedding=True)
          == counts['tiny'] - 256 * 256)


def test_flops_per_token_formula():
  tiny = model_lib.model_config('tiny')
  matmul = 4 * (4 * 256**2 + 2 * 256 * 1024) + 256 * 256
  assert model_lib.flops_per_token(tiny, 128) == 6 * matmul + 12 * 4 * 256 * 128
  # Matmul weights are all params but the norm scales (the tied embedding is
  # the head).
  norms = (2 * tiny.num_layers + 1) * tiny.d_model
  assert model_lib.matmul_param_count(tiny) == (
      model_lib.param_count(tiny) - norms)


def test_eval_shape_of_1b_preset_does_not_allocate():
  cfg = model_lib.model_config('1b')
  graphdef, params = jax.eval_shape(
      functools.partial(model_lib.init_params, cfg), jax.random.key(0))
  leaves = jax.tree.leaves(params)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
  assert all(x.dtype == jnp.float32 for x in leaves)
  n = sum(math.prod(x.shape) for x in leaves)
  print(f'1b preset: {n:,} params')
  assert n == model_lib.param_count(cfg)
  assert 0.9e9 < n < 1.5e9
  assert graphdef is not None


@pytest.mark.slow
def test_variants_run_with_finite_grads():
  # One config with every option off the default path: one compile.
  cfg = dataclasses.replace(NANO, mlp='swiglu', qk_norm=True,
                            tie_embeddings=False, z_loss=1e-4, num_heads=4,
                            head_dim=6)
  (loss, aux), grads = _jit_loss_and_grad(cfg)(
      _init(cfg)[1], _tokens(cfg, (2, 17)))
  assert np.isfinite(loss) and np.isfinite(aux['ce'])
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    assert np.all(np.isfinite(g)), path
    assert np.any(g != 0), path
  block = _init(cfg)[1]['blocks'][0]
  assert block['mlp']['w_in'].shape == (cfg.d_model, 2, cfg.d_ff)
  assert block['attn']['qkv'].shape == (cfg.d_model, 3, 4, 6)
  assert block['attn']['q_norm']['scale'].shape == (6,)


def test_z_loss_adds_a_positive_term():
  with_z = dataclasses.replace(NANO, z_loss=1e-2)
  graphdef, params = _init(NANO)

  @jax.jit
  def losses(params, batch):
    # z_loss is only a loss coefficient: the same graphdef serves both.
    logits = model_lib.apply(NANO, graphdef, params, batch[:, :-1])
    return (model_lib.loss_fn(NANO, graphdef, params, batch),
            model_lib.loss_fn(with_z, graphdef, params, batch),
            1e-2 * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2))

  batch = _tokens(NANO, (2, 17))
  (loss0, aux0), (loss1, aux1), expected = losses(params, batch)
  assert float(aux0['z_loss']) == 0.0 and float(loss0) == float(aux0['ce'])
  assert float(aux1['z_loss']) > 0.0
  np.testing.assert_allclose(aux1['ce'], aux0['ce'], rtol=1e-6)
  np.testing.assert_allclose(loss1, aux1['ce'] + aux1['z_loss'], rtol=1e-6)
  np.testing.assert_allclose(aux1['z_loss'], expected, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('preset', ['nano', 'tiny'])
def test_loss_at_init_is_about_log_vocab(preset):
  cfg = model_lib.model_config(preset)
  graphdef, params = model_lib.init_params(cfg, jax.random.key(3))
  loss, aux = jax.jit(functools.partial(model_lib.loss_fn, cfg, graphdef))(
      params, _tokens(cfg, (4, 33)))
  assert abs(float(aux['ce']) - math.log(cfg.vocab_size)) < 0.1, float(loss)


@pytest.mark.slow
def test_adamw_overfits_one_batch():
  graphdef, params = _init(NANO)
  batch = _tokens(NANO, (4, 33))
  tx = optax.adamw(1e-2)
  loss_and_grad = _jit_loss_and_grad(NANO)

  @jax.jit
  def step(params, opt_state):
    (loss, _), grads = loss_and_grad(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = tx.init(params)
  losses = []
  for _ in range(25):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  assert losses[-1] < losses[0] - 1.0, losses


@pytest.mark.slow
def test_vmap_over_workers_matches_per_worker_calls():
  graphdef, _ = _init(NANO)
  num_workers = 2
  per_worker = [model_lib.init_params(NANO, jax.random.key(10 + i))[1]
                for i in range(num_workers)]
  params_MxP = jax.tree.map(lambda *xs: jnp.stack(xs), *per_worker)
  batch_MxBxL = _tokens(NANO, (num_workers, 2, 17))
  grad_fn = jax.value_and_grad(
      functools.partial(model_lib.loss_fn, NANO, graphdef), has_aux=True)
  (loss_M, aux_M), grads_M = jax.jit(jax.vmap(grad_fn, axis_name='workers'))(
      params_MxP, batch_MxBxL)
  assert loss_M.shape == (num_workers,) and aux_M['ce'].shape == (num_workers,)
  for i in range(num_workers):
    (loss, _), grads = _jit_loss_and_grad(NANO)(per_worker[i], batch_MxBxL[i])
    np.testing.assert_allclose(loss_M[i], loss, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a[i], b, rtol=1e-4, atol=1e-6),
        grads_M, grads)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params_and_logits():
  cfg = dataclasses.replace(NANO, dtype='bfloat16')
  graphdef, params = _init(cfg)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  batch = _tokens(cfg, (2, 17))
  loss, logits = jax.jit(lambda p, b: (
      model_lib.loss_fn(cfg, graphdef, p, b)[0],
      model_lib.apply(cfg, graphdef, p, b[:, :-1])))(params, batch)
  assert logits.dtype == jnp.float32 and loss.dtype == jnp.float32
  # Same key, same float32 params: bf16 compute only rounds.
  (loss32, _), _ = _jit_loss_and_grad(NANO)(_init(NANO)[1], batch)
  assert abs(float(loss) - float(loss32)) < 0.05


def test_weight_decay_mask_skips_norm_scales():
  mask = model_lib.weight_decay_mask(_init(NANO)[1])
  assert mask['embed'] and mask['blocks'][0]['mlp']['w_in']
  assert not mask['final_norm']['scale']
  assert not mask['blocks'][1]['attn_norm']['scale']


@pytest.mark.parametrize('overrides', [
    dict(d_model=30),              # not divisible by num_heads 4
    dict(num_layers=0),
    dict(vocab_size=-1),
    dict(d_ff=2.5),
    dict(mlp='relu'),
    dict(dtype='float16'),
    dict(z_loss=-1.0),
    dict(head_dim=0),
    dict(head_dim=7),              # odd: RoPE needs pairs
    dict(rope_theta=0.0),
])
def test_bad_config_raises_config_error(overrides):
  with pytest.raises(ConfigError):
    model_lib.model_config('tiny', **overrides)


def test_bad_preset_or_key_or_length_raises_config_error():
  with pytest.raises(ConfigError, match='preset'):
    model_lib.model_config('2b')
  with pytest.raises(ConfigError, match='d_modle'):
    model_lib.model_config('tiny', d_modle=64)
  graphdef, params = _init(NANO)
  with pytest.raises(ConfigError, match='max_seq_len'):
    model_lib.apply(NANO, graphdef, params,
                    jnp.zeros((1, NANO.max_seq_len + 1), jnp.int32))
  with pytest.raises(ConfigError, match='graphdef'):
    model_lib.apply(dataclasses.replace(NANO, dtype='bfloat16'), graphdef,
                    params, jnp.zeros((1, 8), jnp.int32))
