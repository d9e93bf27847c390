"""The inner optimizers (`optimizer.name`): each builds, steps and descends; Muon
orthogonalizes matrices and hands the rest to Adam; one decay mask for all."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loco import algorithms
from loco import experiment
from loco import optim

from loco.errors import ConfigError


def _config(name, **kwargs):
  return optim.InnerConfig(**{'name': name, 'lr': 0.05, 'warmup_steps': 0,
                              'decay_steps': 100, 'weight_decay': 0.0, **kwargs})


def _params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {'w': jax.random.normal(k1, (6, 4)), 'attn': jax.random.normal(k2, (4, 2, 3)),
          'scale': jnp.ones((4,))}


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
