"""The training loop: `run(config, workdir)`, its set-up, and how it stops or fails.

The concepts it puts together live in their own modules: the config boundary
(`loco.experiment`), the jitted program (`loco.step`), where arrays live
(`loco.placement`), the host's accounting per chunk (`loco.ledger`), evaluation
(`loco.evaluate`) and checkpoints (`loco.checkpoint`). The metrics of a chunk are
fetched after the next chunk is dispatched, except at checkpoints, where the chunk's
losses are checked finite before the state is written. A stop (SIGTERM, Ctrl-C: STOP)
is taken at a chunk boundary, as a checkpoint is, so that a preemption loses no step.
"""

import functools
import os
import sys
import threading
import time
from typing import Any, NoReturn

import jax
from jax.experimental import multihost_utils
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
from loco.configs import default as default_config
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
  config (only `steps` may grow); a finished run returns its last record. STOP set
  (`on_signal`, or another thread) ends the run at its next chunk boundary with a
  checkpoint there (`Interrupted` names its step). Process 0 prints a header of what
  the run will do, then each start-up phase's seconds as it ends (stdout).

  Args:
    config: the experiment's ConfigDict (loco/configs/default.py).
    workdir: the run directory.
    timings: if given, filled with seconds per start-up phase (config, init, data,
      restore, compile, first_chunk).
  """
  clock = _Phases(timings)
  abandoned = False
  exp = experiment_lib.parse_config(config)
  r = exp.run
  placement = Placement.make(r.mesh_workers, r.num_workers, r.mesh_fsdp, r.batch_per_worker,
                             r.mesh_slices)
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
      if clock.stopping:   # a second signal while stopping: abandon the save in flight
        abandoned = True
        what = (f'while saving step {clock.saving}; that save was abandoned'
                if clock.saving is not None else f'after step {clock.step}')
        kept = _kept(checkpointer, wd.path, wait=False)
        raise Interrupted(f'interrupted again {what}; {kept}: the same command resumes '
                          'from it.') from None
      at = f' after step {clock.step}' if clock.step is not None else ' while starting'
      raise Interrupted(f'interrupted{at}; {_kept(checkpointer, wd.path)}: the same '
                        'command resumes from it.') from None
    finally:
      _TRAINING.clear()
      if checkpointer is not None and not abandoned:
        _close_quietly(checkpointer)


# Set by `on_signal` (loco.main's SIGINT / SIGTERM handler), or by a caller in another
# thread: the loop stops at its next chunk boundary and saves a checkpoint there.
STOP = threading.Event()
# Set while a loop trains (after its first chunk is dispatched): there is work to save.
_TRAINING = threading.Event()


def on_signal() -> None:
  """What loco.main's SIGINT / SIGTERM handler does (in the main thread).

  While a run trains, the first signal only sets STOP: no exception is raised inside
  JAX or orbax; the loop stops at its next chunk boundary, writes that chunk's row and
  saves a checkpoint there, so a preemption loses no step. While the run starts (there
  is nothing to save yet), and at a second signal (during that save), it raises
  KeyboardInterrupt at once: the save in flight is abandoned and the last committed
  checkpoint is what is kept (orbax gives a step folder its commit marker last).
  """
  again = STOP.is_set()
  STOP.set()
  if again or not _TRAINING.is_set():
    raise KeyboardInterrupt


def _train(wd: workdir_lib.Workdir, config, exp: Experiment, algorithm: Algorithm,
           placement: Placement, checkpointer: Checkpointer, is_main: bool,
           clock: '_Phases') -> dict[str, Any]:
  r = exp.run
  note = _note if is_main else (lambda message: None)
  say = _say if is_main else (lambda line: None)
  _refuse_diverged(wd)
  timeline = ledger_lib.make_timeline(exp, algorithm)
  # Ticks: inner steps, or the asynchronous replay's ticks.
  total = timeline.num_ticks if timeline is not None else r.steps
  start = _resumable_from(wd, config, checkpointer, total, note)
  if start == total:
    note(f'the run in {wd.path} finished before (step {start} of {total}); nothing to do.')
    return wd.last_record()
  for line in experiment_lib.header(exp, wd.path, start, total):
    say(line)

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
  say(_phase('set up', clock.lap('init'), 'the model and optimizer state; the train step '
             'traced (it compiles in the background)'))
  train_data, eval_windows = _data(exp, placement)
  say(_phase('read data', clock.lap('data'), 'train and eval windows' + (
      f' (a first run prepares the corpus once, in {_home(exp.data.resolved_data_dir)})'
      if exp.data.source != 'tfds' else '')))

  host_state = {}
  if start:
    state, data_state, host_state = checkpointer.restore(start, state)
    train_data.set_state(data_state)
  if is_main:
    experiment_lib.write_config_json(wd, config, exp)
  seconds = clock.lap('restore')
  if start:
    say(_phase('restored', seconds, f'the state, data position and counters of step {start}'))

  diverged = functools.partial(_diverged, wd, checkpointer, is_main)
  writer, comm_log = _writers(wd, config, exp, start, is_main, note)
  ledger = ledger_lib.Ledger(
      num_workers=r.num_workers, sequence_tokens=r.batch_per_worker * r.seq_len,
      vocab_size=exp.model.vocab_size, timeline=timeline, comm_log=comm_log,
      diverged=diverged)
  ledger.load_state_dict(host_state)
  check_finite = jax.jit(step_lib.all_finite)
  progress = ProgressBar(total, start, enabled=r.progress and is_main)
  evaluate = _evaluator(exp, graphdef, eval_windows,
                        lambda line: (progress.clear(), say(line)))

  def finish(end_step, k, outputs):   # the host's share of a chunk, once its outputs are in
    record = ledger.finish(end_step, k, *placement.fetch(outputs))
    clock.step = end_step
    return record

  def save(step, state, data_state):
    if not bool(check_finite((state.params, state.anchor))):
      diverged(step, f'the parameters became non-finite by step {step}')
    checkpointer.save(step, state, placement.every_position(data_state),
                      ledger.state_dict())

  compiled = pending = None   # pending: (end_step, k, outputs) of the chunk in flight
  step = saved = start        # the step reached; the newest checkpoint's
  data_state = None
  for step, k, batches, contexts, valid, data_state in _chunks(
      start, total, chunk_len, train_data, timeline, placement):
    if compiled is None:
      clock.lap('first_batch')
      compiled = ahead.get()
      waited = clock.lap('compile')
      say(_phase('compiled', ahead.seconds, 'the train step, in the background '
                 f'({waited:.1f} s waited for it)'))
      ledger.mark()
    state, outputs = compiled(state, batches, contexts, valid)
    _TRAINING.set()
    if pending is not None:
      _emit(writer, progress, *finish(*pending))
    pending = (step, k, outputs)
    boundary_eval = r.eval_every and (step % r.eval_every == 0 or step == total)
    boundary_ckpt = step == total or (r.checkpoint_every and step % r.checkpoint_every == 0)
    if boundary_eval or boundary_ckpt:
      record, step_seconds = finish(*pending)
      pending = None
      if boundary_eval:
        record.update(evaluate(state.params, step))
      # The row first, then the checkpoint: a checkpoint never exists without its row.
      _emit(writer, progress, record, step_seconds)
      if boundary_ckpt:
        save(step, state, data_state)
        saved = step
      ledger.mark()
    if clock.wants('first_chunk'):
      jax.block_until_ready(outputs)
      clock.lap('first_chunk')
  stopped = step < total   # by STOP: the chunk in flight finishes, then a checkpoint
  clock.stopping = stopped
  if pending is not None:
    _emit(writer, progress, *finish(*pending))
  progress.close()
  if stopped:
    message = _save_at_stop(wd.path, checkpointer, clock, saved, step,
                            lambda: save(step, state, data_state))
  writer.close()
  comm_log.close()
  if stopped:
    raise Interrupted(message)
  checkpointer.wait()
  return ledger.last_record


def _save_at_stop(path: str, checkpointer: Checkpointer, clock: '_Phases', saved: int,
                  step: int, save) -> str:
  """Saves the checkpoint of a run stopped at `step` (a chunk boundary whose row is
  written) unless it has one, waits for its commit; returns what the stop line says."""
  if saved != step:
    clock.saving = step
    t = time.perf_counter()
    save()
    checkpointer.wait()
    clock.saving = None
    return (f'interrupted after step {step}; saved its checkpoint (step {step}) in '
            f'{time.perf_counter() - t:.1f} s in {path}: the same command resumes from it.')
  return (f'interrupted after step {step}; {_kept(checkpointer, path)}: the same command '
          'resumes from it.')


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
    for message in wd.check_resume(config.to_dict(), start,
                                   default_config.get_config().to_dict()):
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
  steps, `valid` marking the k real ones. Ends early, at a chunk boundary that every
  process agrees on, once STOP is set (`stop_agreed`)."""
  while step < total:
    k = min(chunk_len - step % chunk_len, total - step)
    batches = np.stack([next(train_data) for _ in range(k)])
    if stop_agreed():   # after the read: on several hosts it waits for the chunk in flight
      return
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


def stop_agreed() -> bool:
  """Whether the loop stops at this chunk boundary: STOP is set, on any process.

  On several hosts every process must stop, and save, at the same step, so the
  processes gather their flags at each boundary (one integer each). loco.main's handler
  takes SIGTERM and SIGINT itself, so jax's preemption sync point (which watches
  SIGTERM through its own handler) would never fire; the gather is that agreement."""
  if jax.process_count() == 1:
    return STOP.is_set()
  flags = multihost_utils.process_allgather(np.int32(STOP.is_set()))
  return bool(np.any(flags))


def _evaluator(exp: Experiment, graphdef, windows: data_lib.EvalWindows, say):
  """`evaluate(params_MxP, step) -> metrics` on the run's eval windows; the first call
  says what an evaluation covers and costs."""
  r = exp.run
  evaluate = evaluate_lib.make_evaluator(exp.model, graphdef, r.eval_per_worker)
  said = []

  def evaluate_saying(params_MxP, step: int):
    t = time.perf_counter()
    metrics = evaluate(params_MxP, windows)
    if not said:
      said.append(True)
      say(_phase('first eval', time.perf_counter() - t,
                 f'at step {step}, compiling it included: {r.eval_batches} x '
                 f'{r.eval_batch_size} sequences from {len(np.unique(windows.docs))} of the '
                 f'{windows.split_documents} {exp.data.eval_split} documents'))
    return metrics
  return evaluate_saying


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
  """Wall seconds of the start-up phases (into a caller's dict), the step reached, and
  whether the run is stopping (a second signal then abandons the stop's save)."""

  def __init__(self, out: dict[str, float] | None):
    self.out = out
    self.t = time.perf_counter()
    self.step: int | None = None    # the last step whose results are in, for messages
    self.stopping = False           # STOP was agreed: finishing the last chunk, saving
    self.saving: int | None = None  # the step the stop's checkpoint is being saved at

  def wants(self, name: str) -> bool:
    return self.out is not None and name not in self.out

  def lap(self, name: str) -> float:
    """Ends phase `name`; returns its seconds."""
    now = time.perf_counter()
    seconds, self.t = now - self.t, now
    if self.out is not None:
      self.out[name] = self.out.get(name, 0.0) + seconds
    return seconds


def _os_error(e: OSError) -> str:
  where = f' ({e.filename})' if e.filename else ''
  return f'{e.strerror or e}{where}'


def _kept(checkpointer: Checkpointer | None, path: str, wait: bool = True) -> str:
  """Names the newest committed checkpoint, after an in-flight save commits or fails
  (`wait`), or as it is on disk now (a save in flight is being abandoned)."""
  step = None
  if checkpointer is not None:
    try:
      if wait:
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


def _say(line: str) -> None:
  """A line of what the run does (its header, its phases), on stdout as its summary;
  stderr keeps the progress bar, notes and the one line of an error or a stop."""
  print(line, flush=True)


def _home(path: str) -> str:
  home = os.path.expanduser('~')
  return '~' + path[len(home):] if path.startswith(home + os.sep) else path


def _phase(name: str, seconds: float, what: str) -> str:
  return experiment_lib.header_line(name, f'{seconds:.1f} s  {what}')
