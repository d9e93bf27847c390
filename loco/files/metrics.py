"""Metrics: the metrics.jsonl schema (DESIGN §6), its sinks (TensorBoard, W&B), a progress bar.

Every row goes to metrics.jsonl first, the record, then to each `Sink`. To send rows to
another logger, write a class with `write(record)` and `close()` and pass it in
`MetricsWriter(workdir, sinks=[*make_sinks(workdir, SinkConfig()), MySink()])`.
"""

import dataclasses
import hashlib
import json
import math
import os
import re
import socket
import sys
import time
from typing import IO, Any, Iterable, Protocol, Sequence

from loco.files import runs
from loco.errors import ConfigError

# Keys that measure this process rather than the run; they differ between an
# interrupted-and-resumed run and an uninterrupted one.
TIMING_KEYS = ('tokens_per_second', 'wall_seconds')


class Sink(Protocol):
  """Where a metrics row goes besides metrics.jsonl: TensorBoard, W&B, or a user's logger.

  `write` gets every row (the dict written to metrics.jsonl, with its `step`) in step
  order; `scalars(record)` gives its plottable numbers. An OSError raised by `write`
  stops the run as a full disk does (the row is already in metrics.jsonl, the record).
  """

  def write(self, record: dict[str, Any]) -> None: ...

  def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class SinkConfig:
  """Which sinks a run writes besides metrics.jsonl (loco/configs/default.py `metrics.*`)."""
  tensorboard: bool = True
  wandb_project: str = ''     # '' = no W&B
  wandb_entity: str = ''
  wandb_mode: str = 'offline'


WANDB_MODES = ('offline', 'online', 'disabled')


class MetricsWriter:
  """Appends one JSON object per log step to metrics.jsonl, then hands it to each sink.

  metrics.jsonl is the record (loco.report, loco.retime and resume read it) and is
  written first, flushed and synced before `write` returns; the sinks (TensorBoard by
  default) mirror it. An OS error in any of them (a full disk, a read-only file system)
  surfaces from `write` as an OSError instead of killing a background thread and
  blocking the run.
  """

  def __init__(self, workdir: str, resume_step: int = 0, note=None,
               sinks: Sequence[Sink] | None = None):
    """Opens metrics.jsonl, dropping the rows after `resume_step` of an earlier run.

    Args:
      workdir: the run directory.
      resume_step: the step the run resumes from (0: a new run).
      note: called with a sentence about a damaged metrics.jsonl, if given.
      sinks: where each row goes after metrics.jsonl; None: TensorBoard under
        workdir/tensorboard/ (`make_sinks(workdir, SinkConfig(), resume_step=...)`).
    """
    self.path = os.path.join(workdir, 'metrics.jsonl')
    # A resumed run redoes the steps after its checkpoint; drop their old lines so the
    # file reads as one uninterrupted run. Write-then-rename: a crash leaves either file.
    if os.path.exists(self.path):
      records, problem = read_metrics_checked(workdir)
      if problem and note:
        note(f'{problem} (a crash while writing it); the run goes on without it.')
      write_jsonl(self.path, [r for r in records if r['step'] <= resume_step])
    self._file = open(self.path, 'a')
    self.sinks = list(make_sinks(workdir, SinkConfig(), resume_step=resume_step)
                      if sinks is None else sinks)

  def write(self, record: dict[str, Any]) -> None:
    append_jsonl(self._file, [record])
    for sink in self.sinks:
      sink.write(record)

  def close(self) -> None:
    """Closes metrics.jsonl and every sink; the first error is raised after all close."""
    closers = [self._file.close] + [sink.close for sink in self.sinks]
    errors = []
    for close in closers:
      try:
        close()
      except Exception as e:  # close the rest first: a failing logger keeps no file open
        errors.append(e)
    if errors:
      raise errors[0]


def make_sinks(workdir: str, config: SinkConfig, run_config: dict[str, Any] | None = None,
               resume_step: int = 0) -> list[Sink]:
  """The sinks `config` asks for (wandb is imported only when a project is set).

  Args:
    workdir: the run directory; TensorBoard writes under workdir/tensorboard/, W&B
      under workdir/wandb/.
    config: which sinks.
    run_config: the experiment's config, shown by W&B with the run.
    resume_step: the step a resumed run restarts from (0: a new run).
  """
  sinks: list[Sink] = []
  if config.tensorboard:
    sinks.append(TensorBoardSink(os.path.join(workdir, 'tensorboard'),
                                 purge_after=resume_step))
  if config.wandb_project and config.wandb_mode != 'disabled':
    sinks.append(WandbSink(workdir, config.wandb_project, mode=config.wandb_mode,
                           entity=config.wandb_entity, run_config=run_config))
  return sinks


def scalars(record: dict[str, Any]) -> dict[str, float]:
  """The finite numbers of a row other than `step` (lists and booleans are left out)."""
  return {key: float(value) for key, value in record.items()
          if key != 'step' and isinstance(value, (int, float))
          and not isinstance(value, bool) and math.isfinite(value)}


class TensorBoardSink:
  """Writes each row's scalars to a TensorBoard event file, synchronously.

  tensorboardX's public `SummaryWriter` writes through a background thread (checked with
  tensorboardX 2.6.5): `add_scalar` puts an event on a queue of `max_queue` items that a
  daemon thread writes, and `flush()` flushes the file without waiting for that queue.
  When a write fails the thread dies with a traceback on stderr and nothing reaches the
  caller: with `max_queue=10` the next `add_scalar` calls block forever once the queue
  fills (the run hangs), with `max_queue=0` (an unbounded queue) every later row is lost
  silently. On a real full disk (a 12 KiB tmpfs) `flush()` raised ENOSPC in the caller
  only when the thread had not already hit it: of three runs with max_queue=0, one
  never raised and lost every later row. The public writer cannot keep the guarantee,
  so this writes the same records itself with tensorboardX's public `RecordWriter` (the
  TFRecord framing) in the caller's thread, and flushes and fsyncs each row: an OS error
  is raised by `write`, naming the event file.
  """

  def __init__(self, logdir: str, purge_after: int = 0):
    """Opens a new event file in `logdir`.

    Args:
      logdir: the directory (workdir/tensorboard/).
      purge_after: the step a resumed run restarts from: TensorBoard hides the earlier
        files' events after it (the steps the run redoes), as metrics.jsonl drops them.
    """
    from tensorboardX import RecordWriter  # no TensorFlow needed
    os.makedirs(logdir, exist_ok=True)
    earlier = any('tfevents' in name for name in os.listdir(logdir))
    # TensorBoard's file name, events.out.tfevents.<seconds>.<host>, made unique: a
    # resume within the same second must not truncate the earlier file.
    stem = os.path.join(logdir, f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}')
    self.path, n = stem, 0
    while os.path.exists(self.path):
      n += 1
      self.path = f'{stem}.{n}'
    self._writer = RecordWriter(self.path)
    self._write(file_version='brain.Event:2')
    if earlier:
      # A SessionLog START at step s makes TensorBoard drop the events at steps >= s
      # that it read before it (what SummaryWriter's purge_step writes).
      self._write(step=purge_after + 1, session_log=dict(status='START'))

  def write(self, record: dict[str, Any]) -> None:
    from tensorboardX.summary import scalar
    values = [scalar(key, value).value[0] for key, value in scalars(record).items()]
    self._write(step=int(record['step']), summary=dict(value=values))

  def _write(self, **event) -> None:
    from tensorboardX.proto import event_pb2
    try:
      self._writer.write(event_pb2.Event(wall_time=time.time(), **event).SerializeToString())
      self._writer.flush()
    except OSError as e:   # name the file: a failed write() does not
      raise OSError(e.errno, e.strerror, e.filename or self.path) from e

  def close(self) -> None:
    self._writer.close()


def wandb_run_id(workdir: str) -> str:
  """The W&B run id of a workdir: the same path gives the same id, so a resumed run
  continues its W&B run."""
  path = os.path.realpath(workdir)
  name = re.sub(r'[^A-Za-z0-9_-]', '-', os.path.basename(path))[:40]
  return f'{name}-{hashlib.sha256(path.encode()).hexdigest()[:12]}'


class WandbSink:
  """Logs each row's scalars to a Weights & Biases run (`pip install -e '.[wandb]'`).

  The run's files go under workdir/wandb/; mode 'offline' needs no network or account
  (`wandb sync workdir/wandb/offline-run-*` uploads it later). W&B writes through its
  own service process, so a disk error there is W&B's to report, not `write`'s.
  """

  def __init__(self, workdir: str, project: str, mode: str = 'offline', entity: str = '',
               run_config: dict[str, Any] | None = None):
    import wandb   # an optional extra: imported only when a run asks for it
    # resume='allow' with an id derived from the workdir: a resumed run continues the
    # same W&B run. The steps it redoes after its checkpoint may be dropped or repeated
    # there (W&B's steps only grow); metrics.jsonl stays the record.
    try:
      self._run = wandb.init(project=project, entity=entity or None, mode=mode, dir=workdir,
                             id=wandb_run_id(workdir), resume='allow',
                             name=os.path.basename(os.path.realpath(workdir)),
                             config=run_config)
    except wandb.errors.Error as e:   # no API key, no network: one line, not a traceback
      raise ConfigError(f'metrics.wandb_mode={mode}: W&B could not start the run: '
                        f'{str(e).rstrip(".")}; metrics.wandb_mode=offline needs no '
                        'account or network.') from e

  def write(self, record: dict[str, Any]) -> None:
    self._run.log(scalars(record), step=int(record['step']))

  def close(self) -> None:
    self._run.finish()


def write_jsonl(path: str, records: Iterable[Any]) -> None:
  """Writes one JSON value per line through a temporary file and a rename."""
  runs.write_atomic(path, ''.join(json.dumps(r) + '\n' for r in records))


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
    self._drawn = 0        # characters of the bar on the terminal's current line

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
      self._drawn = len(text) + 4
    elif time.time() - self._last_plain > 10 or step >= self.total or eval_loss is not None:
      self._last_plain = time.time()
      self.stream.write(text + '\n')
    self.stream.flush()

  def clear(self) -> None:
    """Blanks the bar's line on a terminal, so that a line printed next starts clean
    (the next update draws the bar again)."""
    if self.enabled and self.tty and self._drawn:
      self.stream.write('\r' + ' ' * self._drawn + '\r')
      self.stream.flush()
      self._drawn = 0

  def close(self) -> None:
    if self.enabled and self.tty:
      self.stream.write('\n')
      self.stream.flush()


def duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
