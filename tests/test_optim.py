"""The inner optimizers (`optimizer.name`): each builds, steps and descends; Muon
orthogonalizes matrices and hands the rest to Adam; one decay mask for all."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco.run import experiment
from loco.algorithms import optim

from loco.errors import ConfigError


def _config(name, **kwargs):
  return optim.InnerConfig(**{'name': name, 'lr': 0.05, 'warmup_steps': 0,
                              'decay_steps': 100, 'weight_decay': 0.0, **kwargs})


def _params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {'w': jax.random.normal(k1, (6, 4)), 'attn': jax.random.normal(k2, (4, 2, 3)),
          'scale': jnp.ones((4,))}


@pytest.mark.slow
@pytest.mark.parametrize('name', optim.INNER_OPTIMIZERS)
def test_each_inner_optimizer_descends_a_quadratic(name):
  params = _params()
  target = jax.tree.map(lambda x: jnp.full_like(x, 0.5), params)
  loss = lambda p: sum(0.5 * jnp.sum((a - b) ** 2)  # noqa: E731
                       for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(target)))
  opt = optim.inner_optimizer(_config(name))
  state = opt.init(params)

  @jax.jit
  def step(params, state):
    updates, state = opt.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  start = float(loss(params))
  for _ in range(60):
    params, state = step(params, state)
  assert float(loss(params)) < 0.2 * start, name
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))


@pytest.mark.slow
def test_muon_orthogonalizes_a_matrix_and_gives_the_rest_the_adam_update():
  u, _ = np.linalg.qr(np.random.RandomState(0).randn(6, 6))
  v, _ = np.linalg.qr(np.random.RandomState(1).randn(4, 4))
  grad_w = (u[:, :4] * np.array([10.0, 5.0, 2.0, 1.0])) @ v.T   # singular values 10 .. 1
  grads = {'w': jnp.asarray(grad_w, jnp.float32),
           'attn': jax.random.normal(jax.random.key(1), (4, 2, 3)),
           'scale': jnp.asarray([1.0, -2.0, 0.5, 3.0])}
  params = _params()
  cfg = _config('muon', clip_norm=0.0)
  updates, _ = optim.inner_optimizer(cfg).update(grads, optim.inner_optimizer(cfg).init(params),
                                                 params)
  sv = np.linalg.svd(np.asarray(updates['w']), compute_uv=False)
  # Muon's quintic Newton-Schulz maps every singular value into about [0.7, 1.2].
  assert sv.max() / sv.min() < 1.75, sv              # the gradient's ratio is 10
  adam = optax.adamw(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=0.0,
                     nesterov=True)
  rest = {k: grads[k] for k in ('attn', 'scale')}
  want, _ = adam.update(rest, adam.init(rest), rest)
  for k in rest:
    np.testing.assert_allclose(updates[k], want[k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('name', optim.INNER_OPTIMIZERS)
def test_every_inner_optimizer_decays_matrices_only(name):
  """A zero gradient moves matrices (2-D and the >2-D attention tensors) by
  -lr * weight_decay * p and norm scales not at all: the model's decay mask."""
  params = _params()
  cfg = _config(name, weight_decay=0.1)
  opt = optim.inner_optimizer(cfg)
  updates, _ = opt.update(jax.tree.map(jnp.zeros_like, params), opt.init(params), params)
  for k in ('w', 'attn'):
    np.testing.assert_allclose(updates[k], -cfg.lr * 0.1 * params[k], rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(updates['scale'], 0.0)


def test_a_wrong_name_lists_the_allowed_ones():
  with pytest.raises(ConfigError) as e:
    optim.InnerConfig(name='lion')
  assert str(e.value) == ("optimizer.name must be one of adamw, muon, sgd, signsgd, "
                          "got 'lion'.")


def test_the_config_picks_the_inner_optimizer_or_the_algorithm_default(nano_config):
  assert experiment.parse_config(nano_config).inner.name == 'adamw'
  nano_config.optimizer.name = 'muon'
  assert experiment.parse_config(nano_config).inner.name == 'muon'
  nano_config.optimizer.name = None
  nano_config.algorithm.name = 'sign_ddp'
  spec = algorithms.REGISTRY['ddp']
  algorithms.register('sign_ddp', algorithms.AlgorithmSpec(spec.factory, example={},
                                                          carrier='all-reduce',
                                                          inner='signsgd'))
  try:
    exp = experiment.parse_config(nano_config)
    assert exp.inner.name == 'signsgd'
    assert experiment.build_algorithm(exp) is not None
  finally:
    del algorithms.REGISTRY['sign_ddp']


@pytest.mark.slow
def test_muon_sees_the_models_hidden_matrices_and_leaves_the_rest_to_adam():
  """On the real model: q, k and v are orthogonalized each alone, the attention output
  and the MLP as matrices; the embedding and the norm scales take the Adam update; the
  embedding is still decayed (the model's mask), after the fallback."""
  from loco import model as model_lib
  cfg = model_lib.model_config('nano', vocab_size=64)
  params = model_lib.init_params(cfg, jax.random.key(0))[1]
  grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(p.size), p.shape), params)
  inner = optim.inner_optimizer(_config('muon', clip_norm=0.0, weight_decay=0.0))
  updates, _ = inner.update(grads, inner.init(params), params)
  def newton_schulz(x):   # Muon's quintic iteration (five steps, Frobenius-scaled)
    t = x.shape[0] > x.shape[1]
    x = (x.T if t else x) / (np.linalg.norm(x) + 1e-8)
    for _ in range(5):
      a = x @ x.T
      x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    return x.T if t else x

  def muon_step(g):       # the first step: the momentum is the gradient, up to a scale
    return -0.05 * np.sqrt(max(1.0, g.shape[1] / g.shape[0])) * newton_schulz(g)

  block_g, block_u = grads['blocks'][0]['attn'], updates['blocks'][0]['attn']
  d = block_g['qkv'].shape[0]
  for j in range(3):      # q, k and v: each its own (d, h k) matrix
    g = np.asarray(block_g['qkv'][:, j], np.float64).reshape(d, -1)
    np.testing.assert_allclose(np.asarray(block_u['qkv'][:, j]).reshape(d, -1), muon_step(g),
                               rtol=2e-3, atol=2e-5)
  g = np.asarray(block_g['out'], np.float64)
  g = g.reshape(-1, g.shape[-1])                                  # (h k, d)
  np.testing.assert_allclose(np.asarray(block_u['out']).reshape(g.shape), muon_step(g),
                             rtol=2e-3, atol=2e-5)
  cfg_ = _config('muon')
  adam = optax.adamw(cfg_.lr, b1=cfg_.b1, b2=cfg_.b2, eps=cfg_.eps, weight_decay=0.0,
                     nesterov=True)
  rest = {'embed': grads['embed'], 'final_norm': grads['final_norm']}
  want, _ = adam.update(rest, adam.init(rest), rest)
  np.testing.assert_allclose(updates['embed'], want['embed'], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(updates['final_norm']['scale'], want['final_norm']['scale'],
                             rtol=1e-5, atol=1e-7)
  decayed = optim.inner_optimizer(_config('muon', clip_norm=0.0, weight_decay=0.1))
  zero = jax.tree.map(jnp.zeros_like, params)
  moved, _ = decayed.update(zero, decayed.init(params), params)
  np.testing.assert_allclose(moved['embed'], -cfg_.lr * 0.1 * params['embed'], rtol=1e-5,
                             atol=1e-8)
  np.testing.assert_array_equal(moved['final_norm']['scale'], 0.0)
