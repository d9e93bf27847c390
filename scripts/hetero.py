"""DiLoCo vs GASLoC on a homogeneous and a slow-link network, and DiLoCo under dropout.

  python scripts/hetero.py --out=runs/hetero

Runs the six variants of experiments/tiny_hetero.py (each a normal workdir: re-running
resumes or skips finished runs), then prints and writes (OUT/hetero.md, OUT/*.png):

- per network, for DiLoCo and GASLoC: the simulated seconds to reach a target eval loss
  (the larger of the two final losses, so both reach it), the eval loss at a fixed
  simulated time (the earlier of the two finishing times), the final eval loss and
  the total simulated time;
- the robustness table: DiLoCo with 0%, 25% and 50% of workers dropping out of each
  round, final eval loss.
"""

import collections
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments import tiny_hetero  # noqa: E402
from loco.run import experiment, train  # noqa: E402
from loco import model
from loco.lab import report
from loco.sim import timeline
from loco.files.metrics import read_metrics  # noqa: E402

_OUT = flags.DEFINE_string('out', 'runs/hetero', 'Directory for the runs and hetero.md.')
_STEPS = flags.DEFINE_integer('steps', None, 'Override the inner steps of every run.')

NETWORKS = (('homogeneous links', ('diloco_homogeneous', 'gasloc_homogeneous')),
            ('2 of 8 workers on 100x slower links', ('diloco', 'gasloc', 'gasloc_sampled')))
DROPOUT = (('0%', 'diloco_homogeneous'), ('25%', 'diloco_drop25'), ('50%', 'diloco_drop50'))


def _evals(workdir: str) -> list[tuple[float, float]]:
  """(sim_seconds, eval_loss) of every evaluation of a run."""
  return [(r['sim_seconds'], r['eval_loss']) for r in read_metrics(workdir)
          if 'eval_loss' in r]


def seconds_to(evals, target: float) -> float | None:
  """Simulated seconds of the first evaluation at or below `target`."""
  return next((s for s, loss in evals if loss <= target), None)


def loss_at(evals, seconds: float) -> float | None:
  """Eval loss of the last evaluation done by `seconds`."""
  done = [loss for s, loss in evals if s <= seconds + 1e-9]
  return done[-1] if done else None


def _pairing(variant: str) -> str:
  """Who the asynchronous schedule paired: exchanges, distinct pairs, the most repeated."""
  exp = experiment.parse_config(tiny_hetero.get_config(variant))
  r = exp.run
  line = timeline.make_timeline(
      exp.network, num_workers=r.num_workers, steps=r.steps,
      algorithm=exp.algorithm_name, algorithm_kwargs=exp.algorithm_kwargs,
      flops_per_token=1.0, tokens_per_step=1, model_bytes=4 * model.param_count(exp.model))
  pairs = collections.Counter((i, j) for i, j, _, _ in line.schedule.exchanges)
  (i, j), n = pairs.most_common(1)[0]
  return f'{sum(pairs.values())} | {len(pairs)} | ({i}, {j}) x {n}'


def _fmt(x, spec):
  return '—' if x is None else format(x, spec)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  out = _OUT.value
  os.makedirs(out, exist_ok=True)
  workdirs = {}
  for variant in tiny_hetero.VARIANTS:
    workdir = workdirs[variant] = os.path.join(out, variant)
    config = tiny_hetero.get_config(variant)
    config.progress = False
    if _STEPS.value:
      config.steps = _STEPS.value
    t0 = time.time()
    train.run(config, workdir)
    record = read_metrics(workdir)[-1]
    print(f'{variant}: eval_loss {record.get("eval_loss", float("nan")):.4f}, '
          f'{record["sim_seconds"]:.1f} simulated s ({time.time() - t0:.0f} s here)',
          flush=True)

  lines = ['| network | algorithm | s to target | target | loss at T | T (s) | '
           'final loss | total simulated s | utilization |', '|---|---|---|---|---|---|---|---|---|']
  for label, names in NETWORKS:
    runs = {name: _evals(workdirs[name]) for name in names}
    target = max(evals[-1][1] for evals in runs.values())
    horizon = min(evals[-1][0] for evals in runs.values())
    for name, evals in runs.items():
      last = read_metrics(workdirs[name])[-1]
      lines.append(f'| {label} | {name} | {_fmt(seconds_to(evals, target), ".1f")} | '
                   f'{target:.3f} | {_fmt(loss_at(evals, horizon), ".3f")} | {horizon:.1f} | '
                   f'{evals[-1][1]:.3f} | {evals[-1][0]:.1f} | {last["utilization"]:.0%} |')
  lines += ['', '| DiLoCo, workers dropping out of each round | final eval loss | '
            'bytes sent / worker |', '|---|---|---|']
  for label, variant in DROPOUT:
    last = read_metrics(workdirs[variant])[-1]
    lines.append(f'| {label} | {_evals(workdirs[variant])[-1][1]:.3f} | '
                 f'{last["bytes_sent"] / 1e6:.1f} MB |')
  lines += ['', '| asynchronous run | exchanges | distinct pairs (of 28) | most repeated pair |',
            '|---|---|---|---|']
  for variant in ('gasloc', 'gasloc_sampled', 'gasloc_homogeneous'):
    lines.append(f'| {variant} | {_pairing(variant)} |')
  text = '\n'.join(lines)
  with open(os.path.join(out, 'hetero.md'), 'w') as f:
    f.write(text + '\n')
  print(text)
  names = [n for n in tiny_hetero.VARIANTS if not n.startswith('diloco_drop')]
  report.plot_runs([workdirs[n] for n in names], out, labels=names)
  print(f'plots: {out}/*.png')


if __name__ == '__main__':
  app.run(main)
