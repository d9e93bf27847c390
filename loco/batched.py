"""Batched runs: R runs of one shape trained in one program, each into its own workdir.

  python -m loco.batched --runs=RUNS.json [--results=RESULTS.json]

RUNS.json is a list of {"workdir": W, "argv": ["--config=experiments/x.py", "--config.seed=2",
...]}, each run's `loco.main` arguments. The runs may differ only in seed and the run
knobs (`loco.run_axis.RUN_KNOBS`); anything else is refused in one line naming the
setting. `loco.sweep --batch_runs=N` writes the file and starts this command.

Each workdir ends up as `loco.main` would leave it: config.json, metrics.jsonl,
comms.jsonl, checkpoints, with each run's own data order (its seed) and its numbers
equal to its solo run's. A workdir that holds a checkpoint resumes from it, runs at
different steps train one after the other in groups of one step, and a finished run is
skipped. `loco.main` resumes any of them alone, and they resume here after a solo start.
A run whose losses diverge is marked diverged in its workdir and is no longer recorded
or checkpointed; the others go on. Ctrl-C / SIGTERM stops every run at the next chunk
boundary with a checkpoint there (a second signal: at once); a workdir or disk problem
stops every run at its last committed checkpoint; the same command resumes them.

RESULTS.json (written at the end, also after a failure) holds each workdir's outcome:
{"state": "finished" | "diverged" | "failed" | "interrupted", "error": line or null}.
The exit code is 0 when every run finished, 1 when one did not, 130 when interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
from typing import Any, Sequence

import numpy as np

from loco import cli
from loco.errors import DivergenceError, Interrupted, LocoError, UsageError, WorkdirError

PROG = 'loco.batched'


@dataclasses.dataclass
class _Run:
  """One run's host side: its config, workdir and writers, and how it ended."""
  config: Any
  exp: Any
  workdir: str
  wd: Any = None
  checkpointer: Any = None
  start: int = 0
  state: str | None = None       # finished | diverged | failed | interrupted, once known
  error: str | None = None

  def end(self, state: str, error: str | None = None) -> None:
    self.state, self.error = state, error

  def note(self, message: str) -> None:
    print(f'loco: note: {self.workdir}: {message}', file=sys.stderr, flush=True)


def run_batched(configs: Sequence[Any], workdirs: Sequence[str],
                outcomes: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
  """Trains (or resumes) the runs; returns each one's {'state', 'error', 'record'}.

  `outcomes`, if given, is filled {workdir: {'state', 'error'}} also when this raises
  (a run not started reads 'failed' with the error).

  Raises:
    ConfigError: the runs cannot share a program (one line naming the setting).
    Interrupted: Ctrl-C or SIGTERM (each workdir keeps its last committed checkpoint).
    WorkdirError: a workdir or disk problem stopped every run.
  """
  import jax
  from loco import experiment as experiment_lib
  from loco import run_axis

  if len(set(map(os.path.abspath, workdirs))) != len(workdirs):
    raise UsageError('two batched runs share a workdir.')
  runs = [_Run(c, None, w) for c, w in zip(configs, workdirs)]
  try:
    for r in runs:
      r.exp = experiment_lib.parse_config(r.config)
    run_axis.knobs_of([r.exp for r in runs])           # refuses runs of different shapes
    r0 = runs[0].exp.run
    if max(r0.mesh_workers, 1) * max(r0.mesh_fsdp, 1) > 1 or jax.process_count() > 1:
      raise UsageError('batched runs train on one device (run.mesh_workers = '
                       'run.mesh_fsdp = 1, one process); train mesh runs one at a time '
                       'with loco.main.')
    _train_all(runs)
  except BaseException as e:
    _stop_all(runs, 'interrupted' if isinstance(e, (KeyboardInterrupt, Interrupted))
              else 'failed', str(e) if isinstance(e, LocoError) else None)
    raise
  finally:
    if outcomes is not None:
      outcomes.update({r.workdir: dict(state=r.state, error=r.error) for r in runs})
  return [dict(state=r.state, error=r.error, record=_last_record(r)) for r in runs]


def _train_all(runs: list[_Run]) -> None:
  from loco import train
  from loco.checkpoint import Checkpointer
  stopping = []   # the step a stop (train.STOP) is saving the runs at, once agreed
  abandoned = []  # a second signal came while stopping: the saves in flight are left
  with contextlib.ExitStack() as stack:
    try:
      for r in runs:
        r.wd = stack.enter_context(_workdir(r.workdir))
        r.checkpointer = Checkpointer(r.wd.file('checkpoints'), r.exp.run.checkpoint_keep,
                                      note=r.note)
        # A second signal abandons the stop's saves: they are not waited for.
        stack.callback(lambda c=r.checkpointer: abandoned or train._close_quietly(c))
      for r in runs:
        _plan(r, train)
      for start in sorted({r.start for r in runs if r.state is None}):
        _train_group([r for r in runs if r.state is None and r.start == start], start,
                     stopping)
    except OSError as e:
      _stop_all(runs, 'failed')
      raise WorkdirError(f'{train._os_error(e)}; every run keeps its last good checkpoint '
                         'in its workdir: fix it and the same command resumes them.') from e
    except KeyboardInterrupt:
      again = f' again after step {stopping[0]}' if stopping else ''
      abandoned.extend(stopping)
      _stop_all(runs, 'interrupted', wait=not stopping)
      raise Interrupted(f'interrupted{again}; every run keeps its last good checkpoint in '
                        'its workdir: the same command resumes them.') from None
    finally:
      train._TRAINING.clear()


@contextlib.contextmanager
def _workdir(path: str):
  from loco import workdir as workdir_lib
  with workdir_lib.Workdir(path) as wd:
    yield wd


def _plan(r: _Run, train) -> None:
  """Where `r` starts: skipped if finished or diverged before, else its resume step."""
  from loco import ledger as ledger_lib
  from loco.experiment import build_algorithm
  try:
    train._refuse_diverged(r.wd)
    timeline = ledger_lib.make_timeline(r.exp, build_algorithm(r.exp))
    total = timeline.num_ticks if timeline is not None else r.exp.run.steps
    r.start = train._resumable_from(r.wd, r.config, r.checkpointer, total, r.note)
  except (DivergenceError, WorkdirError) as e:
    r.end('diverged' if isinstance(e, DivergenceError) else 'failed', str(e))
    return
  if r.start == total:
    r.note(f'finished before (step {r.start} of {total}); nothing to do.')
    r.end('finished')


def _train_group(runs: list[_Run], start: int, stopping: list[int]) -> None:
  """Trains runs that resume from one step together, to their end (train._train's loop
  over a run axis); stopped (train.STOP), saves them and appends the step to `stopping`."""
  import jax
  from loco import checkpoint as checkpoint_lib
  from loco import experiment as experiment_lib
  from loco import ledger as ledger_lib
  from loco import run_axis
  from loco import step as step_lib
  from loco import train
  from loco.progress import RunsProgress
  from loco.placement import Placement

  exp = runs[0].exp
  rr = exp.run
  placement = Placement.make(1, rr.num_workers, 1, rr.batch_per_worker)
  knobs = run_axis.knobs_of([r.exp for r in runs])
  algorithms = [experiment_lib.build_algorithm(r.exp) for r in runs]
  timelines = [ledger_lib.make_timeline(r.exp, a) for r, a in zip(runs, algorithms)]
  total = timelines[0].num_ticks if timelines[0] is not None else rr.steps
  experiment_lib.check_vocabulary(exp)
  graphdef, init, abstract = step_lib.init_state(exp, algorithms[0], jax.random.key(0))
  states, host_states, data = [], [], []
  windows = None
  for r in runs:
    key = jax.random.key(r.exp.run.seed)
    state = (checkpoint_lib.warm_start(init, key, abstract, rr.init_from,
                                       rr.init_inner_state, r.note)
             if rr.init_from and not start else init(key))
    train_data, windows = train._data(r.exp, placement)
    host_state = {}
    if start:
      state, data_state, host_state = r.checkpointer.restore(start, state)
      train_data.set_state(data_state)
    experiment_lib.write_config_json(r.wd, r.config, r.exp)
    states.append(state)
    host_states.append(host_state)
    data.append(train_data)
  states = run_axis.stack(states)

  books = []    # per run: (metrics writer, comm log, ledger)
  for r, timeline, host_state in zip(runs, timelines, host_states):
    writer, comm_log = train._writers(r.wd, r.config, r.exp, start, True, r.note)
    ledger = ledger_lib.Ledger(
        num_workers=rr.num_workers, sequence_tokens=rr.batch_per_worker * rr.seq_len,
        vocab_size=exp.model.vocab_size, timeline=timeline, comm_log=comm_log,
        diverged=functools.partial(train._diverged, r.wd, r.checkpointer, True))
    ledger.load_state_dict(host_state)
    books.append((writer, comm_log, ledger))
  evaluate = train._evaluator(exp, graphdef, windows, lambda line: runs[0].note(line.strip()))
  check_finite = jax.jit(step_lib.all_finite)
  progress = RunsProgress([r.workdir for r in runs], total, enabled=rr.progress)
  chunk = run_axis.make_batched_chunk(exp, graphdef)
  chunk_len = min(rr.log_every, total)
  live = lambda: [i for i, r in enumerate(runs) if r.state is None]   # noqa: E731

  def finish(end_step, k, outputs) -> dict[int, tuple[dict, float]]:
    losses, info = placement.fetch(outputs)
    done = {}
    for i in live():
      try:
        done[i] = books[i][2].finish(end_step, k, losses[i], jax.tree.map(lambda x: x[i], info))
      except DivergenceError as e:
        runs[i].end('diverged', str(e))
        runs[i].note(f'diverged: {e} The other runs go on.')
    return done

  def emit(done) -> None:
    for i, (record, _) in done.items():
      books[i][0].write(record)
    progress.update({i: record for i, (record, _) in done.items()})

  def save(i: int, step: int, data_state) -> None:
    one = run_axis.unstack(states, i)
    try:
      if not bool(check_finite((one.params, one.anchor))):
        books[i][2].diverged(step, f'the parameters became non-finite by step {step}')
    except DivergenceError as e:
      runs[i].end('diverged', str(e))
      runs[i].note(f'diverged: {e} The other runs go on.')
      return
    runs[i].checkpointer.save(step, one, data_state, books[i][2].state_dict())

  compiled = pending = None
  step = saved = start      # the step reached; the newest checkpoints'
  data_states = None
  for step, k, batches, contexts, valid, data_states in _chunks(
      start, total, chunk_len, data, timelines[0]):
    if not live():
      break
    if compiled is None:
      compiled = chunk.lower(knobs, states, batches, contexts, valid).compile()
      for _, _, ledger in books:
        ledger.mark()
    states, outputs = compiled(knobs, states, batches, contexts, valid)
    train._TRAINING.set()
    if pending is not None:
      emit(finish(*pending))
    pending = (step, k, outputs)
    boundary_eval = rr.eval_every and (step % rr.eval_every == 0 or step == total)
    boundary_ckpt = step == total or (rr.checkpoint_every and step % rr.checkpoint_every == 0)
    if boundary_eval or boundary_ckpt:
      done = finish(*pending)
      pending = None
      for i, (record, _) in done.items():
        if boundary_eval:
          record.update(evaluate(jax.tree.map(lambda x: x[i], states.params), step))
      emit(done)
      if boundary_ckpt:
        for i in list(done):
          save(i, step, data_states[i])
        saved = step
      for _, _, ledger in books:
        ledger.mark()
  stopped = step < total and bool(live())   # by STOP (train.on_signal): save, then stop
  if stopped:
    stopping.append(step)
  if pending is not None:
    emit(finish(*pending))
  progress.close()
  if stopped:
    message = _save_at_stop(runs, [i for i in live() if saved != step], step,
                            lambda i: save(i, step, data_states[i]))
    for writer, comm_log, _ in books:
      writer.close()
      comm_log.close()
    raise Interrupted(message)
  for i, (writer, comm_log, _) in enumerate(books):
    writer.close()
    comm_log.close()
    runs[i].checkpointer.wait()
    if runs[i].state is None:
      runs[i].end('finished')


def _chunks(step: int, total: int, chunk_len: int, data: Sequence[Any], timeline):
  """Yields (end step, k, batches [R, K, ...], contexts, valid, data states) per chunk,
  as `train._chunks` does for one run."""
  from loco import step as step_lib
  from loco import train
  while step < total:
    k = min(chunk_len - step % chunk_len, total - step)
    batches = np.stack([np.stack([next(d) for _ in range(k)]) for d in data], axis=0)
    if train.stop_agreed():
      return
    contexts = None if timeline is None else timeline.contexts(step, k)
    valid = np.arange(chunk_len) < k
    batches = np.moveaxis(step_lib.pad_steps(np.moveaxis(batches, 1, 0), chunk_len), 0, 1)
    contexts = step_lib.pad_steps(contexts, chunk_len)
    step += k
    yield step, k, batches, contexts, valid, [d.get_state() for d in data]


def _save_at_stop(runs: Sequence[_Run], unsaved: Sequence[int], step: int, save) -> str:
  """Saves the runs stopped at `step` that have no checkpoint there (`save(i)`), waits
  for the commits; returns what the stop line says."""
  import time
  t = time.perf_counter()
  for i in unsaved:
    save(i)
  for i in unsaved:
    runs[i].checkpointer.wait()
  saved = (f'saved each run\'s checkpoint (step {step}) in {time.perf_counter() - t:.1f} s,'
           if unsaved else f'each run keeps its checkpoint (step {step})')
  return (f'interrupted after step {step}; {saved} in its workdir: the same command '
          'resumes them.')


def _stop_all(runs: Sequence[_Run], state: str, error: str | None = None,
              wait: bool = True) -> None:
  """Ends every run still going as `state`, naming the checkpoint each one keeps (once
  its save in flight commits or fails, or as on disk now: not `wait`)."""
  from loco import train
  for r in runs:
    if r.state is None:
      kept = (train._kept(r.checkpointer, r.workdir, wait=wait) if r.checkpointer
              else f'nothing was written in {r.workdir}')
      r.end(state, error or f'{state}; {kept}')


def _last_record(r: _Run) -> dict[str, Any]:
  try:
    return r.wd.last_record() if r.wd is not None else {}
  except LocoError:
    return {}


def _read_runs(path: str) -> list[dict[str, Any]]:
  try:
    with open(path) as f:
      runs = json.load(f)
  except FileNotFoundError:
    raise UsageError(f'the runs file {path} does not exist.') from None
  except (ValueError, UnicodeDecodeError) as e:
    raise UsageError(f'the runs file {path} is not JSON ({e}).') from None
  if (not isinstance(runs, list) or not runs or not all(
      isinstance(r, dict) and isinstance(r.get('workdir'), str)
      and isinstance(r.get('argv'), list) and all(isinstance(a, str) for a in r['argv'])
      for r in runs)):
    raise UsageError(f'the runs file {path} must be a non-empty list of '
                     '{"workdir": DIR, "argv": ["--config=FILE", ...]}.')
  seen: dict[str, str] = {}
  for i, r in enumerate(runs):
    if not r['workdir'].strip():
      raise UsageError(f'the runs file {path} gives run {i} an empty workdir; every run '
                       'needs its own directory.')
    real = os.path.realpath(r['workdir'])
    if real in seen:      # the same directory twice (one name may be a link)
      raise UsageError(f'the runs file {path} names one directory twice: {seen[real]} and '
                       f'{r["workdir"]} are both {real}; every run needs its own workdir.')
    seen[real] = r['workdir']
  return runs


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m loco.batched', description=__doc__.split('\n\n')[0])
  parser.add_argument('--runs', required=True, help='JSON list of {workdir, argv}')
  parser.add_argument('--results', help='where each run\'s outcome is written (JSON)')
  args = parser.parse_args(argv)
  outcomes: dict[str, dict[str, Any]] = {}

  def body() -> int:
    from loco import checkpoint
    from loco import step
    from loco import sweep
    from loco import train
    spec = _read_runs(args.runs)
    configs = []
    for r in spec:
      try:
        configs.append(sweep.load_config(r['argv']))
      except LocoError as e:
        raise type(e)(f'{r["workdir"]}: {e}') from None
    step.enable_compilation_cache()
    checkpoint.quiet_background_errors()

    def interrupt(signum, frame):   # the loop stops at its next chunk boundary and saves
      del signum, frame
      train.on_signal()
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
      results = run_batched(configs, [r['workdir'] for r in spec], outcomes)
    except Interrupted as e:
      print(f'{PROG}: stopped: {e}', file=sys.stderr)
      return 130
    for r, result in zip(spec, results):
      outcomes[r['workdir']] = result
      line = result['state'] + (f': {result["error"]}' if result['error'] else '')
      print(f'{PROG}: {r["workdir"]}: {line}', flush=True)
    return 0 if all(x['state'] == 'finished' for x in results) else 1

  code = cli.run(PROG, body)
  if args.results:
    from loco.workdir import write_json
    try:
      write_json(args.results, outcomes)
    except OSError as e:
      print(f'{PROG}: error: {cli.describe_os_error(e)}', file=sys.stderr)
      return code or 1
  return code


if __name__ == '__main__':
  # Everything durable is on disk when main returns (checkpoints committed, the results
  # written): end at once, as loco.main does, rather than tear down JAX's and orbax's
  # threads in interpreter shutdown, which can hang after an interrupt.
  _code = main()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(_code)
