"""`loco.sweep --launcher=slurm`: each run (or batch of runs) as a SLURM job, through
submitit; `--launcher=submitit_local` runs the same jobs as local processes through
submitit's LocalExecutor (what the tests use: no cluster needed).

The sweep process stays the one that decides and records: it plans each run, writes its
status.json and log header, submits the job, polls it, and records how it ended, exactly
as for a local process; a job is a `Job` that answers the questions the sweep asks of a
`subprocess.Popen` (poll, returncode, terminate, kill, wait). The job itself runs the
command with its output appended to the run's log.txt (a batch's to its log), so the
sweep's directory must be on a filesystem the nodes share. A job of several tasks
(`--slurm=tasks_per_node=N` or `nodes=N`) starts the command in every task with
`--distributed` (jax reads SLURM's variables); task 0 writes the log, task I
`log.process-I.txt` beside it.

Resuming is the sweep's: the same command skips finished runs and resubmits
interrupted ones, which resume from their checkpoints. Stopping the sweep (Ctrl-C,
SIGTERM) cancels its jobs: SLURM sends them SIGTERM, and loco.main saves a checkpoint at
the step reached.

Requires the `cluster` extra (`pip install -e .[cluster]`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Sequence

from loco.errors import UsageError

LAUNCHERS = ('local', 'slurm', 'submitit_local')
SUBMITIT = '.submitit'      # OUT/.submitit/: submitit's job files


def run_command(cmd: Sequence[str], log: str, cwd: str) -> int:
  """What a job runs: `cmd` in `cwd`, its output appended to `log` (task 0's; task I's
  to `log` with `.process-I` before its extension); returns its exit code."""
  import submitit   # pylint: disable=g-import-not-at-top
  try:
    env = submitit.JobEnvironment()
    rank, tasks = env.global_rank, env.num_tasks
  except RuntimeError:        # not inside a submitit job
    rank, tasks = 0, 1
  cmd = list(cmd)
  if tasks > 1 and '--distributed' not in cmd and cmd[2:3] == ['loco.main']:
    cmd.append('--distributed')
  if rank:
    stem, ext = os.path.splitext(log)
    log = f'{stem}.process-{rank}{ext}'
  with open(log, 'a') as out:
    code = subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL)
  if code:
    # submitit reports a job that raised as failed; the sweep reads the code instead.
    print(f'loco.lab.slurm: {cmd[2] if len(cmd) > 2 else cmd[0]} exited with {code}',
          file=sys.stderr, flush=True)
  return code


def parse_options(options: Sequence[str]) -> dict[str, Any]:
  """`--slurm=KEY=VALUE` options (submitit's parameter names: partition, time in
  minutes as timeout_min, nodes, tasks_per_node, gpus_per_node, cpus_per_task, ...);
  numbers become ints."""
  out: dict[str, Any] = {}
  for option in options:
    key, sep, value = option.partition('=')
    if not sep or not key:
      raise UsageError(f'--slurm={option}: expected KEY=VALUE (for example '
                       '--slurm=partition=gpu or --slurm=timeout_min=600).')
    out[key] = int(value) if value.lstrip('-').isdigit() else value
  return out


class Launcher:
  """Submits commands as jobs of one submitit executor (`kind`: slurm or submitit_local)."""

  def __init__(self, kind: str, folder: str, options: dict[str, Any] | None = None):
    try:
      import submitit   # pylint: disable=g-import-not-at-top
    except ImportError:
      raise UsageError(f'--launcher={kind} needs submitit: pip install -e .[cluster] '
                       '(or pip install submitit).') from None
    if kind == 'submitit_local':
      self.executor = submitit.LocalExecutor(folder=folder)
    elif kind == 'slurm':
      self.executor = submitit.AutoExecutor(folder=folder, cluster='slurm')
    else:
      raise UsageError(f'--launcher must be one of {LAUNCHERS}, got {kind!r}.')
    self.kind = kind
    options = dict(options or {})
    options.setdefault('timeout_min', 24 * 60)
    try:
      self.executor.update_parameters(**options)
    except (ValueError, TypeError) as e:
      first = (str(e).strip().splitlines() or [''])[0][:300]
      raise UsageError(f'--slurm: {first}') from None

  def start(self, cmd: Sequence[str], log: str, name: str) -> 'Job':
    """Submits `cmd` (its output to `log`) as a job named `name`."""
    self.executor.update_parameters(name=name[:100])
    job = self.executor.submit(run_command, list(cmd), os.path.abspath(log), os.getcwd())
    return Job(job)


class Job:
  """A submitted job as the sweep sees a process."""

  def __init__(self, job):
    self.job = job
    self.returncode: int | None = None
    self.pid = f'job {job.job_id}'

  def poll(self) -> int | None:
    if self.returncode is None and self.job.done():
      try:
        self.returncode = int(self.job.result())
      except Exception:  # pylint: disable=broad-except  (cancelled, timed out, node failure)
        state = self.job.state.upper()
        self.returncode = -15 if 'CANCEL' in state or 'INTERRUPT' in state else 1
    return self.returncode

  def terminate(self) -> None:
    self.job.cancel(check=False)

  kill = terminate

  def wait(self, timeout: float | None = None) -> int:
    deadline = None if timeout is None else time.time() + timeout
    while self.poll() is None:
      if deadline is not None and time.time() > deadline:
        raise subprocess.TimeoutExpired(f'job {self.job.job_id}', timeout)
      time.sleep(0.5)
    return self.returncode
