"""Progress of several runs at once: one line per run with its step, loss and ETA.

  running diloco/seed=0  step 40/100  loss 3.123  eval 3.201  eta 0:01:02

`loco.sweep` follows each running run's metrics.jsonl (`Follower`), so it learns a run's
progress from the run's record without touching the training loop; `loco.batched` hands
its runs' rows to `RunsProgress`. A `Board` shows the lines. On a terminal it keeps them
below everything printed so far and redraws them in place (the cursor moves up over
them and clears to the end of the screen), so it is only used where nothing else
writes to that terminal: the sweep's runs write to their logs. Anywhere else (a log
file, a pipe) it prints every line once every `every` seconds.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from typing import IO, Any, Mapping, Sequence

from loco.files import runs as runs_lib
from loco.errors import RunFileError
from loco.files.metrics import duration


class Tracker:
  """One run's progress from its metrics rows: the latest step, losses and an ETA.

  The ETA is the wall time per unit of progress since this tracker first saw a row
  (what this process measured, evals and checkpoints included), times what is left; with
  one row seen, the row's own tokens per second. Progress is the row's tokens out of
  `total_tokens` when known (the asynchronous replay's ticks are not inner steps, its
  tokens are), else its step out of `total_steps`.
  """

  def __init__(self, started: float, total_steps: int | None = None,
               total_tokens: int | None = None, ticks: bool = False):
    self.started = started
    self.total_steps, self.total_tokens, self.ticks = total_steps, total_tokens, ticks
    self.row: dict[str, Any] | None = None
    self.eval_loss: float | None = None
    self._base: tuple[float, float] | None = None   # (fraction, time) of the first row
    self._last: tuple[float, float] | None = None   # ... of the latest row

  def fraction(self, row: Mapping[str, Any]) -> float | None:
    tokens, step = row.get('tokens'), row.get('step')
    if self.total_tokens and runs_lib.is_number(tokens):
      return min(1.0, tokens / self.total_tokens)
    if self.total_steps and runs_lib.is_number(step):
      return min(1.0, step / self.total_steps)
    return None

  def add(self, row: Mapping[str, Any], now: float) -> None:
    """Takes the next metrics row, seen at time `now`."""
    if not runs_lib.is_number(row.get('step')):
      return
    self.row = dict(row)
    if runs_lib.is_number(row.get('eval_loss')):
      self.eval_loss = float(row['eval_loss'])
    f = self.fraction(row)
    if f is None:
      return
    # Rows read together (a resumed run's earlier rows) give no rate: the baseline is
    # the last of them. A rewritten file (a resume) starts the measurement again.
    if self._base is None or now == self._base[1] or f < self._last[0]:
      self._base = (f, now)
    self._last = (f, now)

  def eta(self, now: float) -> float:
    """Seconds left (nan when unknown)."""
    if self.row is None or self._last is None:
      return math.nan
    (f0, t0), (f1, t1) = self._base, self._last
    if f1 >= 1.0:
      return 0.0
    if f1 > f0 and t1 > t0:
      left = (t1 - t0) / (f1 - f0) * (1.0 - f1)
    else:
      rate, tokens, step = (self.row.get(k) for k in ('tokens_per_second', 'tokens', 'step'))
      if not (runs_lib.is_number(rate) and rate > 0 and runs_lib.is_number(tokens)):
        return math.nan
      if self.total_tokens:
        left = (self.total_tokens - tokens) / rate
      elif self.total_steps and step > 0:
        left = (self.total_steps - step) * tokens / step / rate
      else:
        return math.nan
    return max(0.0, left - (now - t1))

  def text(self, now: float) -> str:
    """'step 40/100  loss 3.123  eval 3.201  eta 0:01:02', or 'starting 0:00:35' (the
    time since the run started) before its first row."""
    if self.row is None:
      return f'starting {duration(now - self.started)}'
    step = self.row['step']
    if self.ticks:
      f = self.fraction(self.row)
      where = f'tick {step}' + (f' ({100 * f:.0f}%)' if f is not None else '')
    else:
      where = f'step {step}/{self.total_steps}' if self.total_steps else f'step {step}'
    parts = [where]
    if runs_lib.is_number(self.row.get('train_loss')):
      parts.append(f'loss {self.row["train_loss"]:.3f}')
    if self.eval_loss is not None:
      parts.append(f'eval {self.eval_loss:.3f}')
    eta = self.eta(now)
    parts.append(f'eta {duration(round(eta) if math.isfinite(eta) else eta)}')
    return '  '.join(parts)


class Follower:
  """A run directory's progress, read from its metrics.jsonl as the run appends to it.

  Reads only what was appended since the last `poll` (a resume rewrites the file: then
  it is read again from the start) and the run's config.json once, for the totals. A
  missing, damaged or half-written file is simply not progress yet.
  """

  def __init__(self, workdir: str, started: float):
    self.workdir = workdir
    self.tracker = Tracker(started)
    self._configured = False
    self._inode: int | None = None
    self._offset = 0
    self._partial = b''

  def poll(self, now: float) -> None:
    path = os.path.join(self.workdir, runs_lib.METRICS)
    try:
      st = os.stat(path)
      if st.st_ino != self._inode or st.st_size < self._offset:
        self._inode, self._offset, self._partial = st.st_ino, 0, b''
      if st.st_size == self._offset:
        return
      with open(path, 'rb') as f:
        f.seek(self._offset)
        data = f.read()
    except OSError:
      return
    self._offset += len(data)
    *lines, self._partial = (self._partial + data).split(b'\n')
    if not self._configured:
      self._configure()
    for line in lines:
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if isinstance(row, dict):
        self.tracker.add(row, now)

  def _configure(self) -> None:
    """The totals from config.json (loco.main writes it before the first row)."""
    try:
      stored = runs_lib.read_config(self.workdir)
    except (OSError, RunFileError):
      return
    if stored is None:
      return
    self._configured = True
    config = stored.get('config') or {}
    steps = config.get('steps')
    sizes = [config.get(k) for k in ('steps', 'num_workers', 'batch_per_worker', 'seq_len')]
    self.tracker.total_steps = steps
    if all(isinstance(x, int) and x > 0 for x in sizes):
      self.tracker.total_tokens = math.prod(sizes)
    self.tracker.ticks = (config.get('network') or {}).get('mode') == 'async'

  def text(self, now: float) -> str:
    return self.tracker.text(now)


class Board:
  """Shows a set of progress lines below the other lines a command prints.

  On a terminal (`tty`), `show` redraws the lines in place (at most once a second unless
  they changed) and `say` prints a line above them. Elsewhere `show` prints the lines
  once every `every` seconds (or at once with `force`) and `say` prints its line.
  `every=0` shows no progress lines at all.
  """

  def __init__(self, stream: IO[str], every: float, tty: bool | None = None,
               now: float | None = None):
    self.stream, self.every = stream, every
    self.tty = getattr(stream, 'isatty', lambda: False)() if tty is None else tty
    self._lines: list[str] = []
    self._drawn = 0                  # lines of the block now on the terminal
    self._last = time.time() if now is None else now

  def say(self, text: str) -> None:
    """Prints one line above the progress lines."""
    if self._drawn:
      self._erase()
      self.stream.write(text + '\n')
      self._draw()
    else:
      self.stream.write(text + '\n')
    self.stream.flush()

  def show(self, lines: Sequence[str], now: float | None = None, force: bool = False) -> None:
    """Replaces the progress lines, and prints them if it is time to."""
    if self.every <= 0:
      return
    now = time.time() if now is None else now
    lines = list(lines)
    if self.tty:
      if lines != self._lines or now - self._last >= 1.0 or force:
        self._lines, self._last = lines, now
        self._erase()
        self._draw()
        self.stream.flush()
    elif force or now - self._last >= self.every:
      self._lines, self._last = lines, now
      self.stream.write(''.join(line + '\n' for line in lines))
      self.stream.flush()

  def close(self) -> None:
    """Takes the progress lines off the terminal (the lines said stay)."""
    if self._drawn:
      self._erase()
      self.stream.flush()
    self._lines = []

  def _erase(self) -> None:
    if self._drawn:   # up to the block's first line, then clear to the end of the screen
      self.stream.write(f'\x1b[{self._drawn}A\r\x1b[J')
      self._drawn = 0

  def _draw(self) -> None:
    # A line wider than the terminal would wrap and the cursor move above would miss it.
    width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
    self.stream.write(''.join(line[:width] + '\n' for line in self._lines))
    self._drawn = len(self._lines)


class RunsProgress:
  """The progress of runs trained together (`loco.batched`): one line per run, printed
  on stderr every `every` seconds and at each eval and the last step.

  The runs' own notes go to the same stream, so the lines are printed, never redrawn in
  place.
  """

  def __init__(self, workdirs: Sequence[str], total_steps: int, enabled: bool = True,
               every: float = 10.0, stream: IO[str] | None = None):
    now = time.time()
    self.names = short_names(workdirs)
    self.trackers = [Tracker(now, total_steps) for _ in workdirs]
    self.width = max(map(len, self.names))
    self.board = Board(stream or sys.stderr, every if enabled else 0,
                       tty=False, now=now)

  def update(self, records: Mapping[int, Mapping[str, Any]], now: float | None = None) -> None:
    """Takes the new metrics row of each run that has one ({run index: row})."""
    if not records:
      return
    now = time.time() if now is None else now
    for i, row in records.items():
      self.trackers[i].add(row, now)
    last = any(t.row is not None and t.total_steps and t.row['step'] >= t.total_steps
               for t in self.trackers)
    evals = any('eval_loss' in row for row in records.values())
    self.board.show([f'{n:<{self.width}}  {t.text(now)}'
                     for n, t in zip(self.names, self.trackers)], now, force=evals or last)

  def close(self) -> None:
    self.board.close()


def short_names(workdirs: Sequence[str]) -> list[str]:
  """The workdirs relative to the folder they share ('a/seed=0', 'b'); a seed's folder
  keeps its run's name ('x/seed=0', not 'seed=0')."""
  paths = [os.path.normpath(w) for w in workdirs]
  try:
    base = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
  except ValueError:   # absolute and relative paths mixed
    return paths
  if any(os.path.dirname(p) == base and os.path.basename(p).startswith('seed=')
         for p in paths):
    base = os.path.dirname(base)
  return [os.path.relpath(p, base) if base else p for p in paths]
