"""The measured numbers the experiment records and README state, kept with the runs that
measure them.

  python scripts/expected_numbers.py --from=runs/sweeps/main --from=runs
      harvest finished runs: each record's run is DIR/NAME in the first --from that has it
  python scripts/expected_numbers.py --run [--only=diloco,...] [--out=runs/expected]
      measure: run each record's command (through loco.sweep: minutes per run on 2
      cores; the same command resumes), then harvest OUT
  python scripts/expected_numbers.py --check
      every number the docstrings of experiments/*.py and README's results table state
      against experiments/expected.json; exit 1 on a mismatch or a stale record

A record (RECORDS below) is one measured run: a run of a sweep spec (the main
comparison's, `launch/sweeps/main.py`) or a variant defined here, its config and
overrides, and where its numbers are stated. experiments/expected.json keeps, per record:
its command, the final eval loss (4 decimals), its standard error and the workers' own
loss where the run has them, the bytes sent per worker, the steps and tokens, the config
its command loads (keys that are not None) and a fingerprint of the math the numbers
depend on: the sha256 of the golden numbers (tests/golden/trajectories.json) of the
record's algorithm, i.e. of its golden cases, which exercise the model, the inner
optimizer and the algorithm. When those are regenerated (the math changed), or the
command or the config it loads changes, the record is stale and --check says what to run.

What --check reads as a stated number (the prose stays prose):
  in an experiments/X.py docstring
    `final eval_loss 2.173`            the eval loss at the last step
    `each worker's own: 2.245`         eval_loss_workers (the workers' own models)
    `worker_spread 0.16`
    `135 MB sent per worker`           (KB, MB, GB are 10^3, 10^6, 10^9 bytes)
    `tiny_diloco's 2.173`, `tiny_diloco's 135 MB`   that experiment's own record
  belong to the file's own record; after a `--config.KEY=VALUE` flag that is a
  variant's anchor, to that variant until the paragraph ends; after any other flag, to
  no record (an error: an unmeasured variant cannot state a measured number);
  in README.md's results table (`| run | eval loss | ... | bytes / worker |`)
    the `eval loss` and `bytes / worker` cells of each row (a row is a record's `readme`).
A stated number matches when it is the recorded one rounded as printed (2.173 for
2.1734; 135 MB for 134,980,608 bytes). Every record's eval loss must be stated in its
experiment's docstring, and every row of the table must be a record's.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import functools
import hashlib
import json
import os
import re
import shlex
import sys
from typing import Any, Iterable, Mapping, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:     # sweep specs and configs import launch.* and experiments.*
  sys.path.insert(0, REPO)

from loco import cli  # noqa: E402
from loco import configs  # noqa: E402
from loco.files import runs as runs_lib  # noqa: E402
from loco.errors import LocoError, UsageError  # noqa: E402

SCRIPT = 'scripts/expected_numbers.py'
PROG = SCRIPT
EXPECTED = 'experiments/expected.json'
GOLDEN = 'tests/golden/trajectories.json'
README = 'README.md'
DEFAULT_OUT = 'runs/expected'
MAIN = 'launch/sweeps/main.py'
RESULTS_HEADING = '## Results so far'

# Numbers as the prose writes them: 2.173, 135, 6,749, 16.9.
_NUM = r'(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)'
_UNITS = {'KB': 1e3, 'MB': 1e6, 'GB': 1e9}
_UNIT = r'(KB|MB|GB)'
# A space in a phrase is any run of white space (a phrase may wrap).
_PHRASES = (
    ('eval_loss', re.compile(r'final\s+eval_loss\s+' + _NUM, re.IGNORECASE)),
    ('eval_loss_workers', re.compile(r"each\s+worker's\s+own:?\s+" + _NUM)),
    ('worker_spread', re.compile(r'worker_spread\s+' + _NUM)),
    ('bytes_sent', re.compile(_NUM + r'\s+' + _UNIT + r'\s+sent\s+per\s+worker')),
)
_OWNED = re.compile(r"\b([a-z][a-z0-9_]*)'s\s+" + _NUM + r'(?:\s+' + _UNIT + r'\b)?')
# A flag's value ends before white space, `,;)` or the `.` / `:` that ends a sentence.
_FLAG = re.compile(r'--config\.[\w.]+=[^\s`,;)]*[^\s`,;):.]')
# Losses are kept to 4 decimals: a stated loss may differ from the run's by that rounding too.
_LOSS_KEYS = ('eval_loss', 'eval_loss_se', 'eval_loss_workers', 'worker_spread')


@dataclasses.dataclass(frozen=True)
class Measured:
  """A record as written here: its run comes from `spec` (the run called `name` there)
  or is `config` + `overrides`.

  Attributes:
    name: the record, and its run's directory under --from and --out.
    spec: a sweep spec whose run `name` measures it.
    config: else the config file (`experiments/x.py[:variant]`) ...
    overrides: ... and its overrides.
    anchor: for a variant of an experiment, the `--config.KEY=VALUE` flag after which
      its docstring states the variant's numbers; None: the file's own numbers.
    readme: its row in README's results table (the first cell), if it has one.
  """
  name: str
  spec: str | None = None
  config: str | None = None
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  anchor: str | None = None
  readme: str | None = None


RECORDS = (
    Measured('ddp', spec=MAIN, readme='DDP'),
    Measured('diloco', spec=MAIN, readme='DiLoCo, H=50 (outer 0.7 / 0.5)'),
    Measured('sparseloco', spec=MAIN, readme='SparseLoCo, H=15, 1.6% density, 2-bit'),
    Measured('gasloc_ring', spec=MAIN, readme='GASLoC, ring, H=50'),
    Measured('streaming_diloco', spec=MAIN,
             readme='Streaming DiLoCo, H=50, 5 fragments, tau=1, E3M0'),
    Measured('tiny_gasloc_matching', config='experiments/tiny_gasloc.py',
             overrides={'algorithm.topology': 'matching'},
             anchor='--config.algorithm.topology=matching',
             readme='GASLoC, random matching, H=50'),
    Measured('tiny_gasloc_m09', config='experiments/tiny_gasloc.py',
             overrides={'algorithm.outer_momentum': 0.9},
             anchor='--config.algorithm.outer_momentum=0.9'),
)


@dataclasses.dataclass(frozen=True)
class Record:
  """A record resolved: the run that measures it and where its numbers are stated."""
  name: str
  config: str
  overrides: dict[str, Any]
  source: str          # the sweep spec it comes from, or this script
  anchor: str | None
  readme: str | None

  @property
  def experiment(self) -> str:
    """The experiment file whose docstring states its numbers."""
    return self.config.partition(':')[0]

  @property
  def stem(self) -> str:
    return os.path.splitext(os.path.basename(self.experiment))[0]

  def command(self, out: str = DEFAULT_OUT) -> str:
    """Its `loco.main` command line, the run's workdir in `out`."""
    flags = [f'--config.{k}={_format(v)}' for k, v in self.overrides.items()]
    return shlex.join(['python', '-m', 'loco.main', f'--config={self.config}',
                       f'--workdir={out}/{self.name}', *flags])


def _format(value: Any) -> str:
  # As loco.sweep writes an override on a command line.
  from loco.lab import sweep
  return sweep._format(value)   # pylint: disable=protected-access


def records(measured: Sequence[Measured] | None = None, repo: str = REPO) -> list[Record]:
  """`measured` (default RECORDS) resolved, each spec read once.

  Raises:
    LocoError: a spec has no run of a record's name, or two records share a name.
  """
  from loco.lab import sweep
  specs: dict[str, dict[str, Any]] = {}
  out = []
  for m in RECORDS if measured is None else measured:
    if m.spec is not None:
      if m.spec not in specs:
        specs[m.spec] = {r.name: r for r in sweep.load_spec(os.path.join(repo, m.spec))}
      run = specs[m.spec].get(m.name)
      if run is None:
        raise LocoError(f'{m.spec} has no run {m.name!r} (its runs: '
                        f'{", ".join(specs[m.spec])}); fix RECORDS in {SCRIPT}.')
      out.append(Record(m.name, run.config, dict(run.overrides), m.spec, m.anchor, m.readme))
    else:
      out.append(Record(m.name, m.config, dict(m.overrides), SCRIPT, m.anchor, m.readme))
  names = [r.name for r in out]
  if len(set(names)) != len(names):
    raise LocoError(f'two records share a name in RECORDS of {SCRIPT}: {names}.')
  return out


# ---- the config and the math a record's numbers depend on ---------------------------

def _flat(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """Dotted keys of the leaves that are not None (a key added with None changes nothing)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(_flat(value, f'{prefix}{key}.'))
    elif value is not None:
      out[f'{prefix}{key}'] = value
  return out


def loaded_config(record: Record, repo: str = REPO) -> dict[str, Any]:
  """The config the record's command loads, as {dotted key: value} without Nones.

  Raises:
    ConfigError: the file is missing or the overrides do not load (one sentence).
  """
  config = configs.load(os.path.join(repo, record.config), record.overrides)
  configs.validate(config)
  return _flat(json.loads(json.dumps(config.to_dict())))


@functools.cache
def _default_config() -> dict[str, Any]:
  from loco.configs import default
  return _flat(json.loads(json.dumps(default.get_config().to_dict())))


def config_differences(before: Mapping[str, Any], now: Mapping[str, Any],
                       labels: tuple[str, str] = ('then', 'now')) -> str:
  """'key: A then, B now; ...' for the first keys whose values differ (a missing key is
  None); '' if none do. A key missing before that holds its default now was added to
  loco since, with the behaviour runs had before it (as `Workdir.check_resume` reads it)."""
  defaults = _default_config()
  diff = [f'{k}: {json.dumps(before.get(k))} {labels[0]}, {json.dumps(now.get(k))} {labels[1]}'
          for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)
          and not (k not in before and k in defaults and now.get(k) == defaults[k])]
  return '; '.join(diff[:3]) + ('; ...' if len(diff) > 3 else '')


def golden_fingerprint(algorithm: str, golden: Mapping[str, Any]) -> dict[str, Any]:
  """{'file', 'cases', 'sha256'}: the golden cases of `algorithm` and their hash.

  Raises:
    LocoError: the algorithm is not registered or the golden file has none of its cases.
  """
  from loco import algorithms
  spec = algorithms.REGISTRY.get(algorithm)
  if spec is None:
    raise LocoError(f'algorithm {algorithm!r} is not registered (loco.algorithms.REGISTRY).')
  cases = sorted(spec.examples(algorithm))
  missing = [c for c in cases if c not in golden.get('cases', {})]
  if not cases or missing:
    raise LocoError(f'{GOLDEN} has no golden case {", ".join(missing or [algorithm])}; '
                    'regenerate it: python -m tests.test_golden --regenerate')
  blob = json.dumps({c: golden['cases'][c] for c in cases}, sort_keys=True,
                    separators=(',', ':'))
  return {'file': GOLDEN, 'cases': cases,
          'sha256': hashlib.sha256(blob.encode()).hexdigest()}


def read_golden(repo: str = REPO) -> dict[str, Any]:
  golden = runs_lib.read_json_object(os.path.join(repo, GOLDEN))
  if golden is None:
    raise LocoError(f'{GOLDEN} does not exist.')
  return golden


# ---- harvest: a finished run's numbers ----------------------------------------------

def _ended(run: runs_lib.Run) -> str:
  end = (run.sweep_status or {}).get('end')
  if isinstance(end, str):
    return end
  mtime = os.path.getmtime(os.path.join(run.path, runs_lib.METRICS))
  return datetime.datetime.fromtimestamp(mtime).isoformat(timespec='seconds')


def _shown(path: str) -> str:
  rel = os.path.relpath(path)
  return path if rel.startswith('..') else rel


def harvest(record: Record, workdir: str, golden: Mapping[str, Any],
            repo: str = REPO) -> dict[str, Any]:
  """The record's entry of expected.json from its finished run in `workdir`.

  Raises:
    LocoError: the run is not finished, has no final eval, or was not made by the
      record's command (its config differs from the one the command loads).
  """
  run = runs_lib.read_run(workdir)
  where = os.path.normpath(workdir)
  if run.status != 'finished':
    raise LocoError(f'{where} is {run.status}, not finished; finish it (the same command '
                    'resumes it) or measure it: '
                    f'python {SCRIPT} --run --only={record.name}')
  last = run.last
  if 'eval_loss' not in last or last.get('step') != run.config.get('steps'):
    raise LocoError(f'{where} has no eval at its last step ({run.config.get("steps")}); '
                    'its final eval loss is unknown.')
  command_config = loaded_config(record, repo)
  diff = config_differences(_flat(run.config), command_config, ('in the run', 'in the command'))
  if diff:
    raise LocoError(f'{where} was not made by the command of record {record.name} '
                    f'({record.command()}): {diff}.')
  entry: dict[str, Any] = {
      'config': record.config,
      'overrides': record.overrides,
      'command': record.command(),
      'source': record.source,
      'measured_in': where,
      'ended': _ended(run),
      'steps': last['step'],
      'tokens': last.get('tokens'),
  }
  for key in _LOSS_KEYS:
    if key in last:
      entry[key] = round(float(last[key]), 4)
  for key in ('bytes_sent', 'bytes_received', 'peak_bytes', 'syncs'):
    if key in last:
      entry[key] = int(round(last[key]))
  data = run.stored.get('data_fingerprint')
  if isinstance(data, dict):
    entry['data'] = {k: data[k] for k in ('name', 'sha256') if k in data}
  entry['golden'] = golden_fingerprint(command_config['algorithm.name'], golden)
  entry['loaded_config'] = command_config
  return entry


def find_run(name: str, dirs: Sequence[str]) -> str | None:
  """DIR/name of the first of `dirs` where that is a run directory."""
  for d in dirs:
    path = os.path.join(d, name)
    if runs_lib.is_run(path):
      return path
  return None


def read_expected(path: str) -> dict[str, Any]:
  """expected.json's records ({} if the file does not exist)."""
  stored = runs_lib.read_json_object(path)
  if stored is None:
    return {}
  recs = stored.get('records')
  if not isinstance(recs, dict) or not all(isinstance(v, dict) for v in recs.values()):
    raise LocoError(f'{_shown(path)} has no records object; rewrite it with --from or --run.')
  return recs


def write_expected(path: str, recs: Mapping[str, Any]) -> None:
  body = {'_about': f'Written by {SCRIPT} (--from or --run) from finished runs; not by '
                    f'hand. `python {SCRIPT} --check` compares the numbers that '
                    'experiments/*.py and README.md state with these.',
          'records': dict(recs)}
  runs_lib.write_atomic(path, json.dumps(body, indent=1) + '\n')


def harvest_all(recs: Sequence[Record], dirs: Sequence[str], expected_path: str,
                only: Sequence[str] | None = None, say=print, repo: str = REPO) -> int:
  """Harvests the records (those in `only`, if given) found in `dirs` into expected.json;
  every other record keeps its entry.

  Returns:
    0, or 1 if a record has no entry (not found and not measured before).

  Raises:
    LocoError: a run found is unusable (nothing is written then), or it is the very run
      a stale entry was harvested from (it predates the current golden numbers).
  """
  golden = read_golden(repo)
  old = read_expected(expected_path)
  new, lines, missing = {}, [], []
  width = max(len(r.name) for r in recs)
  for record in recs:
    before = old.get(record.name)
    chosen = only is None or record.name in only
    workdir = find_run(record.name, dirs) if chosen else None
    if workdir is None:
      if before is None:
        missing.append(record.name)
        lines.append(f'{record.name:<{width}}  missing: ' + (
            f'in none of {", ".join(map(_shown, dirs))}' if chosen else 'not in --only'))
      else:
        new[record.name] = before
        lines.append(f'{record.name:<{width}}  kept (measured in {before.get("measured_in")}'
                     f', {before.get("ended")})')
      continue
    entry = harvest(record, workdir, golden, repo)
    if (before is not None and before.get('golden') != entry['golden']
        and before.get('ended') == entry['ended']
        and before.get('eval_loss') == entry.get('eval_loss')):
      raise LocoError(f'{_shown(workdir)} is the run {_shown(expected_path)} already has for '
                      f'{record.name} (ended {entry["ended"]}), made before the golden '
                      f'numbers of {", ".join(entry["golden"]["cases"])} changed; measure '
                      f'it again in a new directory: python {SCRIPT} --run '
                      f'--only={record.name} --out=DIR')
    new[record.name] = entry
    lines.append(f'{record.name:<{width}}  from {entry["measured_in"]}: eval_loss '
                 f'{entry["eval_loss"]:.4f}, {entry.get("bytes_sent", 0) / 1e6:,.1f} MB '
                 'sent per worker')
  for line in lines:
    say(line)
  for name in sorted(set(old) - set(new)):
    say(f'{name:<{width}}  dropped (no longer a record)')
  write_expected(expected_path, new)
  say(f'wrote {_shown(expected_path)}')
  if missing:
    say(f'not measured: {", ".join(missing)}; measure: {remeasure_command(missing)}')
    return 1
  return 0


# ---- what the prose states ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Claim:
  """A number stated in a docstring or the README: `value` in nats or bytes, `tol` half
  its last printed digit. `record` None: it belongs to no record (`why`)."""
  where: str
  record: str | None
  key: str
  text: str
  value: float | None
  tol: float
  why: str = ''


def _value(number: str, unit: str | None) -> tuple[float, float]:
  digits = number.replace(',', '')
  decimals = len(digits.partition('.')[2])
  scale = _UNITS[unit] if unit else 1.0
  return float(digits) * scale, 0.5 * 10 ** -decimals * scale


def _defaults(recs: Sequence[Record]) -> dict[str, Record]:
  """Experiment stem -> its own record (no anchor)."""
  out: dict[str, Record] = {}
  for r in recs:
    if r.anchor is None:
      if r.stem in out:
        raise LocoError(f'records {out[r.stem].name} and {r.name} both state the numbers '
                        f'of {r.experiment} without an anchor; give one of them an anchor.')
      out[r.stem] = r
  return out


def docstring_claims(text: str, path: str, recs: Sequence[Record],
                     first_line: int = 1) -> list[Claim]:
  """The numbers a docstring (`text`, of experiment `path`) states, each with its record.

  Args:
    text: the docstring's text as in the file.
    path: the experiment file, `experiments/x.py` (its stem picks the default record).
    recs: the records.
    first_line: the file's line number of the text's first line (for `where`).
  """
  stem = os.path.splitext(os.path.basename(path))[0]
  defaults, stems = _defaults(recs), _stems()
  anchors = {r.anchor: r for r in recs if r.anchor is not None and r.stem == stem}
  own = defaults.get(stem)
  claims: list[Claim] = []
  offset = 0
  for paragraph in re.split(r'(\n[ \t]*\n)', text):
    if not paragraph.strip():
      offset += len(paragraph)
      continue
    events = []   # (start, end, kind, match)
    for m in _OWNED.finditer(paragraph):
      if m.group(1) in stems:
        events.append((m.start(), m.end(), 'owned', m))
    taken = [(s, e) for s, e, _, _ in events]
    for key, pattern in _PHRASES:
      for m in pattern.finditer(paragraph):
        if not any(s < m.end() and m.start() < e for s, e in taken):
          events.append((m.start(), m.end(), key, m))
    for m in _FLAG.finditer(paragraph):
      events.append((m.start(), m.end(), 'flag', m))
    current, after = own, None
    for start, _, kind, m in sorted(events, key=lambda e: e[0]):
      line = first_line + text.count('\n', 0, offset + start)
      where = f'{path}:{line}'
      if kind == 'flag':
        current, after = anchors.get(m.group(0)), m.group(0)
        continue
      if kind == 'owned':
        owner, number, unit = m.groups()
        if unit is None and '.' not in number:
          continue      # `tiny_x's 20 syncs`: not a loss or bytes
        target = defaults.get(owner)
        key = 'bytes_sent' if unit else 'eval_loss'
        why = '' if target else f'{owner} has no measured record'
      else:
        number, unit = m.group(1), (m.group(2) if kind == 'bytes_sent' else None)
        target, key = current, kind
        why = '' if target else (
            f'it follows {after}, a variant with no record' if after else
            f'{stem} has no measured record')
      value, tol = _value(number, unit)
      claims.append(Claim(where, target.name if target else None, key,
                          f'{number} {unit}' if unit else number, value, tol, why))
    offset += len(paragraph)
  return claims


def _stems(repo: str = REPO) -> frozenset[str]:
  return frozenset(os.path.splitext(n)[0] for n in os.listdir(os.path.join(repo, 'experiments'))
                   if n.endswith('.py') and not n.startswith('__'))


def module_docstring(path: str) -> tuple[str, int] | None:
  """(the module docstring as written in the file, its first line), None if none."""
  with open(path, encoding='utf-8') as f:
    source = f.read()
  tree = ast.parse(source)
  if not (tree.body and isinstance(tree.body[0], ast.Expr)
          and isinstance(tree.body[0].value, ast.Constant)
          and isinstance(tree.body[0].value.value, str)):
    return None
  node = tree.body[0]
  return ast.get_source_segment(source, node), node.lineno


def readme_claims(text: str, recs: Sequence[Record], path: str = README) -> list[Claim]:
  """The eval loss and bytes of each row of the results table (and a claim with no
  record for a row that is no record's, or no table)."""
  lines = text.splitlines()
  start = next((i for i, l in enumerate(lines) if l.strip() == RESULTS_HEADING), len(lines))
  end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith('## ')),
             len(lines))
  header = next((i for i in range(start, end)
                 if {'eval loss', 'bytes / worker'} <= set(_cells(lines[i]))), None)
  if header is None:
    return [Claim(path, None, 'table', '(none)', None, 0.0,
                  f'no table with `eval loss` and `bytes / worker` columns under '
                  f'{RESULTS_HEADING!r}')]
  columns = _cells(lines[header])
  loss_col, bytes_col = columns.index('eval loss'), columns.index('bytes / worker')
  by_row = {r.readme: r for r in recs if r.readme}
  claims, seen = [], set()
  for i in range(header + 2, len(lines)):
    cells = _cells(lines[i])
    if not cells:
      break
    where, label = f'{path}:{i + 1}', cells[0]
    record = by_row.get(label)
    seen.add(label)
    name = record.name if record else None
    why = '' if record else f'row {label!r} is no record\'s (RECORDS in {SCRIPT})'
    m = re.match(_NUM + r'(?:\s|$)', cells[loss_col]) if len(cells) > loss_col else None
    if m:
      value, tol = _value(m.group(1), None)
      claims.append(Claim(where, name, 'eval_loss', m.group(1), value, tol, why))
    m = re.match(_NUM + ' ' + _UNIT, cells[bytes_col]) if len(cells) > bytes_col else None
    if m:
      value, tol = _value(m.group(1), m.group(2))
      claims.append(Claim(where, name, 'bytes_sent', f'{m.group(1)} {m.group(2)}', value,
                          tol, why))
  for r in recs:
    if r.readme and r.readme not in seen:
      claims.append(Claim(f'{path}:{header + 1}', r.name, 'eval_loss', '(no row)', None, 0.0,
                          f'the results table has no row {r.readme!r}'))
  return claims


def _cells(line: str) -> list[str]:
  line = line.strip()
  if not line.startswith('|'):
    return []
  return [c.strip() for c in line.strip('|').split('|')]


def all_claims(recs: Sequence[Record], repo: str = REPO) -> list[Claim]:
  """Every stated number of experiments/*.py's docstrings and README's results table, and
  a claim with no value for each record whose eval loss its own docstring does not state."""
  claims: list[Claim] = []
  for stem in sorted(_stems(repo)):
    path = f'experiments/{stem}.py'
    doc = module_docstring(os.path.join(repo, path))
    if doc is not None:
      claims += docstring_claims(doc[0], path, recs, doc[1])
  for r in recs:
    if not any(c.record == r.name and c.key == 'eval_loss' and c.where.startswith(r.experiment)
               for c in claims):
      claims.append(Claim(r.experiment, r.name, 'eval_loss', '(not stated)', None, 0.0,
                          f'its docstring states no final eval_loss for {r.name}'
                          + (f' after {r.anchor}' if r.anchor else '')))
  with open(os.path.join(repo, README), encoding='utf-8') as f:
    claims += readme_claims(f.read(), recs)
  return claims


@dataclasses.dataclass(frozen=True)
class Row:
  claim: Claim
  expected: str
  ok: bool
  why: str


def compare(claims: Iterable[Claim], expected: Mapping[str, Any]) -> list[Row]:
  """Each claim against expected.json's record."""
  rows = []
  for c in claims:
    if c.record is None or c.value is None:
      rows.append(Row(c, '', False, c.why))
      continue
    entry = expected.get(c.record)
    if entry is None or c.key not in entry:
      rows.append(Row(c, '', False, f'{EXPECTED} has no {c.key} for {c.record}'))
      continue
    want = float(entry[c.key])
    tol = c.tol + (0.5e-4 if c.key in _LOSS_KEYS else 0.0)
    ok = abs(c.value - want) <= tol * (1 + 1e-9)
    shown = f'{want / 1e6:,.2f} MB' if c.key == 'bytes_sent' else f'{want:.4f}'
    rows.append(Row(c, shown, ok, '' if ok else f'stated {c.text}, measured {shown}'))
  return rows


def problems(recs: Sequence[Record], expected: Mapping[str, Any],
             golden: Mapping[str, Any], repo: str = REPO) -> list[tuple[str, str]]:
  """(record, what is wrong) for each record expected.json lacks, whose command or loaded
  config changed, whose golden numbers changed, or that is no longer a record."""
  out = []
  for r in recs:
    entry = expected.get(r.name)
    if entry is None:
      out.append((r.name, f'not in {EXPECTED}'))
      continue
    if entry.get('command') != r.command():
      out.append((r.name, f'its command changed ({r.source}): {entry.get("command")} then, '
                          f'{r.command()} now'))
      continue
    try:
      now = loaded_config(r, repo)
    except LocoError as e:
      out.append((r.name, f'its command does not load: {e}'))
      continue
    diff = config_differences(entry.get('loaded_config', {}), now)
    if diff:
      out.append((r.name, f'the config its command loads changed since it was measured ({diff})'))
      continue
    fingerprint = golden_fingerprint(now['algorithm.name'], golden)
    if entry.get('golden') != fingerprint:
      out.append((r.name, f'measured under other golden numbers: the math changed ({GOLDEN}, '
                          f'cases {", ".join(fingerprint["cases"])})'))
  names = {r.name for r in recs}
  out += [(n, 'no longer a record') for n in sorted(set(expected) - names)]
  return out


def remeasure_command(names: Sequence[str]) -> str:
  return f'python {SCRIPT} --run --only={",".join(names)}'


def check(expected_path: str, say=print, repo: str = REPO) -> int:
  """Prints every stated number against expected.json; 1 on a mismatch or a stale record."""
  recs = records(repo=repo)
  if not os.path.isfile(expected_path):
    raise LocoError(f'{_shown(expected_path)} does not exist; make it: python {SCRIPT} '
                    f'--from=runs/sweeps/main (finished runs) or --run.')
  expected = read_expected(expected_path)
  rows = compare(all_claims(recs, repo), expected)
  table = [('where', 'record', 'number', 'stated', 'expected', '')]
  table += [(r.claim.where, r.claim.record or '-', r.claim.key, r.claim.text, r.expected,
             'ok' if r.ok else 'MISMATCH: ' + r.why) for r in rows]
  widths = [max(len(row[i]) for row in table) for i in range(5)]
  for row in table:
    say('  '.join(cell.ljust(w) for cell, w in zip(row, widths)) + '  ' + row[5])
  stale = problems(recs, expected, read_golden(repo), repo)
  for name, what in stale:
    say(f'STALE {name}: {what}')
  bad = sum(not r.ok for r in rows)
  current = [n for n, _ in stale if n in {r.name for r in recs}]
  if current:
    say(f're-measure: {remeasure_command(current)}')
  elif stale:      # only entries that are no longer records: any harvest drops them
    say(f'rewrite it: python {SCRIPT} --from=DIR')
  say(f'{len(rows) - bad} of {len(rows)} stated numbers match {_shown(expected_path)}'
      + (f'; {len(stale)} stale record(s)' if stale else ''))
  return 1 if bad or stale else 0


# ---- the command ------------------------------------------------------------------------

def _only(text: str | None, recs: Sequence[Record]) -> list[Record]:
  if not text:
    return list(recs)
  names = [n.strip() for n in text.split(',') if n.strip()]
  unknown = [n for n in names if n not in {r.name for r in recs}]
  if unknown:
    raise UsageError(f'--only names no record {", ".join(unknown)}; the records: '
                     f'{", ".join(r.name for r in recs)}.')
  return [r for r in recs if r.name in names]


def main(argv: Sequence[str] | None = None) -> int:
  parser = cli.Parser(prog=PROG, description=__doc__.split('\n\n')[0])
  mode = parser.add_mutually_exclusive_group(required=True)
  mode.add_argument('--check', action='store_true',
                    help='compare the stated numbers with the expected file')
  mode.add_argument('--from', dest='dirs', action='append', metavar='DIR',
                    help='harvest finished runs DIR/NAME (repeatable: the first DIR wins)')
  mode.add_argument('--run', action='store_true',
                    help="run the records' commands into --out (slow), then harvest it")
  parser.add_argument('--only', help='records to run or harvest, comma-separated')
  parser.add_argument('--out', default=DEFAULT_OUT,
                      help=f'where --run puts the runs (default {DEFAULT_OUT})')
  parser.add_argument('--expected', default=os.path.join(REPO, EXPECTED),
                      help=f'the expected file (default {EXPECTED})')
  args = parser.parse_args(argv)

  def body() -> int:
    expected_path = os.path.abspath(args.expected)
    if args.check:
      return check(expected_path)
    everything = records()
    recs = _only(args.only, everything)
    if args.dirs:
      for d in args.dirs:
        if not os.path.isdir(d):
          raise LocoError(f'--from {d} is not a directory.')
      return harvest_all(everything, args.dirs, expected_path,
                         only=[r.name for r in recs])
    from loco.lab import sweep
    out = os.path.abspath(args.out)
    cwd = os.getcwd()
    os.chdir(REPO)       # the commands name their config files from the repository root
    try:
      code = sweep.run_sweep([sweep.Run(r.name, r.config, r.overrides) for r in recs], out,
                             spec=SCRIPT, report=False)
    finally:
      os.chdir(cwd)
    if code == 130:
      return code
    done = [r.name for r in recs if runs_lib.is_run(os.path.join(out, r.name))
            and runs_lib.read_run(os.path.join(out, r.name)).status == 'finished']
    harvested = harvest_all(everything, [args.out], expected_path, only=done) if done else 0
    return code or harvested

  return cli.run(PROG, body)


if __name__ == '__main__':
  cli.exit(main())
