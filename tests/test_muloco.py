"""MuLoCo: DiLoCo with Muon inner steps, against a numpy replay of both."""

import pytest
import jax
import jax.numpy as jnp
import numpy as np
from optax import contrib

from loco.algorithms.muloco import muloco

M, H, STEPS, LR, BETA = 2, 2, 6, 0.02, 0.95
NS = (3.4445, -4.7750, 2.0315)


def _orthogonalize(x):
  """Muon's quintic Newton-Schulz iteration, five steps, after a Frobenius scaling."""
  transposed = x.shape[0] > x.shape[1]
  x = x.T if transposed else x
  x = x / (np.linalg.norm(x) + 1e-8)
  for _ in range(5):
    a = x @ x.T
    x = NS[0] * x + (NS[1] * a + NS[2] * a @ a) @ x
  return x.T if transposed else x


def _replay(w0, targets):
  """Per worker: Muon on 0.5 |W - T_i|^2 (optax's form: an EMA momentum, bias-corrected,
  Nesterov; scaled by sqrt(max(1, fan_out / fan_in))); every H steps DiLoCo's outer
  Nesterov step (lr 0.7, momentum 0.9) on the mean pseudo-gradient."""
  w = [w0.astype(np.float64).copy() for _ in range(M)]
  mu = [np.zeros_like(w0, np.float64) for _ in range(M)]
  anchor, velocity = w0.astype(np.float64).copy(), np.zeros_like(w0, np.float64)
  scale = np.sqrt(max(1.0, w0.shape[1] / w0.shape[0]))
  for t in range(1, STEPS + 1):
    for i in range(M):
      g = w[i] - targets[i]
      mu[i] = BETA * mu[i] + (1 - BETA) * g
      hat = BETA * mu[i] / (1 - BETA ** (t + 1)) + (1 - BETA) * g / (1 - BETA ** t)
      w[i] = w[i] - LR * scale * _orthogonalize(hat)
    if t % H == 0:
      delta = np.mean([anchor - wi for wi in w], axis=0)
      velocity = 0.9 * velocity + delta
      anchor = anchor - 0.7 * (delta + 0.9 * velocity)
      w = [anchor.copy() for _ in range(M)]
  return w


@pytest.mark.slow
def test_muloco_matches_numpy_replay_of_diloco_with_muon():
  key = jax.random.key(7)
  w0 = jax.random.normal(key, (6, 10))
  targets = np.asarray(jax.random.normal(jax.random.fold_in(key, 1), (M, 6, 10)))
  alg = muloco(contrib.muon(LR, beta=BETA), sync_every=H)
  state = alg.init({'w': w0}, M, jax.random.key(0))
  step = jax.jit(lambda s: alg.step(s, {'w': s.params['w'] - jnp.asarray(targets)}))
  sent = []
  for _ in range(STEPS):
    state, info = step(state)
    sent.append(np.asarray(info.wire.sent))
  expected = _replay(np.asarray(w0), targets)
  for i in range(M):
    np.testing.assert_allclose(state.params['w'][i], expected[i], atol=2e-5)
  # Bytes by hand: every H-th step a ring all-reduce of the float32 (6, 10) pseudo-
  # gradient, 2 (M - 1) / M * 240 = 240 bytes per worker for M = 2; nothing between.
  want = [[240.0] * M if t % H == 0 else [0.0] * M for t in range(1, STEPS + 1)]
  np.testing.assert_allclose(sent, want)


def test_muon_steps_are_orthogonalized():
  """Muon's step on a matrix has nearly equal singular values (US'V^T with S' in about
  [0.5, 1.5]), unlike the gradient it came from."""
  g = np.diag([10.0, 1.0, 0.1]) @ np.asarray(jax.random.normal(jax.random.key(2), (3, 5)))
  opt = contrib.muon(1.0)
  params = {'w': jnp.zeros((3, 5))}
  update, _ = opt.update({'w': jnp.asarray(g)}, opt.init(params), params)
  s = np.linalg.svd(np.asarray(update['w']) / np.sqrt(5 / 3), compute_uv=False)
  sg = np.linalg.svd(g, compute_uv=False)
  assert s.max() / s.min() < 3 and sg.max() / sg.min() > 50
