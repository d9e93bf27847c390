"""The worker axis on a mesh: blocks of workers per device under shard_map, collectives
proven from the compiled program (the 8 CPU devices of conftest)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from loco.comm import axis

COLLECTIVE = re.compile(r'(collective-permute|all-gather|all-reduce|reduce-scatter|'
                        r'all-to-all)(?:-start)?\(')


def _two_level(fn, m, d, n=5):
  """(one-device vmap result, mesh result, the mesh program's collectives)."""
  mesh = jax.make_mesh((d,), ('workers',), axis_types=(jax.sharding.AxisType.Explicit,))
  x = jnp.arange(m * n, dtype=jnp.float32).reshape(m, n)
  want = jax.vmap(fn, axis_name='workers')(x)
  placed = jax.device_put(x, NamedSharding(mesh, P('workers')))
  f = jax.jit(lambda x: jax.shard_map(
      lambda block: jax.vmap(fn, axis_name=axis.BLOCK)(block), mesh=mesh,
      in_specs=P('workers'), out_specs=P('workers'), check_vma=False)(x))
  hlo = f.lower(placed).compile().as_text()
  return np.asarray(want), np.asarray(f(placed)), hlo


def _ring(m):
  return [(i, (i + 1) % m) for i in range(m)]


def _random(m, seed=0):
  p = np.random.default_rng(seed).permutation(m)
  return [(i, int(p[i])) for i in range(m)]


@pytest.mark.parametrize('m,d', [(8, 8), (16, 4), (16, 8), (32, 8)])
@pytest.mark.parametrize('perm', [_ring, _random])
def test_ppermute_of_workers_across_blocks(m, d, perm):
  pairs = perm(m)
  want, got, hlo = _two_level(lambda v: axis.ppermute(v, 'workers', pairs), m, d)
  np.testing.assert_array_equal(got, want)
  assert set(COLLECTIVE.findall(hlo)) == {'collective-permute'}


def test_a_ring_moves_only_the_boundary_rows_between_devices():
  # 16 workers on 4 devices, 1000 floats each: a +1 ring crosses one row per device,
  # spread over the 4 slots of the block (250 floats each), not the whole block.
  m, d, n = 16, 4, 1000
  _, _, hlo = _two_level(lambda v: axis.ppermute(v, 'workers', _ring(m)), m, d, n)
  shapes = re.findall(r'(f32\[[\d,]*\])[^\n]*collective-permute(?:-start)?\(', hlo)
  assert shapes and all(s in ('f32[4,250]', 'f32[250]', 'f32[1,250]') for s in shapes), shapes


@pytest.mark.parametrize('m,d', [(8, 8), (16, 4), (32, 8)])
def test_psum_all_gather_and_index_across_blocks(m, d):
  want, got, hlo = _two_level(lambda v: axis.psum(v), m, d)
  np.testing.assert_array_equal(got, want)
  assert set(COLLECTIVE.findall(hlo)) == {'all-reduce'}
  fn = lambda v: axis.all_gather(v).sum(0) * 0 + axis.all_gather(v)[3] + axis.axis_index()
  want, got, hlo = _two_level(fn, m, d)
  np.testing.assert_array_equal(got, want)
  assert set(COLLECTIVE.findall(hlo)) == {'all-gather'}
