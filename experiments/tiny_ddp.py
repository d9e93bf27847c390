"""DDP baseline on the embedded corpus: tiny model (3.2M params), 8 workers x 4 rows.

Command:
  python -m loco.main --config=experiments/tiny_ddp.py --workdir=runs/tiny_ddp
Expected: about 5 minutes on 2 CPU cores. Measured as the main comparison runs it
(`python -m loco.sweep launch/sweeps/main.py`, the layout of this file: 8 workers x 4
rows, 4,096 tokens per step; seed 0, every row of a batch an independent window): final
eval_loss 1.715 nats/byte, 6,749 MB sent per worker (1.976 on the stream layout before
26 November 2026), far below the corpus's unigram byte entropy (3.25 nats). The same 8 x
4 layout as tiny_diloco.py, so the two compare at equal tokens and equal workers."""

from loco.configs import default


def get_config():
  c = default.get_config()
  c.num_workers = 8
  c.steps = 300
  c.batch_per_worker = 4
  c.seq_len = 128
  c.algorithm.name = 'ddp'
  c.eval.every = 100
  c.checkpoint.every = 100
  return c
