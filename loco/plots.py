"""Shared plots: learning curves over seeds (matplotlib, no display needed)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

Curve = Sequence[tuple[float, float]]     # [(x, loss)] of one run


def figure(panels: int, width: float = 5.0, height: float = 3.6):
  """(fig, axes): a row of `panels` axes on the Agg backend."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, panels, figsize=(width * panels, height), squeeze=False)
  return fig, list(axes[0])


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


def save(fig, path: str) -> None:
  import matplotlib.pyplot as plt
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
