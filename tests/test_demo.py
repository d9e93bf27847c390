"""DeMo and its DCT codec: an independent numpy replay of the paper's update, hand-counted
bytes, the codec's basis and decode-after-sum."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.fft import dctn, idctn

from loco import comm
from loco.comm import compress
from loco.algorithms.demo import demo
from loco.comm.compress.dct import dct_matrix, dct_topk
from loco.errors import ConfigError

M, LR, BETA, K, CHUNK, STEPS = 3, 0.05, 0.9, 3, 4, 6


def _problem():
  """Per-worker quadratics 0.5 |theta - target_i|^2 on a (8, 12) matrix and an 8-vector."""
  key = jax.random.key(3)
  params = {'b': jax.random.normal(jax.random.fold_in(key, 0), (8,)),
            'w': jax.random.normal(jax.random.fold_in(key, 1), (8, 12))}
  targets = [{n: np.asarray(jax.random.normal(jax.random.fold_in(key, 10 + i + 100 * j),
                                              params[n].shape))
              for j, n in enumerate(sorted(params))} for i in range(M)]
  return params, targets


def _tiles(shape):
  """The (row slice, col slice) tiles of DeMo's reference: sides the largest divisor <= 4."""
  if len(shape) == 1:
    c = max(d for d in range(1, CHUNK + 1) if shape[0] % d == 0)
    return [(slice(j, j + c),) for j in range(0, shape[0], c)]
  r, c = (max(d for d in range(1, CHUNK + 1) if n % d == 0) for n in shape)
  return [(slice(i, i + r), slice(j, j + c)) for i in range(0, shape[0], r)
          for j in range(0, shape[1], c)]


def _replay(params, targets, steps):
  """DeMo (arXiv 2411.19870, Algorithm 1) in numpy with scipy's DCT, constant lr."""
  theta = [{n: np.asarray(v, np.float64) for n, v in params.items()} for _ in range(M)]
  mom = [{n: np.zeros(v.shape) for n, v in params.items()} for _ in range(M)]
  for _ in range(steps):
    new = []
    for n in sorted(params):
      total = np.zeros(params[n].shape)
      count = np.zeros(params[n].shape)
      for i in range(M):
        mom[i][n] = BETA * mom[i][n] + (theta[i][n] - targets[i][n])
        for t in _tiles(params[n].shape):
          coef = dctn(mom[i][n][t], norm='ortho')
          keep = np.zeros(coef.size, bool)
          keep[np.argsort(-np.abs(coef).ravel(), kind='stable')[:min(K, coef.size)]] = True
          kept = np.where(keep.reshape(coef.shape), coef, 0.0)
          mom[i][n][t] -= idctn(kept, norm='ortho')
          total[t] += kept
          count[t] += keep.reshape(coef.shape)
      agg = total / np.maximum(count, 1)
      decoded = np.zeros(params[n].shape)
      for t in _tiles(params[n].shape):
        decoded[t] = idctn(agg[t], norm='ortho')
      new.append((n, decoded))
    for i in range(M):
      for n, decoded in new:
        theta[i][n] = theta[i][n] - LR * np.sign(decoded)
  return theta


def _sign_sgd():
  return optax.chain(optax.scale_by_sign(), optax.scale(-LR))


def _demo():
  return demo(_sign_sgd(), compression_decay=BETA, compression_topk=K, compression_chunk=CHUNK)


def _run(alg, params, targets, steps):
  state = alg.init(params, M, jax.random.key(0))
  target = {n: jnp.stack([jnp.asarray(t[n], jnp.float32) for t in targets]) for n in params}
  step = jax.jit(lambda s: alg.step(s, jax.tree.map(lambda p, t: p - t, s.params, target)))
  infos = []
  for _ in range(steps):
    state, info = step(state)
    infos.append(info)
  return state, infos


def test_demo_matches_numpy_replay_of_the_paper():
  params, targets = _problem()
  alg = _demo()
  state, _ = _run(alg, params, targets, STEPS)
  expected = _replay(params, targets, STEPS)
  for i in range(M):
    for n in params:
      np.testing.assert_allclose(state.params[n][i], expected[i][n], atol=1e-5)
  # Every worker applies the same decoded average: the replicas stay identical.
  np.testing.assert_array_equal(state.params['w'][0], state.params['w'][2])
  # ...and they moved: a sign step of LR on every coordinate that was ever non-zero.
  assert float(jnp.max(jnp.abs(state.params['w'][0] - params['w']))) >= LR


def test_demo_bytes_by_hand():
  """w (8, 12): six 4x4 tiles keep 3 coefficients each, 4 index bits + 32 value bits;
  b (8,): two 4-chunks keep 3 each, 2 index bits + 32: (18*36 + 6*34) / 8 = 106.5 B."""
  params, targets = _problem()
  _, infos = _run(_demo(), params, targets, 2)
  payload = (18 * (4 + 32) + 6 * (2 + 32)) / 8
  for info in infos:
    np.testing.assert_allclose(info.wire.sent, [payload] * M)
    np.testing.assert_allclose(info.wire.received, [(M - 1) * payload] * M)
    assert bool(jnp.all(info.wire.kind == comm.ALL_GATHER))


def test_dct_codec_basis_is_orthonormal_and_matches_scipy():
  d = dct_matrix(5)
  np.testing.assert_allclose(d @ d.T, np.eye(5), atol=1e-6)
  x = np.random.default_rng(0).normal(size=(8, 12)).astype(np.float32)
  codec = dct_topk(k=16, chunk=4)     # every coefficient of a 4x4 tile: lossless
  message, _ = codec.encode({'w': jnp.asarray(x)}, codec.init({'w': x}))
  np.testing.assert_allclose(message.decoded['w'][:4, 4:8], dctn(x[:4, 4:8], norm='ortho'),
                             atol=1e-5)
  np.testing.assert_allclose(codec.decode(message.decoded)['w'], x, atol=1e-5)
  assert message.mask['w'].all()


def test_dct_codec_decodes_after_the_sum():
  """The gathered coefficients are averaged per coefficient over their senders, then
  decoded once (DeMo's scatter-mean); decode is linear, so this is what every receiver
  of the gathered payloads reconstructs."""
  rng = np.random.default_rng(1)
  xs = jnp.asarray(rng.normal(size=(M, 4, 8)).astype(np.float32))
  codec = dct_topk(k=2, chunk=4)
  link = comm.sparse_all_gather_mean(codec)
  out, _ = jax.vmap(lambda x: link.update({'w': x}, link.init({'w': x})),
                    axis_name=comm.WORKERS)(xs)
  msgs = [codec.encode({'w': x}, codec.init({'w': x}))[0] for x in xs]
  total = sum(np.asarray(m.decoded['w']) for m in msgs)
  count = sum(np.asarray(m.mask['w'], np.float32) for m in msgs)
  expected = codec.decode({'w': jnp.asarray(total / np.maximum(count, 1))})['w']
  for i in range(M):
    np.testing.assert_allclose(out['w'][i], expected, atol=1e-6)


@pytest.mark.parametrize('kwargs, key', [({'k': 0}, 'algorithm.compression_topk'),
                                         ({'chunk': 0}, 'algorithm.compression_chunk')])
def test_dct_codec_rejects_bad_sizes(kwargs, key):
  with pytest.raises(ConfigError, match=key):
    dct_topk(**kwargs)
