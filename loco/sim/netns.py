"""Several `loco.main` processes over a rate-limited loopback, in a private namespace.

`run_processes` starts `unshare -n python -m loco.calibrate --namespace-side SPEC`: in
the new network namespace that side brings the loopback up with a 1500-byte MTU (an
Ethernet link's; the loopback's own 64 KiB frames would not pass a token bucket of a
few KB), shapes it with `tc qdisc add dev lo root tbf rate RATEmbit burst 32kbit
latency 50ms` (no qdisc: unshaped), reads the interface's counters (/proc/net/dev,
which is per namespace, unlike /sys/class/net), runs N `loco.main --distributed`
processes with a coordinator on 127.0.0.1, reads the counters again and writes them to
`namespace.json` beside the processes' logs. tbf counts every frame's bytes (TCP/IP
and link headers included) against the rate; the interface's counters count each
packet once, as it leaves (a loopback delivers what it sends).

Needs root (CAP_SYS_ADMIN for the namespace, CAP_NET_ADMIN inside it for tc), and
`unshare`, `ip` and `tc` (util-linux, iproute2); `check_available` says in one sentence
what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

from loco.files import runs
from loco.errors import LocoError

INSIDE = '--namespace-side'
RESULT = 'namespace.json'
MTU = 1500
BURST = '32kbit'
TBF_LATENCY = '50ms'
TOOLS = ('unshare', 'ip', 'tc')


def tbf_command(rate_mbit: float) -> list[str]:
  """The tc command that shapes the namespace's loopback to `rate_mbit` Mbit/s."""
  return ['tc', 'qdisc', 'add', 'dev', 'lo', 'root', 'tbf', 'rate', f'{rate_mbit:g}mbit',
          'burst', BURST, 'latency', TBF_LATENCY]


def parse_net_dev(text: str, interface: str = 'lo') -> tuple[int, int]:
  """(received, transmitted) bytes of `interface` in /proc/net/dev's text."""
  for line in text.splitlines():
    name, colon, rest = line.partition(':')
    if colon and name.strip() == interface:
      fields = rest.split()
      if len(fields) < 16:
        break
      return int(fields[0]), int(fields[8])
  raise LocoError(f'/proc/net/dev has no counters for {interface}.')


def parse_tc_stats(text: str) -> dict[str, int]:
  """{'bytes', 'packets', 'dropped'} from `tc -s qdisc show dev lo` (the root qdisc's
  'Sent B bytes P pkt (dropped D, ...' line); zeros without a qdisc."""
  for line in text.splitlines():
    words = line.replace(',', ' ').replace('(', ' ').split()
    if words[:1] == ['Sent'] and len(words) >= 7 and words[2] == 'bytes':
      return dict(bytes=int(words[1]), packets=int(words[3]), dropped=int(words[6]))
  return dict(bytes=0, packets=0, dropped=0)


def available() -> str | None:
  """None where namespaces and tc work here, else why not (one sentence)."""
  if os.name != 'posix' or not sys.platform.startswith('linux'):
    return 'network namespaces need Linux.'
  missing = [tool for tool in TOOLS if shutil.which(tool) is None]
  if missing:
    return (f'{", ".join(missing)} not found on PATH (unshare is util-linux\'s, ip and tc '
            'iproute2\'s).')
  if os.geteuid() != 0:
    return ('a private network namespace (unshare -n) and tc need root; run as root.')
  probe = ' && '.join(['ip link set lo up', ' '.join(tbf_command(100))])
  try:
    out = subprocess.run(['unshare', '-n', 'sh', '-c', probe], capture_output=True,
                         text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f'unshare -n could not run: {e}.'
  if out.returncode:
    last = (out.stderr.strip().splitlines() or ['exit status %d' % out.returncode])[-1]
    return f'a shaped loopback in a private namespace failed here: {last}'
  return None


def check_available() -> None:
  reason = available()
  if reason is not None:
    raise LocoError(reason)


def run_processes(where: str, processes: int, flags: Sequence[str], rate_mbit: float | None,
                  timeout: float) -> dict:
  """Runs `processes` loco.main processes with `flags` (each with its --process_id)
  in a new namespace, the loopback shaped to `rate_mbit` (None: unshaped); their logs
  and namespace.json go to `where`. Returns namespace.json's record: lo_bytes (sent on
  the loopback), qdisc_bytes and qdisc_dropped (tbf's), wall (seconds), load (the load
  average at the start).

  Raises:
    LocoError: a process failed (its last line) or ran past `timeout`.
  """
  spec = dict(where=os.path.abspath(where), processes=processes, flags=list(flags),
              rate_mbit=rate_mbit, timeout=timeout)
  proc = subprocess.Popen(['unshare', '-n', sys.executable, '-m', 'loco.calibrate', INSIDE,
                           json.dumps(spec)], cwd=_repo(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    output, _ = proc.communicate()
  except BaseException:
    _stop(proc)
    raise
  path = os.path.join(where, RESULT)
  result = runs.read_json_object(path) if os.path.exists(path) else None
  if proc.returncode or not result:
    last = (output.strip().splitlines() or [f'exit status {proc.returncode}'])[-1]
    raise LocoError(f'the calibration run in {where} failed: {last}')
  return result


def _repo() -> str:
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stop(proc: subprocess.Popen, grace: float = 30) -> None:
  """Ends one child we started: SIGTERM, then SIGKILL after `grace` seconds."""
  if proc.poll() is None:
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(grace)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def _counters() -> tuple[int, dict[str, int]]:
  with open('/proc/net/dev') as f:
    _, sent = parse_net_dev(f.read())
  stats = subprocess.run(['tc', '-s', 'qdisc', 'show', 'dev', 'lo'], capture_output=True,
                         text=True, check=True).stdout
  return sent, parse_tc_stats(stats)


def _last_line(path: str) -> str:
  try:
    with open(path, errors='replace') as f:
      lines = [line.strip() for line in f if line.strip()]
  except OSError:
    return 'no log'
  errors = [line for line in lines if line.startswith('loco: ')]
  return (errors or lines or ['no output'])[-1]


def inside(args: Sequence[str]) -> int:
  """The namespace's side of `run_processes` (run by `unshare -n`); exit status 1 with
  one line on failure."""
  def terminate(signum, frame):
    del signum, frame
    raise KeyboardInterrupt
  signal.signal(signal.SIGTERM, terminate)
  spec = json.loads(args[0])
  where, n = spec['where'], spec['processes']
  try:
    subprocess.run(['ip', 'link', 'set', 'lo', 'mtu', str(MTU), 'up'], check=True,
                   capture_output=True)
    if spec['rate_mbit'] is not None:
      subprocess.run(tbf_command(spec['rate_mbit']), check=True, capture_output=True)
  except subprocess.CalledProcessError as e:
    print(f'shaping the loopback failed: {e.stderr.decode().strip()}', flush=True)
    return 1
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}
  load = os.getloadavg()
  sent0, tc0 = _counters()
  start = time.perf_counter()
  procs, logs = [], []
  try:
    for k in range(n):
      logs.append(open(os.path.join(where, f'process-{k}.log'), 'w'))
      procs.append(subprocess.Popen(
          [sys.executable, '-m', 'loco.main', *spec['flags'], '--distributed',
           f'--coordinator_address=127.0.0.1:{port}', f'--num_processes={n}',
           f'--process_id={k}'], cwd=_repo(), env=env, stdout=logs[-1],
          stderr=subprocess.STDOUT))
    deadline = start + spec['timeout']
    while any(p.poll() is None for p in procs):
      if time.perf_counter() > deadline:
        print(f'the run took more than {spec["timeout"]:g} s; stopped.', flush=True)
        return 1
      if any(p.returncode not in (None, 0) for p in procs):
        break   # one failed: the others would wait for it
      time.sleep(0.05)
  finally:
    for p in procs:
      _stop(p, grace=10)
    for f in logs:
      f.close()
  wall = time.perf_counter() - start
  for k, p in enumerate(procs):
    if p.returncode:
      print(f'process {k}: {_last_line(os.path.join(where, f"process-{k}.log"))}',
            flush=True)
      return 1
  sent1, tc1 = _counters()
  runs.write_atomic(os.path.join(where, RESULT), json.dumps(dict(
      lo_bytes=sent1 - sent0, qdisc_bytes=tc1['bytes'] - tc0['bytes'],
      qdisc_packets=tc1['packets'] - tc0['packets'],
      qdisc_dropped=tc1['dropped'] - tc0['dropped'], wall=wall, rate_mbit=spec['rate_mbit'],
      mtu=MTU, burst=BURST, load=list(load)), indent=2))
  return 0
