"""The communication log: what each step put on the wire, kept beside metrics.jsonl.

  runs/x/comms.jsonl   {"workers": M} first, then one line per step in which a worker
                       communicated or sat out:
    {"step": 300, "kind": [1, 1, ...], "sent": [...], "payload": [...],
     "peers": [[1, 2, 3], [0, 2, 3], ...], "overlap": 0, "active": [...]}

A row is a step's `loco.wire.Wire` (host arrays) and its active mask: `kind` indexes
`loco.wire.KINDS`, `peers[i]` lists the workers i exchanged with, `overlap` is the
wire's tau, left out when it is 0, `active` is left out when every worker computed,
and `received` when no worker received more than it sent (kept for catch-ups after
offline dropout, which the clock times, and for all-gathers). A step that is not
in the file is one in which every worker computed and nobody communicated. This is all
`network.Clock` reads, so `loco.retime` can time a finished run on any other network
without training again (`replay`).
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Iterator

import numpy as np

from loco.sim import network as network_lib
from loco.files import runs
from loco import overlap_model
from loco.files.metrics import append_jsonl, write_jsonl
from loco.wire import NO_COMM, Wire

FILE = runs.COMMS    # kept for callers of loco.sim.commlog.FILE


def _row(step: int, active: np.ndarray, wire: Wire) -> dict | None:
  """The log row of a step's host `Wire` and active mask; None: nothing to log."""
  active = np.asarray(active, bool)
  kind = np.asarray(wire.kind, int)
  if active.all() and not kind.any():
    return None
  row = dict(step=step, kind=kind.tolist(),
             sent=[float(x) for x in np.asarray(wire.sent)],
             payload=[float(x) for x in np.asarray(wire.payload)],
             peers=[np.flatnonzero(p).tolist() for p in np.asarray(wire.peers, bool)])
  tau = 0 if wire.overlap is None else int(np.max(wire.overlap))
  if tau:
    row['overlap'] = tau
  if not active.all():
    row['active'] = active.astype(int).tolist()
  if wire.received is not None and _catches_up(kind, wire.sent, wire.received):
    row['received'] = [float(x) for x in np.asarray(wire.received)]
  return row


def _catches_up(kind, sent, received) -> bool:
  # Written only when a worker received more than it sent (a catch-up after offline
  # dropout, or all-gathered messages), to keep the log small otherwise.
  return bool(np.any(np.asarray(received) > np.asarray(sent) + 0.5))


def _wire(row: dict, num_workers: int) -> tuple[np.ndarray, Wire]:
  """(active, Wire) of a log row: one event per worker that communicated, no fragment
  (the log does not keep them), `received` None when the row has none."""
  peers = np.zeros((num_workers, num_workers), bool)
  for i, js in enumerate(row['peers']):
    peers[i, js] = True
  active = np.asarray(row.get('active', [1] * num_workers), bool)
  kind = np.asarray(row['kind'], int)
  return active, Wire(sent=np.asarray(row['sent'], float),
                      received=(np.asarray(row['received'], float)
                                if 'received' in row else None),
                      events=(kind != NO_COMM).astype(int), kind=kind,
                      payload=np.asarray(row['payload'], float), peers=peers,
                      overlap=(np.full(num_workers, int(row['overlap']))
                               if 'overlap' in row else None))


class CommLog:
  """Appends a run's steps to comms.jsonl; a resumed run first drops the steps after
  its checkpoint (through a temporary file and a rename), as metrics.jsonl does."""

  def __init__(self, workdir: str, num_workers: int, resume_step: int = 0):
    self.path = os.path.join(workdir, FILE)
    self.num_workers = num_workers
    if os.path.exists(self.path) and resume_step:
      write_jsonl(self.path, [line for line in _lines(self.path)
                              if 'workers' in line or line['step'] <= resume_step])
      self._file = open(self.path, 'a')
    else:
      self._file = open(self.path, 'w')
      self._file.write(json.dumps({'workers': num_workers}) + '\n')

  def append(self, first_step: int, wires: Iterable[tuple[np.ndarray, Wire]]) -> None:
    """Logs consecutive steps first_step, first_step + 1, ... from their (active, Wire)
    (flushed to disk)."""
    rows = [_row(first_step + k, active, wire) for k, (active, wire) in enumerate(wires)]
    append_jsonl(self._file, [row for row in rows if row is not None])

  def close(self) -> None:
    self._file.close()


def _lines(path: str) -> Iterator[dict]:
  with open(path) as f:
    for line in f:
      try:
        yield json.loads(line)
      except ValueError:   # a torn last line after a crash
        return


def read(workdir: str, steps=None) -> tuple[int, dict[int, tuple[np.ndarray, Wire]]]:
  """(M, {step: (active, Wire)}) of a workdir's comms.jsonl, checked by `runs.read_comms`
  (a damaged log, or one that does not cover the metrics rows `steps`, is a
  RunFileError: a replay of part of a log would be silently too fast)."""
  log = runs.read_comms(workdir, steps)
  return log.num_workers, {step: _wire(row, log.num_workers)
                           for step, row in log.records.items()}


def replay(net: network_lib.Network, log: dict[int, tuple[np.ndarray, Wire]],
           until: int, overlap: str = 'none',
           buckets: int = overlap_model.BUCKETS
           ) -> Iterator[tuple[int, network_lib.Clock]]:
  """Runs `network.Clock` (its `overlap` model, `buckets` pieces) over steps 1 .. until
  of a log; yields (step, clock)."""
  clock = network_lib.Clock(net, overlap=overlap, buckets=buckets)
  m = net.num_workers
  silent = (np.ones(m, bool), Wire(sent=np.zeros(m), received=None,
                                   events=np.zeros(m, int), kind=np.zeros(m, int),
                                   payload=np.zeros(m), peers=np.zeros((m, m), bool)))
  for step in range(1, until + 1):
    active, wire = log.get(step, silent)
    clock.step(wire, active)
    yield step, clock
