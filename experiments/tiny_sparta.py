"""SPARTA on the embedded corpus: tiny model, 8 workers, 0.5% of every tensor averaged
after every inner step (a shared random mask, so only values travel).

Command:
  python -m loco.main --config=experiments/tiny_sparta.py --workdir=runs/tiny_sparta
  python -m loco.main --config=experiments/tiny_sparta.py:sparta_diloco \
      --workdir=runs/tiny_sparta_diloco
Expected: about 10 minutes on 2 CPU cores (same data, model and steps as
experiments/tiny_diloco.py). The variant adds DiLoCo's outer step every H = 50 steps
(EXO Gym's SPARTA-DiLoCo). Each worker sends about 112 KB per step (0.5% of the 3.2M
weights at 4 bytes through a ring all-reduce of 8: 1.75 x 64 KB; a 20-step run measured
2,246,783 bytes). Eval loss: not yet measured here.
"""

from loco.configs import default

VARIANTS = ('sparta', 'sparta_diloco')


def get_config(arg: str = 'sparta'):
  """`arg` 'sparta_diloco' adds DiLoCo's rounds (H = 50, outer Nesterov 0.7 / 0.5)."""
  c = default.get_config()
  c.num_workers = 8
  c.steps = 300
  c.batch_per_worker = 4
  c.seq_len = 128
  c.algorithm.name = 'sparta'
  c.algorithm.fraction = 0.005
  if arg == 'sparta_diloco':
    c.algorithm.name = 'sparta_diloco'
    c.algorithm.sync_every = 50
    c.algorithm.outer_lr = 0.7
    c.algorithm.outer_momentum = 0.5
  elif arg != 'sparta':
    raise ValueError(f"tiny_sparta.py takes 'sparta' or 'sparta_diloco' after ':', got {arg!r}.")
  c.eval.every = 50
  c.checkpoint.every = 100
  return c
