"""Boundaries and edge cases of the data path and the numbers reported about runs.

The corpus cleaner's thresholds exactly at, below and above their values; the sample
standard deviation of a study's finals (and of a report's seed groups) with one seed
and with diverged seeds; non-finite eval losses in a run's metrics; which shards
`prepare c4` counts as done; and batched runs that resume their own data and apply
their own weight decay.
"""

import gzip
import io
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from launch import claims
from loco import batched
from loco.lab import report
from loco.run import run_axis
from loco.files import runs
from loco import stats
from loco.lab import study
from loco.run import train
from loco.data import c4
from loco.data import clean
from loco.errors import Interrupted
from loco.run.experiment import parse_config
from loco.files.metrics import read_metrics
from loco.run.placement import Placement
from tests.c4_shards import write_c4_shards
from tests.nano import make_nano_config

# ------------------------------------------------------------ 1. corpus cleaner

_TABLE_LINE = '    0x{:04x}: 0x{:04x},\n'     # literals, a colon and a comma: a table line
_CODE_LINE = 'name_{:04d} = compute(x)\n'     # a name and a call: a code line


def _file(table: int, code: int, nbytes: int, pad: str = 'p') -> str:
  """`table` table lines and `code` code lines, padded with one comment line (not a
  code line) to exactly `nbytes` bytes of UTF-8."""
  body = (''.join(_TABLE_LINE.format(i, i) for i in range(table))
          + ''.join(_CODE_LINE.format(i) for i in range(code)))
  room = nbytes - len(body.encode('utf-8')) - len('#\n')
  filler = pad * (room // len(pad.encode('utf-8')))
  text = body + '#' + filler + 'p' * (room - len(filler.encode('utf-8'))) + '\n'
  assert len(text.encode('utf-8')) == nbytes
  return text


def test_table_share_counts_code_lines_only():
  # Blank lines and comments are not code; a '#' inside a string does not start a
  # comment; a line of brackets only holds no literal, so it is code, not table.
  text = "x = 1\n'#': 0x23,  # hash\n\n# a comment\n{\n  -1: (2, 'a'),\n"
  assert clean.table_share(text) == pytest.approx(2 / 4)
  assert clean.table_share('# only\n\n   \n') == 0.0
  assert clean.table_share(_file(3, 1, 200)) == 0.75


@pytest.mark.parametrize('table, code, excluded', [
    (300, 100, True),      # exactly 0.75: a table
    (299, 101, False),     # 0.7475, just below
    (301, 99, True),       # 0.7525, just above
])
def test_the_table_share_threshold(table, code, excluded):
  text = _file(table, code, 12_000)
  assert clean.table_share(text) == table / (table + code)
  got = clean.exclusions({'t.py': text}, stdlib=False)
  assert got == ({'t.py': clean.TABLE} if excluded else {})


@pytest.mark.parametrize('nbytes, excluded', [(4095, False), (4096, True), (4097, True)])
def test_the_table_size_threshold_counts_bytes(nbytes, excluded):
  text = _file(100, 0, nbytes)
  assert clean.exclusions({'t.py': text}, stdlib=False) == (
      {'t.py': clean.TABLE} if excluded else {})
  # Bytes, not characters: a two-byte character makes 4095 characters 4096 bytes.
  wide = _file(100, 0, 4096, pad='é')
  assert len(wide) < 4096 and clean.exclusions({'t.py': wide}, stdlib=False) == {
      't.py': clean.TABLE}


def test_an_empty_file_is_whitespace_only_and_comes_first():
  texts = {'blank.py': ' \n\t\n', 'dot.py': '.', 'pydoc_data/topics.py': '\n'}
  assert clean.exclusions(texts, stdlib=True) == {'blank.py': clean.EMPTY,
                                                  'pydoc_data/topics.py': clean.EMPTY}


def _lines(tag: str, n: int) -> list[str]:
  """n distinct code lines of one length (the tag is one letter)."""
  return [f'v_{tag}_{i:03d} = merge(a, b)' for i in range(n)]


ORIGINAL = _lines('a', 40)   # 36 shingles, larger than every file compared with it


def _near(j: int, n: int) -> str:
  """n lines: the first j of ORIGINAL, then n - j lines of its own."""
  return '\n'.join(ORIGINAL[:j] + _lines('u', n - j)) + '\n'


@pytest.mark.parametrize('j, n, excluded', [
    (9, 14, True),      # 5 of 10 shingles seen: exactly half
    (8, 14, False),     # 4 of 10, just below
    (10, 14, True),     # 6 of 10, just above
    (13, 13, False),    # 9 shingles, every one seen: too short to judge
    (14, 14, True),     # 10 shingles, every one seen: judged, a duplicate
])
def test_the_near_duplicate_thresholds(j, n, excluded):
  texts = {'a.py': '\n'.join(ORIGINAL) + '\n', 'b.py': _near(j, n)}
  assert len(clean.shingles(texts['b.py'])) == n - clean.SHINGLE_LINES + 1
  got = clean.exclusions(texts, stdlib=False)
  assert got == ({'b.py': clean.NEAR_DUPLICATE} if excluded else {})


@settings(max_examples=60, deadline=None)
@given(st.integers(10, 22), st.data())
def test_near_duplicate_rule_by_counting(n, data):
  """A file of n lines sharing its first j with a larger file: j - 4 of its n - 4
  shingles are seen; it goes when it has >= 10 shingles and half of them are seen."""
  j = data.draw(st.integers(0, n))
  shingles, seen = n - 4, max(0, j - 4)
  got = clean.exclusions({'a.py': '\n'.join(ORIGINAL) + '\n', 'b.py': _near(j, n)},
                         stdlib=False)
  want = shingles >= clean.MIN_SHINGLES and seen >= clean.NEAR_DUPLICATE_SHARE * shingles
  assert got == ({'b.py': clean.NEAR_DUPLICATE} if want else {})


def test_the_larger_copy_is_kept_and_ties_go_by_path():
  text = '\n'.join(ORIGINAL) + '\n'
  assert clean.exclusions({'a.py': text, 'b.py': text}, stdlib=False) == {
      'b.py': clean.NEAR_DUPLICATE}
  # One byte more (trailing spaces and indentation do not change the shingles) makes
  # z.py the larger: it is kept although its path sorts last.
  bigger = '\n'.join('  ' + line for line in ORIGINAL) + '\n'
  assert clean.shingles(bigger) == clean.shingles(text)
  assert clean.exclusions({'a.py': text, 'z.py': bigger}, stdlib=False) == {
      'a.py': clean.NEAR_DUPLICATE}


def test_an_excluded_file_does_not_count_as_seen():
  """b copies most of a and is dropped; c copies b's own tail, which only b held: c is
  kept, because only kept files' shingles count as seen."""
  big = _lines('a', 60)
  tail = _lines('u', 12)
  texts = {'a.py': '\n'.join(big) + '\n',
           'b.py': '\n'.join(big[:30] + tail) + '\n',             # 26 of 38 seen
           'c.py': '\n'.join(tail + _lines('w', 8)) + '\n'}       # 8 of 16 in b only
  assert clean.exclusions(texts, stdlib=False) == {'b.py': clean.NEAR_DUPLICATE}
  # The same c against b kept (a absent) is a near-duplicate of it.
  del texts['a.py']
  assert clean.exclusions(texts, stdlib=False) == {'c.py': clean.NEAR_DUPLICATE}


def test_a_table_is_not_seen_by_the_near_duplicate_check():
  table = _file(300, 0, 12_000)
  code = '\n'.join(ORIGINAL) + '\n'
  # A copy of the table's first 20 lines, short enough not to be a table itself.
  copy = ''.join(_TABLE_LINE.format(i, i) for i in range(20))
  assert clean.exclusions({'t.py': table, 'c.py': code, 'copy.py': copy},
                          stdlib=False) == {'t.py': clean.TABLE}


# ------------------------------------------- 2. the spread of a study's finals


def _group(losses, diverged=None, name='a'):
  return study.Group(name, dict(losses), {}, None, 0.0, 0.0, 0.0, [], {}, dict(diverged or {}))


def test_a_groups_std_is_the_sample_sd_of_its_finished_seeds():
  three = _group({1: 2.0, 2: 2.2, 3: 2.4})
  assert three.mean == pytest.approx(2.2)
  assert three.std == pytest.approx(0.2)           # sqrt(0.08 / 2); ddof 0 gives 0.163
  assert three.text() == '2.2000 ± 0.2000'
  two = _group({1: 2.0, 2: 2.4})
  assert two.std == pytest.approx(math.sqrt(0.08))  # 0.2828; ddof 0 gives 0.2
  assert two.text() == '2.2000 ± 0.2828'
  assert two.text(1, ' s') == '2.2 ± 0.3 s'


def test_one_seed_has_no_std():
  one = _group({5: 2.5})
  assert math.isnan(one.std) and one.mean == 2.5
  assert one.text() == '2.5000 (1 seed)' and one.text(1, ' s') == '2.5 s (1 seed)'
  assert math.isnan(_group({}).std) and _group({}).text() == 'no seed'


def test_a_diverged_seed_is_left_out_of_mean_and_std():
  g = _group({1: 2.0, 3: 2.4}, {2: 50})
  assert g.values == [2.0, 2.4]
  assert g.mean == pytest.approx(2.2) and g.std == pytest.approx(math.sqrt(0.08))
  assert g.text() == '2.2000 ± 0.2828 over 2 of 3 seeds (seed 2 diverged at step 50)'
  assert g.per_seed() == '2.0000, diverged at step 50, 2.4000'
  alone = _group({1: 2.0}, {2: 50, 3: 7})
  assert math.isnan(alone.std)
  assert alone.text() == ('2.0000 over 1 of 3 seeds (seed 2 diverged at step 50; seed 3 '
                          'diverged at step 7)')
  assert alone.text(1, ' s').startswith('2.0 s over 1 of 3 seeds')


PICKS = {'diloco': {'member': 'diloco_nesterov'}}   # the reference DiLoCo's best member


def test_derived_gains_are_per_seed_differences_with_the_diverged_seeds_named():
  g = {'diloco_r4': _group({1: 2.3, 2: 2.5, 3: 2.4}, name='diloco_r4'),
       'diloco_nesterov': _group({1: 2.2, 2: 2.3}, {3: 40}, name='diloco_nesterov')}
  gain = claims.derived_groups(g, PICKS)['gain_4_to_8']
  assert gain.losses == {1: pytest.approx(0.1), 2: pytest.approx(0.2)}
  assert gain.diverged == {3: 40}
  assert gain.std == pytest.approx(math.sqrt(0.005))     # two values 0.05 from 0.15
  assert gain.text() == '0.1500 ± 0.0707 over 2 of 3 seeds (seed 3 diverged at step 40)'
  assert 'gain_8_to_16' not in claims.derived_groups(g, PICKS)


def test_a_comparison_needs_two_shared_finished_seeds():
  a = _group({1: 2.0, 2: 2.1}, {3: 9})
  b = _group({1: 2.2, 3: 2.3}, {2: 4}, name='b')
  c = study.compare(a, b)
  assert c.paired is None and c.welch is not None        # one shared seed; two each
  assert c.welch.se == pytest.approx(math.sqrt(0.005 / 2 + 0.005 / 2))
  assert c.diverged_a == (3,) and c.diverged_b == (2,)
  assert c.verdict() == 'not reproduced'


def _seed_row(seed, final, best, status='finished', setting='{"lr": 1}'):
  return dict(name=f'run_seed{seed}', seed=seed, setting=setting, status=status,
              final_eval_loss=final, best_eval_loss=best, bytes_sent=10.0,
              bytes_received=20.0)


def test_report_seed_groups_use_the_sample_sd_and_skip_diverged_and_lone_seeds():
  rows = [_seed_row(1, 2.0, 1.9), _seed_row(2, 2.2, 2.0), _seed_row(3, 2.4, 2.4),
          _seed_row(4, float('nan'), 1.5, status='diverged'),
          _seed_row(5, 9.0, 9.0, status='incomplete'),
          _seed_row(1, 3.0, 3.0, setting='{"lr": 2}'),            # one seed: no group
          _seed_row(1, 3.0, 3.0, setting='{"lr": 3}'),            # the same seed twice
          _seed_row(1, 3.2, 3.2, setting='{"lr": 3}')]
  (g,) = report.seed_groups(rows)
  assert (g['name'], g['n'], g['seeds']) == ('run', 3, [1, 2, 3])
  assert g['final_mean'] == pytest.approx(2.2) and g['final_std'] == pytest.approx(0.2)
  assert g['best_mean'] == pytest.approx(2.1) and g['best_std'] == pytest.approx(
      math.sqrt(0.14 / 2))
  half = stats.t_critical(2) * 0.2 / math.sqrt(3)
  assert g['final_ci'] == pytest.approx((2.2 - half, 2.2 + half))
  assert '2.2000 ± 0.2000' in report.seed_table([g])


# ------------------------------------------- 3. non-finite evals in a run's metrics


def _run_dir(root, name, evals, state='finished', steps=30, train_loss=3.0):
  """A run with evals at steps 10, 20, 30 (None: no eval at that step)."""
  path = os.path.join(root, name)
  os.makedirs(path)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump({'config': {'steps': steps, 'seed': 0, 'algorithm': {'name': 'ddp'}}}, f)
  with open(os.path.join(path, 'metrics.jsonl'), 'w') as f:
    for i, loss in enumerate(evals, 1):
      row = dict(step=10 * i, tokens=100 * i, train_loss=train_loss,
                 bytes_sent=5.0 * i, sim_seconds=1.0 * i)
      if loss is not None:
        row['eval_loss'] = loss
      f.write(json.dumps(row) + '\n')        # NaN and Infinity as Python's json writes them
  if state:
    with open(os.path.join(path, 'status.json'), 'w') as f:
      json.dump({'state': state}, f)
  return path


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), float('-inf')])
@pytest.mark.parametrize('where', [0, 2])
def test_a_non_finite_eval_loss_is_divergence_whatever_status_json_says(tmp_path, bad,
                                                                        where):
  evals = [3.0, 2.5, 2.4]
  evals[where] = bad
  path = _run_dir(str(tmp_path), 'r', evals)
  run = runs.read_run(path)
  assert run.status == 'diverged'
  assert not math.isfinite(run.metrics[where]['eval_loss'])     # read back as logged
  # And a study scores such a tuning run +inf, never by its last number.
  assert study.tuning_score(path) == math.inf


def test_summarize_reports_non_finite_evals_without_using_them(tmp_path):
  root = str(tmp_path)
  _run_dir(root, 'ok', [3.0, 2.5, 2.4])
  _run_dir(root, 'nan_last', [3.0, 2.2, float('nan')])
  _run_dir(root, 'neg_inf', [3.0, float('-inf'), 2.3])
  _run_dir(root, 'nan_first', [float('nan'), 2.7, 2.6])     # finite at the end
  rows = {r['name']: r for r in report.summarize(report.find_workdirs(root))}
  assert {n: r['status'] for n, r in rows.items()} == {
      'ok': 'finished', 'nan_last': 'diverged', 'neg_inf': 'diverged',
      'nan_first': 'diverged'}
  # The target is the largest final loss of the finished runs only: ok's 2.4, not
  # nan_first's 2.6 (it diverged on the way) and never a nan.
  assert all(r['target'] == 2.4 for r in rows.values())
  nan_last, neg_inf = rows['nan_last'], rows['neg_inf']
  assert math.isnan(nan_last['final_eval_loss'])     # the last eval, as logged
  assert nan_last['best_eval_loss'] == 2.2           # the best finite one
  assert nan_last['target_step'] == 20
  # -inf is not a loss below everything: neither the best nor where the target is hit.
  assert neg_inf['best_eval_loss'] == 2.3 and neg_inf['final_eval_loss'] == 2.3
  assert (neg_inf['target_step'], neg_inf['target_tokens'], neg_inf['target_bytes'],
          neg_inf['target_sim_seconds']) == (30, 300, 15.0, 3.0)
  assert rows['nan_first']['best_eval_loss'] == 2.6
  assert rows['nan_first']['target_step'] is None
  assert rows['ok']['target_step'] == 30


def test_a_report_of_only_non_finite_runs_has_no_target(tmp_path):
  root = str(tmp_path / 's')
  _run_dir(root, 'a', [float('nan'), float('nan'), float('nan')])
  _run_dir(root, 'b', [3.0, float('inf'), None])
  rows = report.summarize(report.find_workdirs(root))
  assert [r['target'] for r in rows] == [None, None]
  assert [r['best_eval_loss'] for r in rows] == [None, 3.0]
  assert math.isinf(rows[1]['final_eval_loss'])
  assert report.default_target(rows) is None
  path = report.write_report([root], out=str(tmp_path / 'out'), stream=io.StringIO())
  text = open(path).read()
  assert 'Target: none (no finished run has an eval loss' in text
  assert '2 runs: 2 diverged.' in text
  assert report.summarize(report.find_workdirs(root), target=3.0)[1]['target_step'] == 10


# --------------------------------------------- 4. prepare c4's finished shards


@pytest.fixture
def c4_source(tmp_path):
  source = str(tmp_path / 'src')
  write_c4_shards(source, train_shards=2, validation_shards=1, docs=3)
  return source


def _state(data_dir):
  with open(os.path.join(c4.dataset_path(data_dir), c4.STATE_FILE)) as f:
    return json.load(f)['shards']


def _source_file(source, key):
  split, index = key.split('/')
  total = 1024 if split == 'train' else 8
  return os.path.join(source, f'c4-{split}.{int(index):05d}-of-{total:05d}.json.gz')


def test_prepare_records_each_shard_with_its_source_and_output(c4_source, tmp_path):
  data_dir = str(tmp_path / 'tfds')
  first = c4.prepare(c4_source, data_dir, progress=False)
  assert first.written == ['train/00000', 'train/00001', 'validation/00000']
  state = _state(data_dir)
  assert sorted(state) == first.written
  for key, entry in state.items():
    source = os.stat(_source_file(c4_source, key))
    out = c4._shard_file(c4.dataset_path(data_dir), key)
    assert entry['source'] == os.path.basename(_source_file(c4_source, key))
    assert (entry['size'], entry['mtime_ns']) == (source.st_size, source.st_mtime_ns)
    assert entry['split'] == key.split('/')[0] and entry['docs'] == 3
    assert entry['stored_bytes'] == os.path.getsize(out)
  again = c4.prepare(c4_source, data_dir, progress=False)
  assert again.written == [] and again.skipped == first.written
  assert again.docs == first.docs == {'train': 6, 'validation': 3}


def _rewrite_keeping_mtime(path, data):
  before = os.stat(path)
  with open(path, 'wb') as f:
    f.write(data)
  os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_source_that_changed_size_or_time_is_prepared_again(c4_source, tmp_path):
  data_dir = str(tmp_path / 'tfds')
  c4.prepare(c4_source, data_dir, progress=False)
  # train/00001 gets one more document; its mtime is put back, so only its size says so.
  path = _source_file(c4_source, 'train/00001')
  with gzip.open(path, 'rb') as f:
    lines = f.read().splitlines(keepends=True)
  _rewrite_keeping_mtime(path, gzip.compress(b''.join(lines + lines[:1])))
  assert os.stat(path).st_mtime_ns == _state(data_dir)['train/00001']['mtime_ns']
  resized = c4.prepare(c4_source, data_dir, progress=False)
  assert resized.written == ['train/00001']
  assert resized.skipped == ['train/00000', 'validation/00000']
  assert resized.docs == {'train': 7, 'validation': 3} and c4.is_prepared(data_dir)
  assert _state(data_dir)['train/00001']['size'] == os.path.getsize(path)
  # The same bytes with a new mtime: written again too (the source may have changed).
  os.utime(_source_file(c4_source, 'validation/00000'), ns=(1, 10**18))
  touched = c4.prepare(c4_source, data_dir, progress=False)
  assert touched.written == ['validation/00000'] and touched.docs['validation'] == 3


def test_a_missing_or_cut_output_is_prepared_again(c4_source, tmp_path):
  data_dir = str(tmp_path / 'tfds')
  c4.prepare(c4_source, data_dir, progress=False)
  path = c4.dataset_path(data_dir)
  os.remove(c4._shard_file(path, 'train/00000'))
  missing = c4.prepare(c4_source, data_dir, progress=False)
  assert missing.written == ['train/00000'] and c4.is_prepared(data_dir)
  # A shard file cut short after it was recorded (a copy of the folder cut short).
  out = c4._shard_file(path, 'validation/00000')
  with open(out, 'r+b') as f:
    f.truncate(os.path.getsize(out) // 2)
  cut = c4.prepare(c4_source, data_dir, progress=False)
  assert cut.written == ['validation/00000']
  assert os.path.getsize(out) == _state(data_dir)['validation/00000']['stored_bytes']
  assert c4.prepare(c4_source, data_dir, progress=False).written == []


@pytest.mark.parametrize('damage', ['not json', 'a list', 'entry without size',
                                    'another source name'])
def test_a_damaged_or_foreign_state_entry_is_not_a_finished_shard(c4_source, tmp_path,
                                                                  damage):
  data_dir = str(tmp_path / 'tfds')
  c4.prepare(c4_source, data_dir, progress=False)
  state_file = os.path.join(c4.dataset_path(data_dir), c4.STATE_FILE)
  state = {'shards': _state(data_dir)}
  if damage == 'entry without size':
    del state['shards']['train/00000']['size']
  elif damage == 'another source name':
    state['shards']['train/00000']['source'] = 'c4-train.00007-of-01024.json.gz'
  with open(state_file, 'w') as f:
    f.write({'not json': '{"shards": {', 'a list': '[]'}.get(damage, json.dumps(state)))
  redone = c4.prepare(c4_source, data_dir, progress=False)
  every = ['train/00000', 'train/00001', 'validation/00000']
  assert redone.written == (every if damage in ('not json', 'a list') else ['train/00000'])
  assert sorted(redone.written + redone.skipped) == every
  assert c4.is_prepared(data_dir) and redone.docs == {'train': 6, 'validation': 3}


# ----------------------------------- 5. batched runs: own data and own weight decay


def _nano(glob, data_dir, seed, lr=3e-3, weight_decay=0.1):
  c = make_nano_config(glob, data_dir)
  c.seed = seed
  c.optimizer.lr = lr
  c.optimizer.weight_decay = weight_decay
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = 3
  return c


@pytest.mark.slow
def test_weight_decay_is_each_runs_own_knob(small_corpus_glob, data_dir):
  """Two runs on the same seed and batches that differ only in weight decay, through
  one compiled program: each run equals the same program's run with its decay on both
  sides, so the decay of one never reaches the other."""
  decays = (0.0, 20.0)
  exps = [parse_config(_nano(small_corpus_glob, data_dir, 1, 1e-2, wd)) for wd in decays]
  knobs = run_axis.knobs_of(exps)
  np.testing.assert_array_equal(knobs['weight_decay'], np.float32(decays))
  np.testing.assert_array_equal(knobs['lr'], np.float32([1e-2, 1e-2]))
  k, r = 4, exps[0].run
  batch = np.random.default_rng(0).integers(
      0, exps[0].model.vocab_size, (k, r.num_workers, r.batch_per_worker, r.seq_len + 1))
  batches = jnp.asarray(np.stack([batch, batch]), jnp.int32)
  valid = jnp.ones((k,), bool)
  graphdef, states = run_axis.init_states(exps[0], knobs, [1, 1])
  chunk = run_axis.make_batched_chunk(exps[0], graphdef)

  def params(decay):    # per run, the leaves of its params after k steps
    start = jax.tree.map(jnp.copy, states)        # the chunk donates its states
    out, _ = chunk(dict(knobs, weight_decay=np.float32(decay)), start, batches, None,
                   valid)
    return [jax.tree.leaves(jax.tree.map(lambda x: x[i], out.params))  # noqa: B023
            for i in range(2)]

  mixed = params(decays)
  for i, decay in enumerate(decays):
    alone = params([decay, decay])[i]
    for a, b in zip(mixed[i], alone):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  # The decay acted: the two runs' weights differ by far more than the tolerance.
  assert max(float(np.max(np.abs(a - b))) for a, b in zip(*mixed)) > 1e-3


def _checkpointed_data(workdir, step):
  """The data iterator state a run's checkpoint holds, read with orbax alone."""
  import orbax.checkpoint as ocp
  with ocp.CheckpointManager(os.path.join(workdir, 'checkpoints'),
                             item_names=('state', 'data', 'host')) as manager:
    return dict(manager.restore(step, args=ocp.args.Composite(
        data=ocp.args.JsonRestore()))['data'])


@pytest.mark.slow
def test_runs_resumed_together_each_read_their_own_data(tmp_path, small_corpus_glob,
                                                        data_dir, monkeypatch):
  """Two seeds (two data orders) stopped at their step-10 checkpoint and resumed in one
  group: each run reads its own data on from where it stopped, and the data state its
  last checkpoint holds is its own iterator's."""
  configs = [_nano(small_corpus_glob, data_dir, seed) for seed in (1, 2)]
  for c in configs:
    c.steps = 15
    c.eval.every = 0
  dirs = [str(tmp_path / 'a'), str(tmp_path / 'b')]
  real = train._chunks
  seen = []

  def stop_after_10(start, *args):
    for item in real(start, *args):
      if item[0] >= 10:
        train.STOP.set()
      yield item
  monkeypatch.setattr(train, "_chunks", stop_after_10)
  with pytest.raises(Interrupted):
    batched.run_batched(configs, dirs)
  train.STOP.clear()

  def recorded(start, *args):
    for item in real(start, *args):
      seen.append((start, item))
      yield item
  monkeypatch.setattr(train, "_chunks", recorded)
  assert [r['state'] for r in batched.run_batched(configs, dirs)] == ['finished'] * 2
  (start, (end, k, batches, _, _, data_states)), = seen
  assert (start, end, k) == (10, 15, 5)
  for i, config in enumerate(configs):
    exp = parse_config(config)
    placement = Placement.make(1, exp.run.num_workers, 1, exp.run.batch_per_worker)
    own, _ = train._data(exp, placement)      # a fresh iterator of this run's seed
    for _ in range(10):
      next(own)
    np.testing.assert_array_equal(batches[i, :k], np.stack([next(own) for _ in range(k)]))
    assert data_states[i] == own.get_state()
    assert _checkpointed_data(dirs[i], 15) == own.get_state()
    assert [row['step'] for row in read_metrics(dirs[i])] == [5, 10, 15]
  assert not np.array_equal(batches[0, :k], batches[1, :k])
