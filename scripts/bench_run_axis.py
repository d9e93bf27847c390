"""Runs as an axis: tokens/s over all runs, R runs batched in one program against one
run at a time (what one process per run does; on 2 cores two processes at once gain
nothing, WORKSPACE "Runs as an axis").

  python scripts/bench_run_axis.py [--preset=micro --runs=1,3,9 --seq_len=64]
  python scripts/bench_run_axis.py --preset=tiny --runs=1,4 --seq_len=128

Each run is DiLoCo (H = 15, Nesterov) on 8 workers x 4 sequences, the claims page's
shape, with its own seed and inner and outer learning rates; a chunk of 15 steps (one
round) is timed after a compiled warm-up, best of --repeats. "solo" is the train loop's
own chunk (`step.make_train_chunk`), one run; "batched R" is `run_axis.make_batched_chunk`
over R runs. Per-process start-up (about 2 s) and compilation are not counted, so the
solo column flatters separate processes.
"""

import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from loco.run import run_axis  # noqa: E402
from loco.run import step as step_lib  # noqa: E402
from loco.configs import default  # noqa: E402
from loco.run.experiment import build_algorithm, parse_config  # noqa: E402

_PRESET = flags.DEFINE_string('preset', 'micro', 'Model preset.')
_RUNS = flags.DEFINE_list('runs', ['1', '3', '9'], 'Run counts R to batch.')
_SEQ = flags.DEFINE_integer('seq_len', 64, 'Tokens per sequence.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed chunks per case (best is kept).')
_GRAD_MODE = flags.DEFINE_string('grad_mode', 'auto', "Workers' gradients: auto | map | vmap.")
H, M, B = 15, 8, 4


def experiment(seed: int):
  c = default.get_config()
  c.model.preset = _PRESET.value
  c.num_workers, c.batch_per_worker, c.seq_len, c.seed = M, B, _SEQ.value, seed
  c.steps = 600
  c.optimizer.lr = 1.5e-3 * (1 + seed % 3)
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = H
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.5 + 0.25 * (seed % 3)
  c.algorithm.outer_momentum = 0.5
  c.grad_mode = _GRAD_MODE.value
  return parse_config(c)


def best_seconds(fn, repeats: int) -> float:
  fn()                                              # compile and warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def main(argv):
  del argv
  rng = np.random.default_rng(0)
  valid = jnp.ones((H,), bool)
  tokens_per_run = H * M * B * _SEQ.value
  exp = experiment(0)
  vocab = exp.model.vocab_size
  batch = lambda *lead: jnp.asarray(rng.integers(0, vocab, (*lead, H, M, B, _SEQ.value + 1)),
                                    jnp.int32)

  alg = build_algorithm(exp)
  graphdef, init, _ = step_lib.init_state(exp, alg, jax.random.key(0))
  chunk = step_lib.make_train_chunk(alg, exp.model, graphdef, grad_mode=exp.run.grad_mode)
  holder = {'state': init(jax.random.key(0))}
  solo_batch = batch()

  def solo():
    holder['state'], out = chunk(holder['state'], solo_batch, None, valid)
    jax.block_until_ready(out)

  solo_rate = tokens_per_run / best_seconds(solo, _REPEATS.value)
  print(f'{_PRESET.value}, DiLoCo H={H}, {M} workers x {B} x {_SEQ.value} tokens, '
        f'grad_mode {_GRAD_MODE.value}, {jax.device_count()} {jax.devices()[0].platform} '
        'device(s)')
  print(f'{"case":<12} {"tokens/s (all runs)":>20} {"vs one run at a time":>22}')
  print(f'{"solo":<12} {solo_rate:>20,.0f} {1.0:>21.2f}x')
  for r in (int(x) for x in _RUNS.value):
    exps = [experiment(s) for s in range(r)]
    knobs = run_axis.knobs_of(exps)
    graphdef, states = run_axis.init_states(exps[0], knobs, list(range(r)))
    batched = run_axis.make_batched_chunk(exps[0], graphdef)
    holder['states'] = states
    batches = batch(r)

    def step():
      holder['states'], out = batched(knobs, holder['states'], batches, None, valid)
      jax.block_until_ready(out)

    rate = r * tokens_per_run / best_seconds(step, _REPEATS.value)
    print(f'{"batched " + str(r):<12} {rate:>20,.0f} {rate / solo_rate:>21.2f}x')


if __name__ == '__main__':
  app.run(main)
