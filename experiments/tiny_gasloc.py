"""GASLoC on the embedded corpus: tiny model, 8 workers on a ring, H = 50.

Command:
  python -m loco.main --config=experiments/tiny_gasloc.py --workdir=runs/tiny_gasloc
Expected: about 5 minutes on 2 CPU cores (grad_mode auto). Same data, model, steps and
outer optimizer as experiments/tiny_diloco.py, so the two compare at equal tokens: only
the all-reduce is replaced by gossip with the two ring neighbours (Metropolis weights
1/3). Measured in `python -m loco.sweep launch/sweeps/main.py` (seed 0, every row of a
batch an independent window): final eval_loss 2.281 nats/byte for the worker-averaged
model (each worker's own: 2.245; worker_spread 0.16), against tiny_diloco's 2.173;
6 syncs, 154 MB sent per worker (2 x 12.9 MB per sync), against tiny_diloco's 135 MB
through a ring all-reduce. The first round's averaged model equals DiLoCo's (2.777 at
step 50): gossip keeps the workers' mean.

Variants (measured by hand, same seed; `python scripts/expected_numbers.py --run
--only=tiny_gasloc_matching,tiny_gasloc_m09` runs them again):
--config.algorithm.topology=matching, one random partner per sync: final eval_loss 2.263
averaged (each worker's own: 2.272), half the bytes: 77 MB sent per worker;
--config.algorithm.outer_momentum=0.9, the paper's: final eval_loss 2.335 averaged (each
worker's own: 2.310; it overshoots, as DiLoCo's does here);
--config.algorithm.topology=complete is tiny_diloco exactly. One seed each: an eval's
standard error is about 0.06 (eval_loss_se). On the stream layout (before 26 November
2026) the ring run scored 2.344 (the workers' own 2.360).
"""

from loco.configs import default


def get_config():
  c = default.get_config()
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
