"""DDP baseline on the embedded corpus: tiny model (3.3M params), 4 workers.

Command:
  python -m loco.main --config=experiments/tiny_ddp.py --workdir=runs/tiny_ddp
Expected: about 5 minutes on 2 CPU cores; final eval_loss 1.715 nats/byte (seed 0,
measured in `python -m loco.sweep launch/sweeps/main.py`, every row of a batch an
independent window; 1.976 on the stream layout before 26 November 2026), far below the
corpus's unigram byte entropy (3.25 nats).
"""

from loco.configs import default


def get_config():
  c = default.get_config()
  c.num_workers = 4
  c.steps = 300
  c.batch_per_worker = 8
  c.seq_len = 128
  c.algorithm.name = 'ddp'
  c.eval.every = 100
  c.checkpoint.every = 100
  return c
