"""Prints docs/utilization.md's example of the clock's overlap model: a DDP and a DiLoCo
run of the micro config, trained once, re-timed with network.overlap='none' and
'backward'.

  python scripts/retime_overlap.py [--steps=100] [--keep=DIR]    (about a minute)

Micro model (experiments/micro.py: 0.4M weights, 8 workers x 4 x 128 tokens per step;
DiLoCo H = 50), `--steps` inner steps into a temporary directory (or --keep=DIR), then
`loco.retime RUN --network.profile=homogeneous --network.step_seconds=0.1
--network.bandwidth=B --network.latency=L --network.overlap=none|backward` on 1 Gbit/s
links with no latency and with 0.1 ms per hop (in 'backward' each of the 128 pieces
pays the ring's latency, as in loco.overlap_model; the last rows cut each collective in
8 pieces, --network.overlap_buckets=8). Prints a markdown table of the simulated
seconds and compute utilization at the last step.

References: arXiv 2501.18512 section 3.1 (the overlap model).
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loco.lab import retime  # noqa: E402
from loco.run import train  # noqa: E402
from loco.files.metrics import read_metrics  # noqa: E402

GBIT = 1e9 / 8
NETWORKS = {'1 Gbit/s, no latency': dict(bandwidth=GBIT, latency=0.0),
            '1 Gbit/s, 0.1 ms per hop': dict(bandwidth=GBIT, latency=1e-4)}


def _train(algorithm: str, steps: int, workdir: str) -> None:
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from experiments import micro
  c = micro.get_config(algorithm)
  c.steps = steps
  c.log_every = 10
  c.eval.every = steps
  c.eval.batches = 2
  c.eval.per_worker = False
  c.checkpoint.every = steps
  c.progress = False
  train.run(c, workdir)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--steps', type=int, default=100)
  parser.add_argument('--keep', default=None, help='train into this directory')
  args = parser.parse_args()
  root = args.keep or tempfile.mkdtemp(prefix='retime_overlap_')
  print('| run | network | overlap | sim seconds | utilization |')
  print('|---|---|---|---|---|')
  for algorithm in ('ddp', 'diloco'):
    workdir = os.path.join(root, algorithm)
    if not os.path.exists(os.path.join(workdir, 'comms.jsonl')):
      _train(algorithm, args.steps, workdir)
    for label, keys in NETWORKS.items():
      for overlap, buckets in (('none', None), ('backward', None), ('backward', 8)):
        overrides = {'network.profile': 'homogeneous', 'network.step_seconds': '0.1',
                     'network.overlap': overlap,
                     **{f'network.{k}': str(v) for k, v in keys.items()}}
        if buckets:
          overrides['network.overlap_buckets'] = str(buckets)
        name = f'{"lat" if keys["latency"] else "nolat"}+{overlap}{buckets or ""}'
        last = read_metrics(retime.retime(workdir, overrides, name))[-1]
        what = overlap + (f', {buckets} pieces' if buckets else '')
        print(f'| {algorithm}, {last["step"]} steps | {label} | {what} | '
              f'{last["sim_seconds"]:.2f} | {last["utilization"]:.1%} |')


if __name__ == '__main__':
  main()
