"""DiLoCo on the embedded corpus: tiny model, 8 workers, H = 50.

Command:
  python -m loco.main --config=experiments/tiny_diloco.py --workdir=runs/tiny_diloco
  python -m loco.main --config=experiments/tiny_diloco.py:local_sgd --workdir=runs/tiny_local_sgd
Expected: about 10 minutes on 2 CPU cores; final eval_loss 2.173 nats/byte, 135 MB sent
per worker (seed 0, every row of a batch an independent window, measured in
`python -m loco.sweep launch/sweeps/main.py`; 2.268 on the stream layout before 26
November 2026). WORKSPACE.md (DDP vs DiLoCo vs Local SGD) has Local SGD; outer lr and
momentum here are tuned for short from-scratch runs (the paper's 0.7 / 0.9 overshoot at
this scale).
"""

from loco.configs import default

VARIANTS = ('diloco', 'local_sgd')


def get_config(arg: str = 'diloco'):
  """`arg` 'local_sgd' gives Local SGD (outer SGD lr 1) on the same run."""
  c = default.get_config()
  c.num_workers = 8
  c.steps = 300
  c.batch_per_worker = 4
  c.seq_len = 128
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = 50
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.7
  c.algorithm.outer_momentum = 0.5
  if arg == 'local_sgd':
    c.algorithm.name = 'local_sgd'
    c.algorithm.outer_optimizer = c.algorithm.outer_lr = c.algorithm.outer_momentum = None
  elif arg != 'diloco':
    raise ValueError(f"tiny_diloco.py takes 'diloco' or 'local_sgd' after ':', got {arg!r}.")
  c.eval.every = 50
  c.checkpoint.every = 100
  return c
