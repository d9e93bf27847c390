"""Metrics: the metrics.jsonl schema (DESIGN §6), TensorBoard events, a progress bar."""

import json
import math
import os
import sys
import time
from typing import Any

# Keys that measure this process rather than the run; they differ between an
# interrupted-and-resumed run and an uninterrupted one.
TIMING_KEYS = ('tokens_per_second', 'wall_seconds')


class MetricsWriter:
  """Appends one JSON object per log step to metrics.jsonl and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str, resume_step: int = 0, tensorboard: bool = True):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self._truncate_after(resume_step)
    self._file = open(self.path, 'a')
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # writes event files without TensorFlow
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))

  def _truncate_after(self, step: int) -> None:
    # A resumed run redoes the steps after its checkpoint; drop their old lines so the
    # file reads as one uninterrupted run.
    if not os.path.exists(self.path):
      return
    with open(self.path) as f:
      kept = [line for line in f if line.strip() and json.loads(line)['step'] <= step]
    with open(self.path, 'w') as f:
      f.writelines(kept)

  def write(self, record: dict[str, Any]) -> None:
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()
    if self._tb is not None:
      for key, value in record.items():
        if key != 'step' and isinstance(value, (int, float)) and math.isfinite(value):
          self._tb.add_scalar(key, value, record['step'])

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """The records of a workdir's metrics.jsonl (lines that are not records are dropped)."""
  return read_metrics_checked(workdir)[0]


def read_metrics_checked(workdir: str) -> tuple[list[dict[str, Any]], str | None]:
  """(records, problem): the good records of metrics.jsonl and what was wrong, if any.

  A line that is not a JSON object with a `step` (a torn last line after a crash, or a
  corrupted one) is left out and named in `problem`.
  """
  records, bad = [], []
  with open(os.path.join(workdir, 'metrics.jsonl'), errors='replace') as f:
    lines = [line for line in f if line.strip()]
  for number, line in enumerate(lines, 1):
    try:
      record = json.loads(line)
    except ValueError:
      record = None
    if isinstance(record, dict) and 'step' in record:
      records.append(record)
    else:
      bad.append(number)
  if not bad:
    return records, None
  if bad == [len(lines)]:
    return records, f'metrics.jsonl line {bad[0]} (the last) is torn and was left out'
  return records, (f'metrics.jsonl has {len(bad)} unreadable line(s) (first: line {bad[0]}), '
                   'left out')


class ProgressBar:
  """One terminal line: step, loss, tokens/s and ETA (a plain line per update off a tty)."""

  def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True,
               stream=None):
    self.total, self.start = total_steps, start_step
    self.enabled = enabled
    self.stream = stream or sys.stderr
    self.tty = getattr(self.stream, 'isatty', lambda: False)()
    self.t0 = time.time()
    self._last_plain = 0.0

  def update(self, step: int, loss: float, tokens_per_second: float,
             eval_loss: float | None = None) -> None:
    if not self.enabled:
      return
    done = step - self.start
    elapsed = time.time() - self.t0
    eta = elapsed / done * (self.total - step) if done > 0 else float('nan')
    frac = step / max(1, self.total)
    bar = '#' * int(20 * frac) + '-' * (20 - int(20 * frac))
    text = (f'[{bar}] step {step}/{self.total}  loss {loss:.3f}  '
            f'{tokens_per_second:,.0f} tok/s  ETA {_duration(eta)}')
    if eval_loss is not None:
      text += f'  eval {eval_loss:.3f}'
    if self.tty:
      self.stream.write('\r' + text + ' ' * 4)
      self.stream.flush()
    elif time.time() - self._last_plain > 10 or step >= self.total or eval_loss is not None:
      self._last_plain = time.time()
      self.stream.write(text + '\n')
      self.stream.flush()

  def close(self) -> None:
    if self.enabled and self.tty:
      self.stream.write('\n')
      self.stream.flush()


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
