"""The worker axis on a mesh: blocks of workers per device under shard_map, collectives
proven from the compiled program (the 8 CPU devices of conftest)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from loco import algorithms
from loco.comm import axis
from tests import hlo as hlo_lib



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
  assert hlo_lib.kinds(hlo) == {'collective-permute'}


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
  assert hlo_lib.kinds(hlo) == {'all-reduce'}
  fn = lambda v: axis.all_gather(v).sum(0) * 0 + axis.all_gather(v)[3] + axis.axis_index()
  want, got, hlo = _two_level(fn, m, d)
  np.testing.assert_array_equal(got, want)
  assert hlo_lib.kinds(hlo) == {'all-gather'}


# Every algorithm's step on an 8-device mesh: what the compiled program sends.

# case -> (registry name, keys, the collective that carries the model): every registry
# entry's example and its variants (`<name>_<variant>`), from the registry.
ALGORITHMS = {case: (name, keys, spec.carrier) for name, spec in algorithms.REGISTRY.items()
              for case, keys in spec.examples(name).items()}


@functools.cache
def _compiled(name, m=8, overrides=()):
  """One step of `name` compiled for the 8-device mesh: (hlo, model bytes, compiled,
  state, grads). `overrides`: (key, value) pairs over its keys."""
  registered, keys, _ = ALGORITHMS[name]
  keys = {**keys, **dict(overrides)}
  from loco import model as model_lib
  from loco.algorithms import optim
  from loco.run.placement import make_mesh, state_shardings
  mesh = make_mesh(8, m)
  # Without the drift diagnostics: their reductions over the worker axis are
  # all-reduces a deployment would not run, and this program is held to what it counts.
  alg = algorithms.make(registered, optim.inner_optimizer(
      optim.InnerConfig(decay_steps=10)), mesh=mesh, diagnostics=False, **keys)
  cfg = model_lib.model_config('nano', vocab_size=64)
  params = model_lib.init_params(cfg, jax.random.key(0))[1]
  state = alg.init(params, m, jax.random.key(1))
  state = jax.device_put(state, state_shardings(state, mesh))
  grads = jax.device_put(jax.tree.map(jnp.ones_like, state.params),
                         state_shardings(state, mesh).params)
  compiled = jax.jit(alg.step).lower(state, grads).compile()
  return compiled.as_text(), 4 * sum(x.size for x in jax.tree.leaves(params)), compiled, \
      state, grads


def _traffic(hlo: str) -> dict[str, int]:
  """Bytes per collective kind in the program, data only (operands over 64 bytes)."""
  totals: dict[str, int] = {}
  for kind, size in hlo_lib.collectives(hlo):
    if size > 64:
      totals[kind] = totals.get(kind, 0) + size
  return totals


DEFAULT_RUN = {'diloco'}   # the rest: pytest -m slow (gasloc on 8 devices: test_gossip.py)


@pytest.mark.parametrize('name', [n if n in DEFAULT_RUN else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ALGORITHMS) if n != 'sparseloco'])
def test_each_algorithm_moves_the_model_by_its_own_collective(name):
  """Ring and matching gossip are collective-permutes (no all-gather of the model), the
  all-reduce algorithms an all-reduce: read from the compiled 8-device program."""
  *_, carrier = ALGORITHMS[name]
  hlo, model_bytes, *_ = _compiled(name)
  heavy = {kind for kind, size in _traffic(hlo).items() if size >= model_bytes / 2}
  assert heavy == {carrier}, _traffic(hlo)


def _heaviest_step(step, state, grads, sync_every: int):
  """The StepInfo of the step that sends the most, over two rounds."""
  heaviest = None
  for _ in range(2 * max(sync_every, 1) + 2):
    state, info = step(state, grads)
    if heaviest is None or float(info.wire.sent[0]) > float(heaviest.wire.sent[0]):
      heaviest = info
  return heaviest


def test_one_execution_runs_one_branch_of_a_switch():
  """`hlo.executed` counts the heaviest branch of a switch, `hlo.collectives` every
  branch: three branches moving 1, 2 and 3 rows over the ring, nested in a cond."""
  from jax.experimental.shard_map import shard_map
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ('w',))
  ring = [(i, (i + 1) % 8) for i in range(8)]

  def body(x, k, go):
    shift = lambda n: lambda x: x.at[:n].set(jax.lax.ppermute(x[:n], 'w', ring))  # noqa: E731
    switch = lambda x: jax.lax.switch(k, [shift(1), shift(2), shift(3)], x)       # noqa: E731
    return jax.lax.cond(go, switch, lambda x: x, x)
  f = shard_map(body, mesh=mesh, in_specs=(P('w'), P(), P()), out_specs=P('w'))
  x = jnp.zeros((8 * 4, 256), jnp.float32)
  hlo = jax.jit(f).lower(x, 0, True).compile().as_text()
  row = 256 * 4
  assert sorted(n for _, n in hlo_lib.collectives(hlo)) == [row, 2 * row, 3 * row]
  assert [n for _, n in hlo_lib.executed(hlo)] == [3 * row]


def _simulated_as(case: str) -> str | None:
  return algorithms.REGISTRY[ALGORITHMS[case][0]].simulated_as.get(case)


def test_the_registrys_simulation_notes_name_its_examples():
  for name, spec in algorithms.REGISTRY.items():
    assert set(spec.simulated_as) <= set(spec.examples(name)), name


@pytest.mark.parametrize('name', [n if n in DEFAULT_RUN else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ALGORITHMS)])
def test_collective_bytes_agree_with_step_info(name):
  """Every registered example: what its compiled 8-device program sends per device in
  one execution (`hlo.executed`: one branch of each cond or switch) against what its
  StepInfo reports per worker (one worker per device), on its heaviest step. Exactly:
  an all-reduce moves the counted tree (+ the alive count), permutes move the bytes
  sent. An example the registry says is simulated otherwise (`simulated_as`: a dense
  stand-in for a compressed message, every candidate shift for a random partner) must
  move no less than it counts."""
  _, keys, carrier = ALGORITHMS[name]
  hlo, _, alg, state, grads = _compiled(name)
  info = _heaviest_step(alg, state, grads, keys.get('sync_every', 1))
  payload = float(np.asarray(info.wire.payload)[0])
  sent = float(np.asarray(info.wire.sent)[0])
  moved = {}
  for kind, size in hlo_lib.executed(hlo):
    if size > 64:
      moved[kind] = moved.get(kind, 0) + size
  assert payload > 0, 'the example never sent anything in two rounds'
  reason = _simulated_as(name)
  if reason is not None:
    print(f'{name}: the program moves {sum(moved.values()):,} bytes per device against '
          f'{payload:,.0f} counted: {reason}')
    assert sum(moved.values()) >= payload, (moved, payload)
  elif carrier == 'collective-permute':     # e.g. a ring: one permutation each way
    assert moved == {carrier: sent}, (moved, sent)
  else:
    assert set(moved) == {carrier}, moved
    assert payload <= moved[carrier] <= payload + 64, (moved, payload)   # + the alive count


@pytest.mark.slow     # 24 s; the default run checks the gather's numbers (test_sparseloco.py)
def test_sparseloco_gathers_only_its_top_k_payload():
  """SparseLoCo's sync moves no dense tensor: each tensor's top-k coordinates travel as
  int32 indices and float32 values (at the message's capacity) by all-gather, so the
  program sends 8 bytes per kept value where StepInfo counts the packed payload
  (12-bit-or-less indices, 2-bit codes, scales): counted and explained."""
  from loco.comm import compress
  _, keys, _ = ALGORITHMS['sparseloco']
  hlo, model_bytes, alg, state, grads = _compiled('sparseloco', overrides=(('dense_below', 0),))
  traffic = _traffic(hlo)
  assert set(traffic) == {'all-gather'}, traffic            # no all-reduce of a tensor
  leaves = jax.tree.leaves(jax.tree.map(lambda x: x[0], state.params))
  capacity = compress.topk_chunks(64, 4096, 0).select(leaves, None)[0].capacity
  gathered = [k for k, x in zip(capacity, leaves) if 2 * k < x.size]   # the rest: psum
  kept = sum(gathered)
  every_gather = sum(size for kind, size in hlo_lib.collectives(hlo) if kind == 'all-gather')
  # 8 workers x (int32 index + float32 value per kept value, + the int32 count sent per
  # tensor), + the bool alive flags.
  assert every_gather == 8 * (8 * kept + 4 * len(gathered)) + 8, (every_gather, kept)
  assert 8 * kept < model_bytes / 8
  info = _heaviest_step(alg, state, grads, keys['sync_every'])
  reported = float(np.asarray(info.wire.payload)[0])
  assert kept * 2 / 8 < reported < 8 * kept, (reported, kept)


@pytest.mark.slow
def test_a_compressed_all_reduce_is_simulated_by_a_dense_float32_reduction():
  """Counted and explained: Streaming's E3M0 all-reduce is simulated as a float32 psum
  of the decoded values, so the program moves the dense tree while StepInfo reports
  the 4-bit payload a real implementation would send."""
  _, keys, _ = ALGORITHMS['streaming_diloco']
  hlo, model_bytes, alg, state, grads = _compiled('streaming_diloco')
  info = _heaviest_step(alg, state, grads, keys['sync_every'])
  reported = float(np.asarray(info.wire.payload).max())
  dense = _traffic(hlo)['all-reduce']
  assert 0 < reported < dense / 4 and dense >= model_bytes * 0.8, (reported, dense)


# A workers x fsdp mesh: each worker's state sharded over its row of devices.

def _groups(line: str) -> list[tuple[int, ...]]:
  """The replica groups of one HLO collective (explicit or iota form)."""
  explicit = re.search(r'replica_groups=\{(\{[\d,{}]*\})\}', line)
  if explicit:
    return [tuple(int(i) for i in g.split(',')) for g in re.findall(r'\{([\d,]+)\}',
                                                                     explicit.group(1))]
  iota = re.search(r'replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?', line)
  shape, dims, perm = (tuple(int(i) for i in s.split(',')) if s else None
                       for s in iota.groups())
  ids = np.arange(np.prod(dims)).reshape(dims)
  return [tuple(g) for g in (ids.transpose(perm) if perm else ids).reshape(shape).tolist()]


def _diloco_chunk(workers: int, fsdp: int, slices: int = 1):
  """DiLoCo (nano, 4 workers, a sync every step) on a `workers` x `fsdp` mesh of
  `slices` slices: (mesh, the state's init, its abstract state, the compiled chunk)."""
  from loco.configs import default
  from loco.run import experiment, placement
  from loco.run import step as step_lib
  c = default.get_config()
  c.model.preset, c.model.vocab_size = 'nano', 256
  c.num_workers, c.batch_per_worker, c.seq_len = 4, 4, 32
  c.algorithm.name, c.algorithm.sync_every = 'diloco', 1
  c.mesh.workers, c.mesh.fsdp, c.mesh.slices = workers, fsdp, slices
  c.metrics.diagnostics = False     # the program's collectives are the algorithm's own
  exp = experiment.parse_config(c)
  mesh = placement.Placement.make(workers, 4, fsdp, 4, slices=slices).mesh
  algorithm = experiment.build_algorithm(exp, mesh)
  graphdef, init, abstract = step_lib.init_state(exp, algorithm, jax.random.key(0), mesh)
  chunk = step_lib.make_train_chunk(algorithm, exp.model, graphdef, mesh, 'vmap')
  batches = jax.ShapeDtypeStruct((1, 4, 4, 33), jnp.int32,
                                 sharding=placement.steps_sharding(mesh, 4))
  compiled = chunk.lower(abstract, batches, None,
                         jax.ShapeDtypeStruct((1,), jnp.bool_)).compile()
  return mesh, init, abstract, compiled


@pytest.mark.slow
def test_a_workers_x_fsdp_step_shards_the_state_and_splits_the_traffic():
  """DiLoCo's sync step on 2 x 4 devices (4 workers, 2 per row): every device holds
  1/8 of the state; parameters are gathered and gradients reduced inside a row (the
  fsdp groups), and the outer all-reduce runs between rows (the workers groups), each
  device sending its quarter of the pseudo-gradient."""
  mesh, init, abstract, compiled = _diloco_chunk(workers=2, fsdp=4)
  assert dict(mesh.shape) == {'workers': 2, 'fsdp': 4}
  total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
  assert compiled.memory_analysis().argument_size_in_bytes <= total / 8 + 4096
  assert init.lower(jax.random.key(0)).compile().memory_analysis(
      ).output_size_in_bytes <= total / 8 + 4096

  rows, columns = {(0, 1, 2, 3), (4, 5, 6, 7)}, {(0, 4), (1, 5), (2, 6), (3, 7)}
  by_groups: dict[tuple[str, str], int] = {}
  for line in compiled.as_text().splitlines():
    for (kind, size) in hlo_lib.collectives(line):
      if size > 64:
        groups = set(_groups(line))
        where = 'fsdp' if groups == rows else 'workers' if groups == columns else str(groups)
        by_groups[kind, where] = by_groups.get((kind, where), 0) + size
  assert set(by_groups) <= {('all-gather', 'fsdp'), ('all-reduce', 'fsdp'),
                            ('reduce-scatter', 'fsdp'), ('all-to-all', 'fsdp'),
                            ('all-reduce', 'workers')}, by_groups
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(abstract.params)) / 4   # one worker
  assert ('all-gather', 'fsdp') in by_groups          # FSDP: parameters gathered in a row
  outer = by_groups['all-reduce', 'workers']           # 2 workers' quarters, summed locally
  assert model_bytes / 4 <= outer <= model_bytes / 4 + 64, (outer, model_bytes)


@pytest.mark.slow
@pytest.mark.parametrize('per_tensor', [False, True])
def test_large_models_draw_per_tensor_so_a_sharded_init_holds_less_than_a_model(
    per_tensor, monkeypatch):
  """One normal draw sliced into tensors (small models: compiles fast) is
  rematerialised whole on every device by a sharded init; above
  `PER_TENSOR_FROM` weights every tensor has its own key and each device draws only
  its shard (nano stands in for 150m / 1b here by lowering the threshold)."""
  from loco.configs import default
  from loco.run import experiment, placement
  from loco import model
  from loco.run import step as step_lib
  jax.clear_caches()        # init_params' trace is cached per config
  monkeypatch.setattr(model._NormalDraws, 'PER_TENSOR_FROM', 0 if per_tensor else 1 << 40)
  try:
    c = default.get_config()
    c.model.preset, c.model.vocab_size = 'nano', 256
    c.num_workers, c.algorithm.name, c.mesh.workers, c.mesh.fsdp = 4, 'diloco', 2, 4
    exp = experiment.parse_config(c)
    mesh = placement.make_mesh(2, 4, 4)
    _, init, abstract = step_lib.init_state(exp, experiment.build_algorithm(exp, mesh),
                                         jax.random.key(0), mesh)
    one_model = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract.params)) / 4
    temp = init.lower(jax.random.key(0)).compile().memory_analysis().temp_size_in_bytes
    assert (temp < one_model) == per_tensor, (temp, one_model)
    params = init(jax.random.key(0)).params
    for name in ('embed',):                          # std 0.02, workers equal
      x = np.asarray(params[name])
      assert abs(x.std() - 0.02) < 0.002 and np.array_equal(x[0], x[3])
    qkv = np.asarray(params['blocks'][0]['attn']['qkv'][0])
    assert not np.allclose(qkv, np.asarray(params['blocks'][1]['attn']['qkv'][0]))
  finally:
    jax.clear_caches()


# Every algorithm under shard_map equals the one-device vmap run.

def _run_steps(name, m, mesh, steps=4):
  from loco import model as model_lib
  from loco.algorithms import optim
  from loco.run.placement import state_shardings
  registered, keys, _ = ALGORITHMS[name]
  alg = algorithms.make(registered, optim.inner_optimizer(
      optim.InnerConfig(decay_steps=10)), mesh=mesh, **keys)
  params = model_lib.init_params(model_lib.model_config('nano', vocab_size=64),
                                 jax.random.key(0))[1]
  state = alg.init(params, m, jax.random.key(1))
  shardings = state_shardings(state, mesh)
  if mesh is not None:
    state = jax.device_put(state, shardings)
  step, sent = jax.jit(alg.step), []
  for t in range(steps):
    leaves, tree = jax.tree.flatten(state.params)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(2), t), len(leaves))
    grads = tree.unflatten([0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    if mesh is not None:
      grads = jax.device_put(grads, shardings.params)
    state, info = step(state, grads)
    sent.append(np.asarray(info.wire.sent))
  return jax.device_get(state.params), sent


_EQUAL_RUNS = [(n, m) for n in sorted(ALGORITHMS) for m in (8, 16, 32)]
_DEFAULT_EQUAL = set()   # all with pytest -m slow; the default run has
# tests/test_gossip.py::test_gasloc_engine_on_8_devices_matches_one_device and the 2-D runs


@pytest.mark.parametrize('name,m', [r if r in _DEFAULT_EQUAL else
                                    pytest.param(*r, marks=pytest.mark.slow)
                                    for r in _EQUAL_RUNS])
def test_shard_map_equals_the_one_device_run(name, m):
  """M workers in blocks of M / 8 on 8 devices: the same params and bytes as the vmap
  run on one device (every algorithm at M = 8, 16, 32; a few in the default run)."""
  from loco.run.placement import make_mesh
  want, want_sent = _run_steps(name, m, None)
  got, got_sent = _run_steps(name, m, make_mesh(8, m))
  np.testing.assert_array_equal(np.stack(got_sent), np.stack(want_sent))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# The mesh follows the topology: one slice, and two slices (workers across them).

def _slice_crossings(compiled_text: str, mesh, slices: int) -> dict[tuple[str, str], int]:
  """{(kind, 'inside' | 'across'): bytes} of a program's collectives over 64 bytes:
  whether each one's groups stay inside a slice or join devices of several."""
  from loco.run import placement
  where_is = {i: s for s, group in enumerate(placement.slice_groups(mesh, slices))
              for i in group}
  out: dict[tuple[str, str], int] = {}
  for line in compiled_text.splitlines():
    for kind, size in hlo_lib.collectives(line):
      if size > 64:
        crosses = any(len({where_is[i] for i in g}) > 1 for g in _groups(line))
        key = (kind, 'across' if crosses else 'inside')
        out[key] = out.get(key, 0) + size
  return out


@pytest.mark.parametrize('slices', [1, 2])
def test_the_mesh_of_eight_devices_as_one_and_as_two_slices(slices):
  from loco.run import placement
  mesh = placement.make_mesh(4, 4, 2, slices)
  assert dict(mesh.shape) == {'workers': 4, 'fsdp': 2}
  how = placement.arrange(4, 2, slices)[1]
  groups = placement.slice_groups(mesh, slices)
  assert len(groups) == slices and set().union(*groups) == set(range(8))
  # Every fsdp row (one worker's devices) lies inside one slice.
  flat = list(mesh.devices.flat)
  for row in mesh.devices:
    assert sum({flat.index(d) for d in row} <= g for g in groups) == 1
  if slices == 1:
    assert how.startswith('one slice, create_device_mesh')
  else:
    assert how.startswith('2 simulated slices of 4 devices') and 'workers across' in how
    # Rows 0-1 in the first slice, rows 2-3 in the second.
    assert groups == [{0, 1, 2, 3}, {4, 5, 6, 7}]


def test_mesh_slices_must_divide_the_worker_axis():
  from loco.run import placement
  from loco.errors import ConfigError
  with pytest.raises(ConfigError, match='mesh.workers=4 must be divisible by mesh.slices=3'):
    placement.make_mesh(4, 4, 2, 3)


def test_on_two_slices_only_worker_collectives_cross_them():
  """A psum over "workers" and one over "fsdp" on 2 slices of 2 x 2 devices: the
  compiled program's worker-axis all-reduce joins devices of both slices, the fsdp one
  stays inside each."""
  from loco.run import placement
  mesh = placement.make_mesh(4, 4, 2, 2)
  x = jax.device_put(jnp.ones((4, 2, 256)), NamedSharding(mesh, P('workers', 'fsdp')))

  def both(block):
    return jax.lax.psum(block, 'workers') * 2 + jax.lax.psum(block * 3, 'fsdp')

  f = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=P('workers', 'fsdp'),
                            out_specs=P('workers', 'fsdp'), check_vma=False))
  text = f.lower(x).compile().as_text()
  crossings = _slice_crossings(text, mesh, 2)
  assert set(crossings) == {('all-reduce', 'across'), ('all-reduce', 'inside')}, crossings
  np.testing.assert_allclose(np.asarray(f(x)), 4 * 2 + 2 * 3)


@pytest.mark.slow
def test_diloco_on_two_slices_syncs_across_them_and_shards_inside():
  """DiLoCo's train chunk on 2 simulated slices (4 workers x 2 fsdp): parameters are
  gathered and gradients reduced inside a slice; the only traffic that crosses the
  slices is the outer all-reduce of the worker axis."""
  mesh, _, abstract, compiled = _diloco_chunk(workers=4, fsdp=2, slices=2)
  crossings = _slice_crossings(compiled.as_text(), mesh, 2)
  assert ('all-gather', 'inside') in crossings                   # FSDP inside a slice
  assert {k for k in crossings if k[1] == 'across'} == {('all-reduce', 'across')}, crossings
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(abstract.params)) / 4   # one worker
  # Each device's half of one worker's pseudo-gradient (its fsdp shard) crosses.
  assert model_bytes / 2 <= crossings['all-reduce', 'across'] <= model_bytes / 2 + 64
