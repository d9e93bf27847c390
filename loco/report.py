"""Reports: a table of runs and plots of eval loss against steps, tokens, bytes and time.

  python -m loco.report runs/sweeps/main [more sweeps or workdirs] [--out=DIR] [--target=LOSS]

Every directory under the paths with a config.json or a status.json is a run, read
through `loco.runs`. The table has each run's status (finished, diverged, failed,
interrupted, running, incomplete, from its structured files; unreadable when a file is
damaged), final and best eval loss, tokens, bytes sent and bytes received per worker,
peak bytes sent in one step, simulated and wall seconds, and the first step / tokens /
bytes sent / simulated seconds at which its eval loss reached the target (by default
the largest final eval loss among finished runs, so every finished run reaches it).
Finished runs whose configs differ only in `seed` are also summarised as mean ±
standard deviation over their seeds. It is printed, and written with the plots to
OUT/report.md. Runs re-timed on other networks (`loco.retime`: WORKDIR/retimed/NAME)
add a table of the simulated seconds to the target per run x network and one plot
panel per network.

Damaged input: a torn last line of a run's metrics.jsonl (a crash mid-write) is left
out and listed with the problems; a run with any other damaged file (config.json,
metrics.jsonl, status.json, diverged.json) is listed as unreadable with the sentence
naming the file, and warned about on stderr. Paths that hold no run, an --out that is
a file or cannot be written, or a damaged sweep.json end in one `loco.report: error:`
line (exit code 1; 2 for bad arguments), and nothing is written.
"""

import collections
import json
import math
import statistics
import os
import re
import sys
from typing import Any, Sequence

from loco import cli
from loco import plots
from loco import runs
from loco import stats
from loco import workdir as workdir_lib
from loco.errors import LocoError, RunFileError, UsageError
# The run directory's names live in loco.runs; these aliases keep older imports working.
from loco.runs import LOG, RETIMED, STATUS, SWEEP, read_status  # noqa: F401

PROG = 'loco.report'
AS_TRAINED = 'as trained'
UNREADABLE = 'unreadable'    # the status of a run whose files are damaged

# (metrics key, file name, axis label) of each plot.
PLOTS = (('step', 'eval_loss_vs_steps.png', 'inner steps per worker'),
         ('tokens', 'eval_loss_vs_tokens.png', 'training tokens (all workers)'),
         ('bytes_sent', 'eval_loss_vs_bytes_sent.png', 'bytes sent per worker'),
         ('sim_seconds', 'eval_loss_vs_sim_seconds.png', 'simulated seconds'))
NETWORKS_PNG = 'eval_loss_vs_sim_seconds_by_network.png'


class ReportError(LocoError):
  """Nothing to report (no runs under the paths); printed as one line."""


def is_workdir(path: str) -> bool:
  return runs.is_run(path)


def find_workdirs(path: str) -> list[str]:
  """`path` itself if it is a run's workdir, else every workdir below it, sorted."""
  if is_workdir(path):
    return [path]
  found = []
  for root, dirs, _ in os.walk(path):
    dirs.sort()
    for d in list(dirs):
      if is_workdir(os.path.join(root, d)):
        found.append(os.path.join(root, d))
        dirs.remove(d)   # a workdir's checkpoints/ and tensorboard/ hold no runs
  return found


def _finite(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _names(workdirs: Sequence[str]) -> list[str]:
  """Paths relative to the workdirs' common parent (a lone workdir: its basename)."""
  absolute = [os.path.abspath(w) for w in workdirs]
  if len(absolute) == 1:
    return [os.path.basename(absolute[0])]
  parent = os.path.commonpath(absolute)
  if parent in absolute:
    parent = os.path.dirname(parent)
  return [os.path.relpath(w, parent) for w in absolute]


_EMPTY = dict(seed=None, setting=None, algorithm=None, command=None, step=None,
              steps=None, final_eval_loss=None, best_eval_loss=None, tokens=None,
              bytes_sent=None, bytes_received=None, peak_bytes=None, sim_seconds=None,
              wall_seconds=None, metrics_problem=None, _evals=[])


def _run(workdir: str, name: str) -> dict[str, Any]:
  """One run's row, without the time-to-target fields; a run with a damaged file is
  status 'unreadable', its error the sentence naming the file."""
  try:
    run = runs.read_run(workdir)
  except RunFileError as e:
    return dict(_EMPTY, name=name, workdir=workdir, status=UNREADABLE, state=UNREADABLE,
                error=str(e))
  config, last, sweep = run.config, run.last, run.sweep_status or {}
  evals = [r for r in run.metrics if 'eval_loss' in r]
  finite_evals = [r['eval_loss'] for r in evals if _finite(r['eval_loss'])]
  setting = _set_keys(_what_it_computes(config))
  return dict(
      name=name, workdir=workdir, seed=config.get('seed'),
      setting=json.dumps(setting, sort_keys=True, default=str),
      algorithm=(config.get('algorithm') or {}).get('name'),
      # `status` keeps the four values that callers (launch/claims.py) compare against;
      # `state` is the run's own (interrupted and running are incomplete there).
      status='incomplete' if run.status in ('interrupted', 'running') else run.status,
      state=run.status, error=run.error,
      command=sweep.get('command'), step=last.get('step'), steps=config.get('steps'),
      final_eval_loss=evals[-1]['eval_loss'] if evals else None,
      best_eval_loss=min(finite_evals, default=None),
      tokens=last.get('tokens'), bytes_sent=last.get('bytes_sent'),
      bytes_received=last.get('bytes_received'),
      peak_bytes=last.get('peak_bytes'), sim_seconds=last.get('sim_seconds'),
      wall_seconds=sweep.get('seconds'), metrics_problem=run.metrics_note,
      _evals=evals)


def _what_it_computes(config: dict[str, Any]) -> dict[str, Any]:
  """The config without its seed and the keys that only change how a run executes or
  logs (`workdir.MAY_CHANGE`: logging, checkpoints, mesh, metric sinks), so that runs
  differing only in those group as seeds of one setting."""
  flat = workdir_lib.flatten(config)
  return {k: v for k, v in flat.items() if k != 'seed' and not any(
      k == m or (m.endswith('.') and k.startswith(m)) for m in workdir_lib.MAY_CHANGE)}


def _set_keys(d):
  """A config without its unset (None) keys, so that runs of loco versions with more
  keys, all left at their defaults, compare equal."""
  if isinstance(d, dict):
    return {k: _set_keys(v) for k, v in d.items() if v is not None}
  return d


def _metrics(workdir: str) -> list[dict[str, Any]]:
  """The rows of a run's metrics.jsonl; [] if it is damaged (the table says so)."""
  try:
    return runs.read_metrics(workdir).rows
  except RunFileError:
    return []


def default_target(rows: Sequence[dict[str, Any]]) -> float | None:
  """The largest final eval loss among finished runs (None if there is none)."""
  return max((r['final_eval_loss'] for r in rows
              if r['status'] == 'finished' and _finite(r['final_eval_loss'])), default=None)


def summarize(workdirs: Sequence[str], target: float | None = None,
              names: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """One dict per workdir: status, losses, tokens, bytes, seconds and time to target.

  Args:
    workdirs: run directories (see `find_workdirs`).
    target: the eval loss to reach; None: `default_target` of these runs.
    names: a name per workdir; default: their paths relative to their common parent.

  Returns:
    Dicts with keys name, workdir, seed, setting (the config without its seed, as
    JSON), algorithm, status (finished | incomplete | failed | diverged |
    unreadable), state (the run's own status, `loco.runs.Run.status`: incomplete
    is split into interrupted, running and incomplete; or unreadable), error (why it
    did not finish; for an unreadable run the sentence naming the damaged file),
    command, step (last logged), steps (configured), final_eval_loss, best_eval_loss,
    tokens, bytes_sent, bytes_received (per worker, cumulative), peak_bytes (the most
    bytes one worker sent in one step), sim_seconds, wall_seconds (None if unknown),
    metrics_problem (a torn last line of metrics.jsonl, left out; None if none),
    target (the loss used), and target_step,
    target_tokens, target_bytes, target_sim_seconds: the values at the first eval
    with eval_loss <= target (None if never reached).
  """
  names = list(names) if names is not None else _names(workdirs)
  rows = [_run(w, n) for w, n in zip(workdirs, names)]
  if target is None:
    target = default_target(rows)
  for row in rows:
    hit = next((r for r in row.pop('_evals') if target is not None
                and _finite(r['eval_loss']) and r['eval_loss'] <= target), {})
    row.update(target=target, target_step=hit.get('step'), target_tokens=hit.get('tokens'),
               target_bytes=hit.get('bytes_sent'), target_sim_seconds=hit.get('sim_seconds'))
  return rows


def plot_runs(workdirs: Sequence[str], out_dir: str, labels: Sequence[str] | None = None,
              target: float | None = None) -> list[str]:
  """Plots eval loss against steps, tokens, bytes sent and simulated seconds
  (`plots.against_axes`): one line per run with a metrics.jsonl; returns the PNGs."""
  labels = list(labels) if labels is not None else _names(workdirs)
  return plots.against_axes(_eval_series(zip(labels, workdirs)), out_dir, PLOTS, target)


def _eval_series(pairs) -> list[tuple[str, list[dict[str, Any]]]]:
  """(label, its finite eval records) of every (label, workdir) that has some."""
  series = [(label, [r for r in _metrics(w) if _finite(r.get('eval_loss'))])
            for label, w in pairs]
  return [(label, evals) for label, evals in series if evals]


def networks(rows: Sequence[dict[str, Any]], order: Sequence[str] = ()
             ) -> dict[str, list[tuple[str, str]]]:
  """{network: [(run name, workdir)]}: the runs as trained (if any has simulated time),
  then each re-timing (`loco.retime`), in `order` first, then by name."""
  found = {}
  for r in rows:
    root = os.path.join(r['workdir'], RETIMED)
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
      if os.path.isfile(os.path.join(root, name, runs.METRICS)):
        found.setdefault(name, []).append((r['name'], os.path.join(root, name)))
  if not found:
    return {}
  clocked = [(r['name'], r['workdir']) for r in rows
             if _finite(r['sim_seconds']) and r['sim_seconds'] > 0]
  names = [n for n in order if n in found] + sorted(set(found) - set(order))
  return {**({AS_TRAINED: clocked} if clocked else {}), **{n: found[n] for n in names}}


def network_table(by_network: dict[str, list[tuple[str, str]]], target: float | None
                  ) -> str:
  """Markdown: simulated seconds to the target (and in all) per run x network."""
  runs = list(dict.fromkeys(name for pairs in by_network.values() for name, _ in pairs))
  cells = {}
  for network, pairs in by_network.items():
    rows = summarize([w for _, w in pairs], target, [n for n, _ in pairs])
    best = min((r['target_sim_seconds'] for r in rows if _finite(r['target_sim_seconds'])),
               default=None)
    for r in rows:
      hit = _seconds(r['target_sim_seconds'])
      if r['target_sim_seconds'] == best and best is not None:
        hit = f'**{hit}**'
      cells[r['name'], network] = f'{hit} ({_seconds(r["sim_seconds"])})'
  lines = ['| run | ' + ' | '.join(by_network) + ' |', '|' + '---|' * (len(by_network) + 1)]
  lines += ['| ' + ' | '.join([run] + [cells.get((run, n), '') for n in by_network]) + ' |'
            for run in runs]
  return '\n'.join(lines)


def plot_networks(by_network: dict[str, list[tuple[str, str]]], path: str,
                  target: float | None = None) -> str | None:
  """One panel per network: eval loss against simulated seconds (log axis), every run."""
  panels = [(network, _eval_series(pairs)) for network, pairs in by_network.items()]
  return plots.network_panels([(n, series) for n, series in panels if series], path, target)


def _loss(x):
  return f'{x:.4f}' if isinstance(x, (int, float)) else '—'


def _int(x):
  return f'{x:,.0f}' if _finite(x) else '—'


def _bytes(x):
  if not _finite(x):
    return '—'
  for unit, scale in (('GB', 1e9), ('MB', 1e6), ('KB', 1e3)):
    if abs(x) >= scale:
      return f'{x / scale:,.2f} {unit}'
  return f'{x:.0f} B'


# What a byte count in metrics.jsonl measures, for ratios that say which they compare.
BYTES_WHAT = {'bytes_sent': 'bytes sent', 'bytes_received': 'bytes received',
              'peak_bytes': 'peak bytes sent per step'}


def fewer(reference: float, value: float, key: str = 'bytes_sent') -> str:
  """'12.0x fewer bytes sent': how many times fewer `key`'s bytes (bytes_sent,
  bytes_received or peak_bytes, per worker) `value` has than `reference`, saying which;
  '—' when either is unknown."""
  if not (_finite(reference) and _finite(value)) or value <= 0:
    return '—'
  ratio = reference / value
  word = 'fewer' if ratio >= 1 else 'more'
  return f'{max(ratio, 1 / ratio):,.1f}x {word} {BYTES_WHAT[key]}'


def _seconds(x):
  return f'{x:,.1f}' if _finite(x) and x > 0 else '—'


# (header, row -> text) of each table column.
COLUMNS = (
    ('run', lambda r: r['name']),
    ('algorithm', lambda r: r['algorithm'] or '—'),
    ('status', lambda r: r['state']),
    ('final eval', lambda r: _loss(r['final_eval_loss'])),
    ('best eval', lambda r: _loss(r['best_eval_loss'])),
    ('tokens', lambda r: _int(r['tokens'])),
    ('bytes sent / worker', lambda r: _bytes(r['bytes_sent'])),
    ('bytes received / worker', lambda r: _bytes(r['bytes_received'])),
    ('peak bytes sent / step', lambda r: _bytes(r['peak_bytes'])),
    ('sim s', lambda r: _seconds(r['sim_seconds'])),
    ('wall s', lambda r: _int(r['wall_seconds'])),
    ('target: step', lambda r: _int(r['target_step'])),
    ('target: tokens', lambda r: _int(r['target_tokens'])),
    ('target: bytes sent', lambda r: _bytes(r['target_bytes'])),
    ('target: sim s', lambda r: _seconds(r['target_sim_seconds'])),
)


def seed_groups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Finished runs whose configs differ only in `seed`, in groups of two or more: name
  (the first run's, with its seed part removed), n, seeds, and the mean and sample
  standard deviation of the final and best eval loss; bytes sent and received per
  worker (means)."""
  finished = [r for r in rows
              if r['status'] == 'finished' and _finite(r['final_eval_loss']) and r.get('setting')]
  out = []
  for _, members in stats.seed_groups(finished, key=lambda r: r['setting']):
    if len({m['seed'] for m in members}) < 2:
      continue
    name = re.sub(r'[_-]?seed[_=-]?\d+', '', members[0]['name']) or members[0]['name']
    final = [m['final_eval_loss'] for m in members]
    best = [m['best_eval_loss'] for m in members]
    out.append(dict(name=name, n=len(members), seeds=sorted(m['seed'] for m in members),
                    final_mean=statistics.mean(final), final_std=statistics.stdev(final),
                    final_ci=stats.mean_ci(final).ci,
                    best_mean=statistics.mean(best), best_std=statistics.stdev(best),
                    bytes_sent=statistics.mean(m['bytes_sent'] or 0.0 for m in members),
                    bytes_received=statistics.mean(m['bytes_received'] or 0.0
                                                   for m in members)))
  return out


def seed_table(groups: Sequence[dict[str, Any]]) -> str:
  lines = ['| runs | n | seeds | final eval loss (mean ± std) | its 95% CI (t, n - 1 df) | '
           'best eval loss | bytes sent / worker | bytes received / worker |',
           '|---|---|---|---|---|---|---|---|']
  lines += [f'| {g["name"]} | {g["n"]} | {", ".join(map(str, g["seeds"]))} | '
            f'{g["final_mean"]:.4f} ± {g["final_std"]:.4f} | '
            f'[{g["final_ci"][0]:.4f}, {g["final_ci"][1]:.4f}] | '
            f'{g["best_mean"]:.4f} ± {g["best_std"]:.4f} | {_bytes(g["bytes_sent"])} | '
            f'{_bytes(g.get("bytes_received"))} |'
            for g in groups]
  return '\n'.join(lines)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  lines = ['| ' + ' | '.join(h for h, _ in COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  lines += ['| ' + ' | '.join(str(f(r)).replace('|', '\\|') for _, f in COLUMNS) + ' |'
            for r in rows]
  return '\n'.join(lines)


def text_table(rows: Sequence[dict[str, Any]]) -> str:
  """The table as plain aligned text (numbers right-aligned)."""
  cells = [[h for h, _ in COLUMNS]] + [[str(f(r)) for _, f in COLUMNS] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
  align = [str.ljust] * 3 + [str.rjust] * (len(COLUMNS) - 3)
  return '\n'.join('  '.join(a(c, w) for a, c, w in zip(align, row, widths)).rstrip()
                   for row in cells)


def _target_line(rows, given: bool) -> str:
  target = rows[0]['target'] if rows else None
  if target is None:
    return 'Target: none (no finished run has an eval loss; pass --target=LOSS).'
  how = 'given by --target' if given else (
      'the largest final eval loss among finished runs, so every finished run reaches it')
  return (f'Target: eval loss <= {target:.4f} ({how}); the target columns are the first '
          f'eval at which a run reached it.')


def _problems(rows) -> list[str]:
  out = []
  for r in rows:
    notes = [r['metrics_problem']] if r.get('metrics_problem') else []
    if r['state'] != 'finished':
      notes.insert(0, r['error'] or 'interrupted or still running; the same command resumes it')
    if notes:
      out.append(f'`{r["name"]}` ({r["state"]}): {"; ".join(notes)}')
  return out


def _collect(paths: Sequence[str]) -> tuple[list[str], list[str], list[dict], list[str]]:
  """(workdirs, names, missing, retimes): runs of every path; sweep runs never started;
  the sweeps' re-timing names in their order."""
  workdirs, names, missing, retimes = [], [], [], []
  for path in paths:
    if not os.path.isdir(path):
      raise UsageError(f'{path} is not a directory.')
    if is_workdir(path):
      workdirs.append(path)
      names.append(os.path.basename(os.path.abspath(path)))
      continue
    prefix = os.path.basename(os.path.abspath(path)) + '/' if len(paths) > 1 else ''
    sweep = runs.read_sweep(path) or {}
    planned = sweep.get('runs', [])
    retimes += list(sweep.get('retimes', {}))
    rank = {r['name']: i for i, r in enumerate(planned)}
    present = sorted((os.path.relpath(w, path) for w in find_workdirs(path)),
                     key=lambda n: (rank.get(n, len(rank)), n))   # sweep order, then by name
    workdirs += [os.path.join(path, n) for n in present]
    names += [prefix + n for n in present]
    missing += [dict(name=prefix + r['name'], command=r.get('command'))
                for r in planned if r['name'] not in present]
  return workdirs, names, missing, retimes


def write_report(paths: Sequence[str], out: str | None = None,
                 target: float | None = None, stream=None) -> str:
  """Summarizes and plots the runs under `paths`; writes OUT/report.md; returns its path.

  A run whose files are damaged is listed as unreadable, with the sentence naming the
  file, in the table and the problems, and warned about on stderr: the report of
  the other runs is still worth having, and no damaged run is silently left out.

  Raises:
    UsageError: a path is not a directory.
    ReportError: there is no run under the paths (nothing is written).
    LocoError: `out` is a file or cannot be written (checked before any work), or a
      sweep.json is damaged (RunFileError).
  """
  stream = stream or sys.stdout
  workdirs, names, missing, order = _collect(paths)
  if not workdirs and not missing:
    raise ReportError(f'no runs found under {", ".join(paths)} (a run is a directory '
                      'with a config.json or a status.json).')
  if out is None:
    out = paths[0] if not is_workdir(paths[0]) else 'report'
  cli.check_output_dir(out)
  rows = summarize(workdirs, target, names)
  for r in rows:
    if r['state'] == UNREADABLE:
      print(f'{PROG}: warning: {r["error"]} The run is listed as unreadable.',
            file=sys.stderr)
  target_used = rows[0]['target'] if rows else target
  pngs = plot_runs(workdirs, out, names, target_used)
  counts = collections.Counter([r['state'] for r in rows] + ['not started'] * len(missing))
  count_line = f'{len(rows) + len(missing)} runs: ' + ', '.join(
      f'{n} {s}' for s, n in sorted(counts.items()))
  problems = _problems(rows) + [f'`{m["name"]}` (not started)' for m in missing]
  by_network = networks(rows, order)
  lines = [f'# Report: {", ".join(paths)}', '', count_line + '.', '',
           _target_line(rows, target is not None), '', markdown_table(rows), '',
           'Bytes sent and received are per worker (cumulative); "peak bytes sent / step" is '
           'the most bytes one worker sent in one step; "sim s" is the simulated wall-clock on the '
           'configured network (— without one); "wall s" is the measured time over all '
           'attempts (— if unknown).', '', '## Plots', '']
  for p in pngs:
    title = os.path.splitext(os.path.basename(p))[0].replace('_', ' ')
    lines += [f'![{title}]({os.path.relpath(p, out)})', '']
  if not pngs:
    lines += ['No eval loss to plot yet.', '']
  if by_network:
    png = plot_networks(by_network, os.path.join(out, NETWORKS_PNG), target_used)
    table = network_table(by_network, target_used)
    lines += ['## Re-timed on other networks', '',
              'Simulated seconds to the target, and in all (in parentheses), of each run on '
              'each network (`loco.retime`: the same run, its communication log replayed on '
              'that network; — never reached); the fastest to the target in bold.', '',
              table, '']
    if png:
      lines += [f'![eval loss vs simulated seconds, per network]({NETWORKS_PNG})', '']
  groups = seed_groups(rows)
  if groups:
    lines += ['## Over seeds', '',
              'Finished runs whose configs differ only in `seed` (or in keys that only '
              'change how a run executes or logs): mean ± sample standard deviation, and '
              'the 95% confidence interval of the mean from Student\'s t with n - 1 '
              'degrees of freedom. To compare two settings, pair them by seed '
              '(`loco.stats.paired_t`).', '', seed_table(groups), '']
  lines += ['## Problems: failed, diverged, incomplete, unreadable and unstarted runs, '
            'damaged metrics', '',
            *([f'- {p}' for p in problems] or ['None.'])]
  commands = [(r['name'], r['command']) for r in rows + missing if r.get('command')]
  if commands:
    lines += ['', '## Commands', '']
    lines += [f'- `{n}`: `{" ".join(["python", *c[1:]])}`' for n, c in commands]
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, runs.REPORT)
  with open(path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  print(text_table(rows), file=stream)
  print(count_line + '. ' + _target_line(rows, target is not None), file=stream)
  if groups:
    print('over seeds (mean ± std):\n' + seed_table(groups), file=stream)
  if by_network:
    print('simulated seconds to target (in all), per network:\n' + table, file=stream)
  for p in problems:
    print(f'  {p.replace("`", "")}', file=stream)
  print(f'report: {path}', file=stream, flush=True)
  return path


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m loco.report', description=__doc__.split('\n\n')[0])
  parser.add_argument('paths', nargs='+', metavar='PATH', help='sweep dirs or workdirs')
  parser.add_argument('--out', help='output directory (default: the first PATH if it is '
                      'a sweep dir, else ./report)')
  parser.add_argument('--target', type=cli.finite_float, help='eval loss for the time-to-target '
                      'columns (default: the largest final eval loss of finished runs)')
  args = parser.parse_args(argv)
  return cli.run(PROG, lambda: write_report(args.paths, args.out, args.target) and 0)


if __name__ == '__main__':
  cli.exit(main())
