"""DDP baseline on C4 at the DiLoCo paper's scale: 150M model, 8 workers, global batch 512.

Command (C4 and its SentencePiece model prepared once in DATA_DIR: README, "Paper-scale
runs (C4)", `python -m loco.data.prepare c4` and `... prepare tokenizer`):
  python -m loco.main --config=experiments/c4_ddp.py --workdir=runs/c4_ddp \
    --config.data.data_dir=DATA_DIR --config.data.sp_model=DATA_DIR/c4_en_32k.model
Expected: accelerator-scale (88k steps of 512 x 1024 tokens); the DiLoCo paper reports
validation perplexity 16.23 for the single-worker baseline and 15.30 for 8x-batch DP
(arXiv 2311.08105, Table 2).
"""

from loco.configs import default


def get_config():
  c = default.get_config()
  c.num_workers = 8
  c.steps = 88_000
  c.batch_per_worker = 64          # 8 x 64 = 512 sequences per step, as the paper's batch
  c.seq_len = 1024
  c.model.preset = '150m'
  c.model.vocab_size = 32_000
  c.data.source = 'tfds'
  c.data.tfds_name = 'loco_c4/en:1.0.0'   # python -m loco.data.prepare c4 (README, C4)
  c.data.tokenizer = 'sentencepiece'
  c.optimizer.lr = 4e-4
  c.optimizer.warmup_steps = 1000
  c.algorithm.name = 'ddp'
  c.eval.every = 1000
  c.eval.batches = 50
  c.eval.per_worker = False        # DDP workers are identical
  c.log_every = 50
  c.checkpoint.every = 1000
  return c
