"""The training loop: one loop for one run (`run`, loco.main) or R runs of one shape
trained as one program (`run_many`, loco.batched), its set-up, and how it stops or fails.

The concepts it puts together live in their own modules: the config boundary
(`loco.run.experiment`), the jitted program (`loco.run.step`; over a run axis, `loco.run.run_axis`),
where arrays live (`loco.run.placement`), the host's accounting per chunk (`loco.run.ledger`),
evaluation (`loco.evaluate`) and checkpoints (`loco.run.checkpoint`). The metrics of a chunk
are fetched after the next chunk is dispatched, except at checkpoints, where the chunk's
losses are checked finite before the state is written. A stop (SIGTERM, Ctrl-C: STOP)
is taken at a chunk boundary, as a checkpoint is, so that a preemption loses no step.
"""

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import time
from typing import Any, Callable, NoReturn, Sequence

import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from loco.run import checkpoint as checkpoint_lib
from loco.sim import commlog
from loco import data as data_lib
from loco.run import evaluate as evaluate_lib
from loco.run import experiment as experiment_lib
from loco.run import ledger as ledger_lib
from loco.run import step as step_lib
from loco.files import workdir as workdir_lib
from loco.configs import default as default_config
from loco.run.checkpoint import Checkpointer
from loco.core.engine import Algorithm
from loco.errors import DivergenceError, Interrupted, LocoError, UsageError, WorkdirError
from loco.run.experiment import Experiment
from loco.files.metrics import MetricsWriter, ProgressBar, make_sinks
from loco.run.placement import Placement


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
  exp = experiment_lib.parse_config(config)
  r = exp.run
  placement = Placement.make(r.mesh_workers, r.num_workers, r.mesh_fsdp, r.batch_per_worker,
                             r.mesh_slices)
  algorithm = experiment_lib.build_algorithm(exp, placement.mesh)
  clock.lap('config')
  is_main = jax.process_index() == 0
  with workdir_lib.Workdir(workdir, lock=is_main) as wd:
    one = _Run(config, exp, workdir, note=_note if is_main else _silent, wd=wd,
               algorithm=algorithm)
    try:
      one.checkpointer = Checkpointer(wd.file('checkpoints'), r.checkpoint_keep,
                                      note=one.note)
      _plan(one)
      if one.state == 'finished':
        return wd.last_record()
      _train([one], placement, clock, _Screen.one(one, is_main), is_main)
      if one.state == 'diverged':
        raise one.error
      return one.record
    except OSError as e:
      raise WorkdirError(f'{_os_error(e)}; {_kept(one.checkpointer, wd.path)}: fix it and '
                         'the same command resumes.') from e
    except KeyboardInterrupt:
      if clock.stopping:   # a second signal while stopping: abandon the save in flight
        clock.abandoned = True
        what = (f'while saving step {clock.saving}; that save was abandoned'
                if clock.saving is not None else f'after step {clock.step}')
        kept = _kept(one.checkpointer, wd.path, wait=False)
        raise Interrupted(f'interrupted again {what}; {kept}: the same command resumes '
                          'from it.') from None
      at = f' after step {clock.step}' if clock.step is not None else ' while starting'
      raise Interrupted(f'interrupted{at}; {_kept(one.checkpointer, wd.path)}: the same '
                        'command resumes from it.') from None
    finally:
      _TRAINING.clear()
      if one.checkpointer is not None and not clock.abandoned:
        _close_quietly(one.checkpointer)


def run_many(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence[str],
             outcomes: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
  """Trains (or resumes) R runs of one shape as one program, each into its own workdir;
  returns each one's {'state', 'error', 'record'}.

  The runs may differ only in seed and the run knobs (`loco.run.run_axis.RUN_KNOBS`). Each
  workdir ends up as `run` would leave it, its numbers equal to its solo run's. Runs at
  different resume steps train one group after the other; a finished run is skipped; a
  run that diverges is marked so in its workdir and the others go on. `outcomes`, if
  given, is filled {workdir: {'state', 'error'}} also when this raises (a run not
  started reads 'failed' with the error).

  Raises:
    ConfigError: the runs cannot share a program (one line naming the setting).
    Interrupted: Ctrl-C or SIGTERM (each workdir keeps its last committed checkpoint).
    WorkdirError: a workdir or disk problem stopped every run.
  """
  from loco.run import run_axis
  if len(set(map(os.path.abspath, workdirs))) != len(workdirs):
    raise UsageError('two batched runs share a workdir.')
  runs = [_Run(c, None, w, note=functools.partial(_note_of, w))
          for c, w in zip(configs, workdirs)]
  try:
    for one in runs:
      one.exp = experiment_lib.parse_config(one.config)
    run_axis.knobs_of([one.exp for one in runs])           # refuses runs of different shapes
    r0 = runs[0].exp.run
    if max(r0.mesh_workers, 1) * max(r0.mesh_fsdp, 1) > 1 or jax.process_count() > 1:
      raise UsageError('batched runs train on one device (run.mesh_workers = '
                       'run.mesh_fsdp = 1, one process); train mesh runs one at a time '
                       'with loco.main.')
    _train_all(runs, Placement.make(1, r0.num_workers, 1, r0.batch_per_worker))
  except BaseException as e:
    _stop_all(runs, 'interrupted' if isinstance(e, (KeyboardInterrupt, Interrupted))
              else 'failed', str(e) if isinstance(e, LocoError) else None)
    raise
  finally:
    if outcomes is not None:
      outcomes.update({one.workdir: dict(state=one.state, error=one.message)
                       for one in runs})
  return [dict(state=one.state, error=one.message, record=_last_record(one))
          for one in runs]


def _train_all(runs: 'list[_Run]', placement: Placement) -> None:
  """`run_many`'s workdirs, checkpointers and groups (runs that resume from one step)."""
  clock = _Phases(None)
  with contextlib.ExitStack() as stack:
    try:
      for one in runs:
        one.wd = stack.enter_context(workdir_lib.Workdir(one.workdir))
        one.checkpointer = Checkpointer(one.wd.file('checkpoints'),
                                        one.exp.run.checkpoint_keep, note=one.note)
        # A second signal abandons the stop's saves: they are not waited for.
        stack.callback(lambda c=one.checkpointer: clock.abandoned or _close_quietly(c))
      for one in runs:
        one.algorithm = experiment_lib.build_algorithm(one.exp)
        try:
          _plan(one)
        except (DivergenceError, WorkdirError) as e:
          one.end('diverged' if isinstance(e, DivergenceError) else 'failed', e)
      for start in sorted({one.start for one in runs if one.state is None}):
        group = [one for one in runs if one.state is None and one.start == start]
        _train(group, placement, clock, _Screen.many(group), True)
    except OSError as e:
      _stop_all(runs, 'failed')
      raise WorkdirError(f'{_os_error(e)}; every run keeps its last good checkpoint '
                         'in its workdir: fix it and the same command resumes them.') from e
    except KeyboardInterrupt:
      again = f' again after step {clock.step}' if clock.stopping else ''
      clock.abandoned = clock.stopping
      _stop_all(runs, 'interrupted', wait=not clock.stopping)
      raise Interrupted(f'interrupted{again}; every run keeps its last good checkpoint in '
                        'its workdir: the same command resumes them.') from None
    finally:
      _TRAINING.clear()


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


@dataclasses.dataclass(eq=False)
class _Run:
  """One run's host side: its config, workdir, checkpointer and books, and how it ended."""
  config: Any
  exp: Experiment | None
  workdir: str
  note: Callable[[str], None]
  wd: workdir_lib.Workdir | None = None
  algorithm: Algorithm | None = None
  checkpointer: Checkpointer | None = None
  timeline: Any = None
  start: int = 0
  total: int = 0
  state: str | None = None       # finished | diverged | failed | interrupted, once known
  error: LocoError | None = None
  message: str | None = None     # the one line of how it ended (None when it finished)
  record: dict[str, Any] | None = None    # its last metrics record, once finished
  books: Any = None              # (metrics writer, comm log, ledger) while it trains

  def end(self, state: str, error: 'LocoError | str | None' = None) -> None:
    self.state = state
    self.error = error if isinstance(error, LocoError) else None
    self.message = None if error is None else str(error)


def _plan(one: _Run) -> None:
  """Where `one` starts (its resume step), its clock and length; a finished run is
  marked finished. Raises DivergenceError (a diverged run) or WorkdirError."""
  _refuse_diverged(one.wd)
  one.timeline = experiment_lib.build_timeline(one.exp, one.algorithm)
  # Ticks: inner steps, or the asynchronous replay's ticks.
  one.total = one.timeline.num_ticks if one.timeline is not None else one.exp.run.steps
  one.start = _resumable_from(one.wd, one.config, one.checkpointer, one.total, one.note)
  if one.start == one.total:
    one.note(f'the run in {one.wd.path} finished before (step {one.start} of '
             f'{one.total}); nothing to do.')
    one.end('finished')


def _train(runs: list[_Run], placement: Placement, clock: '_Phases', screen: '_Screen',
           is_main: bool) -> None:
  """Trains runs that resume from one step together, to their end; each ends finished
  or diverged (`_Run.end`). Stopped (STOP), saves every run at the boundary and raises
  Interrupted."""
  exp, start, total = runs[0].exp, runs[0].start, runs[0].total
  r = exp.run
  chunk_len = min(r.log_every, total)
  program, states, data, graphdef, eval_windows = _set_up(runs, placement, chunk_len,
                                                          clock, screen, is_main)
  check_finite = jax.jit(step_lib.all_finite)
  screen.start(start, total)
  evaluate = _evaluator(exp, graphdef, eval_windows, screen.eval_line)
  live = lambda: [i for i, one in enumerate(runs) if one.state is None]   # noqa: E731

  def diverged(i: int, e: DivergenceError) -> None:
    runs[i].end('diverged', e)
    if len(runs) > 1:
      runs[i].note(f'diverged: {e} The other runs go on.')

  def finish(end_step, k, outputs) -> dict[int, tuple[dict, float]]:
    """The host's share of a chunk, once its outputs are in: {run: (row, step s)}."""
    done = {}
    for i, (losses, info) in zip(live(), program.split(outputs, live())):
      try:
        done[i] = runs[i].books[2].finish(end_step, k, losses, info)
      except DivergenceError as e:
        diverged(i, e)
    clock.step = end_step
    return done

  def save(i: int, step: int, data_state) -> None:
    one = program.unstack(states, i)
    try:
      if not bool(check_finite((one.params, one.anchor))):
        runs[i].books[2].diverged(step, f'the parameters became non-finite by step {step}')
    except DivergenceError as e:
      diverged(i, e)
      return
    runs[i].checkpointer.save(step, one, placement.every_position(data_state),
                              runs[i].books[2].state_dict())

  def mark() -> None:
    for one in runs:
      one.books[2].mark()

  compiled = pending = None   # pending: (end_step, k, outputs) of the chunk in flight
  step = saved = start        # the step reached; the newest checkpoints'
  data_states = None
  for step, k, batches, contexts, valid, data_states in _chunks(
      start, total, chunk_len, data, runs[0].timeline):
    if not live():
      break
    if compiled is None:
      clock.lap('first_batch')
      compiled = program.compiled()
      waited = clock.lap('compile')
      screen.say(_phase('compiled', program.ahead.seconds, 'the train step, in the '
                        f'background ({waited:.1f} s waited for it)'))
      mark()
    states, outputs = compiled(states, program.place(batches), contexts, valid)
    _TRAINING.set()
    if pending is not None:
      screen.show(runs, finish(*pending))
    pending = (step, k, outputs)
    boundary_eval = r.eval_every and (step % r.eval_every == 0 or step == total)
    boundary_ckpt = step == total or (r.checkpoint_every and step % r.checkpoint_every == 0)
    if boundary_eval or boundary_ckpt:
      done = finish(*pending)
      pending = None
      if boundary_eval:
        for i, (record, _) in done.items():
          record.update(evaluate(program.unstack(states, i).params, step))
      # The rows first, then the checkpoints: a checkpoint never exists without its row.
      screen.show(runs, done)
      if boundary_ckpt:
        for i in done:
          save(i, step, data_states[i])
        saved = step
      mark()
    if clock.wants('first_chunk'):
      jax.block_until_ready(outputs)
      clock.lap('first_chunk')
  stopped = step < total and bool(live())   # by STOP: the chunk in flight, then a save
  clock.stopping = stopped
  if pending is not None:
    screen.show(runs, finish(*pending))
  screen.close()
  if stopped:
    unsaved = [i for i in live() if saved != step]
    message = _save_at_stop(runs, unsaved, step, clock,
                            lambda i: save(i, step, data_states[i]))
  for one in runs:
    one.books[0].close()
    one.books[1].close()
  if stopped:
    raise Interrupted(message)
  for one in runs:
    one.checkpointer.wait()
    if one.state is None:
      one.record = one.books[2].last_record
      one.end('finished')


def _set_up(runs: list[_Run], placement: Placement, chunk_len: int, clock: '_Phases',
            screen: '_Screen', is_main: bool):
  """The runs' program (compiling in the background), states (restored at a resume),
  train data, ledgers and writers (`_Run.books`); each phase's seconds on the screen.
  Returns (program, stacked states, the data iterators, graphdef, eval windows)."""
  exp, start, total = runs[0].exp, runs[0].start, runs[0].total
  r = exp.run
  screen.header(start, total)
  experiment_lib.check_vocabulary(exp)
  graphdef, init, abstract = step_lib.init_state(exp, runs[0].algorithm,
                                                 jax.random.key(r.seed), placement.mesh)
  contexts = None if runs[0].timeline is None else runs[0].timeline.contexts(0, 1)
  program = _Program(runs, graphdef, abstract, placement, chunk_len, contexts)
  states, data = [], []
  for one in runs:
    key = jax.random.key(one.exp.run.seed)
    states.append(checkpoint_lib.warm_start(init, key, abstract, r.init_from,
                                            r.init_inner_state, one.note)
                  if r.init_from and not start else init(key))
  screen.say(_phase('set up', clock.lap('init'), 'the model and optimizer state; the '
                    'train step traced (it compiles in the background)'))
  for one in runs:
    train_data, eval_windows = _data(one.exp, placement)
    data.append(train_data)
  screen.say(_phase('read data', clock.lap('data'), 'train and eval windows' + (
      f' (a first run prepares the corpus once, in {_home(exp.data.resolved_data_dir)})'
      if exp.data.source != 'tfds' else '')))

  for i, (one, train_data) in enumerate(zip(runs, data)):
    host_state = {}
    if start:
      states[i], data_state, host_state = one.checkpointer.restore(start, states[i])
      train_data.set_state(data_state)
    if is_main:
      experiment_lib.write_config_json(one.wd, one.config, one.exp)
    writer, comm_log = _writers(one.wd, one.config, one.exp, start, is_main, one.note)
    ledger = ledger_lib.Ledger(
        num_workers=r.num_workers, sequence_tokens=r.batch_per_worker * r.seq_len,
        vocab_size=exp.model.vocab_size, timeline=one.timeline, comm_log=comm_log,
        diverged=functools.partial(_diverged, one.wd, one.checkpointer, is_main))
    ledger.load_state_dict(host_state)
    one.books = (writer, comm_log, ledger)
  states = program.stack(states)
  seconds = clock.lap('restore')
  if start:
    screen.say(_phase('restored', seconds,
                      f'the state, data position and counters of step {start}'))
  return program, states, data, graphdef, eval_windows


class _Program:
  """The jitted train chunk of one run (`loco.run.step`), or of R runs over a run axis
  (`loco.run.run_axis`), compiled in the background from the state's shapes."""

  def __init__(self, runs: list[_Run], graphdef, abstract, placement: Placement,
               chunk_len: int, contexts):
    exp = runs[0].exp
    r = exp.run
    self.placement = placement
    self.many = len(runs) > 1
    batches = placement.batches(chunk_len, r.seq_len)
    if not self.many:
      train_chunk = step_lib.make_train_chunk(runs[0].algorithm, exp.model, graphdef,
                                              placement.mesh, r.grad_mode)
      self.ahead = step_lib.compile_ahead(train_chunk, abstract, batches, contexts)
      return
    from loco.run import run_axis
    self._run_axis = run_axis
    self.knobs = run_axis.knobs_of([one.exp for one in runs])
    many = lambda x: jax.ShapeDtypeStruct((len(runs),) + x.shape, x.dtype)  # noqa: E731
    abstract = jax.tree.map(many, abstract._replace(step=None))._replace(step=abstract.step)
    self.ahead = step_lib.CompileAhead(run_axis.make_batched_chunk(exp, graphdef).lower(
        self.knobs, abstract, many(batches), step_lib.pad_steps(contexts, chunk_len),
        jax.ShapeDtypeStruct((chunk_len,), np.bool_)))

  def compiled(self):
    """The compiled chunk, `(states, batches, contexts, valid) -> (states, outputs)`."""
    compiled = self.ahead.get()
    if not self.many:
      return compiled
    return functools.partial(compiled, self.knobs)

  def place(self, batches_RxK):
    """A chunk's batches [R, K, M, B, L + 1] as the program takes them."""
    return batches_RxK if self.many else self.placement.place_batches(batches_RxK[0])

  def stack(self, states):
    return self._run_axis.stack(states) if self.many else states[0]

  def unstack(self, states, i: int):
    return self._run_axis.unstack(states, i) if self.many else states

  def split(self, outputs, runs: Sequence[int]) -> list[tuple[Any, Any]]:
    """Host copies of a chunk's (losses, StepInfo), for each of `runs`."""
    losses, info = self.placement.fetch(outputs)
    if not self.many:
      return [(losses, info)]
    return [(losses[i], jax.tree.map(lambda x, i=i: x[i], info)) for i in runs]


class _Screen:
  """What the loop shows: one run's header, start-up phases and progress bar (loco.main;
  process 0 only), or one progress line per run (loco.batched)."""

  def __init__(self, runs: list[_Run], enabled: bool, solo: bool):
    self.runs, self.enabled, self.solo = runs, enabled, solo
    self.bar = None

  @classmethod
  def one(cls, run: _Run, is_main: bool) -> '_Screen':
    return cls([run], is_main, True)

  @classmethod
  def many(cls, runs: list[_Run]) -> '_Screen':
    return cls(runs, True, False)

  def say(self, line: str) -> None:
    if self.solo and self.enabled:
      _say(line)

  def header(self, start: int, total: int) -> None:
    one = self.runs[0]
    for line in experiment_lib.header(one.exp, one.wd.path, start, total):
      self.say(line)

  def start(self, start: int, total: int) -> None:
    progress = self.runs[0].exp.run.progress and self.enabled
    if self.solo:
      self.bar = ProgressBar(total, start, enabled=progress)
    else:
      from loco.run.progress import RunsProgress
      self.bar = RunsProgress([one.workdir for one in self.runs], total, enabled=progress)

  def eval_line(self, line: str) -> None:
    if self.solo:
      self.bar.clear()
      self.say(line)
    else:
      self.runs[0].note(line.strip())

  def show(self, runs: list[_Run], done: dict[int, tuple[dict, float]]) -> None:
    """Writes each run's new row and shows it."""
    for i, (record, _) in done.items():
      runs[i].books[0].write(record)
    if not self.solo:
      self.bar.update({i: record for i, (record, _) in done.items()})
      return
    for record, step_seconds in done.values():
      self.bar.update(record['step'], record['train_loss'], record['tokens_per_second'],
                      record.get('eval_loss'), step_seconds=step_seconds)

  def close(self) -> None:
    self.bar.close()


def _save_at_stop(runs: list[_Run], unsaved: Sequence[int], step: int, clock: '_Phases',
                  save: Callable[[int], None]) -> str:
  """Saves the runs stopped at `step` (a chunk boundary whose rows are written) that
  have no checkpoint there (`save(i)`), waits for the commits; returns what the stop
  line says."""
  t = time.perf_counter()
  if unsaved:
    clock.saving = step
    for i in unsaved:
      save(i)
    for i in unsaved:
      runs[i].checkpointer.wait()
    clock.saving = None
  seconds = time.perf_counter() - t
  if len(runs) == 1:
    kept = (f'saved its checkpoint (step {step}) in {seconds:.1f} s in {runs[0].wd.path}'
            if unsaved else _kept(runs[0].checkpointer, runs[0].wd.path))
    return f'interrupted after step {step}; {kept}: the same command resumes from it.'
  kept = (f'saved each run\'s checkpoint (step {step}) in {seconds:.1f} s,'
          if unsaved else f'each run keeps its checkpoint (step {step})')
  return (f'interrupted after step {step}; {kept} in its workdir: the same command '
          'resumes them.')


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


def _chunks(step: int, total: int, chunk_len: int, data: Sequence[Any], timeline):
  """Yields (end step, k, batches [R, K, M, B, L + 1], contexts, valid, data states)
  per chunk, for the R runs reading `data` (one iterator each).

  Chunks end on multiples of log_every (and at the end); each is padded to chunk_len
  steps, `valid` marking the k real ones. Ends early, at a chunk boundary that every
  process agrees on, once STOP is set (`stop_agreed`)."""
  while step < total:
    k = min(chunk_len - step % chunk_len, total - step)
    batches = np.stack([np.stack([next(d) for _ in range(k)]) for d in data])
    if stop_agreed():   # after the read: on several hosts it waits for the chunk in flight
      return
    contexts = None if timeline is None else timeline.contexts(step, k)
    valid = np.arange(chunk_len) < k
    batches = np.moveaxis(step_lib.pad_steps(np.moveaxis(batches, 1, 0), chunk_len), 0, 1)
    step += k
    yield (step, k, batches, step_lib.pad_steps(contexts, chunk_len), valid,
           [d.get_state() for d in data])


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
    self.abandoned = False          # a second signal came while stopping: saves are left

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


def _stop_all(runs: Sequence[_Run], state: str, error: str | None = None,
              wait: bool = True) -> None:
  """Ends every run still going as `state`, naming the checkpoint each one keeps (once
  its save in flight commits or fails, or as on disk now: not `wait`)."""
  for one in runs:
    if one.state is None:
      kept = (_kept(one.checkpointer, one.workdir, wait=wait) if one.checkpointer
              else f'nothing was written in {one.workdir}')
      one.end(state, error or f'{state}; {kept}')


def _last_record(one: _Run) -> dict[str, Any]:
  try:
    return one.wd.last_record() if one.wd is not None else {}
  except LocoError:
    return {}


def _close_quietly(checkpointer: Checkpointer) -> None:
  try:
    checkpointer.close()
  except Exception:  # the error that matters is the one already being raised
    pass


def _note(message: str) -> None:
  print(f'loco: note: {message}', file=sys.stderr, flush=True)


def _note_of(workdir: str, message: str) -> None:
  """A note of one of `run_many`'s runs, naming its workdir."""
  _note(f'{workdir}: {message}')


def _silent(message: str) -> None:
  """The notes of processes other than process 0."""
  del message


def _say(line: str) -> None:
  """A line of what the run does (its header, its phases), on stdout as its summary;
  stderr keeps the progress bar, notes and the one line of an error or a stop."""
  print(line, flush=True)


def _home(path: str) -> str:
  home = os.path.expanduser('~')
  return '~' + path[len(home):] if path.startswith(home + os.sep) else path


def _phase(name: str, seconds: float, what: str) -> str:
  return experiment_lib.header_line(name, f'{seconds:.1f} s  {what}')
