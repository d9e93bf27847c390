"""The run directory: every file name in one place, and the one validated reader.

  runs/x/
    config.json        CONFIG: {'config': the full config, 'model': sizes and FLOPs, ...}
    metrics.jsonl      METRICS: one JSON object per log step (DESIGN §6), steps increasing
    comms.jsonl        COMMS: {"workers": M}, then what each step put on the wire
    status.json        STATUS: written by loco.sweep (state, command, error, seconds, ...)
    log.txt            LOG: a sweep run's output, one '==> loco.sweep attempt N' per launch
    diverged.json      DIVERGED: written by loco.run.train when the run diverged (step, message)
    checkpoints/<step>/  CHECKPOINTS: orbax; a step folder counts once orbax committed it
    tensorboard/       TENSORBOARD: event files
    evals/             EVALS: loco.evaluate results
    retimed/<name>/    RETIMED: loco.retime results, each read like a run
    .lock              LOCK: held by the loco process training here
  sweeps/s/
    sweep.json         SWEEP: the spec's runs and commands; report.md (REPORT) and plots

Tools that read runs (loco.report, loco.retime, loco.sweep) read them only here. A
damaged file is one `RunFileError` sentence naming the file (and line), never a
traceback and never a silently shortened result; the one exception, as when loco
resumes, is a torn last line of metrics.jsonl (a crash mid-write), which is left out
with a note. A run's status comes from these files (status.json's state, diverged.json,
the last metrics step against the configured steps), never from the wording of an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from loco.files import storage
from loco import wire as wire_lib
from loco.errors import RunFileError

CONFIG = 'config.json'
METRICS = 'metrics.jsonl'
COMMS = 'comms.jsonl'
STATUS = 'status.json'
LOG = 'log.txt'
DIVERGED = 'diverged.json'
CHECKPOINTS = 'checkpoints'
TENSORBOARD = 'tensorboard'
EVALS = 'evals'
RETIMED = 'retimed'
PLOTS = 'plots'
LOCK = '.lock'
SWEEP = 'sweep.json'
REPORT = 'report.md'
# Names a sweep's run may not take: its workdir would shadow a file of the sweep or
# of a run (`sweeps/s/sweep.json`, `sweeps/s/a/checkpoints`).
RESERVED = frozenset({CONFIG, METRICS, COMMS, STATUS, LOG, DIVERGED, CHECKPOINTS,
                      TENSORBOARD, EVALS, RETIMED, PLOTS, LOCK, SWEEP, REPORT})

# status.json states (loco.sweep) and the statuses a run can have.
SWEEP_STATES = ('running', 'finished', 'failed', 'interrupted')
STATUSES = ('finished', 'diverged', 'failed', 'interrupted', 'running', 'incomplete')

# The drift diagnostics of the syncs since the row before (loco/comm/drift.py: their
# mean), on the rows of a run with rounds whose chunk synced; absent on the others.
DRIFT_KEYS = ('pg_norm', 'pg_mean_norm', 'pg_cosine', 'consensus_distance')
# metrics.jsonl keys that are numbers when present (DESIGN §6).
NUMBER_KEYS = ('tokens', 'train_loss', 'eval_loss', 'eval_loss_se', 'eval_loss_workers',
               'worker_spread', 'bytes_sent', 'bytes_received', 'peak_bytes', 'syncs',
               'sim_seconds', 'utilization', 'tokens_per_second', 'wall_seconds',
               *DRIFT_KEYS)
NUM_KINDS = len(wire_lib.KINDS)     # none, all-reduce, all-gather, gossip
# Cumulative bytes in metrics.jsonl and the sum over comms.jsonl agree to rounding.
_BYTES_RTOL = 1e-6

# orbax (0.12) writes both into a step folder before the rename that commits it; either
# one counts, so that a bare `checkpoints/45/` (a copy cut short, a crash of another
# tool) is not taken for a checkpoint.
_COMMIT_MARKERS = ('commit_success.txt', '_CHECKPOINT_METADATA')


def is_number(x: Any) -> bool:
  """A JSON number (int or float, not a bool)."""
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


_UMASK = _umask()


def write_atomic(path: str, data: str | bytes, *, sync: bool = True) -> None:
  """Writes `path` whole or not at all: into a new file with a unique name in the same
  directory, created exclusively (so a link planted at a predictable name is never
  followed), synced, then renamed over `path` (a link at `path` itself is replaced, not
  followed). The file gets the usual permissions (0666 less the umask)."""
  try:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or '.',
                               prefix=f'.{os.path.basename(path)}.', suffix='.tmp')
  except OSError as e:     # name the file the caller asked for, not the random one
    raise OSError(e.errno, e.strerror, path) from e
  try:
    os.fchmod(fd, 0o666 & ~_UMASK)
    with os.fdopen(fd, 'wb') as f:
      f.write(data.encode() if isinstance(data, str) else data)
      f.flush()
      if sync:
        os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    if e.filename in (None, tmp):     # name the file the caller asked for
      raise OSError(e.errno, e.strerror, path) from e
    raise
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def read_text(path: str) -> str | None:
  """The file's text, None if it does not exist; unreadable: RunFileError."""
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except FileNotFoundError:
    return None
  except IsADirectoryError:
    raise RunFileError(f'{path} is a directory, not a file.') from None
  except OSError as e:
    raise RunFileError(f'{path} cannot be read: {e.strerror or e}.') from None
  return data.decode('utf-8', errors='replace')


def read_json_object(path: str) -> dict[str, Any] | None:
  """A JSON object file; None if it does not exist, RunFileError if it is not one."""
  text = read_text(path)
  if text is None:
    return None
  try:
    value = json.loads(text)
  except ValueError as e:
    why = 'it is empty' if not text.strip() else f'line {e.lineno}: {e.msg}'
    raise RunFileError(f'{path} is not valid JSON ({why}).') from None
  if not isinstance(value, dict):
    raise RunFileError(f'{path} holds a JSON {type(value).__name__}, not an object.')
  return value


# ---- typed fields: a JSON object a command reads back, checked key by key --------------

def _is_finite(v: Any) -> bool:
  return is_number(v) and math.isfinite(v)


# What a field may hold: a name for the message and a test.
INT = ('a whole number', _is_int)
NUMBER = ('a finite number', _is_finite)
TEXT = ('a string', lambda v: isinstance(v, str))
OBJECT = ('an object', lambda v: isinstance(v, dict))
NUMBERS = ('a list of finite numbers', lambda v: isinstance(v, list) and all(map(_is_finite, v)))
INTS = ('a list of whole numbers', lambda v: isinstance(v, list) and all(map(_is_int, v)))


def optional(kind: tuple[str, Any]) -> tuple[str, Any]:
  """`kind` or null."""
  return (f'{kind[0]} or null', lambda v: v is None or kind[1](v))


def pair(kind: tuple[str, Any]) -> tuple[str, Any]:
  """Two of `kind`, as a list."""
  return (f'a pair of {kind[0].removeprefix("a ").removeprefix("an ")}s',
          lambda v: isinstance(v, list) and len(v) == 2 and all(map(kind[1], v)))


def check_fields(path: str, value: Mapping[str, Any], fields: Mapping[str, tuple[str, Any]],
                 what: str, fix: str) -> None:
  """Raises RunFileError naming the first key of `fields` that `value` lacks or holds
  with the wrong type: 'PATH is not WHAT (no k)' or 'PATH is damaged: k is a str, not
  a whole number', each followed by `fix`."""
  missing = sorted(k for k in fields if k not in value)
  if missing:
    raise RunFileError(f'{path} is not {what} (no {", ".join(missing)}); {fix}')
  for key, (kind, test) in fields.items():
    if not test(value[key]):
      got = 'null' if value[key] is None else f'a {type(value[key]).__name__}'
      if _is_finite(value[key]) or isinstance(value[key], float):
        got = repr(value[key])
      raise RunFileError(f'{path} is damaged: {key} is {got}, not {kind}; {fix}')


def _check(path: str, ok: bool, what: str) -> None:
  if not ok:
    raise RunFileError(f'{path}: {what}.')


# ---- the single files ----------------------------------------------------------------

def read_config(workdir: str) -> dict[str, Any] | None:
  """config.json: {'config': {...}, 'model': {...}, ...}; None if the run has none.

  Raises:
    RunFileError: not JSON, no `config` object, or a key the tools read is of the
      wrong type (steps, num_workers, batch_per_worker, seq_len, seed, algorithm,
      network, model).
  """
  path = os.path.join(workdir, CONFIG)
  stored = read_json_object(path)
  if stored is None:
    return None
  config = stored.get('config')
  _check(path, isinstance(config, dict), "it has no 'config' object (not a loco run's "
         'config.json)')
  for key in ('steps', 'num_workers', 'batch_per_worker', 'seq_len'):
    value = config.get(key)
    _check(path, value is None or (_is_int(value) and value >= 1),
           f'config.{key} is {value!r}, not a whole number >= 1')
  _check(path, config.get('seed') is None or _is_int(config['seed']),
         f"config.seed is {config.get('seed')!r}, not a whole number")
  for key in ('algorithm', 'network'):
    _check(path, config.get(key) is None or isinstance(config[key], dict),
           f'config.{key} is {type(config.get(key)).__name__}, not an object')
  _check(path, stored.get('model') is None or isinstance(stored['model'], dict),
         "'model' is not an object")
  return stored


def read_status(workdir: str) -> dict[str, Any] | None:
  """status.json (loco.sweep); None if the run has none.

  Raises:
    RunFileError: not a JSON object, or a `state` that is not one of SWEEP_STATES, or
      `error`, `command`, `seconds` or `attempts` of the wrong type.
  """
  path = os.path.join(workdir, STATUS)
  status = read_json_object(path)
  if status is None:
    return None
  _check(path, status.get('state') in SWEEP_STATES,
         f"state is {status.get('state')!r}, not one of {', '.join(SWEEP_STATES)}")
  _check(path, status.get('error') is None or isinstance(status['error'], str),
         'error is not text')
  command = status.get('command')
  _check(path, command is None or (isinstance(command, list)
                                   and all(isinstance(c, str) for c in command)),
         'command is not a list of strings')
  _check(path, status.get('seconds') is None or is_number(status['seconds']),
         f"seconds is {status.get('seconds')!r}, not a number")
  _check(path, status.get('attempts') is None or _is_int(status['attempts']),
         f"attempts is {status.get('attempts')!r}, not a whole number")
  return status


def read_diverged(workdir: str) -> dict[str, Any] | None:
  """diverged.json (loco.run.train): {'step', 'message'}; None if the run did not diverge."""
  path = os.path.join(workdir, DIVERGED)
  diverged = read_json_object(path)
  if diverged is None:
    return None
  _check(path, _is_int(diverged.get('step')), f"step is {diverged.get('step')!r}, not a "
         'whole number')
  _check(path, isinstance(diverged.get('message', ''), str), 'message is not text')
  return diverged


def read_sweep(sweep_dir: str) -> dict[str, Any] | None:
  """sweep.json (loco.sweep): {'runs': [{'name', 'command', ...}], 'retimes': {...}};
  None if `sweep_dir` is not a sweep directory."""
  path = os.path.join(sweep_dir, SWEEP)
  sweep = read_json_object(path)
  if sweep is None:
    return None
  entries = sweep.get('runs', [])
  _check(path, isinstance(entries, list) and all(
      isinstance(r, dict) and isinstance(r.get('name'), str) for r in entries),
         "runs is not a list of {'name': ...} objects")
  _check(path, isinstance(sweep.get('retimes', {}), dict), 'retimes is not an object')
  return sweep


def read_error_line(workdir: str) -> str | None:
  """The last `loco: error:` line of the latest attempt in log.txt, else its last line
  (shown to people; a run's status never depends on it)."""
  text = read_text(os.path.join(workdir, LOG))
  if text is None:
    return None
  lines = [line.rstrip() for line in text.splitlines()]
  starts = [i for i, line in enumerate(lines) if line.startswith('==> loco.sweep')]
  lines = [line for line in lines[starts[-1] + 1 if starts else 0:] if line.strip()]
  candidates = [line for line in lines if line.startswith('loco: error:')] or lines
  return candidates[-1].strip() if candidates else None


def is_committed(step_dir: str) -> bool:
  """Whether a `checkpoints/<step>/` folder holds orbax's commit marker: an empty or
  partial folder (an interrupted save or copy) does not."""
  if storage.is_url(storage.native(step_dir)):   # no rename: orbax writes in place, marker last
    return storage.isfile(storage.join(step_dir, _COMMIT_MARKERS[0]))
  step_dir = storage.native(step_dir)
  return any(os.path.isfile(os.path.join(step_dir, marker)) for marker in _COMMIT_MARKERS)


def committed_in(directory: str) -> list[int]:
  """The committed steps of a checkpoints folder, sorted (in-flight
  `<step>.orbax-checkpoint-tmp-*` folders and bare step folders are not checkpoints)."""
  try:
    names = storage.listdir(directory) if storage.is_url(directory) else os.listdir(directory)
  except (FileNotFoundError, NotADirectoryError):
    return []
  except OSError as e:
    raise RunFileError(f'{directory} cannot be read: {e.strerror or e}.') from None
  return sorted(int(n) for n in names
                if n.isdigit() and is_committed(storage.join(directory, n)))


def committed_steps(workdir: str) -> list[int]:
  """The steps of the run's checkpoints/ that orbax committed, sorted."""
  return committed_in(os.path.join(workdir, CHECKPOINTS))


# ---- the line files --------------------------------------------------------------------

def _lines(path: str) -> Iterator[tuple[int, str]]:
  """(line number, text) of the non-blank lines of a file that exists."""
  text = read_text(path)
  for number, line in enumerate((text or '').splitlines(), 1):
    if line.strip():
      yield number, line


def _parse_lines(path: str) -> tuple[list[tuple[int, Any]], int | None]:
  """((number, value) of every line, the number of a torn last line or None): a torn
  last line is left out; any other line that is not JSON is a RunFileError."""
  lines = list(_lines(path))
  out, torn = [], None
  for i, (number, line) in enumerate(lines):
    try:
      out.append((number, json.loads(line)))
    except ValueError:
      if i < len(lines) - 1:
        raise RunFileError(f'{path} line {number} is not valid JSON (a damaged line in '
                           'the middle of the file).') from None
      torn = number
  return out, torn


class Metrics(NamedTuple):
  """metrics.jsonl: its rows (steps strictly increasing) and a note if a torn last line
  was left out."""
  rows: list[dict[str, Any]]
  note: str | None


def read_metrics(workdir: str) -> Metrics:
  """The rows of metrics.jsonl ([] if there is none), checked.

  Raises:
    RunFileError: a line in the middle that is not JSON, a row that is not an object,
      has no whole-number `step` or a non-number where DESIGN §6 has a number, or a
      step that does not follow the one before.
  """
  path = os.path.join(workdir, METRICS)
  parsed, torn = _parse_lines(path)
  note = None if torn is None else (
      f'{METRICS} line {torn} (the last) is torn and was left out')
  rows: list[dict[str, Any]] = []
  for number, row in parsed:
    where = f'{path} line {number}'
    if not isinstance(row, dict):
      raise RunFileError(f'{where} is a JSON {type(row).__name__}, not a metrics row.')
    step = row.get('step')
    if not _is_int(step) or step < 0:
      raise RunFileError(f'{where} has no whole-number step (step: {step!r}).')
    if rows and step <= rows[-1]['step']:
      raise RunFileError(f'{where}: step {step} does not follow step {rows[-1]["step"]} '
                         'of the line before (steps must increase).')
    for key in NUMBER_KEYS:
      if key in row and not is_number(row[key]):
        raise RunFileError(f'{where}: {key} is {row[key]!r}, not a number.')
    rows.append(row)
  return Metrics(rows, note)


@dataclasses.dataclass(frozen=True)
class Comms:
  """comms.jsonl, checked: M and {step: record} (kind, sent, payload, peers and, when
  not the default, overlap, active and received), as `loco.sim.commlog` wrote them."""
  num_workers: int
  records: dict[int, dict[str, Any]]


def _check_record(where: str, row: Any, m: int) -> None:
  if not isinstance(row, dict):
    raise RunFileError(f'{where} is a JSON {type(row).__name__}, not a step record.')
  def need(ok, what):
    if not ok:
      raise RunFileError(f'{where} is not a communication record: {what}.')
  need(_is_int(row.get('step')) and row['step'] >= 1,
       f'step is {row.get("step")!r}, not a whole number >= 1')
  for key, ok in (('kind', lambda x: _is_int(x) and 0 <= x < NUM_KINDS),
                  ('sent', lambda x: is_number(x) and math.isfinite(x) and x >= 0),
                  ('payload', lambda x: is_number(x) and math.isfinite(x) and x >= 0),
                  ('peers', lambda x: isinstance(x, list) and all(
                      _is_int(j) and 0 <= j < m for j in x))):
    value = row.get(key)
    need(isinstance(value, list) and len(value) == m and all(ok(x) for x in value),
         f'{key} must be a list of {m} (one per worker) of the right type, got '
         f'{json.dumps(value)[:80]}')
  if 'active' in row:
    active = row['active']
    need(isinstance(active, list) and len(active) == m and all(
        x in (0, 1) and not isinstance(x, float) for x in active),
         f'active must be a list of {m} zeros and ones')
  if 'overlap' in row:
    need(_is_int(row['overlap']) and row['overlap'] >= 0,
         f'overlap is {row["overlap"]!r}, not a whole number >= 0')
  if 'received' in row:
    value = row['received']
    need(isinstance(value, list) and len(value) == m and all(
        is_number(x) and math.isfinite(x) and x >= 0 for x in value),
         f'received must be a list of {m} finite numbers >= 0')


def read_comms(workdir: str, steps: Sequence[Mapping[str, Any]] | None = None) -> Comms:
  """comms.jsonl, every record checked; with `steps`, checked to cover them.

  Args:
    workdir: the run.
    steps: metrics rows (`read_metrics(workdir).rows`) the log must cover: at each row,
      the bytes sent per worker summed over the log up to its step must be the row's
      cumulative `bytes_sent`. A log that lost lines (cut short, a line deleted) fails
      this even when every line left is well-formed.

  Raises:
    RunFileError: no log, no `{"workers": M}` header, a line that is not JSON (a torn
      last line too: the log must be whole to be replayed), a malformed record, steps
      that do not increase, or a log that does not cover `steps`.
  """
  path = os.path.join(workdir, COMMS)
  if not os.path.isfile(path):
    raise RunFileError(f'{workdir} has no {COMMS}.')
  parsed, torn = _parse_lines(path)
  if torn is not None:
    raise RunFileError(f'{path} line {torn} (the last) is cut short: the log is '
                       'incomplete.')
  if not parsed:
    raise RunFileError(f'{path} is empty (no {{"workers": M}} header).')
  number, header = parsed[0]
  if not (isinstance(header, dict) and _is_int(header.get('workers'))
          and header['workers'] >= 1):
    raise RunFileError(f'{path} line {number} is not the header {{"workers": M}} of a '
                       'loco communication log.')
  m = header['workers']
  records: dict[int, dict[str, Any]] = {}
  last = 0
  for number, row in parsed[1:]:
    where = f'{path} line {number}'
    _check_record(where, row, m)
    if row['step'] <= last:
      raise RunFileError(f'{where}: step {row["step"]} does not follow step {last} of the '
                         'record before (steps must increase).')
    last = row['step']
    records[last] = row
  if steps is not None:
    _check_covers(path, records, steps)
  return Comms(m, records)


def _check_covers(path: str, records: Mapping[int, Mapping[str, Any]],
                  steps: Sequence[Mapping[str, Any]]) -> None:
  ordered = sorted(records.items())
  total, k, logged = 0.0, 0, 0
  for row in steps:
    while k < len(ordered) and ordered[k][0] <= row['step']:
      sent = ordered[k][1]['sent']
      total += sum(sent) / len(sent)
      logged = ordered[k][0]
      k += 1
    want = row.get('bytes_sent')
    if want is None:
      continue
    if not math.isclose(total, want, rel_tol=_BYTES_RTOL, abs_tol=1e-3):
      raise RunFileError(
          f'{path} does not cover the run: up to step {row["step"]} it records '
          f'{total:,.0f} bytes sent per worker and {METRICS} {want:,.0f} (its last record '
          f'before that is step {logged}); lines are missing, so the run cannot be '
          'replayed from it.')


# ---- the run -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Run:
  """One run directory, read and checked.

  Attributes:
    path: the directory.
    stored: config.json as stored ({} if the run has none).
    config: its `config` section ({} if none).
    metrics: the rows of metrics.jsonl.
    metrics_note: a torn last line left out, if any.
    status: finished | diverged | failed | interrupted | running | incomplete.
    sweep_status: status.json (loco.sweep), None for a run started by hand.
    diverged: diverged.json, None unless the run diverged.
    error: the sentence the run ended with, to show (status.json's error,
      diverged.json's message, or the last error line of log.txt); None if none.
  """
  path: str
  stored: dict[str, Any]
  config: dict[str, Any]
  metrics: tuple[dict[str, Any], ...]
  metrics_note: str | None
  status: str
  sweep_status: dict[str, Any] | None
  diverged: dict[str, Any] | None
  error: str | None

  @property
  def last(self) -> dict[str, Any]:
    """The last metrics row ({} if none)."""
    return self.metrics[-1] if self.metrics else {}


def _nonfinite_loss(rows: Sequence[Mapping[str, Any]]) -> bool:
  return any(key in r and not math.isfinite(r[key])
             for r in rows for key in ('train_loss', 'eval_loss'))


def run_status(config: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
               sweep_status: Mapping[str, Any] | None,
               diverged: Mapping[str, Any] | None) -> str:
  """A run's status from its structured files, in this order: diverged (diverged.json,
  or a non-finite loss in metrics.jsonl), status.json's state, finished (the last
  metrics step reached config.steps), else incomplete (stopped, or still running by
  hand: the same command resumes it)."""
  if diverged is not None or _nonfinite_loss(rows):
    return 'diverged'
  if sweep_status is not None:
    return sweep_status['state']
  steps = config.get('steps')
  if steps and rows and rows[-1]['step'] >= steps:
    return 'finished'
  return 'incomplete'


def is_run(path: str) -> bool:
  """Whether `path` is a run directory (it has a config.json or a status.json)."""
  return any(os.path.isfile(os.path.join(path, f)) for f in (CONFIG, STATUS))


def read_run(workdir: str) -> Run:
  """Reads and checks a run directory.

  Raises:
    RunFileError: `workdir` is not a directory, or one of its files is damaged
      (config.json, metrics.jsonl, status.json, diverged.json, log.txt).
  """
  if not os.path.isdir(workdir):
    raise RunFileError(f'{workdir} is not a directory.')
  stored = read_config(workdir) or {}
  config = stored.get('config', {})
  metrics = read_metrics(workdir)
  sweep_status = read_status(workdir)
  diverged = read_diverged(workdir)
  error = ((diverged or {}).get('message') or (sweep_status or {}).get('error')
           or (None if sweep_status else read_error_line(workdir)))
  status = run_status(config, metrics.rows, sweep_status, diverged)
  return Run(path=workdir, stored=stored, config=config, metrics=tuple(metrics.rows),
             metrics_note=metrics.note, status=status, sweep_status=sweep_status,
             diverged=diverged, error=None if status == 'finished' else error)
