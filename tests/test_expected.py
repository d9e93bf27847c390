"""The measured numbers experiments/*.py and README state equal experiments/expected.json's,
and expected.json is in step with the config and the math that made them.

experiments/expected.json is written by scripts/expected_numbers.py from finished runs
(`--from=runs/sweeps/main --from=runs`) or by running each record's command (`--run`).
No training here: the script's parser and checks run on the real files and on small
synthetic ones, so that a check that finds nothing, or attributes a number to the wrong
run, fails.
"""

import copy
import importlib.util
import json
import os
import re
import shlex
import sys

import pytest

from loco import configs
from loco.errors import LocoError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    'expected_numbers', os.path.join(REPO, 'scripts', 'expected_numbers.py'))
script = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = script     # its dataclasses look their module up
_spec.loader.exec_module(script)

RUN = 'python scripts/expected_numbers.py --run --only='


@pytest.fixture(scope='module')
def recs():
  return script.records()


@pytest.fixture(scope='module')
def expected():
  return script.read_expected(os.path.join(REPO, script.EXPECTED))


@pytest.fixture(scope='module')
def golden():
  return script.read_golden()


# Measured numbers for the parser's tests (the real ones may be measured again).
MEASURED = {'ddp': {'eval_loss': 1.7148, 'bytes_sent': 6749030400},
            'diloco': {'eval_loss': 2.1734, 'bytes_sent': 134980608},
            'gasloc_ring': {'eval_loss': 2.2805, 'eval_loss_workers': 2.2452,
                            'worker_spread': 0.1576, 'bytes_sent': 154263552},
            'tiny_gasloc_matching': {'eval_loss': 2.2627, 'bytes_sent': 77131776}}


@pytest.fixture(scope='module')
def fresh(recs, expected, golden):
  """expected.json's entries made current (command, config, golden numbers), so that the
  staleness tests see only the change they make."""
  out = copy.deepcopy(expected)
  for r in recs:
    out[r.name].update(command=r.command(), loaded_config=script.loaded_config(r))
    out[r.name]['golden'] = script.golden_fingerprint(
        out[r.name]['loaded_config']['algorithm.name'], golden)
  return out


def _by(claims, **keys):
  return [c for c in claims if all(getattr(c, k) == v for k, v in keys.items())]


# ---- the repository's own numbers ------------------------------------------------------

def test_every_stated_number_equals_the_measured_one(recs, expected):
  rows = script.compare(script.all_claims(recs), expected)
  bad = [f'{r.claim.where} ({r.claim.record or "no record"}, {r.claim.key}): {r.why}'
         for r in rows if not r.ok]
  assert not bad, (
      'numbers stated in experiments/*.py or README.md disagree with '
      'experiments/expected.json:\n  ' + '\n  '.join(bad) + '\nCorrect the prose to the '
      'measured number (python scripts/expected_numbers.py --check prints them all); if the '
      f'measurement is what is wrong, measure again: {RUN}NAME')


def test_the_parser_finds_every_record_in_its_docstring_and_the_readme(recs):
  claims = script.all_claims(recs)
  for r in recs:
    stated = [c for c in _by(claims, record=r.name, key='eval_loss')
              if c.where.startswith(r.experiment + ':') and c.value is not None]
    assert stated, f'{r.experiment} states no final eval_loss of {r.name}'
    if r.readme:
      assert _by(claims, record=r.name, key='bytes_sent')
      assert any(c.where.startswith('README.md:') for c in _by(claims, record=r.name))
  in_readme = [c for c in claims if c.where.startswith('README') and c.value is not None]
  assert len(in_readme) == 2 * len([r for r in recs if r.readme]) >= 12


def test_every_record_names_a_config_that_exists_and_a_command_that_loads_it(recs, expected):
  assert set(expected) == {r.name for r in recs}, (
      'experiments/expected.json and RECORDS of scripts/expected_numbers.py list different '
      f'records; measure the new ones: {RUN}NAME')
  for r in recs:
    entry = expected[r.name]
    assert os.path.isfile(os.path.join(REPO, r.experiment)), r.experiment
    assert entry['command'] == r.command(), (
        f'the command of {r.name} changed ({r.source}) since it was measured; measure '
        f'it: {RUN}{r.name}')
    argv = shlex.split(entry['command'])
    assert argv[:3] == ['python', '-m', 'loco.main']
    spec, overrides = configs.split_argv(argv[3:])
    config = configs.load(os.path.join(REPO, spec), overrides)
    configs.validate(config)
    loaded = script._flat(json.loads(json.dumps(config.to_dict())))
    assert loaded['steps'] == entry['steps'] and entry['tokens'] == (
        entry['steps'] * loaded['num_workers'] * loaded['batch_per_worker'] * loaded['seq_len'])
    diff = script.config_differences(entry['loaded_config'], loaded)
    assert not diff, (f'{r.name}: the config its command loads changed since it was '
                      f'measured ({diff}); measure it again: {RUN}{r.name}')


def test_the_numbers_were_measured_under_the_current_golden_numbers(recs, expected, golden):
  stale = [r.name for r in recs if expected[r.name]['golden'] != script.golden_fingerprint(
      expected[r.name]['loaded_config']['algorithm.name'], golden)]
  assert not stale, (
      f'the golden numbers ({script.GOLDEN}) of {", ".join(stale)} changed since their '
      'numbers were measured: the math changed, so the numbers that experiments/*.py and '
      f'README.md state are stale. Measure them again: {RUN}{",".join(stale)} '
      '(minutes per run), then correct every number python scripts/expected_numbers.py '
      '--check reports.')


def test_check_passes_on_the_repository(capsys):
  assert script.main(['--check']) == 0
  out = capsys.readouterr().out
  assert 'MISMATCH' not in out and 'STALE' not in out
  assert 'experiments/tiny_gasloc.py:' in out and 'README.md:' in out


# ---- the parser on synthetic prose -----------------------------------------------------

def test_a_wrong_number_in_a_docstring_is_a_mismatch(recs):
  doc = ('"""DiLoCo.\n\nExpected: final eval_loss 2.999 nats/byte, 135 MB sent\n'
         'per worker.\n"""')
  claims = script.docstring_claims(doc, 'experiments/tiny_diloco.py', recs, first_line=1)
  assert [(c.where, c.record, c.key, c.text) for c in claims] == [
      ('experiments/tiny_diloco.py:3', 'diloco', 'eval_loss', '2.999'),
      ('experiments/tiny_diloco.py:3', 'diloco', 'bytes_sent', '135 MB')]
  rows = script.compare(claims, MEASURED)
  assert [r.ok for r in rows] == [False, True]
  assert rows[0].why == 'stated 2.999, measured 2.1734'


@pytest.mark.parametrize('stated, ok', [
    ('final eval_loss 2.173', True), ('final eval_loss 2.174', False),
    ('final eval_loss 2.17', True), ('final eval_loss 2.2', True),
    ('final eval_loss 2.1', False), ('Final eval_loss 2.1734', True),
    ('135 MB sent per worker', True), ('134 MB sent per worker', False),
    ('0.13 GB sent per worker', True), ('134,981 KB sent per worker', True),
    ('134,900 KB sent per worker', False)])
def test_a_number_matches_within_the_rounding_it_is_printed_with(recs, stated, ok):
  claims = script.docstring_claims(stated, 'experiments/tiny_diloco.py', recs)
  assert len(claims) == 1
  assert script.compare(claims, MEASURED)[0].ok == ok


def test_variant_numbers_belong_to_their_anchor_and_an_unmeasured_flag_to_none(recs):
  doc = ('final eval_loss 2.281 (each worker\'s own: 2.245; worker_spread 0.16).\n\n'
         'Variants: --config.algorithm.topology=matching: final eval_loss 2.263, 77 MB\n'
         'sent per worker; --config.algorithm.topology=complete: final eval_loss 2.173.\n'
         '\n'
         'Back to the ring: final eval_loss 2.281.')
  claims = script.docstring_claims(doc, 'experiments/tiny_gasloc.py', recs)
  assert [(c.record, c.key, c.text) for c in claims] == [
      ('gasloc_ring', 'eval_loss', '2.281'), ('gasloc_ring', 'eval_loss_workers', '2.245'),
      ('gasloc_ring', 'worker_spread', '0.16'),
      ('tiny_gasloc_matching', 'eval_loss', '2.263'),
      ('tiny_gasloc_matching', 'bytes_sent', '77 MB'),
      (None, 'eval_loss', '2.173'),
      ('gasloc_ring', 'eval_loss', '2.281')]     # a new paragraph is the file's own again
  assert 'topology=complete, a variant with no record' in claims[5].why
  assert [r.ok for r in script.compare(claims, MEASURED)] == [True] * 5 + [False, True]


def test_a_number_owned_by_another_experiment_is_checked_against_that_record(recs):
  doc = ("below tiny_diloco's 2.999 and tiny_diloco's 135 MB; tiny_demo's 2.5; "
         "DiLoCo's 2.5 and tiny_sparseloco's 20 syncs are not measured numbers.")
  claims = script.docstring_claims(doc, 'experiments/tiny_sparseloco.py', recs)
  assert [(c.record, c.key, c.text) for c in claims] == [
      ('diloco', 'eval_loss', '2.999'), ('diloco', 'bytes_sent', '135 MB'),
      (None, 'eval_loss', '2.5')]
  assert claims[2].why == 'tiny_demo has no measured record'
  assert [r.ok for r in script.compare(claims, MEASURED)] == [False, True, False]


def test_an_experiment_without_a_record_cannot_state_a_measured_number(recs):
  claims = script.docstring_claims('Expected: final eval_loss 2.5.', 'experiments/tiny_demo.py',
                                   recs)
  assert [(c.record, c.why) for c in claims] == [(None, 'tiny_demo has no measured record')]
  assert not script.compare(claims, MEASURED)[0].ok


_TABLE = """# loco

## Results so far

| run | eval loss | stream layout (before 26 Nov) | bytes / worker |
|---|---|---|---|
| DDP | 1.715 | 1.976 | 6,749 MB |
| DiLoCo, H=50 (outer 0.7 / 0.5) | 2.173 | 2.268 | 13.5 MB |
| A new method | 2.000 | 2.100 | 1 MB |

Prose after the table: final eval_loss 9.999 is not read here.
"""


def test_the_readme_table_is_read_row_by_row(recs):
  claims = script.readme_claims(_TABLE, recs)
  got = [(c.where, c.record, c.key, c.text) for c in claims if c.value is not None]
  assert got == [('README.md:7', 'ddp', 'eval_loss', '1.715'),
                 ('README.md:7', 'ddp', 'bytes_sent', '6,749 MB'),
                 ('README.md:8', 'diloco', 'eval_loss', '2.173'),
                 ('README.md:8', 'diloco', 'bytes_sent', '13.5 MB'),
                 ('README.md:9', None, 'eval_loss', '2.000'),
                 ('README.md:9', None, 'bytes_sent', '1 MB')]
  rows = script.compare(claims, MEASURED)
  bad = {(r.claim.record, r.claim.key, r.claim.text) for r in rows if not r.ok}
  assert ('diloco', 'bytes_sent', '13.5 MB') in bad
  assert (None, 'eval_loss', '2.000') in bad
  # Every record with a README row and no row in this table is reported missing.
  missing = {r.claim.record for r in rows if r.claim.text == '(no row)'}
  assert missing == {r.name for r in recs if r.readme} - {'ddp', 'diloco'}
  assert not any(r.ok for r in rows if r.claim.record is None)


def test_a_readme_without_the_results_table_fails_the_check(recs):
  claims = script.readme_claims('# loco\n\n## Results so far\n\nNothing yet.\n', recs)
  assert len(claims) == 1 and claims[0].value is None
  assert not script.compare(claims, MEASURED)[0].ok


# ---- staleness: the golden numbers, the config, the command ----------------------------

def _golden_with(golden, case):
  changed = copy.deepcopy(golden)
  changed['cases'][case]['final_loss'][0] += 1e-3
  return changed


def test_a_changed_golden_case_makes_exactly_its_records_stale(recs, fresh, golden):
  assert script.problems(recs, fresh, golden) == []
  stale = script.problems(recs, fresh, _golden_with(golden, 'diloco'))
  assert [name for name, _ in stale] == ['diloco']
  assert 'the math changed' in stale[0][1] and 'cases diloco' in stale[0][1]
  # gasloc's variant case belongs to gasloc: all three gasloc records.
  stale = script.problems(recs, fresh, _golden_with(golden, 'gasloc_matching'))
  assert [n for n, _ in stale] == ['gasloc_ring', 'tiny_gasloc_matching', 'tiny_gasloc_m09']
  # An algorithm no record runs: nothing is stale.
  assert script.problems(recs, fresh, _golden_with(golden, 'demo')) == []


def test_a_changed_config_or_command_makes_the_record_stale(recs, fresh, golden):
  changed = copy.deepcopy(fresh)
  changed['diloco']['loaded_config']['algorithm.outer_lr'] = 0.5
  changed['ddp']['command'] = changed['ddp']['command'].replace('steps=300', 'steps=200')
  del changed['sparseloco']
  changed['old_run'] = {}
  stale = dict(script.problems(recs, changed, golden))
  assert stale['diloco'] == ('the config its command loads changed since it was measured '
                             '(algorithm.outer_lr: 0.5 then, 0.7 now)')
  assert stale['ddp'].startswith('its command changed (launch/sweeps/main.py)')
  assert stale['sparseloco'] == 'not in experiments/expected.json'
  assert stale['old_run'] == 'no longer a record'


def test_check_reports_a_mismatch_and_a_stale_record(tmp_path, capsys, fresh):
  changed = copy.deepcopy(fresh)
  changed['diloco']['eval_loss'] = 9.0
  changed['ddp']['golden']['sha256'] = '0' * 64
  path = tmp_path / 'expected.json'
  path.write_text(json.dumps({'records': changed}))
  assert script.main(['--check', f'--expected={path}']) == 1
  lines = capsys.readouterr().out.splitlines()
  rows = [line.split() for line in lines[1:] if line.startswith(('experiments/', 'README'))]
  diloco = [row for row in rows if row[1:3] == ['diloco', 'eval_loss']]
  # tiny_diloco's own, the three docstrings that compare with it, the README row.
  assert len(diloco) >= 5 and {row[0].split(':')[0] for row in diloco} >= {
      'experiments/tiny_diloco.py', 'experiments/tiny_gasloc.py', 'README.md'}
  assert all(row[5:7] == ['MISMATCH:', 'stated'] and row[-1] == '9.0000' for row in diloco)
  assert all(row[-1] == 'ok' for row in rows if row not in diloco)
  assert ('STALE ddp: measured under other golden numbers: the math changed '
          '(tests/golden/trajectories.json, cases ddp)') in lines
  assert f're-measure: {RUN}ddp' in lines


# ---- harvest -------------------------------------------------------------------------

def _fake_run(path, record, final=None, steps=300, drop=(), **config_changes):
  """A run directory as loco.main writes it, for `record`'s command, ending at `steps`."""
  config = configs.load(os.path.join(REPO, record.config), record.overrides).to_dict()
  for key, value in config_changes.items():
    section, leaf = key.split('__')
    config[section][leaf] = value
  os.makedirs(path)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump({'config': config, 'data_fingerprint': {'name': 'c', 'sha256': 'ab'}}, f)
  rows = [{'step': 150, 'tokens': 614400, 'train_loss': 2.5, 'bytes_sent': 7.7e7},
          {'step': steps, 'tokens': steps * 4096, 'train_loss': 2.1,
           'bytes_sent': 154263552.0, 'peak_bytes': 25710592.0, 'syncs': 6.0,
           'eval_loss': 2.33526821, 'eval_loss_se': 0.0645235,
           'eval_loss_workers': 2.30987715, 'worker_spread': 0.18728, **(final or {})}]
  for key in drop:
    del rows[-1][key]
  with open(os.path.join(path, 'metrics.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def _record(recs, name):
  return next(r for r in recs if r.name == name)


def test_harvest_reads_a_finished_run_of_the_records_command(tmp_path, recs, golden):
  record = _record(recs, 'tiny_gasloc_m09')
  entry = script.harvest(record, _fake_run(tmp_path / 'r', record), golden)
  assert (entry['eval_loss'], entry['eval_loss_se'], entry['eval_loss_workers']) == (
      2.3353, 0.0645, 2.3099)
  assert (entry['bytes_sent'], entry['peak_bytes'], entry['syncs']) == (154263552, 25710592, 6)
  assert (entry['steps'], entry['tokens']) == (300, 1228800)
  assert entry['command'] == ('python -m loco.main --config=experiments/tiny_gasloc.py '
                              '--workdir=runs/expected/tiny_gasloc_m09 '
                              '--config.algorithm.outer_momentum=0.9')
  assert entry['golden'] == script.golden_fingerprint('gasloc', golden)
  assert entry['golden']['cases'] == ['gasloc', 'gasloc_matching']
  assert entry['loaded_config']['algorithm.outer_momentum'] == 0.9


def test_harvest_refuses_another_commands_run_an_unfinished_one_and_one_without_eval(
    tmp_path, recs, golden):
  record = _record(recs, 'tiny_gasloc_m09')
  other = _fake_run(tmp_path / 'other', record, algorithm__outer_momentum=0.5)
  with pytest.raises(LocoError, match=r'was not made by the command of record '
                     r'tiny_gasloc_m09 .*: algorithm.outer_momentum: 0.5 in the run, 0.9 in '
                     r'the command\.$'):
    script.harvest(record, other, golden)
  short = _fake_run(tmp_path / 'short', record, steps=200)
  with pytest.raises(LocoError, match='is incomplete, not finished'):
    script.harvest(record, short, golden)
  no_eval = _fake_run(tmp_path / 'no_eval', record, drop=('eval_loss',))
  with pytest.raises(LocoError, match='has no eval at its last step'):
    script.harvest(record, no_eval, golden)


def test_harvest_updates_what_it_finds_and_keeps_the_rest(tmp_path, capsys, expected):
  path = tmp_path / 'expected.json'
  path.write_text(json.dumps({'records': expected}))
  runs = tmp_path / 'runs'
  record = _record(script.records(), 'tiny_gasloc_m09')
  _fake_run(runs / 'tiny_gasloc_m09', record, final={'eval_loss': 2.4})
  assert script.main([f'--from={runs}', f'--expected={path}']) == 0
  out = capsys.readouterr().out
  assert re.search(r'^tiny_gasloc_m09 +from .*: eval_loss 2.4000, 154.3 MB sent per worker$',
                   out, re.M)
  assert re.search(rf'^diloco +kept \(measured in {expected["diloco"]["measured_in"]}, ', out,
                   re.M)
  written = script.read_expected(str(path))
  assert written['tiny_gasloc_m09']['eval_loss'] == 2.4
  assert written['diloco'] == expected['diloco']
  # Then --check finds the docstring's number of it wrong.
  assert script.main(['--check', f'--expected={path}']) == 1
  assert 'measured 2.4000' in capsys.readouterr().out


def test_harvest_refuses_the_same_old_run_for_a_stale_record(tmp_path, expected, recs):
  """After the golden numbers change, harvesting the very run the record came from again
  would hide the change: refused, with the command that measures it again."""
  runs = tmp_path / 'runs'
  record = _record(recs, 'tiny_gasloc_m09')
  _fake_run(runs / 'tiny_gasloc_m09', record)
  path = tmp_path / 'expected.json'
  path.write_text(json.dumps({'records': expected}))
  assert script.harvest_all(recs, [str(runs)], str(path), only=['tiny_gasloc_m09'],
                            say=lambda _: None) == 0
  harvested = script.read_expected(str(path))
  harvested['tiny_gasloc_m09']['golden']['sha256'] = '0' * 64    # measured under old math
  path.write_text(json.dumps({'records': harvested}))
  with pytest.raises(LocoError, match=r'made before the golden numbers of gasloc, '
                     r'gasloc_matching changed; measure it again in a new directory: python '
                     r'scripts/expected_numbers.py --run --only=tiny_gasloc_m09 --out=DIR'):
    script.harvest_all(recs, [str(runs)], str(path), only=['tiny_gasloc_m09'],
                       say=lambda _: None)


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path, capsys, recs):
  assert script.main(['--check', f'--expected={tmp_path / "none.json"}']) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith('scripts/expected_numbers.py: error: ') and 'does not exist' in err
  assert '\n' not in err
  assert script.main(['--run', '--only=nope']) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('scripts/expected_numbers.py: error: --only names no record nope')
  assert '\n' not in err
  runs = tmp_path / 'runs'
  _fake_run(runs / 'diloco', _record(recs, 'tiny_gasloc_m09'))   # another command's run
  assert script.main([f'--from={runs}', f'--expected={tmp_path / "e.json"}',
                      '--only=diloco']) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith('scripts/expected_numbers.py: error: ') and '\n' not in err
  assert 'was not made by the command of record diloco' in err
  assert not (tmp_path / 'e.json').exists()      # nothing written
  (tmp_path / 'damaged.json').write_text('{"records": [1]}')
  assert script.main(['--check', f'--expected={tmp_path / "damaged.json"}']) == 1
  assert 'has no records object' in capsys.readouterr().err


@pytest.mark.slow
def test_run_measures_each_records_command_and_harvests_it(tmp_path, monkeypatch, capsys,
                                                           small_corpus_glob, data_dir):
  """--run end to end on a nano record: loco.sweep trains it into --out, then the harvest
  writes its entry; a second --run finds it finished and trains nothing."""
  config = tmp_path / 'nano.py'
  config.write_text('from tests.nano import make_nano_config\n\n\ndef get_config():\n'
                    f'  return make_nano_config({small_corpus_glob!r}, {data_dir!r})\n')
  monkeypatch.setattr(script, 'RECORDS', (
      script.Measured('nano', config=str(config), overrides={'steps': 10}),))
  out, path = tmp_path / 'runs', tmp_path / 'expected.json'
  argv = ['--run', f'--out={out}', f'--expected={path}']
  assert script.main(argv) == 0
  entry = script.read_expected(str(path))['nano']
  assert entry['steps'] == 10 and entry['tokens'] == 10 * 2 * 2 * 32
  assert entry['command'] == (f'python -m loco.main --config={config} '
                              '--workdir=runs/expected/nano --config.steps=10')
  assert entry['measured_in'] == os.path.join(str(out), 'nano')
  assert 2.0 < entry['eval_loss'] < 7.0 and entry['golden']['cases'] == ['ddp']
  capsys.readouterr()
  assert script.main(argv) == 0
  assert re.search(r'^skip +nano', capsys.readouterr().out, re.M)
  assert script.read_expected(str(path))['nano'] == entry


def test_a_key_added_since_at_its_default_is_no_difference():
  assert script.config_differences({'steps': 300}, {'steps': 300,
                                                    'data.hf_eval_fraction': 0.05}) == ''
  assert script.config_differences({'steps': 300}, {'steps': 300,
                                                    'data.hf_eval_fraction': 0.1}) == (
      'data.hf_eval_fraction: null then, 0.1 now')
