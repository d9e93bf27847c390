"""Shared plots (matplotlib on the Agg backend, no display needed): learning curves over
seeds (the claims page), eval loss against each x axis and per network (loco.report)."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

Curve = Sequence[tuple[float, float]]     # [(x, loss)] of one run


def _pyplot():
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  return plt


def figure(panels: int, width: float = 5.0, height: float = 3.6, rows: int = 1):
  """(fig, axes): `panels` axes of `width` x `height` inches each, in `rows` rows filled
  row by row (a row of them by default)."""
  cols = -(-panels // rows)
  fig, axes = _pyplot().subplots(rows, cols, figsize=(width * cols, height * rows),
                                 squeeze=False)
  return fig, [ax for row in axes for ax in row][:panels]


def seed_curves(ax, series: Mapping[str, Sequence[Curve]], xlabel: str,
                ylabel: str = 'eval loss (nats/token)', title: str = '') -> None:
  """One colour per name: the mean over seeds where their x values agree (tokens,
  steps), with a band from the lowest to the highest seed; each seed's own curve, thin,
  where they do not (simulated seconds)."""
  for i, (name, curves) in enumerate(series.items()):
    curves = [c for c in curves if len(c)]
    if not curves:
      continue
    color = f'C{i % 10}'
    n = min(len(c) for c in curves)
    xs = np.array([[x for x, _ in c[:n]] for c in curves])
    ys = np.array([[y for _, y in c[:n]] for c in curves])
    if np.allclose(xs, xs[0]):
      ax.plot(xs[0], ys.mean(axis=0), color=color, marker='o', markersize=2.5,
              label=f'{name} ({len(curves)} seeds)')
      if len(curves) > 1:
        ax.fill_between(xs[0], ys.min(axis=0), ys.max(axis=0), color=color, alpha=0.2,
                        linewidth=0)
    else:
      for k, c in enumerate(curves):
        ax.plot([x for x, _ in c], [y for _, y in c], color=color, linewidth=1,
                label=f'{name} ({len(curves)} seeds)' if k == 0 else None)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if title:
    ax.set_title(title)
  if ax.lines:
    ax.legend(fontsize=7)


def save(fig, path: str, dpi: int = 90) -> None:
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  _pyplot().close(fig)


Series = Sequence[tuple[str, Sequence[Mapping[str, Any]]]]   # (label, its eval rows)
# (label, the eval rows of each of its runs): one run, or the seeds of one setting.
Groups = Sequence[tuple[str, Sequence[Sequence[Mapping[str, Any]]]]]

LINESTYLES = ('-', '--', '-.', ':')
MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X')


def style(i: int, n: int) -> dict[str, Any]:
  """How line i of n is drawn so that curves which coincide all stay visible: its own
  colour, line style and hollow marker shape, and each line drawn over the ones before
  it, thinner, so an earlier line shows as a rim around a later one on top of it."""
  return dict(color=f'C{i % 10}', linestyle=LINESTYLES[i % len(LINESTYLES)],
              marker=MARKERS[i % len(MARKERS)], markerfacecolor='none', markersize=5,
              linewidth=1.0 + 2.0 * (n - 1 - i) / max(n - 1, 1), zorder=2 + i)


def si(x: float, unit: str = '') -> str:
  """A tick label in SI steps: 1500000 -> '1.5M', with unit 'B' -> '1.5 MB'."""
  for prefix, scale in (('G', 1e9), ('M', 1e6), ('k' if unit != 'B' else 'K', 1e3)):
    if abs(x) >= scale:
      return f'{x / scale:g} {prefix}{unit}' if unit else f'{x / scale:g}{prefix}'
  return f'{x:g} {unit}' if unit else f'{x:g}'


def _draw_group(ax, key: str, label: str, runs: Sequence[Sequence[Mapping[str, Any]]],
                look: Mapping[str, Any]) -> None:
  """One run as a line; seeds of one setting as their mean with a band from the
  lowest to the highest seed where their x values agree, else each seed thin."""
  curves = [([r.get(key) or 0 for r in rows], [r['eval_loss'] for r in rows])
            for rows in runs if rows]
  if len(curves) == 1:
    ax.plot(*curves[0], label=label, **look)
    return
  n = min(len(xs) for xs, _ in curves)
  xs = np.array([c[0][:n] for c in curves], dtype=float)
  ys = np.array([c[1][:n] for c in curves], dtype=float)
  if np.allclose(xs, xs[0]):
    ax.plot(xs[0], ys.mean(axis=0),
            label=f'{label} (mean of {len(curves)} seeds, band: min-max)', **look)
    ax.fill_between(xs[0], ys.min(axis=0), ys.max(axis=0), color=look['color'],
                    alpha=0.18, linewidth=0, zorder=1)
  else:   # e.g. simulated seconds with seeded stragglers: no common x to average at
    thin = dict(look, linewidth=1.0, markersize=3)
    for k, (x, y) in enumerate(curves):
      ax.plot(x, y, label=f'{label} ({len(curves)} seeds)' if k == 0 else None, **thin)


def against_axes(groups: Groups, out_dir: str,
                 axes: Sequence[tuple[str, str, str]], target: float | None = None
                 ) -> list[str]:
  """One PNG per (metrics key, file name, x label) of `axes`: eval loss against that
  key, one line per run or seed group (`style`; seeds as mean and min-max band). The
  simulated-seconds plot only if some run has sim_seconds > 0; bytes on a log axis
  when every value is positive, labelled in KB/MB/GB; `target` as a dashed line."""
  if not groups:
    return []
  from matplotlib import ticker
  os.makedirs(out_dir, exist_ok=True)
  written = []
  for key, filename, xlabel in axes:
    values = [r.get(key) or 0 for _, group in groups for rows in group for r in rows]
    if key == 'sim_seconds' and not any(v > 0 for v in values):
      continue
    fig, (ax,) = figure(1, 7, 4.5)
    for i, (label, group) in enumerate(groups):
      _draw_group(ax, key, label, group, style(i, len(groups)))
    if key == 'bytes_sent':
      if all(v > 0 for v in values):
        ax.set_xscale('log')
      ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: si(x, 'B')))
    elif key == 'tokens':
      ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: si(x)))
    if target is not None:
      ax.axhline(target, color='gray', linestyle='--', linewidth=1, zorder=1,
                 label=f'target {target:.4f}')
    ax.set(xlabel=xlabel, ylabel='eval loss (nats/token, worker-averaged model)',
           title=f'eval loss vs {xlabel}')
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize='small')
    path = os.path.join(out_dir, filename)
    save(fig, path, dpi=110)
    written.append(path)
  return written


def network_panels(panels: Sequence[tuple[str, Series]], path: str,
                   target: float | None = None) -> str | None:
  """One panel per network: eval loss of every run against simulated seconds (a log
  axis when all are positive), one colour, line style and marker per run across
  panels, a shared legend."""
  if not panels:
    return None
  plt = _pyplot()
  from matplotlib import ticker
  runs = list(dict.fromkeys(label for _, series in panels for label, _ in series))
  looks = {name: style(i, len(runs)) for i, name in enumerate(runs)}
  cols = min(3, len(panels))
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), sharey=True,
                           squeeze=False)
  for ax, (network, series) in zip(axes.flat, panels):
    for label, evals in series:
      ax.plot([r.get('sim_seconds') or 0 for r in evals], [r['eval_loss'] for r in evals],
              label=label, **looks[label])
    if target is not None:
      ax.axhline(target, color='gray', linestyle='--', linewidth=1)
    if all((r.get('sim_seconds') or 0) > 0 for _, evals in series for r in evals):
      ax.set_xscale('log')
      ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f'{x:g}'))
      ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_title(network, fontsize='medium')
    ax.set_xlabel('simulated seconds')
    ax.grid(True, alpha=0.3)
  for ax in axes.flat[len(panels):]:
    ax.axis('off')
  for ax in axes[:, 0]:
    ax.set_ylabel('eval loss (nats/token)')
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='lower center', ncol=min(len(labels), 6),
             fontsize='small')
  fig.tight_layout(rect=(0, 0.4 / fig.get_figheight(), 1, 1))
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def log_axis(axis, unit: str = '') -> None:
  """A log axis of the data drawn so far, labelled in SI steps (`si`): at 1, 2 and 5 of
  each decade where it spans under two decades (so a short range still has labels), at
  each decade otherwise."""
  from matplotlib import ticker
  if axis is axis.axes.xaxis:
    axis.axes.set_xscale('log')
  else:
    axis.axes.set_yscale('log')
  low, high = axis.get_data_interval()
  short = 0 < low and high < 100 * low
  axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0) if short else (1.0,)))
  axis.set_major_formatter(ticker.FuncFormatter(lambda x, _: si(x, unit)))
  axis.set_minor_formatter(ticker.NullFormatter())


def _seed_band(ax, name: str, curves: Sequence[Curve], look: Mapping[str, Any]) -> None:
  """The mean over seeds with a lowest-to-highest band where their x values agree, else
  each seed thin (as `seed_curves`), in `look`."""
  curves = [c for c in curves if len(c)]
  if not curves:
    return
  n = min(len(c) for c in curves)
  xs = np.array([[x for x, _ in c[:n]] for c in curves], dtype=float)
  ys = np.array([[y for _, y in c[:n]] for c in curves], dtype=float)
  seeds = f'{len(curves)} seed{"s" * (len(curves) > 1)}'
  if np.allclose(xs, xs[0]):
    ax.plot(xs[0], ys.mean(axis=0), label=f'{name} ({seeds})', **look)
    if len(curves) > 1:
      ax.fill_between(xs[0], ys.min(axis=0), ys.max(axis=0), color=look['color'],
                      alpha=0.15, linewidth=0, zorder=1)
  else:
    thin = dict(look, linewidth=1.0, markersize=3)
    for k, c in enumerate(curves):
      ax.plot([x for x, _ in c], [y for _, y in c], label=f'{name} ({seeds})' if k == 0
              else None, **thin)


def curve_panels(panels: Sequence[tuple[str, Mapping[str, Sequence[Curve]]]], path: str,
                 xlabel: str, ylabel: str = 'eval loss (nats/token)',
                 targets: Mapping[str, float] | None = None, log_x: bool = True
                 ) -> str | None:
  """One panel per (title, {name: per-seed curves}), side by side with a shared y axis:
  each name in the same colour, line style and marker in every panel (`style`), seeds as
  their mean with a min-max band, a shared legend below; x on a log axis where every x is
  positive (`log_x`), `targets[title]` as a dashed line. None if there is no panel."""
  if not panels:
    return None
  plt = _pyplot()
  names = list(dict.fromkeys(n for _, series in panels for n in series))
  looks = {n: dict(style(i, len(names)), markersize=3) for i, n in enumerate(names)}
  fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), sharey=True,
                           squeeze=False)
  handles = {}
  for ax, (title, series) in zip(axes[0], panels):
    for n, curves in series.items():
      _seed_band(ax, n, curves, looks[n])
    xs = [x for curves in series.values() for c in curves for x, _ in c]
    if log_x and xs and min(xs) > 0:
      log_axis(ax.xaxis)
    if targets and title in targets:
      ax.axhline(targets[title], color='gray', linestyle='--', linewidth=1, zorder=1)
    ax.set_title(title, fontsize='medium')
    ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)
    for h, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, h)
  axes[0][0].set_ylabel(ylabel)
  fig.legend(list(handles.values()), list(handles), loc='lower center',
             ncol=min(len(handles), 4), fontsize='small')
  rows = math.ceil(len(handles) / 4)
  fig.set_figheight(3.8 + 0.22 * rows)
  fig.tight_layout(rect=(0, (0.1 + 0.22 * rows) / fig.get_figheight(), 1, 1))
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
