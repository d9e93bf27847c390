"""Runs as an axis: R runs in one program give each run's solo numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loco.run import run_axis
from loco.run import step as step_lib
from loco.errors import ConfigError
from loco.run.experiment import build_algorithm, parse_config
from tests.nano import make_nano_config

R, K = 3, 4
RUNS = [dict(seed=1, lr=3e-3, outer_lr=0.7, outer_momentum=0.9, gossip_step=1.0,
             error_decay=0.95, merge_alpha=0.5),
        dict(seed=2, lr=1e-3, outer_lr=0.5, outer_momentum=0.5, gossip_step=0.5,
             error_decay=0.9, merge_alpha=0.0),
        dict(seed=5, lr=6e-3, outer_lr=1.0, outer_momentum=0.95, gossip_step=0.8,
             error_decay=1.0, merge_alpha=0.75)]
KNOBS = {'diloco': ('outer_momentum',), 'gasloc': ('outer_momentum', 'gossip_step'),
         'sparseloco': ('error_decay',), 'streaming_diloco': ('outer_momentum', 'merge_alpha')}
ALGORITHMS = {
    'diloco': dict(sync_every=2),
    'gasloc': dict(sync_every=2, topology='ring'),                      # gossip
    'sparseloco': dict(sync_every=2, topk=8, chunk_size=64),            # compressed
    'streaming_diloco': dict(sync_every=6, overlap_steps=1),            # merged late
}


def _experiments(small_corpus_glob, data_dir, name, runs=RUNS, **extra):
  exps = []
  for run in runs:
    c = make_nano_config(small_corpus_glob, data_dir)
    c.num_workers = 4
    c.seed = run['seed']
    c.optimizer.lr = run['lr']
    c.algorithm.name = name
    own = {k: run[k] for k in KNOBS[name]}
    for key, value in {**ALGORITHMS[name], 'outer_lr': run['outer_lr'], **own,
                       **extra}.items():
      c.algorithm[key] = value
    exps.append(parse_config(c))
  return exps


def _batches(exp, seed):
  r = exp.run
  return jnp.asarray(np.random.default_rng(seed).integers(
      0, exp.model.vocab_size, (K, r.num_workers, r.batch_per_worker, r.seq_len + 1)),
      jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(ALGORITHMS))
def test_batched_runs_equal_their_solo_runs(small_corpus_glob, data_dir, name):
  exps = _experiments(small_corpus_glob, data_dir, name)
  knobs = run_axis.knobs_of(exps)
  for knob in ('lr', 'outer_lr') + KNOBS[name]:
    np.testing.assert_allclose(knobs[knob], [r[knob] for r in RUNS], rtol=1e-7)
  graphdef, states = run_axis.init_states(exps[0], knobs, [r['seed'] for r in RUNS])
  batches = jnp.stack([_batches(e, i) for i, e in enumerate(exps)])
  valid = jnp.ones((K,), bool)
  chunk = run_axis.make_batched_chunk(exps[0], graphdef)
  states, (losses, info) = chunk(knobs, states, batches, None, valid)
  for i, exp in enumerate(exps):       # each run alone, through the solo path
    alg = build_algorithm(exp)
    g, init, _ = step_lib.init_state(exp, alg, jax.random.key(exp.run.seed))
    solo = init(jax.random.key(exp.run.seed))
    solo_chunk = step_lib.make_train_chunk(alg, exp.model, g, grad_mode=exp.run.grad_mode)
    solo, (solo_losses, solo_info) = solo_chunk(solo, batches[i], None, valid)
    np.testing.assert_allclose(losses[i], solo_losses, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(info.wire.sent[i], solo_info.wire.sent)
    np.testing.assert_array_equal(info.wire.received[i], solo_info.wire.received)
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[i], states.params)),
                    jax.tree.leaves(solo.params)):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
  # The runs really differ (their own seeds and knobs), and their knobs acted: a round
  # (and for Streaming a merge, one step after a fragment's sync) fell in the chunk.
  assert not np.allclose(losses[0], losses[1])
  assert np.asarray(info.synced)[0, :K - 1].any()


def test_runs_that_differ_in_shape_are_refused_in_one_line(small_corpus_glob, data_dir):
  exps = _experiments(small_corpus_glob, data_dir, 'diloco', runs=RUNS[:1])
  other = _experiments(small_corpus_glob, data_dir, 'diloco', runs=RUNS[1:2],
                       sync_every=4)
  with pytest.raises(ConfigError) as err:
    run_axis.knobs_of(exps + other)
  assert str(err.value) == (
      'run 1 differs from run 0 in algorithm_kwargs.sync_every, which batched runs must '
      'share (they may differ in seed and optimizer.lr, optimizer.weight_decay, '
      'algorithm.outer_lr, algorithm.outer_momentum, algorithm.gossip_step, '
      'algorithm.error_decay, algorithm.merge_alpha).')
  # Whether a momentum exists is shape: 0 against 0.9 is refused, 0.5 against 0.9 not.
  plain = _experiments(small_corpus_glob, data_dir, 'diloco', runs=RUNS[1:2],
                       outer_momentum=0.0)
  with pytest.raises(ConfigError, match='in algorithm_kwargs.outer_momentum > 0, '):
    run_axis.knobs_of(exps + plain)
  knobs = run_axis.knobs_of(exps + _experiments(small_corpus_glob, data_dir, 'diloco',
                                                runs=RUNS[1:2]))
  np.testing.assert_allclose(knobs['outer_momentum'], [0.9, 0.5])
  with pytest.raises(ConfigError, match='no runs'):
    run_axis.knobs_of([])
