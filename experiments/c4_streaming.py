"""Streaming DiLoCo at the paper's settings on C4: 150M model, 2 workers, H = 100.

Command (C4 and its SentencePiece model prepared once in DATA_DIR: README, "Paper-scale
runs (C4)", `python -m loco.data.prepare c4` and `... prepare tokenizer`):
  python -m loco.main --config=experiments/c4_streaming.py --workdir=runs/c4_streaming \
    --config.data.data_dir=DATA_DIR --config.data.sp_model=DATA_DIR/c4_en_32k.model
Expected: accelerator-scale (the steps and global batch of 512 x 1024 tokens of c4_ddp).
The paper (arXiv 2501.18512) trains M = 2 replicas with H = 100, 3 layers per fragment
(strided), tau = 1, alpha = 0.5, E3M0 outer gradients and outer Nesterov 0.4 / 0.9, and
reports a loss within ~0.5% of data-parallel at 1B on C4 (2.50 vs 2.49 at H = 100). Here:
12 blocks in 4 fragments plus the embedding as fragment 0 (5 syncs per round, one every
20 steps); per round each worker sends 1/8 of DiLoCo's float32 bytes and the peak step
(one 30M-value fragment, ~15 MB) is 1/40 of DiLoCo's. Compare with c4_diloco at the same
M and H: `--config.num_workers=2 --config.batch_per_worker=256
--config.algorithm.sync_every=100`.
"""

from experiments import c4_diloco


def get_config():
  c = c4_diloco.get_config()
  c.num_workers = 2
  c.batch_per_worker = 256           # 2 x 256 = 512 sequences per step, as c4_ddp
  c.algorithm.name = 'streaming_diloco'
  c.algorithm.sync_every = 100
  c.algorithm.layers_per_fragment = 3
  c.algorithm.fragment_pattern = 'strided'
  c.algorithm.non_block = 'own'
  c.algorithm.overlap_steps = 1
  c.algorithm.merge_alpha = 0.5
  c.algorithm.compression = 'e3m0'
  c.algorithm.eager = False
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.4
  c.algorithm.outer_momentum = 0.9
  return c
