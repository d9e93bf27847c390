"""The host ledger: what a run accounts for on the host, chunk by chunk.

`Ledger.finish` takes a chunk's fetched losses and StepInfo and does the host's share
of it: the divergence rule (`check_losses`), the cumulative counters (tokens, bytes
sent and received per worker, peak bytes, syncs), the wire records appended to the
communication log, the simulated clock advanced (`loco.sim.timeline`), and the chunk's
metrics record with its throughput and the drift diagnostics of its syncs (each the
mean over the chunk's syncs, `loco.comm.drift.summary`; absent in a chunk without a
sync and for algorithms without rounds). `state_dict` / `load_state_dict` are the
checkpoint's `host` item, so a resumed run counts on from where it stopped.
"""

import math
import time
from typing import Any, Callable, NoReturn

import jax
import numpy as np

from loco.sim import timeline as timeline_lib
from loco.comm import drift as drift_lib

# The divergence rule: a run has diverged when a step's mean training loss is not
# finite, or when, after the run has learned something (its best loss is LEARNED_MARGIN
# nats below ln V, the loss of uniform guessing over the vocabulary), a step's loss is
# back within UNIFORM_MARGIN of ln V or above (the model exploded: its predictions are
# no better than uniform, whatever its parameters). No checkpoint is written after it.
LEARNED_MARGIN = 0.5
UNIFORM_MARGIN = 0.01


def check_losses(losses_KxM: np.ndarray, first_step: int, best: float,
                 vocab_size: int) -> tuple[float, int | None, str | None]:
  """(best loss so far, None, None), or (best, the step, why) if the run diverged."""
  uniform = math.log(vocab_size)
  for i, row in enumerate(np.asarray(losses_KxM, np.float64)):
    loss, step = float(row.mean()), first_step + i
    if not np.all(np.isfinite(row)):
      return best, step, f'the training loss became {loss} at step {step}'
    if best < uniform - LEARNED_MARGIN and loss >= uniform - UNIFORM_MARGIN:
      return best, step, (f'the training loss rose to {loss:.3f} at step {step}, no '
                          f'better than uniform guessing (ln V = {uniform:.3f}) after '
                          f'reaching {best:.3f}: the model exploded')
    best = min(best, loss)
  return best, None, None


class Ledger:
  """Cumulative host-side accounting of a run, checkpointed with the state.

  Args:
    num_workers: M.
    sequence_tokens: one worker's tokens per step.
    vocab_size: V, for the divergence rule's ln V.
    timeline: the simulated clock, or None.
    comm_log: where each chunk's wire records go (`append(first_step, wires)`).
    diverged: called with (step, why) when the losses diverge; it raises.
  """

  def __init__(self, *, num_workers: int, sequence_tokens: int, vocab_size: int,
               timeline: timeline_lib.Timeline | None, comm_log,
               diverged: Callable[[int, str], NoReturn]):
    self.num_workers = num_workers
    self.sequence_tokens = sequence_tokens
    self.vocab_size = vocab_size
    self.timeline = timeline
    self.comm_log = comm_log
    self.diverged = diverged
    self.load_state_dict({})
    self.last_record: dict[str, Any] = {}
    self.mark()

  def state_dict(self) -> dict:
    return dict(tokens=self.tokens, bytes_sent=self.bytes_sent,
                bytes_received=self.bytes_received, peak_bytes=self.peak_bytes,
                syncs=self.syncs, best_loss=self.best_loss, timeline=self.timeline_state)

  def load_state_dict(self, d: dict) -> None:
    self.timeline_state = d.get('timeline', {})
    self.tokens = int(d.get('tokens', 0))
    self.bytes_sent = float(d.get('bytes_sent', 0.0))
    self.bytes_received = float(d.get('bytes_received', 0.0))
    self.peak_bytes = float(d.get('peak_bytes', 0.0))
    self.syncs = float(d.get('syncs', 0.0))
    self.best_loss = float(d.get('best_loss', math.inf))
    if self.timeline is not None:
      self.timeline.load_state_dict(self.timeline_state)

  def mark(self) -> None:
    """Restarts the throughput interval: throughput is wall time between consecutive
    chunk results, less compilation, evaluation and checkpointing (each calls this)."""
    self._mark = time.perf_counter()

  def finish(self, end_step: int, k: int, losses, info) -> tuple[dict[str, Any], float]:
    """(the record, seconds per step) of the chunk of `k` steps ending at `end_step`,
    from its host-copied outputs (padded to the chunk's length)."""
    now = time.perf_counter()
    elapsed, self._mark = max(now - self._mark, 1e-9), now
    losses = np.asarray(losses)[:k]                              # [k, M]
    info = _head(info, k)
    start_step = end_step - k
    self.best_loss, bad_step, why = check_losses(
        losses, start_step + 1, self.best_loss, self.vocab_size)
    if why:
      self.diverged(bad_step, why)
    active = (np.ones((k, self.num_workers), bool) if self.timeline is None
              else self.timeline.active(start_step, k))
    worker_tokens = active.sum() * self.sequence_tokens
    self._add(info, worker_tokens)
    self.comm_log.append(start_step + 1, timeline_lib.wires(active, info))
    sim = dict(sim_seconds=0.0)
    if self.timeline is not None:
      self.timeline.advance(start_step, info)
      self.timeline_state = self.timeline.state_dict()
      sim = self.timeline.metrics(end_step)
    record = dict(step=end_step, tokens=self.tokens,
                  train_loss=float(losses[-1].mean()),
                  bytes_sent=self.bytes_sent, bytes_received=self.bytes_received,
                  peak_bytes=self.peak_bytes, syncs=self.syncs, **sim,
                  **drift_lib.summary(info.drift, info.synced),
                  tokens_per_second=float(worker_tokens / elapsed))
    self.last_record = record
    return record, elapsed / k

  def _add(self, info, tokens: int) -> None:
    sent = np.asarray(info.wire.sent, np.float64)        # [K, M]
    self.tokens += int(tokens)
    self.bytes_sent += float(sent.mean(axis=1).sum())
    self.bytes_received += float(np.asarray(info.wire.received, np.float64).mean(1).sum())
    self.peak_bytes = max(self.peak_bytes, float(sent.max()))
    self.syncs += float(np.asarray(info.wire.events, np.float64).mean(axis=1).sum())


def _head(info, k: int):
  """The first `k` steps of every leaf (the rest is the chunk's padding)."""
  return jax.tree.map(lambda x: np.asarray(x)[:k], info)
