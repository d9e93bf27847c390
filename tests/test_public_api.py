"""The stable surface in `loco/__init__.py`: every name resolves, `import loco` stays
cheap, and the documented use runs through those names alone."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import optax

import loco


def test_every_exported_name_resolves_and_is_listed():
  for name in loco.__all__:
    assert getattr(loco, name) is not None, name
  assert set(loco.__all__) <= set(dir(loco))
  assert callable(loco.make_algorithm) and 'diloco' in loco.REGISTRY
  assert loco.run.train.run and loco.stats.paired_t and loco.lab.study.compare


def test_a_former_name_resolves_to_its_export_and_is_not_listed():
  assert loco.utilization is loco.overlap_model
  assert loco.utilization.compute_utilization is loco.overlap_model.compute_utilization
  assert 'utilization' not in loco.__all__ and 'overlap_model' in loco.__all__


def test_import_loco_does_not_import_jax():
  out = subprocess.run([sys.executable, '-c', 'import sys, loco; print("jax" in sys.modules)'],
                       capture_output=True, text=True, check=True)
  assert out.stdout.strip() == 'False'


def test_an_unknown_name_is_an_attribute_error():
  try:
    loco.no_such_name  # pylint: disable=pointless-statement
  except AttributeError as e:
    assert 'no_such_name' in str(e)
  else:
    raise AssertionError('loco.no_such_name resolved')


def test_the_documented_use_trains_the_nano_model_through_the_public_names():
  cfg = loco.model_config('nano', vocab_size=32)
  graphdef, params = loco.init_params(cfg, jax.random.key(0))
  alg = loco.make_algorithm('diloco', optax.adamw(3e-3), sync_every=2)
  state = alg.init(params, 2, jax.random.key(1))
  batch = jax.random.randint(jax.random.key(2), (2, 4, 17), 0, 32)   # [M, B, L + 1]
  loss = lambda p, b: loco.loss_fn(cfg, graphdef, p, b)[0]  # noqa: E731
  first = float(jax.vmap(loss)(state.params, batch).mean())
  synced = 0
  step = jax.jit(alg.step)
  for _ in range(6):
    grads = jax.vmap(jax.grad(loss))(state.params, batch)
    state, info = step(state, grads)
    synced += int(info.synced)
    assert isinstance(info, loco.StepInfo) and isinstance(state, loco.LocoState)
  assert synced == 3
  assert float(jax.vmap(loss)(state.params, batch).mean()) < first
  assert jnp.all(jnp.isfinite(jax.tree.leaves(state.params)[0]))
