"""Cost per worker-step of the asynchronous replay against the synchronous run.

  python scripts/bench_replay.py [--model=nano --workers=8 --sync_every=10 --steps=60]

GASLoC on random matchings (tiny_hetero.py's algorithm and `slow_links` network: 1
Gbit/s, 10 ms, every link of 2 of the 8 workers 100x slower, 0.1 s per step), run by the
train loop's own jitted chunk (lax.scan of per-worker value_and_grad + Algorithm.step,
state donated) twice: replayed asynchronously (network.mode='async': ticks of
`schedule.simulate_async`, an [M] active mask, an [M] sync mask and a mixing matrix per
tick), and synchronously (every worker steps every tick, the outer step every H steps).
Both take `--steps` inner steps per worker. Each tick is one chunk
call, timed alone (best of --repeats passes after a compiling pass, the two modes
interleaved). Printed: seconds per tick and per worker-step (the run's time over the
inner steps its workers took), and the median tick without and with an exchange. A tick
where nobody exchanges should cost only its inner steps, the same in both modes.
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

from loco import algorithms, model  # noqa: E402
from loco.sim import network, timeline
from loco.algorithms import optim
from loco.run import step as step_lib  # noqa: E402

_MODEL = flags.DEFINE_string('model', 'nano', 'Model preset.')
_WORKERS = flags.DEFINE_integer('workers', 8, 'Simulated workers.')
_BATCH = flags.DEFINE_integer('batch', 4, 'Sequences per worker per step.')
_SEQ = flags.DEFINE_integer('seq_len', 64, 'Tokens per sequence.')
_H = flags.DEFINE_integer('sync_every', 10, 'Local steps between exchanges (H).')
_STEPS = flags.DEFINE_integer('steps', 60, 'Inner steps per worker.')
_GRAD_MODE = flags.DEFINE_enum('grad_mode', 'auto', ['auto', 'vmap', 'map'],
                               'How per-worker gradients are mapped.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed passes (best is kept).')

# The blocking replay, which the recorded measurements used (overlap='compute' adds
# a snapshot cond per tick and a tick without steps per exchange).
NETWORK = dict(profile='slow_links', mode='async', overlap='none', step_seconds=0.1,
               bandwidth=1e9 / 8, latency=0.01, slow_workers=2, slow_factor=100.0)


def build(cfg):
  graphdef, params = model.init_params(cfg, jax.random.PRNGKey(0))
  inner = optim.inner_optimizer(optim.InnerConfig(lr=1e-3, warmup_steps=10,
                                                  decay_steps=_STEPS.value))
  alg = algorithms.make('gasloc', inner, sync_every=_H.value, topology='matching',
                        mix='models', outer_lr=0.7, outer_momentum=0.5)
  chunk = step_lib.make_train_chunk(alg, cfg, graphdef, grad_mode=_GRAD_MODE.value)
  init = jax.jit(lambda: alg.init(params, _WORKERS.value, jax.random.PRNGKey(1)))
  return alg, chunk, init, model.param_count(cfg)


def run(chunk, state, batches, contexts, num_ticks):
  """One pass over all ticks, one chunk call per tick; returns seconds per tick."""
  seconds = np.zeros(num_ticks)
  for t in range(num_ticks):
    ctx = None if contexts is None else contexts(t, 1)
    t0 = time.perf_counter()
    state, out = chunk(state, batches, ctx, np.ones(1, bool))
    jax.block_until_ready((state, out))
    seconds[t] = time.perf_counter() - t0
  return seconds


def main(argv):
  del argv
  cfg = model.model_config(_MODEL.value, max_seq_len=max(_SEQ.value, 16))
  m = _WORKERS.value
  alg, chunk, init, num_params = build(cfg)
  net_cfg = network.parse_network(NETWORK)
  tl = timeline.make_timeline(
      net_cfg, num_workers=m, steps=_STEPS.value, algorithm=alg,
      name='gasloc', flops_per_token=model.flops_per_token(cfg, _SEQ.value),
      tokens_per_step=_BATCH.value * _SEQ.value, model_bytes=4 * num_params)
  sched = tl.schedule
  batches = jnp.asarray(np.random.default_rng(0).integers(
      0, cfg.vocab_size, (1, m, _BATCH.value, _SEQ.value + 1), dtype=np.int32))
  h = _H.value
  cases = {  # label: (contexts, ticks, workers stepping per tick, ticks with an exchange)
      'async replay': (tl.contexts, sched.num_ticks, sched.active.sum(axis=1),
                       sched.sync.any(axis=1)),
      'sync': (None, _STEPS.value, np.full(_STEPS.value, m),
               np.arange(1, _STEPS.value + 1) % h == 0)}
  best = {}
  for label, (contexts, ticks, _, _) in cases.items():
    run(chunk, init(), batches, contexts, ticks)                # compiles
    best[label] = np.full(ticks, np.inf)
  for _ in range(_REPEATS.value):        # interleaved: load drifts hit both alike
    for label, (contexts, ticks, _, _) in cases.items():
      best[label] = np.minimum(best[label], run(chunk, init(), batches, contexts, ticks))
  print(f'{_MODEL.value} preset ({num_params} params), {m} workers x {_BATCH.value} x '
        f'{_SEQ.value} tokens, GASLoC matching H={h}, {_STEPS.value} steps per worker, '
        f'grad_mode={_GRAD_MODE.value} ({jax.default_backend()}), best of '
        f'{_REPEATS.value} per tick')
  print(f'async replay: {sched.num_ticks} ticks, {int(sched.sync.any(axis=1).sum())} '
        f'with an exchange, {sched.active.mean() * m:.2f} workers stepping per tick')
  per_step = {}
  for label, (_, ticks, stepping, exchange) in cases.items():
    seconds = best[label]
    per_step[label] = seconds.sum() / stepping.sum()
    print(f'{label:>14}: {seconds.sum():7.3f} s  {seconds.mean() * 1e3:8.2f} ms/tick  '
          f'{per_step[label] * 1e3:8.3f} ms/worker-step;  ticks without an exchange '
          f'{np.median(seconds[~exchange]) * 1e3:8.2f} ms, with '
          f'{np.median(seconds[exchange]) * 1e3:8.2f} ms (medians)')
  print(f'async / sync cost per worker-step: '
        f'{per_step["async replay"] / per_step["sync"]:.2f}')


if __name__ == '__main__':
  app.run(main)
