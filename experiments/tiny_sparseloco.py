"""SparseLoCo on the embedded corpus: tiny model, 8 workers, H = 15, top-64/4096, 2-bit.

Command:
  python -m loco.main --config=experiments/tiny_sparseloco.py --workdir=runs/tiny_sparseloco
Expected: about 10 minutes on 2 CPU cores (same data, model and steps as
experiments/tiny_diloco.py, so the two compare at equal tokens). Each sync every
worker sends 88,140 bytes (0.22 bits per parameter: 12 index + 2 value bits per kept
value, 1.5625% kept, norm scales sent whole), 146x less than a float32
pseudo-gradient, and receives 7x that from the all-gather; 20 syncs in 300 steps, 1.8 MB
sent per worker.
Final eval_loss 2.101 nats/byte (seed 0, every row an independent window, measured in
`python -m loco.sweep launch/sweeps/main.py`; 2.181 on the stream layout), below
tiny_diloco's 2.173 as the paper reports SparseLoCo below Nesterov DiLoCo at every H
(arXiv 2508.15706). Variants: --config.algorithm.topk=128 (3.125%, the
paper's 512M runs), --config.algorithm.aggregation=workers, and
--config.algorithm.dense_below=0 (the reference code's rule for small tensors).
"""

from loco.configs import default


def get_config():
  c = default.get_config()
  c.num_workers = 8
  c.steps = 300
  c.batch_per_worker = 4
  c.seq_len = 128
  c.algorithm.name = 'sparseloco'
  c.algorithm.sync_every = 15
  c.algorithm.outer_lr = 1.0
  c.algorithm.error_decay = 0.95
  c.algorithm.topk = 64
  c.algorithm.chunk_size = 4096
  c.algorithm.compression = '2bit'
  c.algorithm.aggregation = 'contributors'
  c.eval.every = 50
  c.checkpoint.every = 100
  return c
