"""The claims page's figures a practitioner chooses a method by, from its finals and
without training again:

- loss against simulated wall-clock time on each of the page's networks (every
  synchronous final re-timed by `loco.retime`, a replay of its comms.jsonl), one panel
  per network, and the simulated seconds to a target loss on each;
- final loss against bytes per worker, sent and received, over every final of the page,
  with the non-dominated (Pareto) front drawn and tabled;
- the warm-started finals counted from the step 0 of the run they started from: their
  curves, bytes and seconds offset by that run's tokens, bytes and seconds up to the
  checkpoint.

`launch.claims` names the networks (`NETWORKS`) and calls `retime_finals` (after its
finals, also with --page_only: a re-timing trains nothing), `offset_warm_starts` and
`section` (which draws these figures and returns the page's lines).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from loco.lab import frontier
from loco.sim import network as network_lib
from loco.lab import plots
from loco.lab import report
from loco.files import runs as runs_lib
from loco.lab import study
from loco.lab.study import Final, Group, Method
from loco.lab.sweep import retime_runs

FIGURES = {'time': 'sim_time.png', 'time_to_target': 'time_to_target.png',
           'pareto': 'pareto_bytes.png'}


def figure_paths(figures: str) -> dict[str, str]:
  return {k: os.path.join(figures, v) for k, v in FIGURES.items()}


def network_label(keys: Mapping[str, Any]) -> str:
  """'1 Gbit/s, 100 ms' for a homogeneous network's keys."""
  return (f'{keys["network.bandwidth"] / network_lib.GBIT:g} Gbit/s, '
          f'{keys["network.latency"] * 1e3:g} ms')


# ---- re-timing ------------------------------------------------------------------------

def _seed_dir(out: str, name: str, seed: int) -> str:
  return os.path.join(out, 'final', name, f'seed{seed}')


class _Named(NamedTuple):
  name: str                     # FINAL/seedS, as `loco.lab.sweep.retime_runs` reads a run


def retime_finals(out: str, finals: Sequence[Final], budget: study.Budget,
                  networks: Mapping[str, Mapping[str, Any]],
                  say: Callable[[str], None] = print) -> int:
  """Re-times every finished synchronous final on each network (`loco.lab.sweep.retime_runs`:
  one already current is skipped); returns the failures, each said in one line."""
  runs = [_Named(f'{f.name}/seed{s}') for f in finals for s in f.seeds_of(budget)
          if os.path.isdir(_seed_dir(out, f.name, s))]
  return retime_runs(runs, os.path.join(out, 'final'), dict(networks), say)


# ---- warm starts ----------------------------------------------------------------------

def warm_source(f: Final, seed: int, out: str) -> tuple[str, int] | None:
  """(the run a warm-started final began from, the step of its checkpoint), read from
  its init_from (RUN/checkpoints/STEP); None if the final starts from scratch."""
  path = f.keys_for(seed, out).get('init_from')
  if not path:
    return None
  path = os.path.normpath(path)
  return os.path.dirname(os.path.dirname(path)), int(os.path.basename(path))


def warm_names(finals: Sequence[Final]) -> list[str]:
  """The finals that begin from another run's checkpoint."""
  return [f.name for f in finals if f.keys.get('init_from')]


PHASE_KEYS = ('tokens', 'bytes_sent', 'bytes_received')


def warm_phases(out: str, finals: Sequence[Final], budget: study.Budget
                ) -> dict[str, dict[int, dict[str, float]]]:
  """Per warm-started final and seed: the tokens and bytes per worker of the run it
  began from, up to its checkpoint (that run's metrics; a seed whose run is not there
  is left out)."""
  out_: dict[str, dict[int, dict[str, float]]] = {}
  for f in finals:
    for seed in f.seeds_of(budget):
      source = warm_source(f, seed, out)
      if source is None:
        continue
      rows = runs_lib.read_metrics(source[0]).rows
      phase = {k: frontier.value_at(rows, k, source[1]) for k in PHASE_KEYS}
      if all(v is not None for v in phase.values()):
        out_.setdefault(f.name, {})[seed] = phase
  return out_


def _phase(phases: Mapping[int, Mapping[str, float]], seed: int, key: str) -> float:
  """A seed's phase value; another seed's where its source run is gone (tokens and
  bytes up to a checkpoint do not depend on the seed), 0 if none is known."""
  found = phases.get(seed) or next(iter(phases.values()), {})
  return float(found.get(key, 0.0))


def offset_warm_starts(g: Mapping[str, Group], out: str, finals: Sequence[Final],
                       budget: study.Budget) -> dict[str, Group]:
  """`g` with each warm-started final's curves moved right by the tokens its source
  run trained before the checkpoint (per seed), so that at equal x every curve has
  seen equal tokens, and its bytes per worker including that run's up to there."""
  phases = warm_phases(out, finals, budget)
  result = dict(g)
  for name, per_seed in phases.items():
    if name not in g:
      continue
    x = g[name]
    seeds = list(x.losses)      # the curves are in the order of the scored seeds
    curves = [frontier.shift(c, _phase(per_seed, s, 'tokens'))
              for s, c in zip(seeds, x.curves)]
    before = {k: float(np.mean([_phase(per_seed, s, k) for s in seeds] or [0.0]))
              for k in ('bytes_sent', 'bytes_received')}
    result[name] = dataclasses.replace(
        x, curves=curves, bytes_sent=x.bytes_sent + before['bytes_sent'],
        bytes_received=x.bytes_received + before['bytes_received'])
  return result


def tokens_label(names: Sequence[str], warm: Sequence[str]) -> str:
  """The x label of a curve of tokens: says where warm starts are counted from."""
  if set(names) & set(warm):
    return 'tokens (warm starts: with their DDP phase\'s)'
  return 'tokens'


def caption(names: Sequence[str], warm: Sequence[str]) -> list[str]:
  """The line under a figure that draws a warm-started final, saying how it is drawn."""
  drawn = [n for n in names if n in warm]
  if not drawn:
    return []
  return ['', f'{", ".join(drawn)} start{"s" * (len(drawn) == 1)} from DDP\'s checkpoint '
          'of the same seed: their curves begin at the tokens DDP had trained by then (not '
          'at 0), so at equal x every curve has seen equal tokens, and their bytes include '
          'DDP\'s up to the checkpoint.']


# ---- loss against simulated time ------------------------------------------------------

def time_names(finals: Sequence[Final], methods: Sequence[Method]) -> list[str]:
  """The finals drawn against simulated time: each method's own final (its pick, keys
  unchanged) at the page's length, the finals that change only the codec, and the warm
  starts; the rest are re-timed too (the front's table reads them)."""
  h1 = {m.name for m in methods if m.h1}
  return [f.name for f in finals
          if (f.name == f.method and f.method not in h1)
          or set(f.keys) == {'algorithm.compression'} or f.keys.get('init_from')]


def time_curves(out: str, finals: Sequence[Final], budget: study.Budget, names: Sequence[str],
                network: str) -> dict[str, list[frontier.Curve]]:
  """Per name: per seed, (simulated seconds on `network`, eval loss); a warm start's
  seconds begin where its source run's, re-timed on the same network, reached the
  checkpoint. Seeds not re-timed there are left out."""
  by_name = {f.name: f for f in finals}
  result = {}
  for name in names:
    f = by_name[name]
    curves = []
    for seed in f.seeds_of(budget):
      c = frontier.retimed_curve(_seed_dir(out, name, seed), network)
      if not c:
        continue
      source = warm_source(f, seed, out)
      if source is not None:
        rows = frontier.retimed_rows(source[0], network) or []
        before = frontier.value_at(rows, 'sim_seconds', source[1])
        if before is None:
          continue
        c = frontier.shift(c, before)
      curves.append(c)
    if curves:
      result[name] = curves
  return result


@dataclasses.dataclass
class Timing:
  """Simulated seconds per network: to the target loss and for the whole run, per final
  (means over the seeds that reach it; `never`: seeds that do not)."""
  target: float
  to_target: dict[str, dict[str, float]]      # network -> final -> mean seconds
  never: dict[str, dict[str, int]]            # network -> final -> seeds that do not
  total: dict[str, dict[str, float]]          # network -> final -> mean seconds


def timing(curves: Mapping[str, Mapping[str, Sequence[frontier.Curve]]]) -> Timing | None:
  """Seconds to the highest last eval loss of any curve (so every final reaches it),
  per network (`curves`: network -> final -> per-seed curves); None if there are none."""
  last = [c[-1][1] for per in curves.values() for cs in per.values() for c in cs if c]
  if not last:
    return None
  target = max(last)
  t = Timing(target, {}, {}, {})
  for net, per in curves.items():
    t.to_target[net], t.never[net], t.total[net] = {}, {}, {}
    for name, cs in per.items():
      seconds = study.seconds_to(cs, target)
      hit = [x for x in seconds if x is not None]
      if hit:
        t.to_target[net][name] = float(np.mean(hit))
      t.never[net][name] = sum(x is None for x in seconds)
      t.total[net][name] = float(np.mean([c[-1][0] for c in cs]))
  return t


def _draw_time_to_target(t: Timing, labels: Mapping[str, str], path: str) -> str:
  nets = list(t.to_target)
  names = list(dict.fromkeys(n for per in t.to_target.values() for n in per))
  fig, (ax,) = plots.figure(1, 7, 4.5)
  for i, name in enumerate(names):
    pts = [(k, t.to_target[net][name]) for k, net in enumerate(nets)
           if name in t.to_target[net]]
    ax.plot([k for k, _ in pts], [y for _, y in pts], label=name, **plots.style(i, len(names)))
  ax.set_xticks(range(len(nets)), [labels[n] for n in nets])
  plots.log_axis(ax.yaxis)
  ax.set_xlabel('network (bandwidth, latency)')
  ax.set_ylabel(f'simulated seconds to eval loss {t.target:.3f}')
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=6, ncol=2)
  plots.save(fig, path)
  return path


def _seconds(x: float | None) -> str:
  return '—' if x is None or not math.isfinite(x) else f'{x:,.0f} s'


def time_table(t: Timing, labels: Mapping[str, str], loss: Mapping[str, Group]) -> list[str]:
  nets = list(t.to_target)
  names = list(dict.fromkeys(n for per in t.total.values() for n in per))
  rows = ['| final | final eval loss | ' + ' | '.join(
              f'{labels[n]}: to {t.target:.3f} / whole run' for n in nets) + ' |',
          '|---|---|' + '---|' * len(nets)]
  for name in names:
    cells = []
    for net in nets:
      best = min(t.to_target[net].values(), default=None)
      hit = t.to_target[net].get(name)
      text = _seconds(hit)
      if hit is not None and hit == best:
        text = f'**{text}**'
      never = t.never[net].get(name)
      if never:
        text += f' ({never} seed{"s" * (never > 1)} never)'
      cells.append(f'{text} / {_seconds(t.total[net].get(name))}')
    value = loss[name].text() if name in loss else '—'
    rows.append(f'| {name} | {value} | ' + ' | '.join(cells) + ' |')
  return rows


# ---- loss against bytes: the Pareto front ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class Point:
  """A final's place in the loss-against-bytes plane."""
  name: str
  family: str                   # its algorithm (algorithm.name)
  sent: float                   # bytes per worker, mean over seeds
  received: float
  loss: float                   # final eval loss, mean over seeds
  low: float                    # lowest and highest seed
  high: float
  tokens: float                 # tokens trained (warm starts: with their source's)
  eligible: bool                # on the page's token budget and sending something


def points(g: Mapping[str, Group], finals: Sequence[Final], methods: Sequence[Method]
           ) -> list[Point]:
  """Every final of `g` with a seed scored (curves and bytes as `offset_warm_starts`
  leaves them). Only finals at the page's token budget (the tokens most finals train)
  that send something are eligible for the front: more tokens would buy loss with data,
  not communication."""
  keys = {m.name: m.keys for m in methods}
  found = []
  for f in finals:
    x = g.get(f.name)
    if x is None or not x.losses:
      continue
    family = {**keys.get(f.method, {}), **f.keys}.get('algorithm.name', 'ddp')
    tokens = float(np.mean([c[-1][0] for c in x.curves if c])) if x.curves else math.nan
    found.append(Point(f.name, family, x.bytes_sent, x.bytes_received, x.mean,
                       min(x.values), max(x.values), tokens, False))
  budget = collections.Counter(round(p.tokens) for p in found
                               if math.isfinite(p.tokens)).most_common(1)
  return [dataclasses.replace(p, eligible=bool(budget) and p.sent > 0 and math.isfinite(p.tokens)
                              and abs(p.tokens - budget[0][0]) <= 1e-3 * budget[0][0])
          for p in found]


def fronts(pts: Sequence[Point]) -> dict[str, list[Point]]:
  """{'sent': front, 'received': front}, each by ascending bytes, over the eligible."""
  ok = [p for p in pts if p.eligible]
  return {key: [ok[i] for i in frontier.pareto_front([(getattr(p, key), p.loss) for p in ok])]
          for key in ('sent', 'received')}


def _draw_pareto(pts: Sequence[Point], front: Mapping[str, Sequence[Point]], path: str) -> str:
  families = list(dict.fromkeys(p.family for p in pts))
  color = {f: f'C{i % 10}' for i, f in enumerate(families)}
  fig, axes = plots.figure(2, 6.2, 4.6)
  for ax, key in zip(axes, ('sent', 'received')):
    drawn = [p for p in pts if getattr(p, key) > 0]
    for fam in families:
      for eligible in (True, False):
        mine = [p for p in drawn if p.family == fam and p.eligible == eligible]
        if not mine:
          continue
        xs = [getattr(p, key) for p in mine]
        ys = [p.loss for p in mine]
        err = [[p.loss - p.low for p in mine], [p.high - p.loss for p in mine]]
        ax.errorbar(xs, ys, yerr=err, linestyle='', marker='o' if eligible else 'D',
                    markersize=4, color=color[fam], elinewidth=0.8, capsize=1.5,
                    markerfacecolor=color[fam] if eligible else 'none',
                    label=fam if eligible else f'{fam} (other token budget)')
    members = front[key]
    if members:
      right = max(getattr(p, key) for p in drawn)
      xs, ys = frontier.front_steps([(getattr(p, key), p.loss) for p in members],
                                    range(len(members)), right)
      ax.step(xs, ys, where='post', color='black', linewidth=1, zorder=1,
              label='Pareto front')
      for p in members:
        ax.annotate(p.name, (getattr(p, key), p.loss), fontsize=5, xytext=(3, -7),
                    textcoords='offset points')
    plots.log_axis(ax.xaxis, 'B')
    ax.set_xlabel(f'bytes {key} per worker (whole run)')
    ax.set_ylabel('final eval loss (mean, bars: seed range)')
    ax.grid(True, alpha=0.3)
  found = {}
  for ax in axes:
    for h, label in zip(*ax.get_legend_handles_labels()):
      found.setdefault(label, h)
  fig.legend(list(found.values()), list(found), loc='lower center', fontsize='small',
             ncol=min(len(found), 5))
  rows = math.ceil(len(found) / 5)
  fig.tight_layout(rect=(0, (0.1 + 0.22 * rows) / fig.get_figheight(), 1, 1))
  fig.savefig(path, dpi=110)
  from matplotlib import pyplot      # loaded (on Agg) by plots.figure
  pyplot.close(fig)
  return path


def whole_runs(out: str, finals: Sequence[Final], budget: study.Budget,
               names: Sequence[str], networks: Sequence[str]) -> dict[str, dict[str, float]]:
  """network -> final -> its whole run's simulated seconds there, mean over the seeds
  re-timed (a warm start's with its source run's seconds before it)."""
  return {net: {n: float(np.mean([c[-1][0] for c in cs]))
                for n, cs in time_curves(out, finals, budget, names, net).items()}
          for net in networks}


def front_table(front: Mapping[str, Sequence[Point]], totals: Mapping[str, Mapping[str, float]],
                labels: Mapping[str, str]) -> list[str]:
  """The members of either front: bytes, loss, and the whole run's simulated seconds on
  each network (`totals`: network -> final -> seconds, as `whole_runs`)."""
  nets = list(totals)
  members = {p.name: p for key in ('sent', 'received') for p in front[key]}
  rows = ['| final | on the front of | bytes sent / worker | bytes received / worker | '
          'final eval loss (mean) | ' + ''.join(f'{labels[n]}: whole run | ' for n in nets),
          '|---|---|---|---|---|' + '---|' * len(nets)]
  for p in sorted(members.values(), key=lambda p: p.sent):
    on = ' and '.join(k for k in ('sent', 'received') if p in front[k])
    cells = ''.join(f'{_seconds(totals[n].get(p.name))} | ' for n in nets)
    rows.append(f'| {p.name} | {on} | {report.human_bytes(p.sent)} | '
                f'{report.human_bytes(p.received)} | {p.loss:.4f} | {cells}')
  return rows


# ---- the page's section ---------------------------------------------------------------

def _network_rows(networks: Mapping[str, Mapping[str, Any]], t: Timing | None,
                  reference: str | None, steps: int) -> list[str]:
  """The networks' table, with `reference`'s simulated seconds per inner step on each."""
  per_step = lambda n: (t.total[n].get(reference) if t and n in t.total else None)  # noqa: E731
  rows = ['| network | bandwidth | latency | compute per inner step | '
          + (f'{reference}: simulated seconds per inner step |' if reference else ''),
          '|---|---|---|---|' + ('---|' if reference else '')]
  for n, k in networks.items():
    cell = per_step(n)
    rows.append(f'| {n} | {k["network.bandwidth"] / network_lib.GBIT:g} Gbit/s | '
                f'{k["network.latency"] * 1e3:g} ms | {k["network.step_seconds"]:g} s | '
                + (('—' if cell is None else f'{cell / steps:.3f} s') + ' |'
                   if reference else ''))
  return rows


def section(out: str, g: Mapping[str, Group], finals: Sequence[Final],
            methods: Sequence[Method], budget: study.Budget,
            networks: Mapping[str, Mapping[str, Any]], figures: str, rel: str) -> list[str]:
  """Draws the figures into `figures` and returns the page's lines for them (`g`: the
  finals' groups as `offset_warm_starts` leaves them; `rel`: `figures` from the page).
  `networks`: name -> the homogeneous network's keys (bandwidth, latency, step_seconds)."""
  paths = figure_paths(figures)
  os.makedirs(figures, exist_ok=True)
  labels = {n: network_label(k) for n, k in networks.items()}
  names = time_names(finals, methods)
  timed = {net: per for net in networks
           if (per := time_curves(out, finals, budget, names, net))}
  t = timing(timed) if timed else None
  reference = names[0] if names else None          # the first method: DDP
  sent = g[reference].bytes_sent / budget.steps if reference in g else None
  lines = ['## Choosing a method: loss against simulated time, and against bytes', '',
           *_network_rows(networks, t, reference, budget.steps), '',
           'Every synchronous final is re-timed on each network (`loco.retime`: a replay of '
           'its comms.jsonl through the network clock, no training). The compute per inner '
           'step is claim 9\'s, one compute model for both simulated-time figures. A ring '
           'all-reduce over M workers pays the latency 2 (M - 1) times and moves 2 (M - 1) / M '
           'of the payload over each link'
           + (f'; {reference} sends {report.human_bytes(sent)} per worker per step, so at '
              'these latencies its collective is mostly latency, and what separates the '
              'networks here is latency x syncs: bandwidth decides at the papers\' model sizes '
              '(`python -m loco.overlap_model`)' if sent else '') + '. These figures need no '
           'training: the page\'s command with `--page_only` re-times the finished finals '
           'where a network is missing and redraws them.', '']
  if t is not None:
    plots.curve_panels([(labels[n], per) for n, per in timed.items()], paths['time'],
                       'simulated seconds (log)')
    _draw_time_to_target(t, labels, paths['time_to_target'])
    lines += [f'![loss against simulated time]({rel}/{FIGURES["time"]})', '',
              'In-loop eval loss (seeds: mean, band lowest to highest) against simulated '
              'seconds, one panel per network: each method\'s own final at its pick, the '
              'codec variants and the warm starts, whose seconds begin where the run they '
              'started from, re-timed on the same network, reached their checkpoint.', '',
              f'![time to target]({rel}/{FIGURES["time_to_target"]})', '',
              f'Simulated seconds to eval loss {t.target:.3f} (the highest last eval of '
              'these finals, so each reaches it) and for the whole run, mean over seeds; '
              'the fastest to the target per network in bold.', '',
              *time_table(t, labels, g), '']
  else:
    lines += ['No final is re-timed on these networks yet: the same command re-times '
              'the finished ones (also with --page_only).', '']
  pts = points(g, finals, methods)
  front = fronts(pts)
  if any(p.eligible for p in pts):
    _draw_pareto(pts, front, paths['pareto'])
    silent = [p.name for p in pts if p.sent <= 0]
    off = [p.name for p in pts if not p.eligible and p.sent > 0]
    lines += [f'![loss against bytes]({rel}/{FIGURES["pareto"]})', '',
              'Final eval loss (mean over seeds, bars lowest to highest) against bytes per '
              'worker over the whole run, sent (left) and received (right), every final of '
              'this page, one colour per algorithm; the step line is the Pareto front (no '
              'other final has both fewer bytes and a lower loss) over the finals at the '
              'page\'s token budget. Warm starts count the bytes of their DDP phase. '
              + (f'Not on the front (another token budget; hollow): {", ".join(off)}. '
                 if off else '')
              + (f'Sending nothing (not drawn on the log axis): {", ".join(silent)}.'
                 if silent else ''), '',
              *front_table(front, whole_runs(out, finals, budget, list({
                  p.name for k in front for p in front[k]}), list(networks)), labels), '']
  else:
    lines += ['No final is scored yet: the Pareto front follows.', '']
  return lines
