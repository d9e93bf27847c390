"""GASLoC at the DiLoCo paper's scale: C4, 150M model, 16 workers on a ring, H = 500.

Command (C4 and its SentencePiece model prepared once in DATA_DIR: README, "Paper-scale
runs (C4)", `python -m loco.data.prepare c4` and `... prepare tokenizer`):
  python -m loco.main --config=experiments/c4_gasloc.py --workdir=runs/c4_gasloc \
    --config.data.data_dir=DATA_DIR --config.data.sp_model=DATA_DIR/c4_en_32k.model
Expected: accelerator-scale (88k steps, the global batch of 512 x 1024 tokens of
experiments/c4_ddp.py split over 16 workers). No GASLoC numbers are public (arXiv
2606.11081 gives its abstract only); the reference is DiLoCo at M = 16 on iid shards
(as c4_diloco.py): validation perplexity 15.02 (arXiv 2311.08105), which GASLoC with
--config.algorithm.topology=complete reproduces exactly. On the ring each worker
sends its 600 MB model to 2 neighbours per sync, with no all-reduce; the outer
Nesterov momentum doubles as gossip acceleration (chi1 of the 16-ring is 13.1).
Variant: --config.algorithm.topology=matching (one random partner per sync).
"""

from experiments import c4_diloco


def get_config():
  c = c4_diloco.get_config()
  c.num_workers = 16
  c.batch_per_worker = 32          # 16 x 32 = 512 sequences per step, as c4_ddp / c4_diloco
  c.algorithm.name = 'gasloc'
  c.algorithm.topology = 'ring'
  c.algorithm.weights = 'metropolis'
  c.algorithm.mix = 'models'
  c.algorithm.sync_every = 500
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.7
  c.algorithm.outer_momentum = 0.9
  return c
