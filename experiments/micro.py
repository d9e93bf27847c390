"""The cheap-round scale for checking claims: many rounds of H = 50 on 2 CPU cores.

Micro model (0.4M weights, d_model 128, 2 layers), byte-level embedded corpus,
8 workers x 4 sequences x 128 tokens per step (the tiny configs' 4,096 tokens per
step), 2,000 steps = 40 rounds of H = 50 in about 5 minutes (about 30k tokens/s).
Eval on 64 x 16 x 128 = 131k held-out tokens.

Command:
  python -m loco.main --config=experiments/micro.py:ddp --workdir=runs/micro_ddp
  python -m loco.main --config=experiments/micro.py:diloco --workdir=runs/micro_diloco
Measured curves and the seed spread: WORKSPACE.md, "A scale where rounds are cheap".
"""

from loco.configs import default

VARIANTS = ('ddp', 'diloco', 'local_sgd')


def get_config(arg: str = 'diloco'):
  """`arg`: 'ddp', 'diloco' (Nesterov 0.7 / 0.9, the paper's) or 'local_sgd'."""
  if arg not in VARIANTS:
    raise ValueError(f'micro.py takes one of {VARIANTS} after ":", got {arg!r}.')
  c = default.get_config()
  c.model.preset = 'micro'
  c.num_workers = 8
  c.steps = 2000
  c.batch_per_worker = 4
  c.seq_len = 128
  c.optimizer.lr = 3e-3
  c.optimizer.warmup_steps = 100
  c.algorithm.name = arg
  if arg == 'diloco':
    c.algorithm.sync_every = 50
    c.algorithm.outer_optimizer = 'nesterov'
    c.algorithm.outer_lr = 0.7
    c.algorithm.outer_momentum = 0.9
  elif arg == 'local_sgd':
    c.algorithm.sync_every = 50
  c.log_every = 50
  c.eval.every = 250
  c.eval.batches = 64
  c.eval.batch_size = 16
  c.checkpoint.every = 500
  return c
