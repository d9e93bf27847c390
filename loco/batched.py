"""Batched runs: R runs of one shape trained in one program, each into its own workdir.

  python -m loco.batched --runs=RUNS.json [--results=RESULTS.json]

RUNS.json is a list of {"workdir": W, "argv": ["--config=experiments/x.py", "--config.seed=2",
...]}, each run's `loco.main` arguments. The runs may differ only in seed and the run
knobs (`loco.run.run_axis.RUN_KNOBS`); anything else is refused in one line naming the
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

import json
import os
import signal
import sys
from typing import Any, Sequence

from loco import cli
from loco.errors import Interrupted, LocoError, UsageError

PROG = 'loco.batched'


def run_batched(configs: Sequence[Any], workdirs: Sequence[str],
                outcomes: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
  """Trains (or resumes) the runs as one program: `loco.run.train.run_many`."""
  from loco.run import train
  return train.run_many(configs, workdirs, outcomes)


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
    from loco.run import checkpoint
    from loco.run import step
    from loco.lab import sweep
    from loco.run import train
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
    from loco.files.workdir import write_json
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
