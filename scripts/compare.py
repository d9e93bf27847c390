"""Runs a named suite of tiny experiments at equal tokens and prints a Markdown table.

  python scripts/compare.py --suite=engine --out=runs/compare_engine

Each row is one config file plus overrides; every run is a normal workdir (re-running
resumes or skips finished runs). The table has the final eval loss of the worker-averaged
model, the mean of each worker's own eval loss, bytes sent per worker, peak bytes in one
step, rounds (communication events per worker) and wall time.
"""

import json
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loco import algorithms, train  # noqa: E402
from loco.metrics import read_metrics  # noqa: E402

_SUITE = flags.DEFINE_string('suite', 'engine', 'Which suite of runs (see SUITES).')
_OUT = flags.DEFINE_string('out', None, 'Directory for the runs and table.md.')
_STEPS = flags.DEFINE_integer('steps', 300, 'Inner steps per worker for every run.')

# Shared by every run of a suite so that tokens are equal: 8 workers x 4 x 128 per step.
COMMON = {'num_workers': 8, 'batch_per_worker': 4, 'seq_len': 128, 'eval.every': 150,
          'eval.batches': 8, 'checkpoint.every': 150, 'log_every': 10, 'progress': False}
_CLEAR = {'algorithm.outer_optimizer': None, 'algorithm.outer_lr': None,
          'algorithm.outer_momentum': None, 'algorithm.sync_every': None}

SUITES = {
    'engine': [
        ('DDP', 'tiny_ddp', {}),
        ('Local SGD, H=50', 'tiny_diloco', {'algorithm.name': 'local_sgd'}),
        ('DiLoCo, H=50, outer Nesterov 0.7 / 0.9 (paper)', 'tiny_diloco',
         {'algorithm.outer_lr': 0.7, 'algorithm.outer_momentum': 0.9}),
        ('DiLoCo, H=50, outer Nesterov 0.7 / 0.5', 'tiny_diloco', {}),
    ],
    # One step per communication on a ring (a), then H=50 (b); DiLoCo is in 'engine'.
    'gossip': [
        ('GASLoC, ring, H=1', 'tiny_gasloc', {'algorithm.sync_every': 1}),
        ('D-AdamW (dsgd), ring', 'tiny_gasloc', {**_CLEAR, 'algorithm.name': 'dsgd'}),
        ('AD-PSGD, ring matchings', 'tiny_gasloc', {**_CLEAR, 'algorithm.name': 'adpsgd'}),
        ('A2CiD2, ring', 'tiny_gasloc', {**_CLEAR, 'algorithm.name': 'a2cid2'}),
        ('NoLoCo, ring matchings, H=1', 'tiny_gasloc',
         {**_CLEAR, 'algorithm.name': 'noloco', 'algorithm.sync_every': 1}),
        ('GASLoC, ring, H=50', 'tiny_gasloc', {}),
        ('GASLoC, random matching, H=50', 'tiny_gasloc', {'algorithm.topology': 'matching'}),
    ],
    'sparseloco': [
        ('SparseLoCo, H=15, top-64/4096 (1.6%), 2-bit', 'tiny_sparseloco', {'algorithm.topk': 64}),
        ('SparseLoCo, H=15, top-128/4096 (3.1%), 2-bit', 'tiny_sparseloco',
         {'algorithm.topk': 128}),
        ('DiLoCo, H=50, 4-bit (E3M0) pseudo-gradients', 'tiny_diloco',
         {'algorithm.compression': 'e3m0'}),
    ],
    'streaming': [
        ('Streaming DiLoCo, tau=1, E3M0', 'tiny_streaming', {}),
        ('Streaming DiLoCo, tau=5, E3M0', 'tiny_streaming', {'algorithm.overlap_steps': 5}),
        ('Streaming DiLoCo, tau=1, float32', 'tiny_streaming',
         {'algorithm.compression': 'none'}),
        ('Streaming DiLoCo, tau=5, float32', 'tiny_streaming',
         {'algorithm.overlap_steps': 5, 'algorithm.compression': 'none'}),
    ],
}


def _load(config_name: str, overrides: dict, steps: int):
  import importlib
  config = importlib.import_module(f'experiments.{config_name}').get_config()
  for key, value in {**COMMON, 'steps': steps, **overrides}.items():
    node = config
    *path, leaf = key.split('.')
    for part in path:
      node = node[part]
    node[leaf] = value
  # A row that switches algorithm keeps only the keys the new one takes.
  taken = set(algorithms.keys_of(config.algorithm.name)) | {'name'}
  for key in config.algorithm.keys():
    if key not in taken:
      config.algorithm[key] = None
  return config


def _row(label: str, workdir: str, seconds: float) -> dict:
  records = read_metrics(workdir)
  last = records[-1]
  evals = [r for r in records if 'eval_loss' in r]
  return dict(label=label, eval_loss=last.get('eval_loss'),
              best_eval_loss=min(r['eval_loss'] for r in evals),
              eval_loss_workers=last.get('eval_loss_workers'),
              tokens=last['tokens'], bytes_sent=last['bytes_sent'],
              peak_bytes=last['peak_bytes'], syncs=last['syncs'], seconds=seconds)


def table(rows: list[dict]) -> str:
  lines = ['| run | eval loss | workers\' own eval loss | tokens | bytes sent / worker '
           '| peak bytes / step | comm rounds | wall s |',
           '|---|---|---|---|---|---|---|---|']
  for r in rows:
    own = f'{r["eval_loss_workers"]:.3f}' if r['eval_loss_workers'] is not None else '-'
    lines.append(f'| {r["label"]} | {r["eval_loss"]:.3f} | {own} | {r["tokens"]:,} | '
                 f'{r["bytes_sent"] / 1e6:,.1f} MB | {r["peak_bytes"] / 1e6:,.2f} MB | '
                 f'{r["syncs"]:.0f} | {r["seconds"]:.0f} |')
  return '\n'.join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  out = _OUT.value or os.path.join('runs', f'compare_{_SUITE.value}')
  os.makedirs(out, exist_ok=True)
  rows = []
  for i, (label, config_name, overrides) in enumerate(SUITES[_SUITE.value]):
    workdir = os.path.join(out, f'{i:02d}_{config_name}')
    config = _load(config_name, overrides, _STEPS.value)
    t0 = time.time()
    train.run(config, workdir)
    rows.append(_row(label, workdir, time.time() - t0))
    print(f'{label}: eval_loss {rows[-1]["eval_loss"]:.4f}', flush=True)
  text = table(rows)
  with open(os.path.join(out, 'table.md'), 'w') as f:
    f.write(text + '\n')
  with open(os.path.join(out, 'rows.json'), 'w') as f:
    json.dump(rows, f, indent=1)
  print(text)


if __name__ == '__main__':
  app.run(main)
