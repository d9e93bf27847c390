"""Metrics: the metrics.jsonl schema (DESIGN §6), TensorBoard events, a progress bar."""

import json
import math
import os
import sys
import time
from typing import IO, Any, Iterable

# Keys that measure this process rather than the run; they differ between an
# interrupted-and-resumed run and an uninterrupted one.
TIMING_KEYS = ('tokens_per_second', 'wall_seconds')


class MetricsWriter:
  """Appends one JSON object per log step to metrics.jsonl and mirrors scalars to TensorBoard.

  Every write is flushed before it returns, and TensorBoard events are written
  synchronously: an OS error (a full disk, a read-only file system) surfaces in `write`
  as an OSError instead of killing a background thread and blocking the run.
  """

  def __init__(self, workdir: str, resume_step: int = 0, note=None):
    from tensorboardX.event_file_writer import EventsWriter  # no TensorFlow needed
    self.path = os.path.join(workdir, 'metrics.jsonl')
    # A resumed run redoes the steps after its checkpoint; drop their old lines so the
    # file reads as one uninterrupted run. Write-then-rename: a crash leaves either file.
    if os.path.exists(self.path):
      records, problem = read_metrics_checked(workdir)
      if problem and note:
        note(f'{problem} (a crash while writing it); the run goes on without it.')
      write_jsonl(self.path, [r for r in records if r['step'] <= resume_step])
    self._file = open(self.path, 'a')
    os.makedirs(os.path.join(workdir, 'tensorboard'), exist_ok=True)
    self._tb = EventsWriter(os.path.join(workdir, 'tensorboard', 'events'))

  def write(self, record: dict[str, Any]) -> None:
    append_jsonl(self._file, [record])
    from tensorboardX import summary
    from tensorboardX.proto import event_pb2
    values = [summary.scalar(key, value).value[0] for key, value in record.items()
              if key != 'step' and isinstance(value, (int, float))
              and not isinstance(value, bool) and math.isfinite(value)]
    self._tb.write_event(event_pb2.Event(
        wall_time=time.time(), step=int(record['step']), summary=summary.Summary(value=values)))
    self._tb.flush()

  def close(self) -> None:
    self._file.close()
    self._tb.close()


def write_jsonl(path: str, records: Iterable[Any]) -> None:
  """Writes one JSON value per line through a temporary file and a rename."""
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def append_jsonl(file: IO[str], records: Iterable[Any]) -> None:
  """Appends one JSON value per line to an open file and syncs it to disk."""
  try:
    file.writelines(json.dumps(r) + '\n' for r in records)
    file.flush()
    os.fsync(file.fileno())
  except OSError as e:   # name the file: a failed write() does not
    raise OSError(e.errno, e.strerror, file.name) from e


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

  def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True):
    self.total, self.start = total_steps, start_step
    self.enabled = enabled
    self.stream = sys.stderr
    self.tty = getattr(self.stream, 'isatty', lambda: False)()
    self._first: tuple[int, float] | None = None   # (step, time) of the first update
    self._last_plain = 0.0

  def update(self, step: int, loss: float, tokens_per_second: float,
             eval_loss: float | None = None, step_seconds: float | None = None) -> None:
    """Shows one update; `step_seconds` (the last chunk's, compilation excluded) gives
    the ETA until there are two updates to measure from."""
    if not self.enabled:
      return
    now = time.time()
    if self._first is None:
      self._first = (step, now)
    first_step, first_time = self._first
    if step > first_step:
      eta = (now - first_time) / (step - first_step) * (self.total - step)
    elif step_seconds is not None:
      eta = step_seconds * (self.total - step)
    else:
      eta = float('nan')
    frac = step / max(1, self.total)
    bar = '#' * int(20 * frac) + '-' * (20 - int(20 * frac))
    text = (f'[{bar}] step {step}/{self.total}  loss {loss:.3f}  '
            f'{tokens_per_second:,.0f} tok/s  ETA {duration(eta)}')
    if eval_loss is not None:
      text += f'  eval {eval_loss:.3f}'
    if self.tty:
      self.stream.write('\r' + text + ' ' * 4)
    elif time.time() - self._last_plain > 10 or step >= self.total or eval_loss is not None:
      self._last_plain = time.time()
      self.stream.write(text + '\n')
    self.stream.flush()

  def close(self) -> None:
    if self.enabled and self.tty:
      self.stream.write('\n')
      self.stream.flush()


def duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
