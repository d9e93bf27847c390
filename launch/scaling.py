"""DiLoCo against DDP at one model size, placed on the published scaling trends.

  python -m launch.scaling --out=runs/scaling_tiny                  # tiny: an accelerator
  python -m launch.scaling --preset=micro --out=runs/scaling_micro  # micro: this machine
  python -m launch.scaling --quick --out=runs/scaling_quick         # the pipeline, CPU
  python -m launch.scaling --overlay runs/scaling_micro runs/scaling_tiny --out=docs/figures/scaling

The analogue of the DiLoCo scaling-law paper's Table 4 (arXiv 2503.09799) at one model
size N: from scratch, `--tokens_per_weight` training tokens per weight (20, Chinchilla),
H = 30, a global batch of G sequences split over M workers, the embedded corpus. DDP
(one worker holding the whole batch: the same update as M workers averaging) and DiLoCo
with M = 1, 2, 4, 8 (outer Nesterov, momentum 0.9) get equal tuning budgets
(`loco.lab.study`: the shared inner-lr grid, then the outer lr 0.4 / 0.7 / 1.0, five
settings each, an edge pick extended once), scored on validation[:50%]; the picks train
at seeds 1-3 and are scored by `loco.evaluate` on validation[50%:]. Runs that differ
only in seed or lr train three at a time in one program (`--batch_runs`).

Sizing (`--minutes`, default 25): before anything else, three DiLoCo M = 8 runs of 210
steps are trained batched (OUT/probe), and the tokens per weight are scaled down until
the whole study's predicted time fits; the plan is kept in OUT/plan.json, so the same
command resumes with the same runs. Writes OUT/points.json (loco's relative gaps L_M /
L_DDP - 1, per seed and with 95% CIs, beside the published fits' prediction at this N)
and OUT/scaling.md. `--overlay DIR...` draws every points.json on the published fits.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from typing import Any, Mapping, Sequence

from loco import cli
from loco.files import runs as runs_lib
from loco import stats
from loco.lab import study
from loco.errors import LocoError
from loco.lab.study import Final, Knob, Method
from loco.files.workdir import write_json

BASE = 'experiments/micro.py:ddp'
H = 30
WORKERS = (1, 2, 4, 8)
OUTER = Knob('algorithm.outer_lr', (0.4, 0.7, 1.0))
CHECK_SEED = 10

# Published (arXiv 2503.09799): Table 7's fits L(N) = A * N^alpha per method, and Table
# 4's measured relative gaps to DP (C4, from scratch, Chinchilla tokens, H = 30).
FITS = {'ddp': (18.129, -0.0953), 1: (18.363, -0.0961), 2: (18.768, -0.0969),
        4: (19.762, -0.0992), 8: (21.051, -0.1018)}
MEASURED = {  # N -> {M: relative gap in %}
    35e6: {1: -0.1, 2: 0.7, 4: 2.0, 8: 3.9},
    180e6: {8: 2.3},
    2.4e9: {8: 1.1},
}
SOURCE = 'arXiv 2503.09799 (Table 4 measured gaps; Table 7 fits L = A N^alpha)'

# Per preset: the global batch in sequences and their length, the quick variant apart.
SHAPES = {'tiny': (128, 128), 'micro': (32, 64), 'nano': (8, 32)}


def predicted_gap(n: float, m: int) -> float:
  """The published fits' L_M(N) / L_DP(N) - 1 (extrapolated outside 35M-2.4B)."""
  a, alpha = FITS[m]
  a0, alpha0 = FITS['ddp']
  return a * n ** alpha / (a0 * n ** alpha0) - 1.0


def methods(batch: int) -> list[Method]:
  out = [Method('ddp', {'algorithm.name': 'ddp', 'num_workers': 1,
                        'batch_per_worker': batch})]
  for m in WORKERS:
    out.append(Method(f'diloco_m{m}', {
        'algorithm.name': 'diloco', 'algorithm.sync_every': H, 'num_workers': m,
        'batch_per_worker': batch // m, 'algorithm.outer_optimizer': 'nesterov',
        'algorithm.outer_momentum': 0.9}, OUTER))
  return out


def finals() -> list[Final]:
  return [Final(m.name, m.name) for m in methods(8)]


def budget(plan: Mapping[str, Any]) -> study.Budget:
  steps = plan['steps']
  # A plan from before independent-row batches has no 'sampling': it was the stream's.
  common = {'model.preset': plan['preset'], 'seq_len': plan['seq_len'],
            'data.sampling': plan.get('sampling', 'stream'),
            'eval.batches': plan['eval_batches'], 'eval.batch_size': 16,
            'eval.per_worker': False, 'eval.every': steps // 4, 'log_every': plan['h'],
            'checkpoint.every': steps // 2, 'progress': False}
  return study.Budget(base=BASE, steps=steps, steps_h1=steps, common=common,
                      inner_lrs=tuple(plan['inner_lrs']), seeds=tuple(plan['seeds']),
                      score_batches=plan['score_batches'],
                      check_seed=plan.get('check_seed'))


def steps_for(tokens_per_weight: float, params: int, tokens_per_step: int, h: int) -> int:
  """Steps of `tokens_per_weight` x `params` tokens, a multiple of 4 H (at least 4 H)."""
  unit = 4 * h
  return max(unit, int(round(tokens_per_weight * params / tokens_per_step / unit)) * unit)


def _params(preset: str) -> int:
  from loco import model as model_lib   # imports jax: only where a plan is made
  from loco.configs import default
  from loco.run.experiment import parse_config
  # With jax imported, its fork hook warns at every run the sweep starts; subprocess
  # execs at once after the fork, which is safe.
  warnings.filterwarnings('ignore', message=r'os\.fork\(\) was called',
                          category=RuntimeWarning)
  c = default.get_config()
  c.model.preset = preset
  return model_lib.param_count(parse_config(c).model)


# Runs in the study: 5 methods x (5 settings + up to 2 extensions) + 5 finals x seeds;
# in batches of up to 3, about a third as many programs.
def _runs(seeds: int) -> int:
  return len(WORKERS + ('ddp',)) * (6 + seeds)


PROBE_STEPS = 7 * H     # about 200 steps, whole rounds (eval.every is a multiple of H)


def probe_runs(plan: Mapping[str, Any], batch_runs: int) -> list[Any]:
  """The sizing probe: `batch_runs` DiLoCo M = 8 runs of PROBE_STEPS steps."""
  from loco.lab import sweep
  steps = PROBE_STEPS
  b = budget({**plan, 'steps': steps})
  m8 = methods(plan['batch'])[-1]
  return [sweep.Run(f'r{i}', BASE, {**study.run_keys(m8, b), 'optimizer.lr': lr,
                                    'eval.every': steps, 'checkpoint.every': steps})
          for i, lr in enumerate(plan['inner_lrs'][:batch_runs])]


def _probe(out: str, plan: dict[str, Any], batch_runs: int) -> float:
  """Seconds per step of `batch_runs` DiLoCo M = 8 runs trained together (whole wall,
  compilation included), from a short sweep in OUT/probe."""
  from loco.lab import sweep
  runs = probe_runs(plan, batch_runs)
  steps = PROBE_STEPS
  t = time.time()
  code = sweep.run_sweep(runs, os.path.join(out, 'probe'), report=False,
                         batch_runs=batch_runs, stream=open(os.devnull, 'w'))
  if code == 130:      # Ctrl-C or SIGTERM during the probe: an interrupt, not a failure
    raise KeyboardInterrupt
  if code:
    raise LocoError(f'the sizing probe failed (see {os.path.join(out, "probe")}).')
  return (time.time() - t) / steps


# plan.json and points.json as launch.scaling writes them: every key it reads back.
PLAN_FIELDS = {
    'preset': runs_lib.TEXT, 'params': runs_lib.INT, 'batch': runs_lib.INT,
    'seq_len': runs_lib.INT, 'h': runs_lib.INT, 'steps': runs_lib.INT,
    'inner_lrs': runs_lib.NUMBERS, 'seeds': runs_lib.INTS, 'eval_batches': runs_lib.INT,
    'score_batches': runs_lib.INT, 'batch_runs': runs_lib.INT,
    'tokens_per_weight': runs_lib.NUMBER,
    'probe_seconds_per_step': runs_lib.optional(runs_lib.NUMBER)}
POINTS_FIELDS = {'params': runs_lib.INT, 'tokens_per_weight': runs_lib.NUMBER,
                 'workers': runs_lib.OBJECT,
                 'ddp': runs_lib.optional(runs_lib.OBJECT)}
WORKER_FIELDS = {'gaps': runs_lib.OBJECT, 'gap_mean': ('a number', lambda v: isinstance(
                     v, (int, float)) and not isinstance(v, bool)),
                 'gap_ci': runs_lib.optional(runs_lib.pair(runs_lib.NUMBER)),
                 'predicted': runs_lib.NUMBER}


def make_plan(out: str, preset: str, quick: bool, tokens_per_weight: float,
              minutes: float, batch_runs: int, sampling: str | None = None
              ) -> dict[str, Any]:
  """The study's plan: kept in OUT/plan.json, made once (the probe sizes it).
  `sampling`: the batch layout (`data.sampling`) of a new plan (default 'windows'); a
  kept plan keeps its own, and asking for another is refused."""
  path = os.path.join(out, 'plan.json')
  kept = runs_lib.read_json_object(path)   # a damaged one: one line naming it
  if kept is not None:
    runs_lib.check_fields(path, kept, PLAN_FIELDS, 'a launch.scaling plan',
                          'delete it to make a new plan.')
    # A plan from before the check seed has no 'check_seed' (and keeps its picks).
    runs_lib.check_fields(path, {'check_seed': kept.get('check_seed')},
                          {'check_seed': runs_lib.optional(runs_lib.INT)},
                          'a launch.scaling plan', 'delete it to make a new plan.')
    if kept['preset'] not in SHAPES:
      raise LocoError(f'{path} is damaged: preset {kept["preset"]!r} is not one of '
                      f'{", ".join(SHAPES)}; delete it to make a new plan.')
    if sampling is not None and kept.get('sampling', 'stream') != sampling:
      raise LocoError(f'{path} was planned with data.sampling='
                      f'{kept.get("sampling", "stream")}, not {sampling}; give another '
                      '--out for a study with other batches.')
    return kept
  batch, seq_len = SHAPES['nano' if quick else preset]
  params = _params(preset)
  plan = dict(preset=preset, quick=quick, params=params, batch=batch, seq_len=seq_len,
              h=3 if quick else H, inner_lrs=[1.5e-3, 3e-3, 6e-3],
              seeds=[1, 2] if quick else [1, 2, 3], eval_batches=4 if quick else 32,
              score_batches=16 if quick else 512, batch_runs=batch_runs,
              sampling=sampling or 'windows',
              # The pick and its neighbour train again at this seed (loco.lab.study); a plan
              # from before the check seed has none and keeps its picks.
              check_seed=None if quick else CHECK_SEED,
              tokens_per_weight_asked=tokens_per_weight, minutes=minutes)
  tokens_per_step = batch * seq_len
  if quick:
    plan.update(steps=4 * plan['h'], tokens_per_weight=4 * plan['h'] * tokens_per_step / params,
                probe_seconds_per_step=None)
  else:
    per_step = _probe(out, plan, batch_runs)
    # Programs of batch_runs runs each; scale tokens until the study fits the minutes.
    programs = math.ceil(_runs(len(plan['seeds'])) / batch_runs)
    fit = minutes * 60 / (programs * per_step)            # steps per run that fit
    tpw = min(tokens_per_weight, fit * tokens_per_step / params)
    plan.update(steps=steps_for(tpw, params, tokens_per_step, H),
                probe_seconds_per_step=per_step)
    plan['tokens_per_weight'] = plan['steps'] * tokens_per_step / params
  os.makedirs(out, exist_ok=True)
  write_json(path, plan)
  return plan


def points(out: str, plan: Mapping[str, Any], groups: Mapping[str, study.Group]
           ) -> dict[str, Any]:
  """loco's relative gaps at this N, per seed and with their CIs, and the fits'."""
  ddp = groups.get('ddp')
  result = dict(preset=plan['preset'], params=plan['params'],
                tokens_per_weight=plan['tokens_per_weight'], steps=plan['steps'],
                h=plan['h'], global_batch=plan['batch'], seq_len=plan['seq_len'],
                source=SOURCE, ddp=None, workers={})
  if ddp is None:
    return result
  result['ddp'] = dict(losses=ddp.losses, mean=ddp.mean)
  for m in WORKERS:
    g = groups.get(f'diloco_m{m}')
    if g is None:
      continue
    seeds = sorted(set(g.losses) & set(ddp.losses))
    gaps = [g.losses[s] / ddp.losses[s] - 1.0 for s in seeds]
    ci = stats.mean_ci(gaps) if len(gaps) > 1 else None
    result['workers'][str(m)] = dict(
        losses=g.losses, gaps={s: x for s, x in zip(seeds, gaps)},
        gap_mean=float(sum(gaps) / len(gaps)) if gaps else math.nan,
        gap_ci=list(ci.ci) if ci else None, predicted=predicted_gap(plan['params'], m),
        diverged={str(s): step for s, step in sorted(g.diverged.items())})
  return result


def ordering(p: Mapping[str, Any]) -> str:
  """Whether loco's gaps follow the published ordering M1 <= M2 < M4 < M8, in words."""
  w = p['workers']
  if not all(str(m) in w for m in WORKERS):
    return 'not all of M = 1, 2, 4, 8 have finals yet'
  means = [w[str(m)]['gap_mean'] for m in WORKERS]
  order = ' < '.join(f'M = {m} ({x:+.1%})' for m, x in sorted(zip(WORKERS, means),
                                                              key=lambda t: t[1]))
  follows = all(a <= b for a, b in zip(means, means[1:]))
  return (f'{"follows" if follows else "does not follow"} the published ordering '
          f'M = 1 <= 2 < 4 < 8 in the means: {order}')


def write_page(out: str, plan: Mapping[str, Any], p: Mapping[str, Any],
               picks: Mapping[str, Any], seconds: float) -> str:
  rows = ['| workers | loco: L_M / L_DDP - 1 (mean, 95% CI over seeds) | per seed | '
          'published fits at this N | within the CI? |', '|---|---|---|---|---|']
  for m in WORKERS:
    w = p['workers'].get(str(m))
    if w is None:
      rows.append(f'| M = {m} | not run | | {predicted_gap(plan["params"], m):+.1%} | |')
      continue
    ci = w['gap_ci']
    inside = ('—' if ci is None else
              'yes' if ci[0] <= w['predicted'] <= ci[1] else 'no')
    rows.append(f'| M = {m} | {w["gap_mean"]:+.2%}' +
                (f' [{ci[0]:+.2%}, {ci[1]:+.2%}]' if ci else '') + ' | ' +
                ', '.join([f'{x:+.2%}' for x in w['gaps'].values()] +
                          [f'seed {s} diverged at step {step}'
                           for s, step in (w.get('diverged') or {}).items()]) +
                f' | {w["predicted"]:+.1%} | {inside} |')
  text = '\n'.join([
      f'# DiLoCo against DDP at N = {plan["params"]:,} ({plan["preset"]})', '',
      f'`python -m launch.scaling --preset={plan["preset"]} '
      f'--out=runs/scaling_{plan["preset"]}` ({seconds / 60:.0f} minutes of runs). '
      f'{plan["steps"]} steps x {plan["batch"]} x '
      f'{plan["seq_len"]} tokens = {plan["tokens_per_weight"]:.1f} tokens per weight, '
      f'H = {plan["h"]}, seeds {plan["seeds"]}; batches: '
      + ('every row an independent window (`data.sampling=\'windows\'`)'
         if plan.get('sampling', 'stream') == 'windows' else
         'one token stream per worker (`data.sampling=\'stream\'`, before independent '
         'rows)') + '; DDP\'s final loss '
      + (f'{p["ddp"]["mean"]:.4f}.' if p['ddp'] else 'not run yet.'), '',
      f'Published: {SOURCE}. The fits are extrapolated far below their 35M-2.4B range: '
      'expect the ordering and rough size, not the digits.', '',
      *rows, '', f'Ordering: {ordering(p)}.', '',
      *study.tuning_table(picks, 0, plan.get('check_seed')), ''])
  path = os.path.join(out, 'scaling.md')
  with open(path, 'w') as f:
    f.write(text)
  return path


def points_path(where: str) -> str:
  """A study's points file: `where` itself if it names a .json file (a copy kept with the
  docs, docs/scaling/micro_points.json), else where/points.json."""
  return where if where.endswith('.json') else os.path.join(where, 'points.json')


def study_name(where: str) -> str:
  """runs/scaling_micro -> scaling_micro; docs/scaling/micro_points.json -> micro."""
  name = os.path.basename(os.path.normpath(where))
  return name.removesuffix('.json').removesuffix('_points').removesuffix('points') or where


def read_points(folder: str) -> dict[str, Any]:
  """A study's points.json (`points_path`), checked (one line naming a damaged or foreign
  file)."""
  path = points_path(folder)
  p = runs_lib.read_json_object(path)
  if p is None:
    raise LocoError(f'{folder} has no points.json (run launch.scaling there first).'
                    if path != folder else f'{folder} is missing or not a JSON object.')
  again = 'run launch.scaling there again.'
  runs_lib.check_fields(path, p, POINTS_FIELDS, 'a launch.scaling points file', again)
  for m, w in p['workers'].items():
    where = f'{path} (workers.{m})'
    if not isinstance(w, dict):
      raise LocoError(f'{where} is damaged: not an object; {again}')
    runs_lib.check_fields(where, w, WORKER_FIELDS, 'a launch.scaling point', again)
  if p['ddp'] is not None:
    runs_lib.check_fields(f'{path} (ddp)', p['ddp'], {'mean': runs_lib.NUMBER},
                          'a launch.scaling point', again)
  return p


def overlay(dirs: Sequence[str], path: str) -> str:
  """The relative gap against N: the published fits (lines), Table 4's measured points
  (open markers) and every points.json of `dirs` (filled, with 95% CIs)."""
  import numpy as np
  from loco.lab import plots
  fig, (ax,) = plots.figure(1, width=6.5, height=4.2)
  ns = np.logspace(5, 10, 60)
  for i, m in enumerate(WORKERS):
    color = f'C{i}'
    ax.plot(ns, [100 * predicted_gap(n, m) for n in ns], color=color, linewidth=1,
            label=f'M = {m}, published fit')
    for n, gaps in MEASURED.items():
      if m in gaps:
        ax.plot([n], [gaps[m]], marker='o', markerfacecolor='none', color=color)
    for d in dirs:
      p = read_points(d)
      w = p['workers'].get(str(m))
      if not w:
        continue
      y = 100 * w['gap_mean']
      err = None if not w['gap_ci'] else [[y - 100 * w['gap_ci'][0]],
                                          [100 * w['gap_ci'][1] - y]]
      # Side by side around N (x 0.8 to 1.25) so that the four CIs stay apart.
      x = p['params'] * 1.16 ** (i - (len(WORKERS) - 1) / 2)
      ax.errorbar([x], [y], yerr=err, marker='s', color=color, capsize=3)
  ax.axhline(0, color='grey', linewidth=0.8)
  ax.set_xscale('log')
  ax.set_xlabel('model size N (weights)')
  ax.set_ylabel('DiLoCo loss / DDP loss - 1 (%)')
  ax.set_title('open: published measured; squares: loco (95% CI, M = 1 to 8 left to '
               'right around N)', fontsize=9)
  ax.legend(fontsize=7)
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  plots.save(fig, path)
  return path


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m launch.scaling', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', default=os.path.join('runs', 'scaling'))
  parser.add_argument('--preset', default='tiny', choices=('micro', 'tiny'))
  parser.add_argument('--quick', action='store_true',
                      help='nano model, 12-step runs, 2 seeds: a pipeline check')
  parser.add_argument('--tokens_per_weight', type=cli.positive_float, default=20.0)
  parser.add_argument('--minutes', type=cli.positive_float, default=25.0,
                      help='the wall time the study is sized to (default 25)')
  parser.add_argument('--batch_runs', type=cli.positive_int, default=3)
  parser.add_argument('--sampling', choices=('windows', 'stream'),
                      help="a new plan's batch layout (data.sampling; default windows: "
                      "independent rows; stream reproduces the pages made before them)")
  parser.add_argument('--overlay', nargs='+', metavar='DIR',
                      help='draw these studies\' points.json (or these points files) on '
                      'the published fits (into OUT/overlay.png); train nothing')
  args = parser.parse_args(argv)

  def body() -> int:
    cli.check_output_dir(args.out)
    if args.overlay:
      for d in args.overlay:
        read_points(d)
      print(f'overlay: {overlay(args.overlay, os.path.join(args.out, "overlay.png"))}')
      return 0
    clock = os.path.join(args.out, 'seconds.json')
    with study.clocked(clock):
      plan = make_plan(args.out, 'nano' if args.quick else args.preset, args.quick,
                       args.tokens_per_weight, args.minutes, args.batch_runs,
                       args.sampling)
      print(f'plan: {plan["preset"]}, {plan["params"]:,} weights, {plan["steps"]} steps '
            f'({plan["tokens_per_weight"]:.1f} tokens per weight), H = {plan["h"]}'
            + (f'; probe {plan["probe_seconds_per_step"]:.3f} s per step of '
               f'{plan["batch_runs"]} runs' if plan['probe_seconds_per_step'] else ''),
            flush=True)
      picks, groups = study.run_all(args.out, methods(plan['batch']), finals(),
                                    budget(plan), batch_runs=plan['batch_runs'])
    p = points(args.out, plan, groups)
    write_json(os.path.join(args.out, 'points.json'), p)
    seconds = study.read_seconds(clock, math.nan)
    page = write_page(args.out, plan, p, picks, seconds)
    print(f'points: {os.path.join(args.out, "points.json")}; page: {page}; '
          f'{ordering(p)}')
    return 0

  return cli.run('launch.scaling', body)


if __name__ == '__main__':
  cli.exit(main())
