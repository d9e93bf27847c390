"""The report: exact table values on hand-written workdirs, plots, problem runs listed."""

import io
import json
import os
import re
import subprocess
import sys

import pytest

from loco.lab import report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _workdir(root, name, algorithm=None, steps=30, metrics=(), status=None, log=None,
             diverged=None):
  path = os.path.join(root, name)
  os.makedirs(path)
  if algorithm:
    with open(os.path.join(path, 'config.json'), 'w') as f:
      json.dump({'config': {'steps': steps, 'algorithm': {'name': algorithm}}}, f)
  if metrics:
    with open(os.path.join(path, 'metrics.jsonl'), 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in metrics)
  if status:
    with open(os.path.join(path, 'status.json'), 'w') as f:
      json.dump(status, f)
  if log:
    with open(os.path.join(path, 'log.txt'), 'w') as f:
      f.write(log)
  if diverged:
    with open(os.path.join(path, 'diverged.json'), 'w') as f:
      json.dump(diverged, f)
  return path


def _records(evals, bytes_per_step=10.0, sim_per_step=0.0, extra=None, drift=False):
  """Log lines every 5 steps, evals at 10, 20, 30 (1,000 tokens per step); with
  `drift`, the diagnostics of a sync every 10 steps."""
  out = []
  for step in range(5, 5 * (2 * len(evals) + 1), 5):
    r = dict(step=step, tokens=1000 * step, train_loss=4.0 - step / 100,
             bytes_sent=bytes_per_step * step, bytes_received=bytes_per_step * step,
             peak_bytes=bytes_per_step, syncs=step, sim_seconds=sim_per_step * step,
             tokens_per_second=123.0, utilization=0.5)      # an unknown key is ignored
    if step % 10 == 0:
      r.update(eval_loss=evals[step // 10 - 1], eval_loss_workers=9.0, worker_spread=0.0)
      if drift:
        r.update(pg_norm=step / 10, pg_mean_norm=0.5, pg_cosine=0.25 * step / 10,
                 consensus_distance=0.01 * step)
    out.append(r)
  return out


def _cells(line):
  """The cells of a printed table's line (columns are two or more spaces apart)."""
  return re.split(r'\s{2,}', line.strip())


@pytest.fixture
def sweep_dir(tmp_path):
  root = str(tmp_path / 'sweep')
  finished = dict(state='finished', returncode=0, error=None, seconds=12.5,
                  command=['/usr/bin/python3', '-m', 'loco.main', '--config=x.py'])
  _workdir(root, 'ddp', 'ddp', metrics=_records([3.0, 2.1, 2.2], bytes_per_step=100.0),
           status=finished)
  _workdir(root, 'diloco', 'diloco', metrics=_records([3.2, 2.6, 2.4], sim_per_step=0.5,
                                                     drift=True),
           status=dict(finished, seconds=20.0))
  _workdir(root, 'bad', status=dict(state='failed', returncode=1, seconds=1.0,
                                    error='loco: error: optimizer.lr must be positive, got -1.0.'))
  # Run by hand (no status.json): diverged, per the diverged.json loco.run.train writes (the
  # status never comes from an error's wording); and one cut short, nested.
  message = ('the training loss became nan at step 14; the last good checkpoint (step 10) '
             'is kept in x.')
  _workdir(root, 'nan', 'gasloc', metrics=_records([2.9]),
           log=f'step 10\nloco: error: {message}\n', diverged=dict(step=14, message=message))
  _workdir(root, 'more/partial', 'sparseloco', metrics=_records([2.0]))
  with open(os.path.join(root, 'sweep.json'), 'w') as f:
    json.dump({'runs': [{'name': n} for n in
                        ('diloco', 'ddp', 'bad', 'nan', 'more/partial', 'never')]}, f)
  return root


def test_summarize_values_and_time_to_target(sweep_dir):
  workdirs = report.find_workdirs(sweep_dir)
  rows = {r['name']: r for r in report.summarize(workdirs)}
  assert sorted(rows) == ['bad', 'ddp', 'diloco', 'more/partial', 'nan']
  assert {n: r['status'] for n, r in rows.items()} == {
      'bad': 'failed', 'ddp': 'finished', 'diloco': 'finished', 'more/partial': 'incomplete',
      'nan': 'diverged'}
  ddp, diloco = rows['ddp'], rows['diloco']
  assert (ddp['algorithm'], ddp['final_eval_loss'], ddp['best_eval_loss']) == ('ddp', 2.2, 2.1)
  assert (ddp['tokens'], ddp['bytes_sent'], ddp['peak_bytes']) == (30000, 3000.0, 100.0)
  assert (ddp['sim_seconds'], ddp['wall_seconds']) == (0.0, 12.5)
  # The drift diagnostics of the last row that has them (step 30), none for DDP.
  assert (diloco['pg_norm'], diloco['pg_cosine'], diloco['consensus_distance']) == (
      3.0, 0.75, 0.3)
  assert ddp['pg_cosine'] is None and rows['bad']['pg_norm'] is None
  # Default target: the largest final loss of the finished runs (diloco's 2.4); the
  # partial run's 2.0 does not count.
  assert all(r['target'] == 2.4 for r in rows.values())
  assert (ddp['target_step'], ddp['target_tokens'], ddp['target_bytes'],
          ddp['target_sim_seconds']) == (20, 20000, 2000.0, 0.0)
  assert (diloco['target_step'], diloco['target_tokens'], diloco['target_bytes'],
          diloco['target_sim_seconds']) == (30, 30000, 300.0, 15.0)
  assert rows['more/partial']['target_step'] == 10
  assert rows['nan']['target_step'] is None and rows['bad']['target_step'] is None
  assert rows['bad']['error'] == 'loco: error: optimizer.lr must be positive, got -1.0.'
  assert rows['nan']['error'].startswith('the training loss became nan')
  assert rows['bad']['final_eval_loss'] is None and rows['bad']['wall_seconds'] == 1.0

  given = {r['name']: r for r in report.summarize(workdirs, target=2.15)}
  assert given['ddp']['target_step'] == 20 and given['diloco']['target_step'] is None
  assert given['ddp']['target'] == 2.15


@pytest.mark.slow
def test_write_report_table_plots_and_problem_runs(sweep_dir, tmp_path):
  stream = io.StringIO()
  path = report.write_report([sweep_dir], stream=stream)
  assert path == os.path.join(sweep_dir, 'report.md')
  text = open(path).read()
  assert ('Target: eval loss <= 2.4000 (the largest final eval loss among finished runs, '
          'so every finished run reaches it)') in text
  assert '6 runs: 1 diverged, 1 failed, 2 finished, 1 incomplete, 1 not started.' in text
  assert ('| diloco | diloco | finished | 2.4000 | 2.4000 | 30,000 | 300 B | 300 B | 10 B | '
          '15.0 | 20 | 0.75 | 0.3 | 30 | 30,000 | 300 B | 15.0 |') in text
  assert ('| ddp | ddp | finished | 2.2000 | 2.1000 | 30,000 | 3.00 KB | 3.00 KB | 100 B | — | '
          '12 | — | — | 20 | 20,000 | 2.00 KB | — |') in text
  assert ('| run | algorithm | status | final eval | best eval | tokens | bytes sent / worker | '
          'bytes received / worker | peak bytes sent / step |') in text
  # Sweep order (sweep.json), then problems, never hidden.
  assert text.index('| diloco |') < text.index('| ddp |') < text.index('| bad |')
  assert '- `bad` (failed): loco: error: optimizer.lr must be positive, got -1.0.' in text
  assert '- `nan` (diverged): the training loss became nan at step 14' in text
  assert '- `more/partial` (incomplete): ' in text
  assert '- `never` (not started)' in text
  assert '- `ddp`: `python -m loco.main --config=x.py`' in text
  for name in ('steps', 'tokens', 'bytes_sent', 'sim_seconds'):
    png = os.path.join(sweep_dir, f'eval_loss_vs_{name}.png')
    assert f'(eval_loss_vs_{name}.png)' in text
    with open(png, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  printed = stream.getvalue()
  assert 'report: ' + path in printed
  table = printed.splitlines()
  header = next(line for line in table if line.startswith('run '))
  ddp = next(line for line in table if line.startswith('ddp '))
  # The printed table: what decides "which is better, at what cost"; the rest is in
  # report.md.
  assert ddp.split() == ['ddp', 'finished', '2.2000', '3.00', 'KB', '3.00', 'KB', '—', '20']
  end = header.index('final eval ± SE') + len('final eval ± SE')   # numbers right-aligned
  assert ddp.index('2.2000') + len('2.2000') == end
  assert max(map(len, table)) <= 100


def test_plot_runs_skips_sim_seconds_without_a_network(sweep_dir, tmp_path):
  out = str(tmp_path / 'plots')
  written = report.plot_runs([os.path.join(sweep_dir, 'ddp')], out, labels=['DDP'])
  assert sorted(os.path.basename(p) for p in written) == [
      'eval_loss_vs_bytes_sent.png', 'eval_loss_vs_steps.png', 'eval_loss_vs_tokens.png']
  assert sorted(os.listdir(out)) == sorted(os.path.basename(p) for p in written)
  assert report.plot_runs([os.path.join(sweep_dir, 'bad')], out) == []


@pytest.mark.slow
def test_cli_on_workdirs_with_a_given_target(sweep_dir, tmp_path):
  out = tmp_path / 'rep'
  proc = subprocess.run(
      [sys.executable, '-m', 'loco.report', os.path.join(sweep_dir, 'ddp'),
       os.path.join(sweep_dir, 'diloco'), f'--out={out}', '--target=2.15'],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  text = (out / 'report.md').read_text()
  assert 'Target: eval loss <= 2.1500 (given by --target)' in text
  assert '| ddp | ddp | finished |' in text and '| diloco | diloco | finished |' in text
  assert 'None.' in text                       # no failed, diverged or incomplete run
  missing = subprocess.run([sys.executable, '-m', 'loco.report', str(tmp_path / 'nope')],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
  assert missing.returncode == 2
  assert missing.stderr.strip() == f'loco.report: error: {tmp_path / "nope"} is not a directory.'


@pytest.mark.parametrize('target, says', [('nan', "'nan' must be a finite number"),
                                           ('-inf', "'-inf' must be a finite number"),
                                           ('low', "'low' is not a number")])
def test_a_target_that_is_not_a_finite_number_is_one_line(sweep_dir, target, says):
  proc = subprocess.run([sys.executable, '-m', 'loco.report', sweep_dir, f'--target={target}'],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.splitlines() == [
      f'loco.report: error: argument --target: {says} (see --help)']


def test_cli_on_a_directory_without_runs_fails_and_writes_nothing(tmp_path):
  """Before: exit code 0 and a report.md of zero runs."""
  empty = tmp_path / 'empty'
  empty.mkdir()
  proc = subprocess.run([sys.executable, '-m', 'loco.report', str(empty)],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1
  assert proc.stderr.splitlines() == [
      f'loco.report: error: no runs found under {empty} (a run is a directory with a '
      'config.json or a status.json).']
  assert os.listdir(empty) == []
  with pytest.raises(report.ReportError):
    report.write_report([str(empty)], out=str(tmp_path / 'out'), stream=io.StringIO())
  assert not os.path.exists(tmp_path / 'out')


def test_a_torn_metrics_line_keeps_the_good_rows_and_is_listed(tmp_path):
  """A crash mid-write: the rows before the torn line count; the report says what was lost."""
  root = str(tmp_path / 'sweep')
  path = _workdir(root, 'torn', 'ddp', metrics=_records([3.0, 2.5, 2.2]),
                  status=dict(state='failed', returncode=1, error='killed'))
  _workdir(root, 'ok', 'ddp', metrics=_records([3.0, 2.4]),
           status=dict(state='finished', returncode=0, error=None))
  with open(os.path.join(path, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 35, "tokens": 350')
  rows = {r['name']: r for r in report.summarize(report.find_workdirs(root))}
  torn = rows['torn']
  assert (torn['step'], torn['final_eval_loss'], torn['best_eval_loss']) == (30, 2.2, 2.2)
  assert torn['metrics_problem'] == 'metrics.jsonl line 7 (the last) is torn and was left out'
  assert rows['ok']['metrics_problem'] is None
  text = open(report.write_report([root], stream=io.StringIO())).read()
  assert ('- `torn` (failed): killed; metrics.jsonl line 7 (the last) is torn and was left '
          'out') in text
  assert '`ok`' not in text.split('## Problems')[1].split('## Commands')[0]


def test_report_does_not_import_the_sweep_launcher():
  """loco.sweep uses loco.report; the run-file readers live here, so no import cycle."""
  import ast
  tree = ast.parse(open(os.path.join(REPO, 'loco', 'report.py')).read())
  imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
  imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names}
  assert not {'loco.sweep', 'sweep'} & imported
  assert not any(isinstance(node, ast.ImportFrom) and node.module == 'loco'
                 and any(a.name == 'sweep' for a in node.names) for node in ast.walk(tree))


def test_runs_re_timed_on_other_networks_get_a_table_and_a_panel_each(tmp_path):
  root = str(tmp_path / 'sweep')
  done = dict(state='finished', returncode=0, error=None)
  _workdir(root, 'ddp', 'ddp', metrics=_records([3.0, 2.1, 2.2], sim_per_step=1.0),
           status=done)
  _workdir(root, 'diloco', 'diloco', metrics=_records([3.2, 2.6, 2.4], sim_per_step=0.5),
           status=done)
  # loco.retime's layout: WORKDIR/retimed/NAME; 'fast' only for ddp.
  for run, name, per_step in (('ddp', 'slow', 10.0), ('diloco', 'slow', 0.6),
                              ('ddp', 'fast', 0.2)):
    evals = [3.0, 2.1, 2.2] if run == 'ddp' else [3.2, 2.6, 2.4]
    _workdir(root, f'{run}/retimed/{name}', run, metrics=_records(evals, sim_per_step=per_step))
  with open(os.path.join(root, 'sweep.json'), 'w') as f:
    json.dump({'runs': [{'name': 'ddp'}, {'name': 'diloco'}],
               'retimes': {'slow': {}, 'fast': {}}}, f)
  rows = report.summarize(report.find_workdirs(root))
  assert [r['name'] for r in rows] == ['ddp', 'diloco']      # re-timings are not runs
  stream = io.StringIO()
  text = open(report.write_report([root], stream=stream)).read()
  # Target 2.4 (diloco's final loss): ddp reaches it at step 20, diloco at step 30.
  table = ('| run | as trained | slow | fast |\n|---|---|---|---|\n'
           '| ddp | 20.0 (30.0) | 200.0 (300.0) | **4.0** (6.0) |\n'
           '| diloco | **15.0** (15.0) | **18.0** (18.0) |  |')
  assert '## Re-timed on other networks' in text and table in text
  printed = stream.getvalue().splitlines()
  at = printed.index('simulated seconds to the target (in all), per network; ** the fastest:')
  assert [_cells(line) for line in printed[at + 1:at + 4]] == [
      ['run', 'as trained', 'slow', 'fast'],
      ['ddp', '20.0 (30.0)', '200.0 (300.0)', '**4.0** (6.0)'],
      ['diloco', '**15.0** (15.0)', '**18.0** (18.0)']]
  assert f'({report.NETWORKS_PNG})' in text
  with open(os.path.join(root, report.NETWORKS_PNG), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  # A retimed workdir is itself a run for loco.report.
  alone = report.summarize([os.path.join(root, 'ddp', 'retimed', 'slow')])[0]
  assert (alone['status'], alone['sim_seconds'], alone['target_sim_seconds']) == (
      'finished', 300.0, 200.0)     # its own final loss, 2.2, first at step 20


def test_runs_that_differ_only_in_seed_are_summarised_as_mean_and_std(tmp_path):
  root = str(tmp_path / 'seeds')
  finished = dict(state='finished', returncode=0, error=None, seconds=1.0)
  def run(name, seed, lr, evals):
    path = _workdir(root, name, metrics=_records(evals), status=finished)
    with open(os.path.join(path, 'config.json'), 'w') as f:
      json.dump({'config': {'steps': 30, 'seed': seed, 'progress': False,
                            'algorithm': {'name': 'diloco'}, 'optimizer': {'lr': lr}}}, f)
  run('a_seed0', 0, 1e-3, [3.0, 2.5, 2.0])
  run('a_seed1', 1, 1e-3, [3.0, 2.5, 2.2])
  run('a_seed2', 2, 1e-3, [3.0, 2.0, 2.4])
  with open(os.path.join(root, 'a_seed2', 'config.json')) as f:   # a key added later, unset
    config = json.load(f)
  config['config']['algorithm']['form'] = None
  with open(os.path.join(root, 'a_seed2', 'config.json'), 'w') as f:
    json.dump(config, f)
  run('b_seed0', 0, 3e-3, [3.0, 2.5, 1.0])
  run('b_seed1', 1, 3e-3, [3.0, 2.5, 3.0])
  run('c_seed0', 0, 1e-2, [3.0, 2.5, 1.5])             # one seed: no group
  groups = report.seed_groups(report.summarize(report.find_workdirs(root)))
  by_name = {g['name']: g for g in groups}
  assert sorted(by_name) == ['a', 'b']
  a = by_name['a']
  assert a['n'] == 3 and a['seeds'] == [0, 1, 2]
  assert a['final_mean'] == pytest.approx(2.2) and a['final_std'] == pytest.approx(0.2)
  assert a['best_mean'] == pytest.approx(6.2 / 3) and a['best_std'] == pytest.approx(0.2 / 3 ** 0.5)
  assert by_name['b']['final_std'] == pytest.approx(2 ** 0.5)
  # 95% CI of a's mean: 2.2 +- t(0.975, 2) x 0.2 / sqrt(3), t = 4.3027.
  half = 4.302653 * 0.2 / 3 ** 0.5
  assert a['final_ci'] == pytest.approx((2.2 - half, 2.2 + half), abs=1e-5)
  out = io.StringIO()
  path = report.write_report([root], str(tmp_path / 'out'), stream=out)
  text = open(path).read()
  assert '## Over seeds' in text
  assert '| a | 3 | 0, 1, 2 | 2.2000 ± 0.2000 | [1.7032, 2.6968] |' in text
  printed = out.getvalue().splitlines()
  at = next(i for i, line in enumerate(printed) if line.startswith('seeds of'))
  assert [_cells(line) for line in printed[at:at + 3]] == [
      ['seeds of', 'n', 'final eval: mean [95% CI]', 'sd', 'sent', 'received'],
      ['a', '3', '2.2000 [1.7032, 2.6968]', '0.2000', '300 B', '300 B'],
      ['b', '2', '2.0000 [-10.7062, 14.7062]', '1.4142', '300 B', '300 B']]
  assert max(map(len, printed)) <= 100


def test_the_printed_report_of_a_realistic_sweep_fits_100_columns(tmp_path, monkeypatch):
  """The main sweep's five algorithms x 3 seeds, with its real sizes (GB of bytes, SEs,
  simulated seconds), re-timed on two networks, and one run cut short: every printed
  line fits 100 columns; report.md keeps every column, and the SE."""
  monkeypatch.setattr(report.plots, 'against_axes', lambda *a, **k: [])   # tested above
  monkeypatch.setattr(report.plots, 'network_panels', lambda *a, **k: None)
  root = str(tmp_path / 'main')
  done = dict(state='finished', returncode=0, error=None, seconds=788.0)
  sizes = {'ddp': 2.25e7, 'diloco': 4.5e5, 'gasloc_ring': 5.14e5, 'sparseloco': 5.9e3,
           'streaming_diloco': 5.6e4}
  for algorithm, per_step in sizes.items():
    for seed in range(3):
      name = f'{algorithm}_seed{seed}'
      evals = [3.1, 2.4 + seed / 100, 2.2 + seed / 100]
      rows = _records(evals, bytes_per_step=per_step * 10, sim_per_step=0.42)
      for r in rows:
        r['tokens'] *= 4096
        if 'eval_loss' in r:
          r['eval_loss_se'] = 0.0647
      path = _workdir(root, name, metrics=rows, status=done)
      with open(os.path.join(path, 'config.json'), 'w') as f:
        json.dump({'config': {'steps': 30, 'seed': seed, 'algorithm': {'name': algorithm}}},
                  f)
      for network in ('multi_region', 'slow_links'):
        _workdir(path, f'retimed/{network}', algorithm,
                 metrics=_records(evals, bytes_per_step=per_step, sim_per_step=12.5))
  _workdir(root, 'streaming_diloco_with_a_long_descriptive_name_seed0_interrupted',
           'streaming_diloco', metrics=_records([3.0]),
           status=dict(state='interrupted', returncode=130, error='interrupted'))
  with open(os.path.join(root, 'sweep.json'), 'w') as f:
    json.dump({'runs': [], 'retimes': {'multi_region': {}, 'slow_links': {}}}, f)
  stream = io.StringIO()
  text = open(report.write_report([root], stream=stream)).read()
  printed = stream.getvalue().splitlines()
  assert max(map(len, printed)) <= 100, '\n'.join(l for l in printed if len(l) > 100)
  ddp = next(line for line in printed if line.startswith('ddp_seed0 '))
  assert _cells(ddp) == ['ddp_seed0', 'finished', '2.2000 ± 0.0647', '6.75 GB', '6.75 GB',
                         '12.6', '30']
  assert any(line.startswith('streaming_dilo…0_interrupted  interrupted') for line in printed)
  seeds = next(line for line in printed if line.startswith('ddp '))
  assert _cells(seeds)[:3] == ['ddp', '3', '2.2100 [2.1852, 2.2348]']
  # report.md: every column, full names.
  assert ('| ddp_seed0 | ddp | finished | 2.2000 ± 0.0647 | 2.2000 | 122,880,000 | 6.75 GB | '
          '6.75 GB | 225.00 MB | 12.6 | 788 |') in text
  assert '| streaming_diloco_with_a_long_descriptive_name_seed0_interrupted |' in text


def test_plots_keep_coinciding_curves_visible_and_band_seed_groups(tmp_path, monkeypatch):
  """Two runs with the same curve are both visible (own line style and marker, the later
  one thinner on top); a seed group is one line, its mean, with a min-max band."""
  root = str(tmp_path / 'runs')
  for name, evals in (('a', [3.0, 2.5, 2.2]), ('b', [3.0, 2.5, 2.2]),
                      ('s_seed0', [3.0, 2.4, 2.0]), ('s_seed1', [3.2, 2.6, 2.4])):
    _workdir(root, name, 'ddp', metrics=_records(evals))
  figures = {}
  def keep(fig, path, dpi=90):
    figures[os.path.basename(path)] = fig
  monkeypatch.setattr(report.plots, 'save', keep)
  workdirs = [os.path.join(root, n) for n in ('a', 'b', 's_seed0', 's_seed1')]
  report.plot_runs(workdirs, str(tmp_path / 'out'), ['a', 'b', 's_seed0', 's_seed1'],
                   groups=[('s', ['s_seed0', 's_seed1'])])
  ax = figures['eval_loss_vs_steps.png'].axes[0]
  lines = {line.get_label(): line for line in ax.lines}
  assert sorted(lines) == ['a', 'b', 's (mean of 2 seeds, band: min-max)']
  a, b, s = lines['a'], lines['b'], lines['s (mean of 2 seeds, band: min-max)']
  assert list(a.get_ydata()) == list(b.get_ydata())          # they coincide ...
  assert a.get_linestyle() != b.get_linestyle() and a.get_marker() != b.get_marker()
  assert b.get_zorder() > a.get_zorder() and b.get_linewidth() < a.get_linewidth()
  assert a.get_markerfacecolor() == 'none'                   # ... and both show
  assert list(s.get_ydata()) == pytest.approx([3.1, 2.5, 2.2])
  (band,) = ax.collections
  ys = band.get_paths()[0].vertices[:, 1]
  assert min(ys) == pytest.approx(2.0) and max(ys) == pytest.approx(3.2)
  assert ax.get_ylabel().startswith('eval loss (nats/token')
  assert report.plots.si(1.5e6, 'B') == '1.5 MB' and report.plots.si(2e5) == '200k'


@pytest.mark.parametrize('name, group', [
    ('ddp_seed2', 'ddp'), ('ddp/seed=2', 'ddp'), ('diloco,seed=10', 'diloco'),
    ('a-seed3', 'a'), ('seed1', 'seed1'), ('h=5/seed=0', 'h=5'), ('ddp', 'ddp')])
def test_a_runs_group_name_drops_its_seed_part(name, group):
  assert report.seedless_name(name) == group
