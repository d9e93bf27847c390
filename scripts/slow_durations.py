"""Runs the slow test tier and records each test's seconds in tests/slow_durations.json.

  python scripts/slow_durations.py [PYTEST_ARGS...]

With PYTEST_ARGS (some tests, `-k ...`) the measured tests' times replace theirs and the
rest of the file is kept; without, the whole tier is measured and the file rewritten.

tests/tiers.py packs the slow tests into shares of about SHARE_SECONDS by these
times; the default run (`python -m pytest -q`) adds the UTC day's share. Re-run this
after adding or changing slow tests (a test not measured yet is placed by its id's hash).
Prints the tier's total and the shares it makes.
"""

import collections
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, 'tests', 'slow_durations.json')
LINE = re.compile(r'^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*)$')


def main(argv: list[str]) -> int:
  cmd = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:xdist', '-m', 'slow',
         '--durations=0', '--durations-min=0', *argv]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  seconds: dict[str, float] = collections.defaultdict(float)
  for line in proc.stdout.splitlines():
    m = LINE.match(line)
    if m:
      seconds[m.group(3).strip()] += float(m.group(1))
  lines = proc.stdout.splitlines()
  print('\n'.join(line for line in lines if line.startswith('FAILED')))
  print(lines[-1] if lines else proc.stderr[-2000:])
  if not seconds:
    print('the slow tier recorded nothing; tests/slow_durations.json left as it was')
    return 1
  recorded = {}
  if argv and os.path.isfile(OUT):      # a subset: keep the other tests' times
    with open(OUT) as f:
      recorded = json.load(f)
  recorded.update({k: round(v, 1) for k, v in seconds.items()})
  with open(OUT, 'w') as f:
    json.dump(dict(sorted(recorded.items())), f, indent=1)
    f.write('\n')
  seconds = collections.defaultdict(float, recorded)
  sys.path.insert(0, ROOT)
  from tests import tiers
  shares = tiers.slow_shares(list(seconds), seconds)
  print(f'{len(seconds)} slow tests, {sum(seconds.values()) / 60:.1f} min in all; '
        f'{len(shares)} shares: ' +
        ', '.join(f'{sum(seconds[n] for n in s) / 60:.1f}' for s in shares) + ' min')
  return 1 if proc.returncode else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
