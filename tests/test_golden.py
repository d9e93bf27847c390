"""Golden trajectories: every registered algorithm, 8 steps of the nano model, pinned.

Each case drives an algorithm through the public contract only (DESIGN §2):

  alg = algorithms.make(name, optim.inner_optimizer(optim.InnerConfig(...)), **keys)
  state = alg.init(params, M, key)
  (loss, _), grads = jax.vmap(jax.value_and_grad(loss_fn, has_aux=True))(state.params, batch)
  state, info = alg.step(state, grads)

on the nano Transformer (`loco.model` preset 'nano'), 4 workers, 8 steps, on token
batches cut from a fixed text embedded here at offsets drawn from
`np.random.RandomState` (whose stream numpy keeps frozen). It pins, per step and per
worker, the training loss, `bytes_sent` and `bytes_received`, and each worker's loss on
the first batch after the last step (so the last step's update is pinned too), in
`tests/golden/trajectories.json`.

Tolerances: losses rtol 1e-4 (see `LOSS_RTOL`); bytes exactly (they are computed from
shapes, codec widths and the topology, never from values).

If a number changes: was the change intended (a deliberate change of an algorithm's
math, its defaults or its registry example, the model, the inner optimizer or the test
setup)? Then regenerate the fixture and say why in the commit message:

  python -m tests.test_golden --regenerate [CASE ...]

A regeneration rewrites only the named cases, or (none named) the cases whose numbers
left the tolerance: the others keep their stored numbers to the last digit. XLA:CPU
compiles for the host's instruction set, so the same jax and numpy give losses that
differ in the last digits between machines (measured: SSE4.2 against AVX2 on one host,
`XLA_FLAGS=--xla_cpu_max_isa=SSE4_2`, moved train losses by up to 9.5e-7; the fixture,
made on another host, differs from this AVX2 host's by up to 2e-7 relative); rewriting
every case would move all of them with each regeneration. `generated_with` records the
host's instruction set.

If it was not intended, the change altered the math of training: find out why.
"""

import argparse
import functools
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loco import algorithms
from loco import model as model_lib
from loco.algorithms import optim

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'golden',
                      'trajectories.json')
REGENERATE = 'python -m tests.test_golden --regenerate [CASE ...]'

M = 4             # workers
STEPS = 8
BATCH = 2         # sequences per worker per step
SEQ_LEN = 32
# Losses: rtol 1e-4. Measured when the fixture was made (each case rerun with one
# change): perturbing every initial weight by up to one float32 ulp, which stands for
# the rounding differences between CPUs (vector width, FMA, XLA's reduction order),
# moved the losses by at most 2.1e-7 relative over the 8 steps (the short runs do not
# amplify noise); a 1% larger inner learning rate moved them by 2.1e-3 to 3.8e-3, a
# 1% larger outer learning rate by 7.6e-4 (Streaming DiLoCo) to 3.5e-3. So 1e-4 is
# ~500x the rounding noise and still catches a 1% change of either rate in every case.
LOSS_RTOL = 1e-4

# A fixed text (written for this test: no corpus files, which differ between Python
# versions). Byte tokens; the model learns its byte statistics within a few steps.
TEXT = (
    'Communication-efficient training lets many workers learn one model while they '
    'talk rarely. Each worker takes a few local steps of its own optimizer, then the '
    'workers agree on a common direction: an all-reduce of their pseudo-gradients, a '
    'sparse all-gather of the largest entries, or a gossip exchange with a neighbour '
    'on a ring or a random matching. The outer optimizer turns the agreed direction '
    'into a step of the shared anchor, with momentum when it helps. Fewer bytes on '
    'the wire, slower links tolerated, and the loss should still fall as if the '
    'workers had met at every step. This short text is the whole data set of the '
    'golden test: it only has to be fixed, not large.')

# case -> (registry name, keys): every registry entry's example (syncs within a few
# steps) and its variants, `<name>_<variant>` (loco/algorithms/spec.py).
CASES = {case: (name, keys) for name, spec in algorithms.REGISTRY.items()
         for case, keys in spec.examples(name).items()}
INNER = optim.InnerConfig(lr=1e-2, warmup_steps=2, decay_steps=STEPS)


def _batches() -> np.ndarray:
  """int32 tokens [STEPS, M, BATCH, SEQ_LEN + 1], windows of TEXT at seeded offsets."""
  data = np.frombuffer(TEXT.encode('utf-8'), np.uint8).astype(np.int32)
  offsets = np.random.RandomState(0).randint(0, len(data) - SEQ_LEN - 1,
                                             size=(STEPS, M, BATCH))
  return data[offsets[..., None] + np.arange(SEQ_LEN + 1)]


def trajectory(case: str) -> dict:
  """Runs one case for STEPS steps; returns its per-step, per-worker numbers."""
  # Full float32 matmuls on every backend (GPUs default to TF32); a no-op on CPUs.
  with jax.default_matmul_precision('highest'):
    return _trajectory(case)


@functools.cache
def _nano():
  """The nano model's initial params and its jitted per-worker loss and gradient.

  Shared by all cases, so it compiles once; each case then compiles only its step.
  """
  cfg = model_lib.model_config('nano')
  graphdef, params = model_lib.init_params(cfg, jax.random.PRNGKey(0))
  loss = functools.partial(model_lib.loss_fn, cfg, graphdef)
  return params, jax.jit(jax.vmap(jax.value_and_grad(loss, has_aux=True)))


def _trajectory(case: str) -> dict:
  name, keys = CASES[case]
  params, grad_fn = _nano()
  alg = algorithms.make(name, optim.inner_optimizer(INNER), **keys)
  state = alg.init(params, M, jax.random.PRNGKey(1))
  step = jax.jit(alg.step)
  batches = jnp.asarray(_batches())
  out = {'train_loss': [], 'bytes_sent': [], 'bytes_received': []}
  for t in range(STEPS):
    (loss_M, _), grads = grad_fn(state.params, batches[t])
    state, info = step(state, grads)
    out['train_loss'].append(_floats(loss_M))
    out['bytes_sent'].append(_floats(info.wire.sent))
    out['bytes_received'].append(_floats(info.wire.received))
  (final_M, _), _ = grad_fn(state.params, batches[0])
  out['final_loss'] = _floats(final_M)
  return out


def _floats(x_M: jax.Array) -> list[float]:
  return [float(v) for v in np.asarray(x_M)]


def _load() -> dict:
  with open(GOLDEN) as f:
    return json.load(f)


def _advice(case: str) -> str:
  return (f'The golden numbers of {case!r} changed. Was that intended (a deliberate '
          'change of the algorithm, its defaults, the model, the inner optimizer or '
          f'this test)? Then regenerate the fixture with `{REGENERATE}` and say why in '
          'the commit message. If not, the change altered the math of training.')


def test_a_regeneration_rewrites_only_what_moved_or_was_named():
  stored = _load()['cases']
  case, other = sorted(stored)[:2]
  ulp = {c: dict(v, train_loss=[[x * (1 + 3e-7) for x in row] for row in v['train_loss']])
         for c, v in stored.items()}                    # another machine's last digits
  cases, rewritten = merged(stored, ulp, set())
  assert cases == stored and rewritten == []
  moved = dict(ulp, **{case: dict(ulp[case], final_loss=[
      x * 1.01 for x in ulp[case]['final_loss']])})     # an intended change of one case
  cases, rewritten = merged(stored, moved, set())
  assert rewritten == [case] and cases[case] == moved[case] and cases[other] == stored[other]
  cases, rewritten = merged(stored, ulp, {other})       # named: rewritten all the same
  assert rewritten == [other] and cases[other] == ulp[other]
  assert merged({}, ulp, set())[1] == sorted(ulp)       # a new fixture: every case
  bytes_moved = dict(ulp, **{other: dict(ulp[other], bytes_sent=[
      [x + 1 for x in row] for row in ulp[other]['bytes_sent']])})
  assert merged(stored, bytes_moved, set())[1] == [other]


def test_every_registered_algorithm_has_golden_numbers():
  covered = {name for name, _ in CASES.values()}
  missing = sorted(set(algorithms.REGISTRY) - covered)
  assert not missing, (f'no golden case for {missing}: give its AlgorithmSpec an example '
                       f'and run `{REGENERATE}`.')
  assert set(_load()['cases']) == set(CASES), (
      f'tests/golden/trajectories.json does not hold the cases of CASES; run '
      f'`{REGENERATE}`.')


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(CASES))
def test_golden_trajectory(case):
  want = _load()['cases'][case]
  got = trajectory(case)
  advice = _advice(case)
  for key in ('bytes_sent', 'bytes_received'):
    np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]),
                                  err_msg=f'{key} [step, worker]. {advice}')
  for key in ('train_loss', 'final_loss'):
    np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]),
                               rtol=LOSS_RTOL, atol=0,
                               err_msg=f'{key} [step, worker]. {advice}')


def within_tolerance(got: dict, want: dict) -> bool:
  """Whether a case's numbers `got` pass `test_golden_trajectory` against `want`."""
  try:
    for key in ('bytes_sent', 'bytes_received'):
      np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]))
    for key in ('train_loss', 'final_loss'):
      np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]),
                                 rtol=LOSS_RTOL, atol=0)
  except (AssertionError, KeyError, ValueError):
    return False
  return True


def merged(stored: dict, fresh: dict, named: set[str]) -> tuple[dict, list[str]]:
  """The fixture's cases after a regeneration, and the cases rewritten: a named case,
  a new one and one whose fresh numbers leave the tolerance take the fresh numbers;
  every other case keeps its stored ones (so a regeneration on another machine does
  not move them in their last digits). Cases no longer in CASES are dropped."""
  cases, rewritten = {}, []
  for case in sorted(fresh):
    keep = (case not in named and case in stored
            and within_tolerance(fresh[case], stored[case]))
    cases[case] = stored[case] if keep else fresh[case]
    if not keep:
      rewritten.append(case)
  return cases, rewritten


def _isa() -> str:
  """The host's widest vector instruction set that XLA:CPU compiles for."""
  try:
    with open('/proc/cpuinfo') as f:
      flags = set(f.read().split())
  except OSError:
    return 'unknown'
  for isa in ('avx512f', 'avx2', 'avx', 'sse4_2'):
    if isa in flags:
      return isa
  return 'other'


def regenerate(named: set[str]) -> None:
  unknown = sorted(named - set(CASES))
  if unknown:
    sys.exit(f'tests.test_golden: error: no golden case {unknown[0]!r} (the cases: '
             f'{", ".join(sorted(CASES))}).')
  stored = _load()['cases'] if os.path.exists(GOLDEN) else {}
  fresh = {}
  for case in sorted(CASES):
    print(f'{case} ...', file=sys.stderr)
    fresh[case] = trajectory(case)
  cases, rewritten = merged(stored, fresh, named)
  print(f'rewritten: {", ".join(rewritten) or "none"}; every other case kept its stored '
        'numbers.', file=sys.stderr)
  golden = {
      '_about': ('Golden trajectories of tests/test_golden.py (nano model, '
                 f'{M} workers, {STEPS} steps). Regenerate with `{REGENERATE}` only '
                 'for an intended change, and say why in the commit message.'),
      # The last regeneration that rewrote a case (cases it kept are older).
      'generated_with': ({'jax': jax.__version__, 'numpy': np.__version__,
                          'backend': jax.default_backend(), 'cpu_isa': _isa()}
                         if rewritten else _load().get('generated_with')),
      'cases': cases,
  }
  os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
  text = json.dumps(golden, indent=1)
  # One line per list of numbers (a step's workers), for readable diffs.
  text = re.sub(r'\[\s*([-+0-9.eE,\s]+?)\s*\]',
                lambda m: '[' + ' '.join(m.group(1).split()) + ']', text)
  with open(GOLDEN, 'w') as f:
    f.write(text + '\n')
  print(f'wrote {GOLDEN}', file=sys.stderr)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--regenerate', action='store_true',
                      help=f'rewrite {os.path.relpath(GOLDEN)}: the named cases, or the '
                      'cases whose numbers left the tolerance')
  parser.add_argument('cases', nargs='*', help='cases to rewrite even within tolerance')
  args = parser.parse_args()
  if args.regenerate:
    regenerate(set(args.cases))
  else:
    parser.print_help()
