"""The training loop: `run(config, workdir)`, its set-up, and how it stops or fails.

The concepts it puts together live in their own modules: the config boundary
(`loco.experiment`), the jitted program (`loco.step`), where arrays live
(`loco.placement`), the host's accounting per chunk (`loco.ledger`), evaluation
(`loco.evaluate`) and checkpoints (`loco.checkpoint`). The metrics of a chunk are
fetched after the next chunk is dispatched, except at checkpoints, where the chunk's
losses are checked finite before the state is written.
"""

import functools
import sys
import threading
import time
from typing import Any, NoReturn

import jax
import ml_collections
import numpy as np

from loco import checkpoint as checkpoint_lib
from loco import commlog
from loco import data as data_lib
from loco import evaluate as evaluate_lib
from loco import experiment as experiment_lib
from loco import ledger as ledger_lib
from loco import step as step_lib
from loco import workdir as workdir_lib
from loco.checkpoint import Checkpointer
from loco.engine import Algorithm
from loco.errors import DivergenceError, Interrupted, WorkdirError
from loco.experiment import Experiment
from loco.metrics import MetricsWriter, ProgressBar, make_sinks
from loco.placement import Placement


def run(config: ml_collections.ConfigDict, workdir: str, *,
        timings: dict[str, float] | None = None) -> dict[str, Any]:
  """Trains (or resumes) the experiment in `workdir`; returns the last metrics record.

  Everything a user can cause ends in one `LocoError` (a config, data, workdir or
  checkpoint problem, divergence, Ctrl-C / SIGTERM) and never loses a committed
  checkpoint. A workdir holds one run at a time (a lock); resuming needs the same
  config (only `steps` may grow); a finished run returns its last record.

  Args:
    config: the experiment's ConfigDict (loco/configs/default.py).
    workdir: the run directory.
    timings: if given, filled with seconds per start-up phase (config, init, data,
      restore, compile, first_chunk).
  """
  clock = _Phases(timings)
  exp = experiment_lib.parse_config(config)
  r = exp.run
  placement = Placement.make(r.mesh_workers, r.num_workers, r.mesh_fsdp, r.batch_per_worker)
  algorithm = experiment_lib.build_algorithm(exp, placement.mesh)
  clock.lap('config')
  is_main = jax.process_index() == 0
  with workdir_lib.Workdir(workdir, lock=is_main) as wd:
    checkpointer = None
    try:
      checkpointer = Checkpointer(wd.file('checkpoints'), r.checkpoint_keep,
                                  note=_note if is_main else None)
      return _train(wd, config, exp, algorithm, placement, checkpointer, is_main, clock)
    except OSError as e:
      raise WorkdirError(f'{_os_error(e)}; {_kept(checkpointer, wd.path)}: fix it and '
                         'the same command resumes.') from e
    except KeyboardInterrupt:
      at = f' after step {clock.step}' if clock.step is not None else ' while starting'
      raise Interrupted(f'interrupted{at}; {_kept(checkpointer, wd.path)}: the same '
                        'command resumes from it.') from None
    finally:
      if checkpointer is not None:
        _close_quietly(checkpointer)


# Set by loco.main's SIGINT / SIGTERM handler: the loop stops before its next chunk.
STOP = threading.Event()


def _train(wd: workdir_lib.Workdir, config, exp: Experiment, algorithm: Algorithm,
           placement: Placement, checkpointer: Checkpointer, is_main: bool,
           clock: '_Phases') -> dict[str, Any]:
  r = exp.run
  note = _note if is_main else (lambda message: None)
  _refuse_diverged(wd)
  timeline = ledger_lib.make_timeline(exp, algorithm)
  # Ticks: inner steps, or the asynchronous replay's ticks.
  total = timeline.num_ticks if timeline is not None else r.steps
  start = _resumable_from(wd, config, checkpointer, total, note)
  if start == total:
    note(f'the run in {wd.path} finished before (step {start} of {total}); nothing to do.')
    return wd.last_record()

  experiment_lib.check_vocabulary(exp)
  key = jax.random.key(r.seed)
  graphdef, init, abstract_state = step_lib.init_state(exp, algorithm, key, placement.mesh)
  train_chunk = step_lib.make_train_chunk(algorithm, exp.model, graphdef, placement.mesh,
                                          r.grad_mode)
  chunk_len = min(r.log_every, total)
  ahead = step_lib.compile_ahead(train_chunk, abstract_state,
                                 placement.batches(chunk_len, r.seq_len),
                                 None if timeline is None else timeline.contexts(0, 1))
  state = (checkpoint_lib.warm_start(init, key, abstract_state, r.init_from,
                                     r.init_inner_state, note)
           if r.init_from and not start else init(key))
  clock.lap('init')
  train_data, eval_windows = _data(exp, placement)
  clock.lap('data')

  host_state = {}
  if start:
    state, data_state, host_state = checkpointer.restore(start, state)
    train_data.set_state(data_state)
  if is_main:
    experiment_lib.write_config_json(wd, config, exp)
  clock.lap('restore')

  diverged = functools.partial(_diverged, wd, checkpointer, is_main)
  writer, comm_log = _writers(wd, config, exp, start, is_main, note)
  ledger = ledger_lib.Ledger(
      num_workers=r.num_workers, sequence_tokens=r.batch_per_worker * r.seq_len,
      vocab_size=exp.model.vocab_size, timeline=timeline, comm_log=comm_log,
      diverged=diverged)
  ledger.load_state_dict(host_state)
  evaluate = _evaluator(exp, graphdef, eval_windows, note)
  check_finite = jax.jit(step_lib.all_finite)
  progress = ProgressBar(total, start, enabled=r.progress and is_main)

  def finish(end_step, k, outputs):   # the host's share of a chunk, once its outputs are in
    record = ledger.finish(end_step, k, *placement.fetch(outputs))
    clock.step = end_step
    return record

  compiled = pending = None   # pending: (end_step, k, outputs) of the chunk in flight
  for step, k, batches, contexts, valid, data_state in _chunks(
      start, total, chunk_len, train_data, timeline, placement):
    if compiled is None:
      clock.lap('first_batch')
      compiled = ahead.get()
      clock.lap('compile')
      ledger.mark()
    state, outputs = compiled(state, batches, contexts, valid)
    if pending is not None:
      _emit(writer, progress, *finish(*pending))
    pending = (step, k, outputs)
    boundary_eval = r.eval_every and (step % r.eval_every == 0 or step == total)
    boundary_ckpt = step == total or (r.checkpoint_every and step % r.checkpoint_every == 0)
    if boundary_eval or boundary_ckpt:
      record, step_seconds = finish(*pending)
      pending = None
      if boundary_eval:
        record.update(evaluate(state.params))
      # The row first, then the checkpoint: a checkpoint never exists without its row.
      _emit(writer, progress, record, step_seconds)
      if boundary_ckpt:
        if not bool(check_finite((state.params, state.anchor))):
          diverged(step, f'the parameters became non-finite by step {step}')
        checkpointer.save(step, state, placement.every_position(data_state),
                          ledger.state_dict())
      ledger.mark()
    if clock.wants('first_chunk'):
      jax.block_until_ready(outputs)
      clock.lap('first_chunk')
  if pending is not None:
    _emit(writer, progress, *finish(*pending))
  progress.close()
  writer.close()
  comm_log.close()
  checkpointer.wait()
  return ledger.last_record


def _refuse_diverged(wd: workdir_lib.Workdir) -> None:
  diverged = wd.diverged()
  if diverged:
    raise DivergenceError(
        f'the run in {wd.path} diverged at step {diverged.get("step")} (see '
        f'{workdir_lib.DIVERGED}): resuming it would diverge again; use a new workdir, '
        f'or delete {workdir_lib.DIVERGED} to try anyway.')


def _resumable_from(wd: workdir_lib.Workdir, config, checkpointer: Checkpointer,
                    total: int, note) -> int:
  """The step to resume from (0 for a new run), once the config allows resuming."""
  start = checkpointer.latest_step() or 0
  if start:
    for message in wd.check_resume(config.to_dict(), start):
      note(message)
    if start > total:
      raise WorkdirError(f'the checkpoint in {wd.path} is at step {start}, past this '
                         f'run\'s {total} steps; steps may only grow on resume.')
  return start


def _data(exp: Experiment, placement: Placement):
  """(the train iterator of this process's workers, the eval windows)."""
  r = exp.run
  # On several hosts each process reads and tokenizes only its own workers' data.
  train_data = data_lib.make_train_iterator(
      exp.data, num_workers=r.num_workers, batch_per_worker=r.batch_per_worker,
      seq_len=r.seq_len, seed=r.seed, workers=placement.process_workers)
  if jax.process_count() > 1:
    mine = train_data.workers
    print(f'loco: process {jax.process_index()} reads the data of workers '
          f'{mine[0]}-{mine[-1]} of {r.num_workers}.', flush=True)
  eval_windows = data_lib.make_eval_windows(
      exp.data, batch_size=r.eval_batch_size, seq_len=r.seq_len,
      num_batches=r.eval_batches)
  return train_data, eval_windows


def _chunks(step: int, total: int, chunk_len: int, train_data, timeline,
            placement: Placement):
  """Yields (end step, k, placed batches, contexts, valid, data state) per chunk.

  Chunks end on multiples of log_every (and at the end); each is padded to chunk_len
  steps, `valid` marking the k real ones. Stops (KeyboardInterrupt) before reading a
  chunk once STOP is set."""
  while step < total:
    if STOP.is_set():
      raise KeyboardInterrupt
    k = min(chunk_len - step % chunk_len, total - step)
    batches = np.stack([next(train_data) for _ in range(k)])
    contexts = None if timeline is None else timeline.contexts(step, k)
    valid = np.arange(chunk_len) < k
    batches, contexts = step_lib.pad_steps((batches, contexts), chunk_len)
    step += k
    yield (step, k, placement.place_batches(batches), contexts, valid,
           train_data.get_state())


def _writers(wd: workdir_lib.Workdir, config, exp: Experiment, start: int, is_main: bool,
             note):
  """(metrics writer, communication log): process 0 writes them, the others do not."""
  if not is_main:
    return _NoWriter(), _NoWriter()
  sinks = make_sinks(wd.path, exp.sinks, config.to_dict(), start)
  return (MetricsWriter(wd.path, resume_step=start, note=note, sinks=sinks),
          commlog.CommLog(wd.path, exp.run.num_workers, resume_step=start))


def _evaluator(exp: Experiment, graphdef, windows: data_lib.EvalWindows, note):
  """`evaluate(params_MxP) -> metrics` on the run's eval windows; the first call notes
  what an evaluation covers and costs."""
  r = exp.run
  evaluate = evaluate_lib.make_evaluator(exp.model, graphdef, r.eval_per_worker)
  noted = []

  def evaluate_noting(params_MxP):
    t = time.perf_counter()
    metrics = evaluate(params_MxP, windows)
    if not noted:
      noted.append(True)
      note(f'eval: {r.eval_batches} x {r.eval_batch_size} windows from '
           f'{len(np.unique(windows.docs))} of {windows.split_documents} documents of '
           f'{exp.data.eval_split}, {time.perf_counter() - t:.1f} s per eval (the first '
           'includes compiling it).')
    return metrics
  return evaluate_noting


def _diverged(wd: workdir_lib.Workdir, checkpointer: Checkpointer, is_main: bool,
              step: int, why: str) -> NoReturn:
  """Marks the run diverged at `step` (no checkpoint is written after it) and stops it."""
  message = f'{why}; {_kept(checkpointer, wd.path)}.'
  if is_main:
    wd.mark_diverged(step, message)
  raise DivergenceError(message)


def _emit(writer: MetricsWriter, progress: ProgressBar, record: dict,
          step_seconds: float) -> None:
  writer.write(record)
  progress.update(record['step'], record['train_loss'], record['tokens_per_second'],
                  record.get('eval_loss'), step_seconds=step_seconds)


class _NoWriter:
  """The metrics and communication-log writer of processes other than process 0."""

  def write(self, record: dict[str, Any]) -> None:
    del record

  def append(self, *args) -> None:
    del args

  def close(self) -> None:
    pass


class _Phases:
  """Wall seconds of the start-up phases (into a caller's dict), and the step reached."""

  def __init__(self, out: dict[str, float] | None):
    self.out = out
    self.t = time.perf_counter()
    self.step: int | None = None    # the last step whose results are in, for messages

  def wants(self, name: str) -> bool:
    return self.out is not None and name not in self.out

  def lap(self, name: str) -> None:
    now = time.perf_counter()
    if self.out is not None:
      self.out[name] = self.out.get(name, 0.0) + now - self.t
    self.t = now


def _os_error(e: OSError) -> str:
  where = f' ({e.filename})' if e.filename else ''
  return f'{e.strerror or e}{where}'


def _kept(checkpointer: Checkpointer | None, path: str) -> str:
  """Names the newest committed checkpoint, after an in-flight save commits or fails."""
  step = None
  if checkpointer is not None:
    try:
      checkpointer.wait()
    except Exception:  # a failed save: the newest committed one is what is kept
      pass
    try:
      step = checkpointer.latest_step()
    except Exception:  # the checkpoint dir itself may be unreadable
      step = None
  if step:
    return f'the last good checkpoint (step {step}) is kept in {path}'
  return f'no checkpoint was written in {path} yet'


def _close_quietly(checkpointer: Checkpointer) -> None:
  try:
    checkpointer.close()
  except Exception:  # the error that matters is the one already being raised
    pass


def _note(message: str) -> None:
  print(f'loco: note: {message}', file=sys.stderr, flush=True)
