"""loco.compare: the interval of a difference of final eval losses, on hand-written runs
whose numbers give the interval by hand; the verdicts; every bad input as one line."""

import io
import json
import math
import os
import re
import subprocess
import sys

import pytest

from loco.lab import compare

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T2 = 4.302652729911275       # Student's t, 97.5% quantile, 2 df
Z = 1.959963984540054        # the normal's 97.5% quantile


def _run(root, name, loss, se=0.05, seed=0, algorithm='ddp', steps=30, sent=1e6,
         split='validation', eval_every=10, sim=2.0, **config):
  """A run as loco.run.train leaves it: config.json, and metrics.jsonl logging every 5 steps
  with an eval every `eval_every` steps whose final value is `loss` (± `se`)."""
  path = os.path.join(root, name)
  os.makedirs(path)
  cfg = dict(steps=steps, seed=seed, seq_len=32, algorithm={'name': algorithm},
             data={'source': 'stdlib', 'eval_split': split}, eval={'batches': 2,
                                                                   'batch_size': 4},
             **config)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump({'config': cfg, 'model': {}}, f)
  with open(os.path.join(path, 'metrics.jsonl'), 'w') as f:
    for step in range(5, steps + 1, 5):
      row = dict(step=step, tokens=100 * step, train_loss=3.0, bytes_sent=sent * step / steps,
                 bytes_received=2 * sent * step / steps, sim_seconds=sim * step / steps)
      if eval_every and step % eval_every == 0:
        row.update(eval_loss=loss + (steps - step) / 100, eval_loss_se=se)
      f.write(json.dumps(row) + '\n')
  return path


def _seeds(root, name, losses, **kw):
  return [_run(root, f'{name}_seed{s}', loss, seed=s, **kw) for s, loss in losses.items()]


def _out(specs, **kw):
  stream = io.StringIO()
  comparisons = compare.run_compare(specs, stream=stream, **kw)
  return comparisons, stream.getvalue()


def _error(capsys, argv, code=1):
  """Runs the command; returns its one stderr line after `loco.compare: error: `."""
  try:
    got = compare.main(argv)
  except SystemExit as e:      # argparse's errors (cli.Parser): one line too
    got = e.code
  assert got == code
  captured = capsys.readouterr()
  lines = captured.err.splitlines()
  assert len(lines) == 1 and lines[0].startswith('loco.compare: error: '), captured.err
  assert captured.out == ''
  return lines[0].removeprefix('loco.compare: error: ')


def test_paired_by_seed_equals_the_hand_computed_paired_t_interval(tmp_path):
  root = str(tmp_path)
  _seeds(root, 'ref', {0: 2.00, 1: 2.10, 2: 2.30}, sent=4e8)
  _seeds(root, 'new', {2: 2.38, 0: 2.05, 1: 2.12}, sent=1e6, algorithm='diloco')
  (c,), printed = _out([f'{root}/ref_seed*', f'{root}/new_seed*'])
  # Per seed: d = new - ref = 0.05, 0.02, 0.08; mean 0.05, sd 0.03, df 2.
  half = T2 * 0.03 / math.sqrt(3)
  assert c.method == 'paired t' and c.seeds == (0, 1, 2) and c.df == 2
  assert c.estimate == pytest.approx(0.05)
  assert c.ci == pytest.approx((0.05 - half, 0.05 + half))
  assert c.relative == pytest.approx(6.55 / 6.40 - 1)
  # The relative interval: the ratios rho at which the paired t of new - rho * ref is
  # exactly at the critical value (Fieller), by hand.
  ref, new = [2.00, 2.10, 2.30], [2.05, 2.12, 2.38]
  for rho, sign in ((1 + c.relative_ci[0], 1), (1 + c.relative_ci[1], -1)):
    d = [a - rho * b for a, b in zip(new, ref)]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    assert mean / (sd / math.sqrt(3)) == pytest.approx(sign * T2, rel=1e-9)
  assert c.relative_ci[0] < c.relative < c.relative_ci[1]
  lines = printed.splitlines()
  assert lines[0].split() == ['runs', '(seeds)', 'final', 'eval', 'loss', 'sent', 'received',
                              'sim', 's', 'at', 'step']
  assert lines[1].startswith('ref (reference)  3 (0,1,2)')
  mean_half = T2 * math.sqrt(((2.0 - 6.4 / 3) ** 2 + (2.1 - 6.4 / 3) ** 2
                              + (2.3 - 6.4 / 3) ** 2) / 2) / math.sqrt(3)
  assert f'{6.4 / 3:.4f} [{6.4 / 3 - mean_half:.4f}, {6.4 / 3 + mean_half:.4f}]' in lines[1]
  assert '400.00 MB' in lines[1] and '1.00 MB' in lines[2]
  assert (f'new - ref: +0.0500 nats/token [{0.05 - half:+.4f}, {0.05 + half:+.4f}] '
          '(95% CI, paired t over seeds 0,1,2, 2 df)') in printed
  assert 'new: 400.0x fewer bytes sent, 400.0x fewer bytes received' in printed
  assert ('verdict: inconclusive: the CI includes 0 (no difference detected between new and '
          'ref)') in printed.replace('\n    ', ' ')
  assert max(map(len, lines)) <= 100


def test_unpaired_single_runs_combine_their_eval_standard_errors(tmp_path):
  root = str(tmp_path)
  a = _run(root, 'a', 2.50, se=0.03)
  b = _run(root, 'b', 2.40, se=0.04, algorithm='diloco')
  (c,), printed = _out([a, b])
  se = math.sqrt(0.03 ** 2 + 0.04 ** 2)          # 0.05
  assert c.method == 'eval SE' and c.df == math.inf
  assert c.se == pytest.approx(0.05)
  assert c.estimate == pytest.approx(-0.10)
  assert c.ci == pytest.approx((-0.10 - Z * se, -0.10 + Z * se))
  # Fieller's ends: |b - rho a| = z sqrt(se_b^2 + rho^2 se_a^2), by hand.
  for rel in c.relative_ci:
    rho = 1 + rel
    assert abs(2.40 - rho * 2.50) == pytest.approx(Z * math.sqrt(0.04 ** 2 + rho ** 2 * 0.03 ** 2))
  assert 'b - a: -0.1000 nats/token [-0.1980, -0.0020] (95% CI, eval SE' in printed
  assert re.split(r'\s{2,}', printed.splitlines()[1]) == [
      'a (reference)', '1 (seed 0)', '2.5000 ± 0.0300 SE', '1.00 MB', '2.00 MB', '2.0', '30']
  flat = printed.replace('\n    ', ' ')
  assert 'verdict: b is better than a: the whole CI lies below 0.' in flat
  assert "this interval holds the eval set's sampling error only" in flat


def test_the_verdict_of_each_case_against_a_margin(tmp_path):
  root = str(tmp_path)
  ref = _run(root, 'ref', 2.50, se=0.004)
  for name, loss, says in (
      ('far_better', 2.30, 'far_better is better than ref by more than the margin (1%): the '
                           'whole CI lies below -1%.'),
      ('far_worse', 2.70, 'far_worse is worse than ref by more than the margin (1%): the '
                          'whole CI lies above +1%.'),
      ('same', 2.50, 'same is within the margin (1%) of ref: the whole CI lies inside ±1%.'),
      ('edge', 2.478, 'inconclusive: the CI straddles the margin (1%) (['),
  ):
    other = _run(root, name, loss, se=0.004, algorithm=name)
    (c,), printed = _out([ref, other], margin=0.01)
    assert f'verdict: {says}' in printed.replace('\n    ', ' '), printed
    assert c.verdict.startswith(says)
  # Paired: 3 seeds each, the new method 3-4% better on every seed.
  _seeds(root, 'a', {0: 2.00, 1: 2.10, 2: 2.30})
  _seeds(root, 'b', {0: 1.93, 1: 2.02, 2: 2.22}, algorithm='x')
  (c,), _ = _out([f'{root}/a_seed*', f'{root}/b_seed*'], margin=0.01)
  assert c.method == 'paired t'
  assert c.verdict == ('b is better than a by more than the margin (1%): the whole CI lies '
                       'below -1%.')


def test_verdict_words():
  v = compare.verdict
  assert v('x', 'r', (-0.05, -0.02)) == 'x is better than r: the whole CI lies below 0.'
  assert v('x', 'r', (0.01, 0.02)) == 'x is worse than r: the whole CI lies above 0.'
  assert v('x', 'r', (-0.01, 0.02)).startswith('inconclusive: the CI includes 0')
  assert v('x', 'r', (-0.015, 0.005), 0.02).startswith('x is within the margin (2%) of r')
  assert v('x', 'r', (-0.03, -0.01), 0.02).startswith('inconclusive: the CI straddles')
  assert v('x', 'r', (-0.03, 0.03), 0.02).startswith('inconclusive: the CI straddles')


def test_seeds_that_do_not_match_use_welch(tmp_path):
  root = str(tmp_path)
  _seeds(root, 'a', {0: 2.0, 1: 2.2, 2: 2.4})
  _seeds(root, 'b', {3: 2.1, 4: 2.2}, algorithm='x')
  (c,), printed = _out([f'{root}/a_seed*', f'{root}/b_seed*'])
  va, vb = 0.04 / 3, 0.005 / 2        # s^2 / n: s_a = 0.2, s_b = sqrt(0.005)
  df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 1)
  assert c.method == 'Welch t'
  assert c.estimate == pytest.approx(2.15 - 2.2)
  assert c.se == pytest.approx(math.sqrt(va + vb)) and c.df == pytest.approx(df)
  assert f'Welch t over seeds, {df:.3g} df' in printed


def test_a_group_against_one_run_adds_its_seed_spread(tmp_path):
  root = str(tmp_path)
  _seeds(root, 'a', {0: 2.0, 1: 2.2, 2: 2.4}, se=0.02)
  one = _run(root, 'one', 2.1, se=0.03, algorithm='x')
  (c,), _ = _out([f'{root}/a_seed*', one])
  assert c.method == 'eval SE'
  assert c.se == pytest.approx(math.sqrt(0.03 ** 2 + 0.02 ** 2 + 0.04 / 3))


def test_a_side_can_be_a_directory_of_seeds_a_comma_list_or_named(tmp_path, capsys):
  root = str(tmp_path)
  seeds = _seeds(os.path.join(root, 'sweep'), 'ddp', {0: 2.0, 1: 2.1, 2: 2.3})
  _seeds(root, 'new', {0: 2.05, 1: 2.12, 2: 2.38}, algorithm='diloco')
  with open(os.path.join(root, 'sweep', 'sweep.json'), 'w') as f:
    json.dump({'runs': [{'name': f'ddp_seed{s}'} for s in range(3)]}, f)
  comma = ','.join(os.path.join(root, f'new_seed{s}') for s in (2, 0, 1))
  (c,), printed = _out([os.path.join(root, 'sweep'), f'fast={comma}'])
  assert (c.reference.name, c.other.name) == ('sweep', 'fast')
  assert c.method == 'paired t' and c.estimate == pytest.approx(0.05)
  assert [r.path for r in c.reference.runs] == seeds
  assert compare.main([os.path.join(root, 'sweep'), f'fast={comma}']) == 0
  assert 'fast - sweep: +0.0500' in capsys.readouterr().out


def test_notes_for_an_incomplete_run_and_seeds_given_one_by_one(tmp_path, capsys):
  root = str(tmp_path)
  a0, a1 = _seeds(root, 'a', {0: 2.0, 1: 2.1})
  partial = _run(root, 'partial', 2.2, steps=30, algorithm='x')
  with open(os.path.join(partial, 'config.json')) as f:
    stored = json.load(f)
  stored['config']['steps'] = 100
  with open(os.path.join(partial, 'config.json'), 'w') as f:
    json.dump(stored, f)
  assert compare.main([a0, a1, partial]) == 0
  err = capsys.readouterr().err.replace('\n', ' ')
  assert (f'{partial} is incomplete (its last step is 30 of 100): its last eval, at step 30, '
          'is used.') in err
  assert 'arguments 1, 2 are seeds of one setting given one by one (an unquoted glob?)' in err


def test_bad_input_is_one_line(tmp_path, capsys):
  root = str(tmp_path)
  good = _run(root, 'good', 2.0)
  assert _error(capsys, [good, f'{root}/nope']) == f'{root}/nope: no such directory.'
  assert _error(capsys, [good, f'{root}/nope*']) == f'{root}/nope* matches no directory.'
  os.makedirs(os.path.join(root, 'empty'))
  assert _error(capsys, [good, f'{root}/empty']) == (
      f'{root}/empty is not a run directory and holds none (a run is a directory with a '
      'config.json or a status.json).')
  with open(os.path.join(root, 'file.txt'), 'w') as f:
    f.write('x')
  assert _error(capsys, [good, f'{root}/file.txt']) == (
      f'{root}/file.txt is a file, not a run directory.')
  # A damaged metrics.jsonl: the reader's sentence, naming the file and line.
  damaged = _run(root, 'damaged', 2.0, algorithm='x')
  with open(os.path.join(damaged, 'metrics.jsonl')) as f:
    lines = f.readlines()
  lines[1] = '{"step": 10, "eval_loss": \n'
  with open(os.path.join(damaged, 'metrics.jsonl'), 'w') as f:
    f.writelines(lines)
  assert _error(capsys, [good, damaged]) == (
      f'{damaged}/metrics.jsonl line 2 is not valid JSON (a damaged line in the middle of '
      'the file).')
  no_evals = _run(root, 'no_evals', 2.0, eval_every=0, algorithm='x')
  assert _error(capsys, [good, no_evals]).startswith(
      f'{no_evals} has no eval rows in its metrics.jsonl (no row with an eval_loss)')
  diverged = _run(root, 'diverged', 2.0, algorithm='x')
  with open(os.path.join(diverged, 'diverged.json'), 'w') as f:
    json.dump({'step': 12, 'message': 'the training loss became nan at step 12.'}, f)
  assert _error(capsys, [good, diverged]) == (
      f'{diverged} diverged: the training loss became nan at step 12; a diverged run has no '
      'loss to compare.')
  other_split = _run(root, 'other_split', 2.0, split='test', algorithm='x')
  assert _error(capsys, [good, other_split]) == (
      f"{good} and {other_split} were scored on different eval sets (data.eval_split: "
      "'validation' vs 'test'); their losses do not compare (loco.evaluate scores runs again "
      'on one eval set).')
  no_se = _run(root, 'no_se', 2.0, algorithm='x')
  rows = [json.loads(line) for line in open(os.path.join(no_se, 'metrics.jsonl'))]
  with open(os.path.join(no_se, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps({k: v for k, v in r.items() if k != 'eval_loss_se'}) + '\n'
                 for r in rows)
  assert _error(capsys, [good, no_se]).startswith(
      f'{no_se} has no eval_loss_se in its final eval row')
  _seeds(root, 'mixed', {0: 2.0})
  _run(root, 'mixed_lr', 2.0, seed=1, optimizer={'lr': 0.1})
  assert _error(capsys, [good, f'{root}/mixed*']) == (
      f"{root}/mixed* holds runs that differ in more than their seed (optimizer.lr: 0.1 in "
      f"{root}/mixed_lr, unset in {root}/mixed_seed0); a side is one run or the seeds of one "
      'setting: give the others as separate arguments.')
  twice = _run(root, 'twice', 2.0, seed=0)
  assert _error(capsys, [good, f'{good},{twice}']) == (
      f'{good},{twice} has two runs of seed 0 ({good} and {twice}); a group of seeds needs '
      'one run per seed.')
  assert _error(capsys, [good], 2) == (
      'needs at least two runs or groups of seeds: REFERENCE OTHER [...]')
  assert _error(capsys, [good, good, '--margin=5'], 2) == (
      "argument --margin: '5' must lie in [0, 1) (relative: 0.01 is 1%) (see --help)")


def test_the_command_line(tmp_path):
  """`python -m loco.compare` end to end (its errors: test_bad_input_is_one_line)."""
  root = str(tmp_path)
  _seeds(root, 'ddp', {0: 2.00, 1: 2.10, 2: 2.30})
  _seeds(root, 'diloco', {0: 2.05, 1: 2.12, 2: 2.38}, algorithm='diloco')
  ok = subprocess.run([sys.executable, '-m', 'loco.compare', f'{root}/ddp_seed*',
                       f'{root}/diloco_seed*', '--margin=0.1'],
                      cwd=REPO, capture_output=True, text=True, timeout=60)
  assert ok.returncode == 0, ok.stderr
  assert 'diloco - ddp: +0.0500 nats/token' in ok.stdout
  assert ('verdict: diloco is within the margin (10%) of ddp'
          in ok.stdout.replace('\n    ', ' ')), ok.stdout
