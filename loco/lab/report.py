"""Reports: a table of runs and plots of eval loss against steps, tokens, bytes and time.

  python -m loco.report runs/sweeps/main [more sweeps or workdirs] [--out=DIR] [--target=LOSS]

Every directory under the paths with a config.json or a status.json is a run, read
through `loco.files.runs`. The table has each run's status (finished, diverged, failed,
interrupted, running, incomplete, from its structured files; unreadable when a file is
damaged), final eval loss ± its standard error (clustered by document, `eval_loss_se`)
and best eval loss, tokens, bytes sent and bytes received per worker, peak bytes sent
in one step, simulated and wall seconds, and the first step / tokens / bytes sent /
simulated seconds at which its eval loss reached the target (by default the largest
final eval loss among finished runs, so every finished run reaches it). Finished runs
whose configs differ only in `seed` are also summarised as mean ± standard deviation
over their seeds, with the 95% CI of the mean, and plotted as one line (their mean)
with a band from the lowest to the highest seed; every line has its own colour, line
style and marker, so curves that coincide stay visible. The printed tables fit 100
columns (the main columns; report.md, written with the plots to OUT, has them all).
Runs re-timed on other networks (`loco.retime`: WORKDIR/retimed/NAME) add a table of
the simulated seconds to the target per run x network and one plot panel per network.
Two settings are compared, with a confidence interval of the difference, by
`python -m loco.compare`.

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
import os
import re
import statistics
import sys
import textwrap
from typing import Any, Sequence

from loco import cli
from loco.lab import plots
from loco.files import runs
from loco import stats
from loco.files import workdir as workdir_lib
from loco.errors import LocoError, RunFileError, UsageError
# The run directory's names live in loco.files.runs; these aliases keep older imports working.
from loco.files.runs import LOG, RETIMED, STATUS, SWEEP, read_status  # noqa: F401

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
              steps=None, final_eval_loss=None, final_eval_se=None, best_eval_loss=None,
              tokens=None,
              bytes_sent=None, bytes_received=None, peak_bytes=None, sim_seconds=None,
              wall_seconds=None, metrics_problem=None, _evals=[],
              **dict.fromkeys(runs.DRIFT_KEYS))


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
  # The drift diagnostics of the last row that has them (the run's last syncs).
  drift = next((r for r in reversed(run.metrics) if 'pg_norm' in r), {})
  finite_evals = [r['eval_loss'] for r in evals if _finite(r['eval_loss'])]
  return dict(
      name=name, workdir=workdir, seed=config.get('seed'),
      setting=json.dumps(setting(config), sort_keys=True, default=str),
      algorithm=(config.get('algorithm') or {}).get('name'),
      # `status` keeps the four values that callers (launch/claims.py) compare against;
      # `state` is the run's own (interrupted and running are incomplete there).
      status='incomplete' if run.status in ('interrupted', 'running') else run.status,
      state=run.status, error=run.error,
      command=sweep.get('command'), step=last.get('step'), steps=config.get('steps'),
      final_eval_loss=evals[-1]['eval_loss'] if evals else None,
      final_eval_se=evals[-1].get('eval_loss_se') if evals else None,
      best_eval_loss=min(finite_evals, default=None),
      tokens=last.get('tokens'), bytes_sent=last.get('bytes_sent'),
      bytes_received=last.get('bytes_received'),
      peak_bytes=last.get('peak_bytes'), sim_seconds=last.get('sim_seconds'),
      wall_seconds=sweep.get('seconds'), metrics_problem=run.metrics_note,
      _evals=evals, **{k: drift.get(k) for k in runs.DRIFT_KEYS})


def setting(config: dict[str, Any]) -> dict[str, Any]:
  """What a run computes, flat ({'algorithm.name': 'diloco', ...}): its config without
  the seed, the keys that only change how it executes or logs, and unset keys. Runs
  with equal settings are seeds of one setting."""
  return _set_keys(_what_it_computes(config))


def differing_keys(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
  """The keys, sorted, whose values differ between two flat dicts (a missing key counts
  as different)."""
  return sorted(k for k in set(a) | set(b) if a.get(k, _MISSING) != b.get(k, _MISSING))


_MISSING = object()


def seedless_name(name: str) -> str:
  """A run's name without its seed part ('ddp_seed2', 'ddp/seed=2' -> 'ddp'): the name
  of its group."""
  return re.sub(r'[_/,-]?seed[_=-]?\d+', '', name).rstrip('/,_-') or name


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
    unreadable), state (the run's own status, `loco.files.runs.Run.status`: incomplete
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
              target: float | None = None,
              groups: Sequence[tuple[str, Sequence[str]]] = ()) -> list[str]:
  """Plots eval loss against steps, tokens, bytes sent and simulated seconds
  (`plots.against_axes`): one line per run with a metrics.jsonl, in its own colour,
  line style and marker.

  Args:
    workdirs: the runs.
    out_dir: where the PNGs go.
    labels: a label per workdir; default: their paths relative to their common parent.
    target: drawn as a dashed line.
    groups: (label, labels of its runs) of seed groups: their runs are drawn as one
      line, the mean over seeds, with a band from the lowest to the highest seed.

  Returns:
    The PNGs written.
  """
  labels = list(labels) if labels is not None else _names(workdirs)
  evals = dict(_eval_series(zip(labels, workdirs)))
  grouped = {label for _, members in groups for label in members}
  drawn: list[tuple[str, list]] = []
  for label in labels:
    if label in evals and label not in grouped:
      drawn.append((label, [evals[label]]))
    for name, members in groups:
      if label == members[0]:
        runs_of = [evals[m] for m in members if m in evals]
        if runs_of:
          drawn.append((name, runs_of))
  return plots.against_axes(drawn, out_dir, PLOTS, target)


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


def network_cells(by_network: dict[str, list[tuple[str, str]]], target: float | None
                  ) -> list[list[str]]:
  """Simulated seconds to the target (and in all) per run x network: a header row,
  then one row per run; the fastest to the target in bold."""
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
  return [['run', *by_network]] + [[run] + [cells.get((run, n), '') for n in by_network]
                                   for run in runs]


def network_table(by_network: dict[str, list[tuple[str, str]]], target: float | None
                  ) -> str:
  """Markdown: simulated seconds to the target (and in all) per run x network."""
  cells = network_cells(by_network, target)
  lines = ['| ' + ' | '.join(cells[0]) + ' |', '|' + '---|' * len(cells[0])]
  lines += ['| ' + ' | '.join(row) + ' |' for row in cells[1:]]
  return '\n'.join(lines)


def plot_networks(by_network: dict[str, list[tuple[str, str]]], path: str,
                  target: float | None = None) -> str | None:
  """One panel per network: eval loss against simulated seconds (log axis), every run."""
  panels = [(network, _eval_series(pairs)) for network, pairs in by_network.items()]
  return plots.network_panels([(n, series) for n, series in panels if series], path, target)


def _loss(x):
  return f'{x:.4f}' if isinstance(x, (int, float)) else '—'


def _number(x):
  return f'{x:.4g}' if _finite(x) else '—'


def _int(x):
  return f'{x:,.0f}' if _finite(x) else '—'


def human_bytes(x) -> str:
  """'134.98 MB' (decimal units); '—' when unknown."""
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


def human_seconds(x) -> str:
  """'31.9'; '—' when unknown or 0 (a run without a network has no simulated time)."""
  return f'{x:,.1f}' if _finite(x) and x > 0 else '—'


_seconds = human_seconds


def _loss_se(r) -> str:
  """'2.2103 ± 0.0647': the final eval loss and its standard error (clustered by
  document) where the run logged one."""
  if _finite(r['final_eval_loss']) and _finite(r.get('final_eval_se')):
    return f'{r["final_eval_loss"]:.4f} ± {r["final_eval_se"]:.4f}'
  return _loss(r['final_eval_loss'])


# (header, row -> text) of each column of the table in report.md: everything.
COLUMNS = (
    ('run', lambda r: r['name']),
    ('algorithm', lambda r: r['algorithm'] or '—'),
    ('status', lambda r: r['state']),
    ('final eval', _loss_se),
    ('best eval', lambda r: _loss(r['best_eval_loss'])),
    ('tokens', lambda r: _int(r['tokens'])),
    ('bytes sent / worker', lambda r: human_bytes(r['bytes_sent'])),
    ('bytes received / worker', lambda r: human_bytes(r['bytes_received'])),
    ('peak bytes sent / step', lambda r: human_bytes(r['peak_bytes'])),
    ('sim s', lambda r: _seconds(r['sim_seconds'])),
    ('wall s', lambda r: _int(r['wall_seconds'])),
    ('last syncs: pg cosine', lambda r: _number(r['pg_cosine'])),
    ('last syncs: consensus distance', lambda r: _number(r['consensus_distance'])),
    ('target: step', lambda r: _int(r['target_step'])),
    ('target: tokens', lambda r: _int(r['target_tokens'])),
    ('target: bytes sent', lambda r: human_bytes(r['target_bytes'])),
    ('target: sim s', lambda r: _seconds(r['target_sim_seconds'])),
)

# The printed table: the columns that answer "which is better, at what cost", in at
# most WIDTH terminal columns; the rest are in report.md.
TERMINAL_COLUMNS = (
    ('run', lambda r: r['name']),
    ('status', lambda r: r['state']),
    ('final eval ± SE', _loss_se),
    ('sent', lambda r: human_bytes(r['bytes_sent'])),
    ('received', lambda r: human_bytes(r['bytes_received'])),
    ('sim s', lambda r: _seconds(r['sim_seconds'])),
    ('target step', lambda r: _int(r['target_step'])),
)
TERMINAL_LEGEND = ('sent, received: bytes per worker; sim s: simulated seconds; ± SE: '
                   'the final eval\'s standard error, clustered by document. Every column '
                   'is in report.md.')
WIDTH = 100      # the printed tables and lines fit this many terminal columns


def aligned(cells: Sequence[Sequence[str]], left: int = 1, width: int = WIDTH,
            squeeze: int = 0) -> str:
  """Rows of cells (the first the header) as plain text, columns two spaces apart: the
  first `left` columns left-aligned, the rest (numbers) right-aligned. A table wider
  than `width` shortens column `squeeze` (the names) in the middle, '…' marking the
  cut, down to 8 characters."""
  widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
  over = sum(widths) + 2 * (len(widths) - 1) - width
  if over > 0:
    widths[squeeze] = max(8, widths[squeeze] - over)
  def fit(text: str, w: int) -> str:
    if len(text) <= w:
      return text
    head = (w - 1) - (w - 1) // 2
    return text[:head] + '…' + text[len(text) - (w - 1 - head):]
  lines = []
  for row in cells:
    parts = [fit(c, w).ljust(w) if i < left else fit(c, w).rjust(w)
             for i, (c, w) in enumerate(zip(row, widths))]
    lines.append('  '.join(parts).rstrip())
  return '\n'.join(lines)


def wrap(text: str, width: int = WIDTH, indent: str = '') -> str:
  """A paragraph folded to `width` columns (continuation lines indented)."""
  return textwrap.fill(text, width, subsequent_indent=indent, break_long_words=False,
                       break_on_hyphens=False)


def seed_groups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Finished runs whose configs differ only in `seed`, in groups of two or more: name
  (the first run's, with its seed part removed), n, seeds, members (the runs' names),
  and the mean and sample
  standard deviation of the final and best eval loss; bytes sent and received per
  worker (means)."""
  finished = [r for r in rows
              if r['status'] == 'finished' and _finite(r['final_eval_loss']) and r.get('setting')]
  out = []
  for _, members in stats.seed_groups(finished, key=lambda r: r['setting']):
    if len({m['seed'] for m in members}) < 2:
      continue
    name = seedless_name(members[0]['name'])
    final = [m['final_eval_loss'] for m in members]
    best = [m['best_eval_loss'] for m in members]
    out.append(dict(name=name, n=len(members), seeds=sorted(m['seed'] for m in members),
                    members=[m['name'] for m in members],
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
            f'{g["best_mean"]:.4f} ± {g["best_std"]:.4f} | {human_bytes(g["bytes_sent"])} | '
            f'{human_bytes(g.get("bytes_received"))} |'
            for g in groups]
  return '\n'.join(lines)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  lines = ['| ' + ' | '.join(h for h, _ in COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  lines += ['| ' + ' | '.join(str(f(r)).replace('|', '\\|') for _, f in COLUMNS) + ' |'
            for r in rows]
  return '\n'.join(lines)


def text_table(rows: Sequence[dict[str, Any]], width: int = WIDTH) -> str:
  """The printed table (`TERMINAL_COLUMNS`), at most `width` columns wide: names
  left-aligned, numbers right-aligned, long run names shortened in the middle."""
  cells = [[h for h, _ in TERMINAL_COLUMNS]]
  cells += [[str(f(r)) for _, f in TERMINAL_COLUMNS] for r in rows]
  return aligned(cells, left=2, width=width)


def seed_text_table(groups: Sequence[dict[str, Any]], width: int = WIDTH) -> str:
  """The printed table of seed groups: mean final eval loss with its 95% CI over seeds,
  the sample sd, and bytes."""
  cells = [['seeds of', 'n', 'final eval: mean [95% CI]', 'sd', 'sent', 'received']]
  cells += [[g['name'], str(g['n']),
             f'{g["final_mean"]:.4f} [{g["final_ci"][0]:.4f}, {g["final_ci"][1]:.4f}]',
             f'{g["final_std"]:.4f}', human_bytes(g['bytes_sent']),
             human_bytes(g.get('bytes_received'))] for g in groups]
  return aligned(cells, left=1, width=width)


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
  groups = seed_groups(rows)
  pngs = plot_runs(workdirs, out, names, target_used,
                   [(g['name'], g['members']) for g in groups])
  counts = collections.Counter([r['state'] for r in rows] + ['not started'] * len(missing))
  count_line = f'{len(rows) + len(missing)} runs: ' + ', '.join(
      f'{n} {s}' for s, n in sorted(counts.items()))
  problems = _problems(rows) + [f'`{m["name"]}` (not started)' for m in missing]
  by_network = networks(rows, order)
  lines = [f'# Report: {", ".join(paths)}', '', count_line + '.', '',
           _target_line(rows, target is not None), '', markdown_table(rows), '',
           '"final eval" is the last eval loss (nats/token) ± its standard error over the '
           'eval windows, clustered by document (how sure the eval set is; it does not '
           'hold how much another seed would move the loss: see "Over seeds" and '
           '`python -m loco.compare`). '
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
  if groups:
    lines += ['## Over seeds', '',
              'Finished runs whose configs differ only in `seed` (or in keys that only '
              'change how a run executes or logs): mean ± sample standard deviation, and '
              'the 95% confidence interval of the mean from Student\'s t with n - 1 '
              'degrees of freedom. In the plots, a group is one line (the mean) with a '
              'band from its lowest to its highest seed. To compare two settings with a '
              'confidence interval (paired by seed): `python -m loco.compare A B`.', '',
              seed_table(groups), '']
  lines += ['## Problems: failed, diverged, incomplete, unreadable and unstarted runs, '
            'damaged metrics', '',
            *([f'- {p}' for p in problems] or ['None.'])]
  commands = [(r['name'], r['command']) for r in rows + missing if r.get('command')]
  if commands:
    lines += ['', '## Commands', '']
    lines += [f'- `{n}`: `{" ".join(["python", *c[1:]])}`' for n, c in commands]
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, runs.REPORT)
  runs.write_atomic(path, '\n'.join(lines) + '\n')
  print(text_table(rows), file=stream)
  print(wrap(TERMINAL_LEGEND), file=stream)
  print(wrap(count_line + '. ' + _target_line(rows, target is not None)), file=stream)
  if groups:
    print('\nover seeds (runs whose configs differ only in seed; compare two settings '
          'with loco.compare):', file=stream)
    print(seed_text_table(groups), file=stream)
  if by_network:
    print('\nsimulated seconds to the target (in all), per network; ** the fastest:',
          file=stream)
    print(aligned(network_cells(by_network, target_used)), file=stream)
  for p in problems:
    print(wrap(f'  {p.replace("`", "")}', indent='    '), file=stream)
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
