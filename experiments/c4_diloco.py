"""DiLoCo at the paper's setup: C4, 150M model, 8 workers, H = 500, outer Nesterov 0.7 / 0.9.

Command (C4 and its SentencePiece model prepared once in DATA_DIR: README, "Paper-scale
runs (C4)", `python -m loco.data.prepare c4` and `... prepare tokenizer`):
  python -m loco.main --config=experiments/c4_diloco.py --workdir=runs/c4_diloco \
    --config.data.data_dir=DATA_DIR --config.data.sp_model=DATA_DIR/c4_en_32k.model
Expected: accelerator-scale; the paper reports validation perplexity 15.02 (non-iid)
against 16.23 for the baseline, communicating 500x less than DDP (arXiv 2311.08105).
"""

from experiments import c4_ddp


def get_config():
  c = c4_ddp.get_config()
  # The paper's default split is non-iid by k-means clusters of C4; loco's cluster split
  # reads every document (<= 200k), so the full-C4 run uses iid shards (the paper found
  # both reach a similar final perplexity).
  c.data.sharding = 'iid'
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = 500
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.7
  c.algorithm.outer_momentum = 0.9
  c.eval.per_worker = True
  return c
