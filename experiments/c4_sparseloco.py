"""SparseLoCo at DiLoCo's C4 setup with the SparseLoCo paper's outer settings.

150M model, 8 workers, global batch 512 x 1024 tokens (experiments/c4_ddp.py), inner
AdamW as the SparseLoCo 512M runs (lr 1e-3, warm-up 500, cosine to 0.1x, clip 1);
outer: H 15, error feedback beta 0.95, top-128 of every 64x64 tile (3.125%), 2-bit
binned values, per-coordinate mean over the workers that sent it, plain SGD lr 1.

Command (C4 and its SentencePiece model prepared once in DATA_DIR: README, "Paper-scale
runs (C4)", `python -m loco.data.prepare c4` and `... prepare tokenizer`):
  python -m loco.main --config=experiments/c4_sparseloco.py --workdir=runs/c4_sparseloco \
    --config.data.data_dir=DATA_DIR --config.data.sp_model=DATA_DIR/c4_en_32k.model
Expected: accelerator-scale. The paper (512M, DCLM, R = 8) reports SparseLoCo below
Nesterov DiLoCo at every H in 15..250 while sending 1-3% of values at 2 bits
(arXiv 2508.15706; exact losses not retrieved, REFERENCES §4); 0.44 bits per
parameter per sync, 73x less than a float32 pseudo-gradient.
"""

from experiments import c4_ddp


def get_config():
  c = c4_ddp.get_config()
  c.optimizer.lr = 1e-3            # SparseLoCo 512M inner AdamW
  c.optimizer.warmup_steps = 500
  c.optimizer.final_lr_frac = 0.1
  c.algorithm.name = 'sparseloco'
  c.algorithm.sync_every = 15
  c.algorithm.outer_lr = 1.0
  c.algorithm.error_decay = 0.95
  c.algorithm.topk = 128           # 3.125%, the paper's 512M runs (Templar: 64)
  c.algorithm.chunk_size = 4096
  c.algorithm.compression = '2bit'
  c.algorithm.aggregation = 'contributors'
  c.eval.per_worker = True
  return c
