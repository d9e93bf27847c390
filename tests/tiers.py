"""The slow tier's shares: which slow tests join a default run (see tests/conftest.py).

The slow tests are packed into shares of about SHARE_SECONDS each by the times recorded
in tests/slow_durations.json (`python scripts/slow_durations.py` measures them on this
machine); a test not measured yet is placed by a hash of its id.
"""

import hashlib
import json
import os

SHARE_SECONDS = 240
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'slow_durations.json')


def measured() -> dict[str, float]:
  """Recorded seconds per slow test id ({} before the first measurement)."""
  if not os.path.exists(DURATIONS):
    return {}
  with open(DURATIONS) as f:
    return json.load(f)


def slow_shares(nodeids: list[str], seconds: dict[str, float],
                budget: float = SHARE_SECONDS) -> list[list[str]]:
  """The slow tests packed into shares of at most `budget` seconds (first fit, longest
  first; a test longer than the budget is a share alone); tests not measured yet join
  the share their id's hash picks."""
  known = sorted((n for n in nodeids if n in seconds), key=lambda n: (-seconds[n], n))
  shares: list[list[str]] = []
  load: list[float] = []
  for n in known:
    i = next((i for i, t in enumerate(load) if t + seconds[n] <= budget), len(shares))
    if i == len(shares):
      shares.append([])
      load.append(0.0)
    shares[i].append(n)
    load[i] += seconds[n]
  shares = shares or [[]]
  for n in sorted(set(nodeids) - set(known)):
    shares[int(hashlib.sha256(n.encode()).hexdigest(), 16) % len(shares)].append(n)
  return shares
