"""GASLoC and the decentralized baselines on a ring.

Command:
  python -m loco.sweep launch/sweeps/gossip.py --out=runs/sweeps/gossip
Expected: about 30 minutes on 2 CPU cores (7 runs of ~4 minutes, --parallel=1). One
step per communication (GASLoC H=1, D-AdamW, AD-PSGD, A2CiD2, NoLoCo H=1), then H=50
(GASLoC on the ring and on random matchings); measured results: WORKSPACE.md, "GASLoC
and the decentralized baselines" tables (a) and (b). The baselines use the
experiments/tiny_gossip.py variants, which unset the GASLoC keys they do not take (a
command line cannot set a key back to None).
"""

from launch.sweeps.common import suite


def get_sweep():
  return suite([
      ('gasloc_ring_h1', 'experiments/tiny_gasloc.py', {'algorithm.sync_every': 1}),
      ('dsgd_ring', 'experiments/tiny_gossip.py:dsgd', {}),
      ('adpsgd_ring', 'experiments/tiny_gossip.py:adpsgd', {}),
      ('a2cid2_ring', 'experiments/tiny_gossip.py:a2cid2', {}),
      ('noloco_ring_h1', 'experiments/tiny_gossip.py:noloco', {}),
      ('gasloc_ring_h50', 'experiments/tiny_gasloc.py', {}),
      ('gasloc_matching_h50', 'experiments/tiny_gasloc.py', {'algorithm.topology': 'matching'}),
  ])
