"""The overlap model of Streaming DiLoCo section 3.1: compute utilization against
bandwidth, with no training (the clock's overlap='backward' uses its formula too).

  python -m loco.overlap_model --params=10e9 --step_seconds=0.8 --workers=2 \\
      --algorithm=ddp|diloco|streaming_diloco [--sync_every=H --fragments=P \\
      --overlap_steps=T --latency=S --dtype=bfloat16|float32] [--json]

prints the bandwidth (Gbit/s, 1e9 bits/s, per worker link) needed for 50, 80, 90, 95 and
99% compute utilization; with --json exactly
`{"target": [0.5, 0.8, 0.9, 0.95, 0.99], "gbit_per_s": [...]}`, where a target that no
bandwidth reaches (latency alone stalls too long) is `null` (inf in Python).

The model (the one the paper's author re-implemented publicly, REFERENCES.md section 2):

- a step is a forward pass of step/3 then a backward pass of 2 step/3 seconds;
- what a step sends is cut into K = 128 equal buckets released evenly through its
  backward pass (bucket k at forward + (k + 1)/K backward), as a framework reduces
  gradients layer by layer while the backward pass goes on;
- one FIFO network queue; a bucket takes latency + bits / bandwidth (so a send pays the
  latency K times: use --buckets=1 for one message per send), and the bits are the
  payload times 2 (1 - 1/M), the per-worker traffic of a ring all-reduce;
- what step s sends is due when step s + 1 + tau starts: DDP sends every gradient every
  step (tau = 0); DiLoCo sends the whole outer gradient on the last step of each round
  of H steps (tau = 0); Streaming DiLoCo sends fragment f (1/P of the model) at step
  floor(f H / P) of each round and needs it tau = overlap_steps steps later;
- a step cannot start before what is due then has arrived: stall = max(0, arrival -
  deadline), and CU = compute / (compute + stall), measured over whole rounds after a
  warm-up round (the queue may carry traffic from one round into the next).

Defaults, from the papers: 10e9 parameters at 0.8 s per step (the 10B row of the
DiLoCo scaling-law and Streaming DiLoCo tables), M = 2 workers (both papers' main
setting), bfloat16 on the wire (the re-implementation's default), H = 100 (Streaming
DiLoCo Table 4), P = one fragment per 3 layers as the paper's scales have it (1B: 8,
10B: 16, 100B: 36, above: 40), tau = 1 (its main runs), no latency.

References: arXiv 2501.18512 (Streaming DiLoCo, section 3.1 and Table 4),
arXiv 2503.09799 (Scaling Laws for DiLoCo, the bandwidth-for-utilization table).
"""

import argparse
import dataclasses
import json
import math
from typing import Sequence

from loco import cli
from loco.errors import ConfigError, UsageError

PROG = 'loco.overlap_model'
ALGORITHMS = ('ddp', 'diloco', 'streaming_diloco')
TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)
# Bits per value on the wire. float4 is Streaming DiLoCo's E3M0 (its 'FP4 com.' rows).
DTYPE_BITS = {'float32': 32, 'bfloat16': 16, 'float8': 8, 'float4': 4}
FORWARD_SHARE = 1.0 / 3.0     # forward : backward = 1 : 2 (backward computes two products)
BUCKETS = 128
GBIT = 1e9                    # bits/s in one Gbit/s
DEFAULT_SYNC_EVERY = 100
DEFAULT_OVERLAP_STEPS = 1
# Fragments the paper's scales have (3 layers each): (largest parameter count, P).
_FRAGMENTS_BY_SIZE = ((2e9, 8), (15e9, 16), (150e9, 36), (math.inf, 40))


def default_fragments(params: float) -> int:
  """P for a model of `params` parameters: Streaming DiLoCo's 3 layers per fragment at
  its 1B / 10B / 100B scales (8 / 16 / 36 fragments), 40 above."""
  return next(p for size, p in _FRAGMENTS_BY_SIZE if params <= size)


@dataclasses.dataclass(frozen=True)
class Workload:
  """One training setup whose communication the model times.

  Attributes:
    params: parameters sent (one value each).
    step_seconds: compute seconds of one inner step (forward + backward).
    workers: M, workers in the all-reduce.
    algorithm: one of ALGORITHMS.
    sync_every: H, steps per round (DiLoCo, Streaming DiLoCo).
    fragments: P, fragments per round (Streaming DiLoCo).
    overlap_steps: tau, steps a fragment may take to arrive (Streaming DiLoCo).
    latency: seconds added to every bucket's transfer.
    bits: bits per value on the wire.
    buckets: K, pieces each send is cut into through the backward pass.
  """
  params: float
  step_seconds: float
  workers: int
  algorithm: str
  sync_every: int = 1
  fragments: int = 1
  overlap_steps: int = 0
  latency: float = 0.0
  bits: float = 16
  buckets: int = BUCKETS

  def __post_init__(self):
    if self.algorithm not in ALGORITHMS:
      raise ConfigError(f'the algorithm must be one of {", ".join(ALGORITHMS)}, got '
                        f'{self.algorithm!r}.')
    for key in ('params', 'step_seconds', 'bits'):
      value = getattr(self, key)
      if not (math.isfinite(value) and value > 0):
        raise ConfigError(f'{key} must be a positive number, got {value}.')
    if not (math.isfinite(self.latency) and self.latency >= 0):
      raise ConfigError(f'latency must be a number of seconds >= 0, got {self.latency}.')
    for key in ('workers', 'sync_every', 'fragments', 'buckets'):
      if getattr(self, key) < 1:
        raise ConfigError(f'{key} must be at least 1, got {getattr(self, key)}.')
    if self.overlap_steps < 0:
      raise ConfigError(f'overlap_steps must be >= 0, got {self.overlap_steps}.')
    if self.algorithm == 'ddp' and self.sync_every != 1:
      raise ConfigError('ddp sends every step: sync_every does not apply to it.')
    if self.algorithm != 'streaming_diloco' and (self.fragments != 1 or self.overlap_steps):
      raise ConfigError('fragments and overlap_steps apply to streaming_diloco only.')
    if self.fragments > self.sync_every:
      # As loco.algorithms.streaming: each fragment syncs at its own step of the round.
      raise ConfigError(f'fragments={self.fragments} must be <= sync_every='
                        f'{self.sync_every}, so that fragments sync at distinct steps.')

  def sends(self) -> list[tuple[int, float, int]]:
    """One round's traffic: (step of the round, bits each worker sends, tau)."""
    factor = 2.0 * (1.0 - 1.0 / self.workers)   # ring all-reduce, per worker
    total = self.params * self.bits * factor
    if self.algorithm == 'ddp':
      return [(0, total, 0)]
    if self.algorithm == 'diloco':
      return [(self.sync_every - 1, total, 0)]
    return [(f * self.sync_every // self.fragments, total / self.fragments,
             self.overlap_steps) for f in range(self.fragments)]

  @property
  def round_steps(self) -> int:
    return 1 if self.algorithm == 'ddp' else self.sync_every


def backward_overlap_end(starts: Sequence[float], step_seconds: Sequence[float],
                         bucket_seconds: float, buckets: int = BUCKETS,
                         queue_free: float = -math.inf) -> float:
  """When a send overlapped with the backward pass of its step is done.

  Participant i starts its step at starts[i] and computes for step_seconds[i]: a
  forward pass of FORWARD_SHARE of it, then the backward pass, through which the send's
  K = `buckets` equal pieces are released evenly (piece k at starts[i] + step_seconds[i]
  (F + (k + 1) (1 - F) / K)), as a framework reduces gradients layer by layer while the
  backward pass goes on. Piece k goes on the wire once every participant has released
  it and piece k - 1 is done (one FIFO queue, idle from `queue_free`), and takes
  c = `bucket_seconds`. This is the one formula of the overlap model: `compute_utilization`
  times its sends with it and `network.Clock` (network.overlap='backward') its
  collectives.

  Args:
    starts: when each participant starts the step (seconds).
    step_seconds: each participant's compute seconds in the step (forward + backward).
    bucket_seconds: c, seconds one piece takes on the wire.
    buckets: K, pieces the send is cut into.
    queue_free: when the network queue is free of earlier traffic (-inf: it is).

  Returns:
    When the last piece is done: done_k = max(done_{k-1}, release_k) + c unrolls to
    max over k of release_k + (K - k) c; each release_k is a maximum of functions linear
    in k, so the maximum sits at the first or the last piece: max(max(queue_free,
    max_i first release_i) + K c, max_i (starts_i + step_seconds_i) + c).

  References: arXiv 2501.18512 section 3.1.
  """
  first = max(s + d * (FORWARD_SHARE + (1 - FORWARD_SHARE) / buckets)
              for s, d in zip(starts, step_seconds))
  last = max(s + d for s, d in zip(starts, step_seconds))
  return float(max(max(queue_free, first) + buckets * bucket_seconds, last + bucket_seconds))


def compute_utilization(workload: Workload, gbit_per_s: float, rounds: int = 4,
                        warmup_rounds: int = 2) -> float:
  """Compute utilization (0..1] of `workload` over links of `gbit_per_s`.

  Args:
    workload: the setup.
    gbit_per_s: bandwidth in Gbit/s (math.inf: only latency costs time).
    rounds: whole rounds measured (H steps each; one step for DDP).
    warmup_rounds: rounds simulated first and not measured: the queue starts empty,
      and traffic a round leaves in flight (tau > 0) reaches the steady state after one
      round (tests/test_overlap_model.py checks that more rounds change nothing).

  Returns:
    compute / (compute + stall) over the measured rounds.

  References: arXiv 2501.18512 section 3.1.
  """
  if not gbit_per_s > 0:
    raise ConfigError(f'the bandwidth must be > 0 Gbit/s, got {gbit_per_s}.')
  step = workload.step_seconds
  bandwidth = gbit_per_s * GBIT
  t, cursor = 0.0, 0     # the compute clock is at the start of step `cursor`
  net_free = 0.0         # when the network queue is next idle
  due: dict[int, float] = {}   # step -> the latest arrival its start waits for
  stall = measured_from = 0.0

  def advance(s: int) -> None:
    """Computes up to the start of step `s`, stalling where traffic is due."""
    nonlocal t, cursor, stall
    for k in sorted(k for k in due if k <= s):
      t += (k - cursor) * step
      cursor = k
      arrival = due.pop(k)
      if arrival > t:
        stall += arrival - t
        t = arrival
    t += (s - cursor) * step
    cursor = s

  for r in range(warmup_rounds + rounds):
    advance(r * workload.round_steps)
    if r == warmup_rounds:      # measure whole rounds, each from its (stalled) start
      measured_from, stall = t, 0.0
    for offset, bits, tau in workload.sends():
      advance(r * workload.round_steps + offset)
      # The K buckets of this send queue FIFO behind what is in flight.
      c = workload.latency + bits / workload.buckets / bandwidth
      done = backward_overlap_end([t], [step], c, workload.buckets, queue_free=net_free)
      net_free = done
      key = cursor + 1 + tau
      due[key] = max(due.get(key, 0.0), done)
  advance((warmup_rounds + rounds) * workload.round_steps)
  elapsed = t - measured_from
  return (elapsed - stall) / elapsed


def max_utilization(workload: Workload) -> float:
  """Compute utilization with unlimited bandwidth: only latency costs time."""
  return compute_utilization(workload, math.inf)


def required_bandwidth(workload: Workload, targets: Sequence[float] = TARGETS,
                       rel_tol: float = 1e-6) -> list[float]:
  """The least bandwidth (Gbit/s) at which `workload` reaches each target utilization.

  Bisection on log(bandwidth): utilization does not decrease as bandwidth grows. A
  target above what unlimited bandwidth reaches (latency alone stalls too long) is
  math.inf; one reached with no traffic at all (M = 1) is 0.

  References: arXiv 2501.18512 (Table 4), arXiv 2503.09799 (its 10B table).
  """
  for target in targets:
    if not 0 < target < 1:
      raise ConfigError(f'a target utilization must be in (0, 1), got {target}.')
  if workload.workers == 1:
    return [0.0 for _ in targets]
  ceiling = max_utilization(workload)
  # A first guess: the bandwidth that moves one round's traffic in one round of compute.
  bits = sum(b for _, b, _ in workload.sends())
  guess = bits / (workload.round_steps * workload.step_seconds) / GBIT
  out = []
  for target in targets:
    if ceiling < target:
      out.append(math.inf)
      continue
    lo = hi = guess
    while compute_utilization(workload, hi) < target:
      lo, hi = hi, hi * 4
      if hi > guess * 1e12:      # the ceiling is this target to rounding: say so
        hi = math.inf
        break
    while lo > 0 and compute_utilization(workload, lo) >= target:
      lo, hi = lo / 4, lo
    if math.isfinite(hi):
      while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if compute_utilization(workload, mid) >= target:
          hi = mid
        else:
          lo = mid
    out.append(hi)
  return out


def make_workload(params: float = 10e9, step_seconds: float = 0.8, workers: int = 2,
                  algorithm: str = 'ddp', sync_every: int | None = None,
                  fragments: int | None = None, overlap_steps: int | None = None,
                  latency: float = 0.0, dtype: str = 'bfloat16',
                  buckets: int = BUCKETS) -> Workload:
  """A `Workload` with the papers' defaults for what is None (the module docstring);
  a knob that the algorithm does not read is an error rather than silently ignored."""
  if algorithm not in ALGORITHMS:
    raise ConfigError(f'--algorithm must be one of {", ".join(ALGORITHMS)}, got '
                      f'{algorithm!r}.')
  if dtype not in DTYPE_BITS:
    raise ConfigError(f'--dtype must be one of {", ".join(DTYPE_BITS)}, got {dtype!r}.')
  unread = {'ddp': ('sync_every', 'fragments', 'overlap_steps'),
            'diloco': ('fragments', 'overlap_steps'), 'streaming_diloco': ()}[algorithm]
  given = dict(sync_every=sync_every, fragments=fragments, overlap_steps=overlap_steps)
  for key in unread:
    if given[key] is not None:
      raise ConfigError(f'--{key} is not read by --algorithm={algorithm}.')
  kwargs = {}
  if algorithm != 'ddp':
    kwargs['sync_every'] = DEFAULT_SYNC_EVERY if sync_every is None else sync_every
  if algorithm == 'streaming_diloco':
    kwargs['fragments'] = default_fragments(params) if fragments is None else fragments
    kwargs['overlap_steps'] = (DEFAULT_OVERLAP_STEPS if overlap_steps is None
                               else overlap_steps)
  return Workload(params=params, step_seconds=step_seconds, workers=workers,
                  algorithm=algorithm, latency=latency, bits=DTYPE_BITS[dtype],
                  buckets=buckets, **kwargs)


def describe(workload: Workload) -> str:
  """One line naming the setup, for the table's title."""
  what = {'ddp': 'DDP',
          'diloco': f'DiLoCo, H={workload.sync_every}',
          'streaming_diloco': (f'Streaming DiLoCo, H={workload.sync_every}, '
                               f'P={workload.fragments}, tau={workload.overlap_steps}')}
  dtype = next((k for k, v in DTYPE_BITS.items() if v == workload.bits),
               f'{workload.bits:g} bits')
  return (f'{what[workload.algorithm]}: {workload.params:.3g} parameters ({dtype}), '
          f'{workload.step_seconds:g} s per step, M={workload.workers}, latency '
          f'{workload.latency:g} s, K={workload.buckets} buckets')


def _number(kind):
  def parse(text: str):
    value = cli.finite_float(text)
    if kind is int:
      if not value.is_integer():
        raise argparse.ArgumentTypeError(f'{text!r} is not a whole number')
      return int(value)
    return value
  return parse


def _positive(kind):
  def parse(text: str):
    value = _number(kind)(text)
    if not value > 0:
      raise argparse.ArgumentTypeError(f'{text!r} must be > 0')
    return value
  return parse


def _non_negative(kind):
  def parse(text: str):
    value = _number(kind)(text)
    if value < 0:
      raise argparse.ArgumentTypeError(f'{text!r} must be >= 0')
    return value
  return parse


def _json_number(x: float) -> float | None:
  return None if math.isinf(x) else float(f'{x:.6g}')


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog='python -m loco.overlap_model', description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--params', type=_positive(float), default=10e9,
                      help='parameters sent (default 10e9)')
  parser.add_argument('--step_seconds', type=_positive(float), default=0.8,
                      help='compute seconds per inner step (default 0.8)')
  parser.add_argument('--workers', type=_positive(int), default=2,
                      help='M, workers in the all-reduce (default 2)')
  parser.add_argument('--algorithm', choices=ALGORITHMS, required=True)
  parser.add_argument('--sync_every', type=_positive(int),
                      help=f'H, steps per round (default {DEFAULT_SYNC_EVERY})')
  parser.add_argument('--fragments', type=_positive(int),
                      help='P, streaming fragments (default: 8 / 16 / 36 / 40 for up to '
                           '2e9 / 15e9 / 150e9 / more parameters)')
  parser.add_argument('--overlap_steps', type=_non_negative(int),
                      help=f'tau, steps a fragment may take (default {DEFAULT_OVERLAP_STEPS})')
  parser.add_argument('--latency', type=_non_negative(float), default=0.0,
                      help='seconds added to each bucket\'s transfer (default 0)')
  parser.add_argument('--dtype', choices=tuple(DTYPE_BITS), default='bfloat16',
                      help='value type on the wire (default bfloat16)')
  parser.add_argument('--buckets', type=_positive(int), default=BUCKETS,
                      help=f'K, pieces each send is cut into (default {BUCKETS})')
  parser.add_argument('--json', action='store_true',
                      help='print {"target": [...], "gbit_per_s": [...]} only')
  args = parser.parse_args(argv)

  def body() -> int:
    try:
      workload = make_workload(
          params=args.params, step_seconds=args.step_seconds, workers=args.workers,
          algorithm=args.algorithm, sync_every=args.sync_every, fragments=args.fragments,
          overlap_steps=args.overlap_steps, latency=args.latency, dtype=args.dtype,
          buckets=args.buckets)
    except ConfigError as e:
      raise UsageError(str(e)) from None
    needed = required_bandwidth(workload)
    if args.json:
      print(json.dumps({'target': list(TARGETS),
                        'gbit_per_s': [_json_number(x) for x in needed]}))
      return 0
    print(describe(workload))
    print(f'{"CU":>5}  {"Gbit/s":>12}')
    for target, x in zip(TARGETS, needed):
      shown = 'unreachable (latency)' if math.isinf(x) else f'{x:12.4g}'
      print(f'{target:>5.0%}  {shown}')
    return 0

  return cli.run(PROG, body)


if __name__ == '__main__':
  cli.exit(main())
