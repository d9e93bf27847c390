"""The network clock checked against real transfers.

  python -m loco.calibrate [--algorithms=ddp,diloco,gasloc] [--rates=50,200]
      [--processes=2] [--steps=8] [--out=runs/calibrate] [--table=docs/calibration.md]
      [--link_efficiency=X] [--reuse]

For each algorithm and each rate (Mbit/s), trains the same short run (the tiny model,
experiments/tiny_*.py, one worker per process) as N JAX processes over Gloo, inside a
private network namespace (`unshare -n`) whose loopback is shaped by `tc qdisc tbf` to
that rate, and times every step from the host (its metrics row, one step per row). It
then re-times the run's communication log on loco's clock (`network.Clock`, the
homogeneous profile, no latency), with the measured compute time per step as
`step_seconds`, and prints per sync and per run the measured against the predicted
seconds and their ratio, and the bytes that crossed the shaped link (the namespace's
interface counters) against loco's bytes sent.

How the two are made comparable (loco.sim.netns has the namespace's side):

- Compute: each algorithm also runs once on an unshaped loopback; the median of its
  step times (the first two left out: `step_times`) is `step_seconds`. Every other
  measurement covers the same steps: the third to the last.
- The link: the loopback is one queue shaped to `rate`, which every process's traffic
  shares, where the clock gives every pair of workers its own link. A ring collective
  of m workers moves m chunks at once, so the shared queue is the clock's per-link
  model at `rate / m` (exact for ring all-reduce and all-gather, and for gossip with
  two workers); the prediction uses that per-link bandwidth.
- Coordination: the jax.distributed service, the per-step stop agreement and the end's
  checkpoint cross the loopback too; a run of the same length that never syncs
  (DiLoCo with sync_every beyond the run, at the lowest rate) gives those bytes,
  subtracted from each run's.
- Calibration: the fitted `network.link_efficiency` (loco.sim.network) is the predicted
  over the measured seconds of the blocking syncs of the runs whose loopback bytes are
  loco's count plus framing (within BYTES_MATCH: a run that moved more has a byte
  difference, shown in the table, not a link one); `--link_efficiency=X` applies a
  given one. The table shows the ratio before and after it.

Needs root (a network namespace and tc): without it, one line and exit 1. The load
average is printed with every table: the machine may be shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shutil
import statistics
import sys
import time
from typing import Any, Mapping, Sequence

import numpy as np

from loco import cli
from loco.sim import netns
from loco.sim import network as network_lib
from loco.files import runs
from loco.errors import LocoError, UsageError

PROG = 'loco.calibrate'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The overrides every calibration run shares: one worker per process (the worker axis
# over the processes), one step per metrics row (each step timed), no evaluation, a
# checkpoint only at the end, batch 1 (so transfers, not compute, dominate).
COMMON = ('--config.log_every=1', '--config.eval.every=0', '--config.checkpoint.every=0',
          '--config.progress=False', '--config.batch_per_worker=1')
SYNC_EVERY = 4
# algorithm: (experiment file, its overrides). Streaming's 5 fragments (4 blocks and the
# embedding) sync every other step, each arriving tau = 1 step later.
CASES = {
    'ddp': ('experiments/tiny_ddp.py', ()),
    'diloco': ('experiments/tiny_diloco.py', (f'--config.algorithm.sync_every={SYNC_EVERY}',)),
    'streaming': ('experiments/tiny_streaming.py',
                  ('--config.algorithm.sync_every=10',)),
    'sparseloco': ('experiments/tiny_sparseloco.py',
                   (f'--config.algorithm.sync_every={SYNC_EVERY}',)),
    'gasloc': ('experiments/tiny_gasloc.py', (f'--config.algorithm.sync_every={SYNC_EVERY}',)),
}
BASELINE = 'nosync'   # the coordination baseline: DiLoCo that never syncs in the run
MBIT = 1e6 / 8        # bytes/s in one Mbit/s (tc's mbit)
LAG = 1               # a row's interval is this many steps after its own (step_times)
MIN_SYNC_SECONDS = 0.05   # a sync predicted shorter is not given a ratio (noise)
BYTES_MATCH = 1.1     # runs fitted: loopback bytes within this of loco's (framing)


def case_command(algorithm: str, workdir: str, processes: int, steps: int) -> list[str]:
  """The `loco.main` flags of one calibration run (without --distributed's)."""
  if algorithm == BASELINE:
    path, extra = CASES['diloco'][0], (f'--config.algorithm.sync_every={steps + 1}',)
  else:
    path, extra = CASES[algorithm]
  return [f'--config={os.path.join(REPO, path)}', f'--workdir={workdir}', *COMMON, *extra,
          f'--config.num_workers={processes}', f'--config.mesh.workers={processes}',
          f'--config.steps={steps}']


# ---------------------------------------------------------------------------
# The pure parts: step times, the prediction, the comparison, the table.


def step_times(rows: Sequence[Mapping[str, Any]], lag: int = LAG) -> dict[int, float]:
  """{step: wall seconds} from one-step metrics rows: a row's new tokens over its
  tokens_per_second (loco.run.ledger: the wall time between consecutive chunk results).

  With several processes a chunk's results are fetched by a collective
  (`placement.fetch`) that the devices run after the next chunk, already dispatched: a
  row's interval is then the step `lag` = 1 after it. The first row (from the start to
  the first results: the first steps, lag + 1 of them) is left out, as is the rows'
  tail that names a step past the run's last.
  """
  out, tokens = {}, None
  last = max((int(r['step']) for r in rows), default=0)
  for row in rows:
    new = None if tokens is None else row['tokens'] - tokens
    tokens = row['tokens']
    step = int(row['step']) + lag
    if new is not None and row['tokens_per_second'] > 0 and step <= last:
      out[step] = new / row['tokens_per_second']
  return out


def compute_seconds(times: Mapping[int, float]) -> float:
  """A step's compute seconds: the median step time of an unshaped run."""
  if not times:
    raise LocoError('the unshaped run timed no step; give --steps more.')
  return float(statistics.median(times.values()))


def predict(log: Mapping[int, Any], num_workers: int, steps: int, step_seconds: float,
            link_bytes_per_second: float, link_efficiency: float = 1.0) -> dict[int, float]:
  """{step: predicted seconds} of loco's clock over a run's communication log
  (`loco.sim.commlog.read`), on the homogeneous profile: `link_bytes_per_second` per link,
  no latency, `network.link_efficiency`, every worker `step_seconds` per step."""
  from loco.sim import commlog  # pylint: disable=g-import-not-at-top
  cfg = network_lib.NetworkConfig(profile='homogeneous', bandwidth=link_bytes_per_second,
                                  latency=0.0, step_seconds=step_seconds,
                                  link_efficiency=link_efficiency)
  net = network_lib.make_network(cfg, num_workers, step_seconds)
  out, before = {}, 0.0
  for step, clock in commlog.replay(net, log, steps):
    out[step] = clock.seconds - before
    before = clock.seconds
  return out


def sync_steps(log: Mapping[int, Any]) -> dict[int, int]:
  """{step: overlap tau} of the steps in which some worker sent bytes."""
  out = {}
  for step, (_, wire) in log.items():
    if np.asarray(wire.sent, float).sum() > 0:
      out[step] = 0 if wire.overlap is None else int(np.max(wire.overlap))
  return out


def bytes_sent(log: Mapping[int, Any]) -> float:
  """Bytes every worker put on the wire over the whole log, summed over workers."""
  return float(sum(np.asarray(wire.sent, float).sum() for _, wire in log.values()))


@dataclasses.dataclass
class Comparison:
  """One run measured against the clock.

  Attributes:
    syncs: per sync step, (step, tau, measured s, predicted s, after s) of the sync
      alone (the step's time less `compute`).
    measured, predicted, after: the run's seconds over the measured steps (after: the
      prediction with the link efficiency).
    compute: step_seconds used.
  """
  syncs: list[tuple[int, int, float, float, float]]
  measured: float
  predicted: float
  after: float
  compute: float


def compare(measured: Mapping[int, float], predicted: Mapping[int, float],
            after: Mapping[int, float], syncs: Mapping[int, int],
            compute: float) -> Comparison:
  """The measured steps of a run against predicted (and after)."""
  steps = sorted(measured)
  if not steps:
    raise LocoError('the run timed no step; give --steps more.')
  rows = [(s, syncs[s], measured[s] - compute, predicted[s] - compute, after[s] - compute)
          for s in steps if s in syncs]
  return Comparison(syncs=rows, measured=sum(measured[s] for s in steps),
                    predicted=sum(predicted[s] for s in steps),
                    after=sum(after[s] for s in steps), compute=compute)


def fit_efficiency(comparisons: Sequence[Comparison]) -> float | None:
  """The link efficiency that makes the blocking syncs' predicted seconds sum to their
  measured seconds (syncs predicted shorter than MIN_SYNC_SECONDS left out); None if
  there is none, and at most 1."""
  predicted = sum(p for c in comparisons for _, tau, _, p, _ in c.syncs
                  if tau == 0 and p >= MIN_SYNC_SECONDS)
  measured = sum(m for c in comparisons for _, tau, m, p, _ in c.syncs
                 if tau == 0 and p >= MIN_SYNC_SECONDS)
  if predicted <= 0 or measured <= 0:
    return None
  return min(1.0, predicted / measured)


def ratio(measured: float, predicted: float) -> str:
  return f'{measured / predicted:.2f}' if predicted >= MIN_SYNC_SECONDS else '-'


def median_sync(c: Comparison) -> tuple[float, float, float] | None:
  """The median measured, predicted and after seconds of a run's syncs (None: none)."""
  if not c.syncs:
    return None
  return tuple(float(statistics.median(col)) for col in list(zip(*c.syncs))[2:])


@dataclasses.dataclass
class Result:
  """One algorithm at one rate: the comparison, the bytes, the load around it."""
  algorithm: str
  rate: float
  comparison: Comparison
  loco_bytes: float
  wire_bytes: float        # the namespace's loopback bytes, less the baseline's
  qdisc_bytes: float       # what tbf sent (framing included), less the baseline's
  load: tuple[float, float, float]
  wall: float


def table(results: Sequence[Result], efficiency: float | None) -> list[str]:
  """The measured-against-predicted table as markdown lines."""
  eff = '' if efficiency is None else f' (link_efficiency {efficiency:.3f})'
  lines = [
      '| algorithm | Mbit/s | compute s/step | syncs | sync measured s | sync predicted s '
      f'| ratio | after{eff} s | ratio after | run measured s | run predicted s | ratio '
      '| ratio after | loco MB sent | wire MB (tbf MB) | wire / loco | load 1 min |',
      '|' + '---|' * 17]
  for r in results:
    c = r.comparison
    med = median_sync(c)
    sync = ('-', '-', '-', '-', '-') if med is None else (
        f'{med[0]:.2f}', f'{med[1]:.2f}', ratio(med[0], med[1]), f'{med[2]:.2f}',
        ratio(med[0], med[2]))
    lines.append(
        f'| {r.algorithm} | {r.rate:g} | {c.compute:.3f} | {len(c.syncs)} | '
        + ' | '.join(sync)
        + f' | {c.measured:.2f} | {c.predicted:.2f} | {ratio(c.measured, c.predicted)} | '
        f'{ratio(c.measured, c.after)} | {r.loco_bytes / 1e6:.2f} | {r.wire_bytes / 1e6:.2f} '
        f'({r.qdisc_bytes / 1e6:.2f}) | '
        f'{(r.wire_bytes / r.loco_bytes if r.loco_bytes else float("nan")):.3f} | '
        f'{r.load[0]:.2f} |')
  return lines


def sync_lines(r: Result) -> list[str]:
  """Per-sync lines of one result: step, tau, measured, predicted, ratio."""
  return [f'  step {step:3d}{f" (tau {tau})" if tau else ""}: sync measured {m:7.3f} s, '
          f'predicted {p:7.3f} s, ratio {ratio(m, p)}, after {a:7.3f} s, '
          f'ratio {ratio(m, a)}' for step, tau, m, p, a in r.comparison.syncs]


# ---------------------------------------------------------------------------
# Running the cases.


def parse_list(text: str, allowed: Sequence[str]) -> list[str]:
  names = [n.strip() for n in text.split(',') if n.strip()]
  bad = [n for n in names if n not in allowed]
  if bad or not names:
    raise UsageError(f'--algorithms takes names from {", ".join(allowed)}; got '
                     f'{bad[0] if bad else "none"!r}.')
  return names


def parse_rates(text: str) -> list[float]:
  try:
    rates = [float(r) for r in text.split(',') if r.strip()]
  except ValueError:
    raise UsageError(f'--rates takes Mbit/s numbers separated by commas, got {text!r}.'
                     ) from None
  if not rates or not all(np.isfinite(r) and r > 0 for r in rates):
    raise UsageError(f'--rates takes positive Mbit/s numbers, got {text!r}.')
  return rates


def _fresh(path: str) -> None:
  """Clears a calibration run's directory from an earlier invocation (a loco run, or
  the run's logs); anything else there is refused."""
  if os.path.lexists(path):
    if os.path.islink(path) or not os.path.isdir(path):
      raise LocoError(f'{path} is not a directory; remove it or choose another --out.')
    allowed = {netns.RESULT, 'run'} | {f'process-{i}.log' for i in range(64)}
    if set(os.listdir(path)) - allowed:
      raise LocoError(f'{path} holds files that are not a calibration run\'s; choose '
                      'another --out.')
    shutil.rmtree(path)
  os.makedirs(path)


def run_case(algorithm: str, rate: float | None, out: str, processes: int, steps: int,
             timeout: float, reuse: bool = False) -> tuple[str, dict]:
  """Trains one case in a namespace (with `reuse`, one already trained there is read
  again); returns (its workdir, the namespace's result)."""
  where = os.path.join(out, algorithm, 'free' if rate is None else f'rate={rate:g}')
  workdir = os.path.join(where, 'run')
  if reuse and os.path.isfile(os.path.join(where, netns.RESULT)):
    result = runs.read_json_object(os.path.join(where, netns.RESULT))
    if result and runs.read_config(workdir) is not None:
      return workdir, result
  _fresh(where)
  result = netns.run_processes(where, processes, case_command(algorithm, workdir, processes,
                                                               steps),
                               rate_mbit=rate, timeout=timeout)
  return workdir, result


def _read(workdir: str):
  from loco.sim import commlog  # pylint: disable=g-import-not-at-top
  rows = runs.read_metrics(workdir).rows
  num_workers, log = commlog.read(workdir, steps=rows)
  return rows, num_workers, log


def calibrate(algorithms: Sequence[str], rates: Sequence[float], out: str, processes: int,
              steps: int, timeout: float, link_efficiency: float | None,
              say=print, reuse: bool = False) -> tuple[list[Result], float | None]:
  """Runs every case (with `reuse`, reads the ones already in `out`); returns the
  results and the link efficiency used after."""
  cli.check_output_dir(out)
  case = functools.partial(run_case, out=out, processes=processes, steps=steps,
                           timeout=timeout, reuse=reuse)
  _, base = case(BASELINE, min(rates))
  say(f'baseline (no sync, {steps} steps): {base["lo_bytes"] / 1e6:.2f} MB on the loopback')
  pending = []
  for algorithm in algorithms:
    free, _ = case(algorithm, None)
    compute = compute_seconds(step_times(_read(free)[0]))
    say(f'{algorithm}: {compute:.3f} s per step unshaped')
    for rate in rates:
      workdir, result = case(algorithm, rate)
      load = tuple(result.get('load') or (float('nan'),) * 3)
      rows, m, log = _read(workdir)
      pending.append((algorithm, rate, compute, rows, m, log, result, base, load))
  def build(eff):
    results = []
    for algorithm, rate, compute, rows, m, log, result, base, load in pending:
      per_link = rate * MBIT / m
      predicted = predict(log, m, steps, compute, per_link)
      after = predict(log, m, steps, compute, per_link, eff or 1.0)
      comparison = compare(step_times(rows), predicted, after, sync_steps(log), compute)
      results.append(Result(
          algorithm=algorithm, rate=rate, comparison=comparison, loco_bytes=bytes_sent(log),
          wire_bytes=result['lo_bytes'] - base['lo_bytes'],
          qdisc_bytes=result['qdisc_bytes'] - base['qdisc_bytes'], load=load,
          wall=result['wall']))
    return results
  efficiency = link_efficiency
  if efficiency is None:   # a run that moved more bytes than loco counts is not the link's
    efficiency = fit_efficiency([r.comparison for r in build(None) if r.loco_bytes > 0
                                 and r.wire_bytes <= BYTES_MATCH * r.loco_bytes])
  return build(efficiency), efficiency


def report(results: Sequence[Result], efficiency: float | None, command: str, wall: float,
           processes: int, steps: int) -> list[str]:
  """The page: the command, its wall time, the load, the table, the syncs."""
  load = os.getloadavg()
  lines = [f'`{command}`', '',
           f'{processes} processes, {steps} steps each, wall time {wall:.0f} s; load average '
           f'at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min), at each '
           'run\'s start in the last column.', '']
  lines += table(results, efficiency)
  lines += ['', 'Per sync (seconds of the sync alone: the step less compute):', '']
  for r in results:
    lines += [f'- {r.algorithm} at {r.rate:g} Mbit/s:', '', '```', *sync_lines(r), '```', '']
  return lines


def main(argv: Sequence[str] | None = None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  if args[:1] == [netns.INSIDE]:      # the namespace's side (loco.sim.netns)
    return netns.inside(args[1:])
  parser = cli.Parser(prog=f'python -m {PROG}', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--algorithms', default='ddp,diloco,gasloc',
                      help=f'comma-separated, from {", ".join(CASES)}')
  parser.add_argument('--rates', default='50,200', help='Mbit/s of the shaped loopback')
  parser.add_argument('--processes', type=cli.positive_int, default=2,
                      help='JAX processes (workers), >= 2')
  parser.add_argument('--steps', type=cli.positive_int, default=10)
  parser.add_argument('--out', default='runs/calibrate')
  parser.add_argument('--table', default=None, help='also write the page (markdown) here')
  parser.add_argument('--link_efficiency', type=cli.positive_float, default=None,
                      help='applied after (default: fitted from the blocking syncs)')
  parser.add_argument('--timeout', type=cli.positive_float, default=600,
                      help='seconds one run may take')
  parser.add_argument('--reuse', action='store_true',
                      help='read the runs already in --out instead of training them again '
                      '(the table and the fit again, e.g. with another --link_efficiency)')
  parsed = parser.parse_args(args)

  def body() -> int:
    algorithms = parse_list(parsed.algorithms, list(CASES))
    rates = parse_rates(parsed.rates)
    if parsed.processes < 2:
      raise UsageError('--processes must be at least 2 (a transfer needs two ends).')
    if parsed.link_efficiency is not None and parsed.link_efficiency > 1:
      raise UsageError(f'--link_efficiency must be in (0, 1], got {parsed.link_efficiency}.')
    if parsed.steps < LAG + 3:
      raise UsageError(f'--steps must be at least {LAG + 3} (the first {LAG + 1} are not '
                       'timed).')
    netns.check_available()
    start = time.perf_counter()
    results, efficiency = calibrate(algorithms, rates, parsed.out, parsed.processes,
                                    parsed.steps, parsed.timeout, parsed.link_efficiency,
                                    reuse=parsed.reuse)
    wall = time.perf_counter() - start
    command = 'python -m loco.calibrate ' + ' '.join(args)
    lines = report(results, efficiency, command, wall, parsed.processes, parsed.steps)
    print('\n'.join(lines))
    if parsed.table:
      runs.write_atomic(parsed.table, '\n'.join(lines) + '\n')
      print(f'written: {parsed.table}')
    return 0

  return cli.run(PROG, body)


if __name__ == '__main__':
  cli.exit(main())
