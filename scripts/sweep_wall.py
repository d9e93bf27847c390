"""Wall time of sweeps from their runs' status.json, and how the same runs' final eval
losses compare between two sweeps (one batched, one not).

  python scripts/sweep_wall.py runs/claims/tune runs/claims_batched/tune

Per directory: finished runs, processes (a batch of runs is one), the sum of the
processes' seconds (each batch counted once), and the wall from the first start to the
last end (which includes the gaps between stages of an adaptive study). With two
directories, the runs both finished are compared by their last eval loss: how many are
bitwise equal, and the largest and median difference among runs batched in the second.
"""

import datetime
import glob
import json
import os
import sys


def summary(folder: str) -> dict:
  runs, programs = 0, {}
  starts, ends = [], []
  for path in sorted(glob.glob(os.path.join(folder, '**', 'status.json'), recursive=True)):
    with open(path) as f:
      s = json.load(f)
    if s.get('state') != 'finished':
      continue
    runs += 1
    key = tuple(s['batch']) if s.get('batch') else (s['name'],)
    programs[key] = max(programs.get(key, 0.0), float(s.get('seconds') or 0.0))
    if s.get('start') and s.get('end'):
      starts.append(datetime.datetime.fromisoformat(s['start']))
      ends.append(datetime.datetime.fromisoformat(s['end']))
  wall = (max(ends) - min(starts)).total_seconds() if starts else float('nan')
  return dict(runs=runs, processes=len(programs), seconds=sum(programs.values()), wall=wall)


def last_evals(folder: str) -> dict[str, tuple[float, bool]]:
  """run name -> (its last eval loss, whether it trained in a batch)."""
  out = {}
  for path in glob.glob(os.path.join(folder, '**', 'status.json'), recursive=True):
    with open(path) as f:
      s = json.load(f)
    metrics = os.path.join(os.path.dirname(path), 'metrics.jsonl')
    if s.get('state') != 'finished' or not os.path.exists(metrics):
      continue
    with open(metrics) as f:
      evals = [r['eval_loss'] for r in map(json.loads, f) if 'eval_loss' in r]
    if evals:
      out[s['name']] = (evals[-1], bool(s.get('batch')))
  return out


def main(argv):
  if len(argv) < 2:
    sys.exit(__doc__)
  print(f'{"sweep":<40} {"runs":>5} {"processes":>9} {"process s":>10} {"wall s":>8}')
  for folder in argv[1:]:
    s = summary(folder)
    print(f'{folder:<40} {s["runs"]:>5} {s["processes"]:>9} {s["seconds"]:>10.0f} '
          f'{s["wall"]:>8.0f}')
  if len(argv) == 3:
    a, b = last_evals(argv[1]), last_evals(argv[2])
    both = sorted(set(a) & set(b))
    alone = [n for n in both if not b[n][1]]
    batched = sorted(abs(a[n][0] - b[n][0]) for n in both if b[n][1])
    print(f'{len(both)} runs in both: {sum(a[n][0] == b[n][0] for n in alone)} of '
          f'{len(alone)} trained alone in the second are bitwise equal; the '
          f'{len(batched)} batched ones differ by median '
          f'{batched[len(batched) // 2] if batched else float("nan"):.2e}, max '
          f'{batched[-1] if batched else float("nan"):.2e} nats '
          f'({sum(x == 0 for x in batched)} equal)')


if __name__ == '__main__':
  main(sys.argv)
