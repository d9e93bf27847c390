"""Offline dropout and the shared anchor: how often no alive worker is up to date, and
whether the anchors are one again after it.

  python scripts/dropout_anchor_spread.py [--workers=8] [--dropout=0.5] [--rounds=70]
      [--seeds=0,1,2,3,4]

Prints (1) the reproducer: DiLoCo with M = 3, H = 2, absent {0}, {0, 1}, {2}, then
everyone for two rounds; at the third sync both alive workers are rejoining. The largest
difference between two workers' anchors after each round (0 after an all-alive round
when every rejoining worker caught up). (2) For offline dropout at the given rate: per
seed, the syncs (of `--rounds`) at which every alive worker is rejoining, from loco's own
`SyncSchedule`. Runs on the CPU in a few seconds.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loco import comm
from loco.sim import schedule as schedule_lib
from loco.core.engine import StepContext, local_updates
from loco.core.participation import Participation

REPRODUCER = [(0, 1, 1), (0, 0, 1), (1, 1, 0), (1, 1, 1), (1, 1, 1)]


def reproducer(h: int = 2) -> list[float]:
  """The anchor spread (max over values of max - min across workers) after each round."""
  m = len(REPRODUCER[0])
  outer = optax.chain(comm.all_reduce_mean(), optax.sgd(0.7, momentum=0.9, nesterov=True))
  alg = local_updates(optax.sgd(0.1), outer, h)
  state = alg.init(jnp.zeros((5,), jnp.float32), m, jax.random.key(0))
  step = jax.jit(alg.step)
  targets = jnp.arange(m * 5, dtype=jnp.float32).reshape(m, 5) / 7.0
  stale, ones, spreads = np.zeros(m, bool), np.ones(m, bool), []
  for alive in REPRODUCER:
    alive = np.asarray(alive, bool)
    for _ in range(h):
      state, _ = step(state, state.params - targets,
                      StepContext(active=ones, alive=alive, participation=Participation(
                          keep=ones, isolate=ones, rejoin=alive & stale)))
    stale = ~alive
    anchor = np.asarray(state.anchor)
    spreads.append(float((anchor.max(axis=0) - anchor.min(axis=0)).max()))
  return spreads


def no_fresh_syncs(workers: int, dropout: float, rounds: int, seed: int) -> list[int]:
  """The rounds whose sync finds every alive worker rejoining (offline dropout)."""
  sched = schedule_lib.SyncSchedule(workers, round_steps=1, dropout=dropout, seed=seed,
                                    dropout_mode='offline')
  _, alive = sched.masks(0, rounds)
  _, _, rejoin = sched.dropout_masks(0, rounds)
  return [r for r in range(rounds) if not (alive[r] & ~rejoin[r]).any()]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workers', type=int, default=8)
  parser.add_argument('--dropout', type=float, default=0.5)
  parser.add_argument('--rounds', type=int, default=70)
  parser.add_argument('--seeds', default='0,1,2,3,4')
  args = parser.parse_args()
  if args.workers < 1 or args.rounds < 1 or not 0.0 <= args.dropout < 1.0:
    parser.error('--workers and --rounds must be >= 1 and --dropout in [0, 1)')
  print('reproducer (M = 3, H = 2; absent {0}, {0, 1}, {2}, then everyone twice):')
  for alive, spread in zip(REPRODUCER, reproducer()):
    print(f'  alive {alive}: anchor spread {spread:.6f}')
  print(f'\noffline dropout {args.dropout:g}, M = {args.workers}, {args.rounds} rounds: '
        'syncs at which every alive worker is rejoining')
  for seed in (int(s) for s in args.seeds.split(',')):
    hits = no_fresh_syncs(args.workers, args.dropout, args.rounds, seed)
    print(f'  seed {seed}: {len(hits)} of {args.rounds} ({hits[:12]}{" ..." if len(hits) > 12 else ""})')


if __name__ == '__main__':
  main()
