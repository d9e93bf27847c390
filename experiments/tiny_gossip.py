"""The decentralized baselines on the embedded corpus, one step per communication, ring.

Commands (the argument after ':' picks the algorithm):
  python -m loco.main --config=experiments/tiny_gossip.py:dsgd --workdir=runs/tiny_dsgd
  python -m loco.main --config=experiments/tiny_gossip.py:adpsgd --workdir=runs/tiny_adpsgd
  python -m loco.main --config=experiments/tiny_gossip.py:a2cid2 --workdir=runs/tiny_a2cid2
  python -m loco.main --config=experiments/tiny_gossip.py:noloco --workdir=runs/tiny_noloco
  python -m loco.main --config=experiments/tiny_gossip.py:gasloc --workdir=runs/tiny_gasloc_h1
Expected: about 5 minutes each on 2 CPU cores (8 workers, tiny model, 300 steps, the
data and inner optimizer of tiny_gasloc.py). Measured results: WORKSPACE.md, table (a)
of the gossip comparison (`python -m loco.sweep launch/sweeps/gossip.py
--out=runs/sweeps/gossip`).
"""

from experiments import tiny_gasloc

VARIANTS = ('dsgd', 'adpsgd', 'a2cid2', 'noloco', 'gasloc')


def get_config(arg: str = 'dsgd'):
  if arg not in VARIANTS:
    raise ValueError(f'tiny_gossip.py takes one of {VARIANTS} after ":", got {arg!r}.')
  c = tiny_gasloc.get_config()
  c.algorithm.name = arg
  c.algorithm.topology = 'ring'
  if arg in ('gasloc', 'noloco'):
    c.algorithm.sync_every = 1            # one step per communication
  # Keys of tiny_gasloc that this algorithm does not take go back to unset.
  taken = {'gasloc': ('sync_every', 'topology', 'weights', 'mix', 'outer_optimizer',
                      'outer_lr', 'outer_momentum'),
           'dsgd': ('topology', 'weights'),
           'adpsgd': ('topology',),
           'a2cid2': ('topology',),
           'noloco': ('sync_every', 'topology')}[arg]
  for key in ('sync_every', 'topology', 'weights', 'mix', 'outer_optimizer', 'outer_lr',
              'outer_momentum'):
    if key not in taken:
      c.algorithm[key] = None
  return c
