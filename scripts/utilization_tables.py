"""Prints docs/utilization.md's tables: loco.overlap_model beside the published
bandwidth-for-utilization tables.

  python scripts/utilization_tables.py > /tmp/tables.md     (a few seconds)

For each published row it prints three rows: the paper's Gbit/s, loco's (the least
bandwidth reaching the target, by bisection), and loco's put on the grid the published
cells come from: every published number is, to its printed rounding, a point of the
50-point logarithmic grid from 0.1 to 1000 Gbit/s (np.logspace(-1, 3, 50), a step of
x1.207), so the third row is the grid point nearest (in log) to loco's value ('1000.0+'
above the grid). Each table ends with how many cells of that row equal the paper's and
how many are within one grid step, and with the `python -m loco.overlap_model` command
of each loco row.

References: arXiv 2503.09799 (Scaling Laws for DiLoCo, the simulated-utilization table),
arXiv 2501.18512 (Streaming DiLoCo, appendix Table 4).
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loco import overlap_model as u  # noqa: E402

GRID = np.logspace(-1, 3, 50)      # Gbit/s; the published cells are its points

# Scaling Laws for DiLoCo (arXiv 2503.09799), "Simulated compute utilization" (Table 6
# in v1, Table 7 in a later version): M = 2 (assumed, as in Streaming DiLoCo), step
# time from FLOPs at 60% MFU. (size label, params, step seconds, [(method, published)]).
SCALING_LAW = [
    ('Chinchilla 10B', 10e9, 0.8, [
        ('Data-Parallel', dict(algorithm='ddp'), [104.8, 184.2, 222.3, 222.3, 390.7]),
        ('DiLoCo, H = 1', dict(algorithm='diloco', sync_every=1),
         [104.8, 184.2, 222.3, 222.3, 390.7]),
        ('DiLoCo, H = 10', dict(algorithm='diloco', sync_every=10),
         [16.0, 49.4, 86.8, 152.6, 222.3]),
        ('DiLoCo, H = 50', dict(algorithm='diloco', sync_every=50),
         [3.0, 11.0, 23.3, 41.0, 126.5]),
        ('DiLoCo, H = 100', dict(algorithm='diloco', sync_every=100),
         [1.4, 6.2, 13.3, 23.3, 86.8]),
        ('DiLoCo, H = 300', dict(algorithm='diloco', sync_every=300),
         [0.5, 2.0, 4.3, 9.1, 41.0]),
    ]),
    ('Llama3 405B', 405e9, 26.0, [
        ('Data-Parallel', dict(algorithm='ddp'), [126.5, 222.3, 268.3, 323.8, 323.8]),
        ('DiLoCo, H = 10', dict(algorithm='diloco', sync_every=10),
         [19.3, 72.0, 126.5, 184.2, 268.3]),
        ('DiLoCo, H = 100', dict(algorithm='diloco', sync_every=100),
         [2.0, 7.5, 16.0, 33.9, 126.5]),
        ('DiLoCo, H = 300', dict(algorithm='diloco', sync_every=300),
         [0.7, 3.0, 6.2, 13.3, 59.6]),
    ]),
    ('DeepSeek-V3 671B', 671e9, 20.0, [
        ('Data-Parallel', dict(algorithm='ddp'), [323.8, 569.0, 686.6, 686.6, math.inf]),
        ('DiLoCo, H = 10', dict(algorithm='diloco', sync_every=10),
         [49.4, 152.6, 268.3, 390.7, 686.6]),
        ('DiLoCo, H = 100', dict(algorithm='diloco', sync_every=100),
         [4.3, 16.0, 41.0, 72.0, 268.3]),
        ('DiLoCo, H = 300', dict(algorithm='diloco', sync_every=300),
         [1.7, 6.2, 13.3, 28.1, 126.5]),
    ]),
]

# Streaming DiLoCo (arXiv 2501.18512) appendix Table 4: H = 100, 3 layers per fragment
# (P = 8 / 16 / 36), M = 2, step time from FLOPs; the overlapped rows use tau = 1 (its
# main setting), the FP4 row E3M0 values (4 bits).
def _streaming_rows(p):
  return [
      ('Data-Parallel', dict(algorithm='ddp')),
      ('Vanilla DiLoCo', dict(algorithm='diloco', sync_every=100)),
      ('Streaming DiLoCo', dict(algorithm='streaming_diloco', sync_every=100,
                                fragments=p, overlap_steps=0)),
      ('Streaming DiLoCo w/ overlapped com.',
       dict(algorithm='streaming_diloco', sync_every=100, fragments=p, overlap_steps=1)),
      ('Streaming DiLoCo w/ overlapped FP4 com.',
       dict(algorithm='streaming_diloco', sync_every=100, fragments=p, overlap_steps=1,
            dtype='float4')),
  ]


STREAMING = [
    ('1B, 24 layers', 1e9, 0.1, _streaming_rows(8), [
        [86.8, 152.6, 184.2, 222.3, 569.0],
        [1.4, 6.2, 13.3, 23.3, 86.8],
        [1.4, 5.2, 9.1, 16.0, 28.1],
        [1.4, 4.3, 6.2, 9.1, 11.0],
        [0.4, 0.9, 1.7, 2.0, 3.0]]),
    ('10B, 48 layers', 10e9, 0.8, _streaming_rows(16), [
        [104.8, 222.3, 222.3, 268.3, 471.5],
        [1.7, 7.5, 16.0, 33.9, 104.8],
        [1.7, 5.2, 9.1, 13.3, 19.3],
        [1.7, 3.6, 5.2, 6.2, 7.5],
        [0.4, 0.9, 1.4, 1.4, 1.7]]),
    ('100B, 108 layers', 100e9, 4.9, _streaming_rows(36), [
        [184.2, 323.8, 390.7, 390.7, 471.5],
        [3.0, 11.0, 23.3, 49.4, 184.2],
        [2.4, 6.2, 9.1, 11.0, 19.3],
        [1.7, 3.6, 4.3, 5.2, 5.2],
        [0.5, 0.9, 1.1, 1.1, 1.4]]),
]


def grid_index(x):
  """The index of the grid point nearest to x in log (len(GRID): above the grid)."""
  if x > GRID[-1] * math.sqrt(GRID[-1] / GRID[-2]):
    return len(GRID)
  return int(np.argmin(np.abs(np.log(GRID) - math.log(x))))


def on_grid(xs):
  return [math.inf if grid_index(x) == len(GRID) else float(GRID[grid_index(x)])
          for x in xs]


def fmt(x):
  if math.isinf(x):
    return '1000.0+' if x > 0 else 'n/a'
  return f'{x:.1f}' if x >= 1 else f'{x:.2f}'


def command(params, step, kw):
  flags = [f'--params={params:g}', f'--step_seconds={step:g}', '--workers=2']
  flags += [f'--{k}={v}' for k, v in kw.items()]
  return 'python -m loco.overlap_model ' + ' '.join(flags)


def table(title, groups):
  print(f'### {title}\n')
  print('| model, step | method | numbers | ' + ' | '.join(f'{t:.0%}' for t in u.TARGETS)
        + ' |')
  print('|---|---|---|' + '---|' * len(u.TARGETS))
  commands = []
  same = near = cells = 0
  for label, params, step, rows in groups:
    for method, kw, published in rows:
      w = u.make_workload(params=params, step_seconds=step, workers=2, **kw)
      exact = u.required_bandwidth(w)
      grid = on_grid(exact)
      for paper, mine in zip(published, exact):
        steps = abs(grid_index(paper) - grid_index(mine))
        same, near, cells = same + (steps == 0), near + (steps <= 1), cells + 1
      where = f'{label}, {step:g} s'
      for name, xs in (('paper', published), ('loco', exact), ('loco on the grid', grid)):
        print(f'| {where} | {method} | {name} | ' + ' | '.join(fmt(x) for x in xs) + ' |')
        where = ''
      commands.append(command(params, step, kw))
  print(f'\nloco on the grid equals the paper in {same} of {cells} cells and is within one '
        f'grid step (x1.207) in {near}.\n')
  for c in dict.fromkeys(commands):
    print(f'    {c}')
  print()


# Data-Parallel with one bucket per layer: the granularity of the paper's per-layer DAG
# (its Figure 3), against the same published Data-Parallel rows of Table 4.
PER_LAYER = [
    (label, params, step,
     [('Data-Parallel, K = layers', dict(algorithm='ddp', buckets=layers), published[0])])
    for (label, params, step, _, published), layers in zip(STREAMING, (24, 48, 108))]


def main():
  table('DiLoCo scaling laws (arXiv 2503.09799): Gbit/s for a compute utilization',
        SCALING_LAW)
  table('Streaming DiLoCo (arXiv 2501.18512) Table 4: Gbit/s for a compute utilization',
        [(label, params, step, [(m, kw, pub) for (m, kw), pub in zip(rows, published)])
         for label, params, step, rows, published in STREAMING])
  table('Streaming DiLoCo Table 4, Data-Parallel with one bucket per layer', PER_LAYER)


if __name__ == '__main__':
  main()
