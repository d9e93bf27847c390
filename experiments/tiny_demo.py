"""DeMo on the embedded corpus: tiny model, 8 workers, every step 32 DCT coefficients
of each 64 x 64 tile of every worker's momentum all-gathered, then a sign step.

Command:
  python -m loco.main --config=experiments/tiny_demo.py --workdir=runs/tiny_demo
Expected: about 15 minutes on 2 CPU cores (same data, model and steps as
experiments/tiny_diloco.py, so they compare at equal tokens; DeMo's DCT and its
all-gather run every step). Inner optimizer: sign-SGD (the spec's default; DeMo's code
uses no weight decay by default, set here to 0). Each worker sends 296,896 bytes per step
(measured by a 20-step run: the kept coefficients at 32 bits plus 12 index bits each;
vectors keep 32 of each 64-chunk) and receives 7x that. Eval loss: not yet measured; the
paper reports loss comparable to AdamW data parallel at up to 85x less data per GPU
(arXiv 2411.19870).
"""

from loco.configs import default


def get_config():
  c = default.get_config()
  c.num_workers = 8
  c.steps = 300
  c.batch_per_worker = 4
  c.seq_len = 128
  c.algorithm.name = 'demo'
  c.algorithm.compression_decay = 0.999
  c.algorithm.compression_topk = 32
  c.algorithm.compression_chunk = 64
  c.optimizer.weight_decay = 0.0
  c.eval.every = 50
  c.checkpoint.every = 100
  return c
