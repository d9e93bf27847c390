"""DiLoCo and GASLoC on a simulated network: homogeneous links, or a few slow ones.

Commands (the argument after ':' picks the run; `python scripts/hetero.py` runs them all
and prints the comparison):
  python -m loco.main --config=experiments/tiny_hetero.py:gasloc --workdir=runs/hetero/gasloc
  python -m loco.main --config=experiments/tiny_hetero.py:diloco --workdir=runs/hetero/diloco
  ... :gasloc_homogeneous, :diloco_homogeneous, :diloco_drop25, :diloco_drop50,
  :gasloc_sampled, :gasloc_overlap

The model, data, steps and outer optimizer are tiny_diloco.py's (8 workers, 300 steps of
4 x 128 tokens each, H = 50). Each worker's step is taken to last 0.1 s (say a small
GPU); links are 1 Gbit/s with 10 ms latency (workers across the internet), and in the
`slow_links` profile every link of 2 of the 8 workers is 100x slower (10 Mbit/s).

- diloco: synchronous; every sync is a ring all-reduce over all 8 workers, so it runs
  at the pace of the slow links.
- gasloc: GASLoC replayed asynchronously (loco/sim/schedule.py): after its H local steps a
  worker averages models with a random ready peer (any worker: topology 'matching'),
  then takes its outer Nesterov step; nobody waits for the slow workers but their
  partners.
- gasloc_sampled: gasloc, but each worker picks a random peer and waits for it
  (`network.peer_choice='sampled'`) instead of taking whoever is ready, which keeps the
  workers behind slow links from pairing only with each other.
- gasloc_overlap: gasloc as the GASLoC paper simulates it: each worker keeps computing
  while its model is in flight and merges its partner's (stale) model on arrival
  (`network.overlap='compute'`), takes H_i local steps from its speed and links
  (`network.local_work='auto'`) and meets its neighbours in a fixed rotation
  (`network.peer_choice='rotation'`: each of the 7 once in every 7 rounds).
  The other gasloc variants keep the blocking replay (`network.overlap='none'`) their
  measured results (WORKSPACE.md) were made with.
- diloco_drop25 / diloco_drop50: DiLoCo on the homogeneous network where each worker
  drops out of each round with probability 0.25 / 0.5 (`network.dropout_mode='discard'`,
  the mode the measured results were made with: its round's work is lost; it restarts
  from the new anchor; docs/claims.md claim 3 compares it with keep_local and offline).

Expected: about 5 minutes per run on 2 CPU cores. Measured: WORKSPACE.md, "The network
clock".
"""

from experiments import tiny_diloco

VARIANTS = ('gasloc', 'diloco', 'gasloc_homogeneous', 'diloco_homogeneous',
            'diloco_drop25', 'diloco_drop50', 'gasloc_sampled', 'gasloc_overlap')


def get_config(arg: str = 'gasloc'):
  if arg not in VARIANTS:
    raise ValueError(f'tiny_hetero.py takes one of {VARIANTS} after ":", got {arg!r}.')
  c = tiny_diloco.get_config()
  algorithm, _, network = arg.partition('_')
  if algorithm == 'gasloc':
    c.algorithm.name = 'gasloc'
    c.algorithm.topology = 'matching'
    c.algorithm.mix = 'models'
    c.network.mode = 'async'
    c.network.overlap = 'none'
  c.eval.every = 25
  c.log_every = 25
  slow = network in ('', 'sampled', 'overlap')
  c.network.profile = 'slow_links' if slow else 'homogeneous'
  if network == 'sampled':
    c.network.peer_choice = 'sampled'
  if network == 'overlap':
    c.network.overlap, c.network.local_work = 'compute', 'auto'
    c.network.peer_choice = 'rotation'
  c.network.step_seconds = 0.1
  c.network.bandwidth = 1e9 / 8            # 1 Gbit/s
  c.network.latency = 0.01
  if c.network.profile == 'slow_links':
    c.network.slow_workers = 2
    c.network.slow_factor = 100.0
  if network.startswith('drop'):
    c.network.dropout = int(network[len('drop'):]) / 100
    c.network.dropout_mode = 'discard'
  return c
