"""MuLoCo on the embedded corpus: experiments/tiny_diloco.py with a Muon inner optimizer.

Command:
  python -m loco.main --config=experiments/tiny_muloco.py --workdir=runs/tiny_muloco
Expected: about 10 minutes on 2 CPU cores; the same data, model, steps, H and outer
optimizer as experiments/tiny_diloco.py, so the two differ only in the inner optimizer
(Muon on the hidden matrices, Adam on the embedding and norms; the spec's default;
both at optimizer.lr, untuned for Muon here). Eval loss: not yet
measured here; the paper finds MuLoCo below DiLoCo at every worker count
(arXiv 2505.23725).
"""

from loco.configs import default


def get_config():
  c = default.get_config()
  c.num_workers = 8
  c.steps = 300
  c.batch_per_worker = 4
  c.seq_len = 128
  c.algorithm.name = 'muloco'
  c.algorithm.sync_every = 50
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.7
  c.algorithm.outer_momentum = 0.5
  c.eval.every = 50
  c.checkpoint.every = 100
  return c
