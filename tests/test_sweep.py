"""The sweep launcher: specs and grids, resume after a kill, failed runs, multi-host init."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from loco.lab import sweep
from loco.lab.sweep import Run, SweepError, grid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Runs started here see one CPU device unless a test asks for more (conftest gives this
# process 8).
ENV = {**{k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}, 'JAX_PLATFORMS': 'cpu'}

_NANO = """
from tests.nano import make_nano_config


def get_config():
  c = make_nano_config({glob!r}, {data_dir!r})
  c.steps = 10
  return c
"""


@pytest.fixture
def nano_file(tmp_path, small_corpus_glob, data_dir) -> str:
  """A config file of the nano model (10 steps, eval and checkpoint at 10)."""
  path = tmp_path / 'nano.py'
  path.write_text(_NANO.format(glob=small_corpus_glob, data_dir=data_dir))
  return str(path)


def _spec(tmp_path, body: str) -> str:
  path = tmp_path / 'spec.py'
  path.write_text('from loco.sweep import Run, grid\n\n\ndef get_sweep():\n'
                  f'  return {body}\n')
  return str(path)


def _sweep_cli(*args, **kwargs):
  return subprocess.run([sys.executable, '-m', 'loco.sweep', *args], cwd=REPO, env=ENV,
                        capture_output=True, text=True, timeout=300, **kwargs)


def _status(out, name):
  return sweep.read_status(os.path.join(out, name)) or {}


# Specs and grids.

def test_grid_is_the_cartesian_product_with_formatted_names():
  runs = grid('experiments/tiny_diloco.py', 'h{sync_every}_lr{outer_lr}_{0}',
              overrides={'steps': 20},
              **{'algorithm.sync_every': [10, 50], 'algorithm.outer_lr': [0.5, 0.7]})
  assert [r.name for r in runs] == ['h10_lr0.5_10', 'h10_lr0.7_10', 'h50_lr0.5_50',
                                    'h50_lr0.7_50']
  assert runs[1] == Run('h10_lr0.7_10', 'experiments/tiny_diloco.py',
                        {'steps': 20, 'algorithm.sync_every': 10, 'algorithm.outer_lr': 0.7})
  both = grid(['experiments/tiny_diloco.py', 'experiments/tiny_diloco.py:local_sgd'],
              '{config}/s{seed}', seed=[0, 1])
  assert [(r.name, r.config) for r in both] == [
      ('tiny_diloco/s0', 'experiments/tiny_diloco.py'),
      ('tiny_diloco/s1', 'experiments/tiny_diloco.py'),
      ('tiny_diloco-local_sgd/s0', 'experiments/tiny_diloco.py:local_sgd'),
      ('tiny_diloco-local_sgd/s1', 'experiments/tiny_diloco.py:local_sgd')]
  with pytest.raises(SweepError, match="uses 'lr'"):
    grid('x.py', 'bad_{lr}', **{'algorithm.outer_lr': [0.5]})
  with pytest.raises(SweepError, match='must be a list'):
    grid('x.py', 'x{seed}', seed=3)


def test_command_passes_overrides_then_extra_ones():
  cmd = sweep.command(Run('a', 'experiments/x.py:v', {'steps': 20, 'optimizer.lr': 0.003,
                                                     'progress': False}),
                      'runs/s/a', sweep.parse_sets(['config.steps=5', 'eval.every=5']))
  assert cmd == [sys.executable, '-m', 'loco.main', '--config=experiments/x.py:v',
                 '--workdir=runs/s/a', '--config.steps=5', '--config.optimizer.lr=0.003',
                 '--config.progress=False', '--config.eval.every=5']
  with pytest.raises(SweepError, match='KEY=VALUE'):
    sweep.parse_sets(['steps'])


@pytest.mark.parametrize('runs,match', [
    ([Run('a', 'x.py'), Run('a', 'y.py')], "duplicate run name 'a'"),
    ([Run('a b', 'x.py')], 'run name'),
    ([Run('../a', 'x.py')], 'run name'),
    ([Run('a', 'x.py'), Run('a/b', 'x.py')], "nested inside run 'a'"),
    ([Run('a', 'x.py', {'algorithm.outer_lr': None})], 'cannot be passed'),
    ([], 'no runs'),
    (['a'], 'Run objects'),
])
def test_bad_runs_are_one_clear_error(runs, match):
  with pytest.raises(SweepError, match=match):
    sweep.check_runs(runs)


def test_spec_errors_are_one_line_on_the_command_line(tmp_path):
  no_get = tmp_path / 'no_get.py'
  no_get.write_text('RUNS = []\n')
  out = _sweep_cli(str(no_get), f'--out={tmp_path / "out"}')
  assert out.returncode == 2
  assert out.stderr.strip() == (
      f'loco.sweep: error: the sweep spec {no_get} does not define get_sweep().')
  spec = _spec(tmp_path, "[Run('a', 'experiments/tiny_ddp.py'), "
                         "Run('a', 'experiments/tiny_ddp.py')]")
  out = _sweep_cli(spec, f'--out={tmp_path / "out"}')
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "loco.sweep: error: duplicate run name 'a': every run needs its own workdir."]
  assert not os.path.exists(tmp_path / 'out')


def test_a_spec_may_return_any_iterable_of_runs_and_never_ends_the_sweep_silently(tmp_path):
  """A generator or tuple of runs loads (a generator once was refused); a spec that
  calls sys.exit, at import or in get_sweep(), or whose generator raises, is one line."""
  gen = _spec(tmp_path, "(Run(n, 'experiments/tiny_ddp.py') for n in ('a', 'b'))")
  assert [r.name for r in sweep.load_spec(gen)] == ['a', 'b']
  assert [r.name for r in sweep.load_spec(_spec(tmp_path, "(Run('t', 'x.py'),)"))] == ['t']
  for body, says in (("Run('a', 'x.py')", "returned Run(name='a'"),
                     ("'abc'", "returned 'abc'"),
                     ("(Run(n, 'x.py') for n in (1 // 0,))", 'raised ZeroDivisionError'),
                     ("__import__('sys').exit(0)", 'called sys.exit(0); it must return')):
    with pytest.raises(SweepError, match=re.escape(says)):
      sweep.load_spec(_spec(tmp_path, body))
  quits = tmp_path / 'quits.py'
  quits.write_text('import sys\nsys.exit(0)\n')
  out = _sweep_cli(str(quits), f'--out={tmp_path / "out"}')
  assert out.returncode == 2
  assert out.stderr.splitlines() == [
      f'loco.sweep: error: the sweep spec {quits} called sys.exit(0) while loading; a spec '
      'only defines get_sweep().']


# Seeds.

def test_seeds_make_every_run_n_runs_named_by_seed():
  spec = [Run('ddp', 'experiments/tiny_ddp.py'),
          *grid('experiments/tiny_diloco.py', 'diloco_h{sync_every}',
                **{'algorithm.sync_every': [10, 50]})]
  runs = sweep.with_seeds(spec, 3)
  assert len(runs) == 3 * 3
  assert [r.name for r in runs[:4]] == ['ddp/seed=0', 'ddp/seed=1', 'ddp/seed=2',
                                        'diloco_h10/seed=0']
  assert runs[5] == Run('diloco_h10/seed=2', 'experiments/tiny_diloco.py',
                        {'algorithm.sync_every': 10, 'seed': 2})
  sweep.check_runs(runs)                                   # legal, distinct workdirs
  cmd = sweep.command(runs[4], 'out/diloco_h10/seed=1', sweep.parse_sets(['steps=20']))
  assert cmd[3:] == ['--config=experiments/tiny_diloco.py',
                     '--workdir=out/diloco_h10/seed=1', '--config.algorithm.sync_every=10',
                     '--config.seed=1', '--config.steps=20']
  assert sweep.load_config(cmd[3:]).seed == 1
  # One seed is still a seed directory: --seeds=3 later keeps its finished seed 0.
  assert sweep.with_seeds(spec[:1], 1) == [Run('ddp/seed=0', spec[0].config, {'seed': 0})]


@pytest.mark.parametrize('seeds,extra,match', [
    (0, None, r"^--seeds must be a whole number >= 1, got 0\.$"),
    (-2, None, 'got -2'),
    (1.5, None, 'got 1.5'),
    (True, None, 'got True'),
    (2, {'seed': '3'}, r"^--seeds=2 sets every run's seed \(0 \.\. 1\); drop --config.seed=3\.$"),
])
def test_bad_seeds_are_one_clear_error(seeds, extra, match):
  with pytest.raises(SweepError, match=match):
    sweep.with_seeds([Run('a', 'x.py')], seeds, extra)


def test_seeds_on_the_command_line_refuse_bad_counts_and_a_spec_that_sets_seed(
    tmp_path, capsys):
  spec = _spec(tmp_path, "grid('experiments/tiny_ddp.py', 'ddp_s{seed}', seed=[0, 1])")
  out = str(tmp_path / 'out')
  for value, says in (('0', "'0' must be at least 1"), ('-1', "'-1' must be at least 1"),
                      ('1.5', "'1.5' is not a whole number"), ('x', "'x' is not a whole number")):
    with pytest.raises(SystemExit) as e:
      sweep.main([spec, f'--out={out}', f'--seeds={value}'])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f'loco.sweep: error: argument --seeds: {says} (see --help)']
  assert sweep.main([spec, f'--out={out}', '--seeds=2']) == 2
  assert capsys.readouterr().err.splitlines() == [
      "loco.sweep: error: --seeds=2 sets every run's seed (0 .. 1), but run 'ddp_s0' sets "
      'seed=0 itself; drop the seed from the spec or drop --seeds.']
  with pytest.raises(SystemExit):
    sweep.main([spec, f'--out={out}', '--progress_every=-1'])
  assert capsys.readouterr().err.splitlines() == [
      "loco.sweep: error: argument --progress_every: '-1' must be >= 0 (see --help)"]
  assert not os.path.exists(out)


def test_the_seeds_of_a_run_share_a_batch(nano_file):
  """Runs that differ only in seed (and lr) have one shape; another shape is its own
  batch, and a batch is never larger than --batch_runs."""
  runs = sweep.with_seeds([Run('a', nano_file), Run('b', nano_file, {'batch_per_worker': 1}),
                           Run('c', nano_file, {'optimizer.lr': 2e-3})], 2)
  cmds = {r.name: sweep.command(r, os.path.join('out', r.name)) for r in runs}
  names = lambda groups: [[r.name for r in g] for g in groups]   # noqa: E731
  assert names(sweep.batches(runs, cmds, 2)) == [
      ['a/seed=0', 'a/seed=1'], ['b/seed=0', 'b/seed=1'], ['c/seed=0', 'c/seed=1']]
  assert names(sweep.batches(runs, cmds, 4)) == [
      ['a/seed=0', 'a/seed=1', 'c/seed=0', 'c/seed=1'], ['b/seed=0', 'b/seed=1']]


def test_batch_files_of_names_that_differ_only_in_slash_and_underscore_are_distinct():
  names = ['x/y', 'x_y', 'a/b_c', 'a_b/c', 'a_b_c', 'a/b/c']
  tags = {sweep.batch_tag([Run(n, 'c.py'), Run('other', 'c.py')]) for n in names}
  assert len(tags) == len(names)
  sweep.check_runs([Run(n, 'c.py') for n in names])      # legal names, distinct workdirs


def test_dry_run_checks_configs_and_starts_nothing(tmp_path, nano_file):
  spec = _spec(tmp_path, f"[Run('ok', {nano_file!r}), Run('typo', {nano_file!r}, "
                         f"{{'optimizr.lr': 1.0}}), Run('type', {nano_file!r}, {{'seed': 'x'}}), "
                         f"Run('none', 'experiments/none.py')]")
  out = _sweep_cli(spec, f'--out={tmp_path / "out"}', '--dry_run', '--config.steps=3')
  assert out.returncode == 1, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].split() == ['start', 'ok']
  assert f'--workdir={tmp_path / "out" / "ok"} --config.steps=3' in lines[1]
  assert 'error: unknown config key optimizr.lr (did you mean optimizer.lr?)' in out.stdout
  assert "error: seed must be an integer, got 'x'." in out.stdout
  assert 'error: no such config file: experiments/none.py' in out.stdout
  assert lines[-1] == '4 runs, 4 to run, 3 with a bad config (dry run: nothing was started).'
  assert not os.path.exists(tmp_path / 'out')


def test_list_values_from_runs_and_set(tmp_path):
  """Before: lists became '[1, 2, 1, 1]' and config_flags refused list-typed keys."""
  run = Run('a', 'experiments/tiny_ddp.py', {'network.churn': [[0, 10, 20]],
                                             'network.profile': 'churn'})
  cmd = sweep.command(run, 'w', sweep.parse_sets(['network.speeds=[1,2,1,1]']))
  assert cmd[5:] == ['--config.network.churn=[[0,10,20]]', '--config.network.profile=churn',
                     '--config.network.speeds=[1,2,1,1]']
  config = sweep.load_config(cmd[3:])
  assert (config.network.churn, config.network.speeds) == ([[0, 10, 20]], [1, 2, 1, 1])
  assert sweep.command(Run('b', 'x.py', {'network.latency_matrix': [[0, 0.5], (0.5, 0)]}),
                       'w')[-1] == '--config.network.latency_matrix=[[0,0.5],[0.5,0]]'


def test_set_checks_keys_and_values_before_anything_runs(tmp_path):
  with pytest.raises(SweepError, match=r'^--config.optimizr.lr=1: unknown config key '
                                       r'optimizr.lr \(did you mean optimizer.lr\?\)$'):
    sweep.parse_sets(['optimizr.lr=1'])
  with pytest.raises(SweepError, match=r"network.speeds must be a list such as"):
    sweep.parse_sets(['network.speeds=[1,2'])
  spec = _spec(tmp_path, "[Run('a', 'experiments/tiny_ddp.py')]")
  out = _sweep_cli(spec, f'--out={tmp_path / "out"}', '--config.steps=2.5')
  assert out.returncode == 2
  assert out.stderr.splitlines() == [
      "loco.sweep: error: --config.steps=2.5: steps must be an integer, got '2.5'."]
  assert not os.path.exists(tmp_path / 'out')
  # --set is an alias of --config.KEY=VALUE; a key without a value is one line.
  out = _sweep_cli(spec, f'--out={tmp_path / "out"}', '--set=steps=2.5')
  assert out.stderr.splitlines() == [
      "loco.sweep: error: --config.steps=2.5: steps must be an integer, got '2.5'."]
  out = _sweep_cli(spec, f'--out={tmp_path / "out"}', '--config.steps')
  assert out.returncode == 2
  assert out.stderr.splitlines() == [
      'loco.sweep: error: --config.steps takes a value: --config.KEY=VALUE (see --help)']


def test_the_sweep_specs_load_and_every_config_parses():
  specs = sorted(f for f in os.listdir(os.path.join(REPO, 'launch', 'sweeps'))
                 if f.endswith('.py') and f != 'common.py')
  assert {'main.py', 'engine.py', 'gossip.py', 'sparseloco.py', 'streaming.py'} <= set(specs)
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    for spec in specs:      # equal tokens within each comparison
      runs = sweep.load_spec(os.path.join('launch', 'sweeps', spec))
      sizes = set()
      for run in runs:
        config = sweep.load_config(sweep.command(run, 'w')[3:])
        sizes.add((config.steps, config.num_workers, config.batch_per_worker, config.seq_len))
      assert len(sizes) == 1 and next(iter(sizes))[1] == 8, (spec, sizes)
  finally:
    os.chdir(cwd)
  names = {r.name: r for r in sweep.load_spec(os.path.join(REPO, 'launch/sweeps/main.py'))}
  assert sorted(names) == ['ddp', 'diloco', 'gasloc_ring', 'sparseloco', 'streaming_diloco']


def test_the_retime_spec_has_eight_networks_that_build_for_its_runs():
  from loco.sim import network
  from loco.lab import retime
  retimes = sweep.load_retimes(os.path.join(REPO, 'launch/sweeps/retime.py'))
  assert len(retimes) >= 8
  profiles = set()
  for name, overrides in retimes.items():
    cfg = network.parse_network(retime.network_section(overrides))
    network.make_network(cfg, 8, 0.1)          # the custom matrix is 8 x 8
    profiles.add(cfg.profile)
  assert {'homogeneous', 'multi_region', 'lognormal', 'slow_links', 'stragglers',
          'custom'} <= profiles
  assert sweep.load_retimes(os.path.join(REPO, 'launch/sweeps/main.py')) == {}


# Running sweeps.

def _wait_for(predicate, proc, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    assert proc.poll() is None, 'the launcher exited early'
    time.sleep(0.05)
  raise AssertionError('timed out')


@pytest.mark.slow
def test_killed_sweep_resumes_without_redoing_finished_runs(tmp_path, nano_file):
  """Kill the launcher (and its run) mid-sweep; the relaunch skips what finished."""
  out = str(tmp_path / 'sweep')
  spec = _spec(tmp_path, f"[Run('a', {nano_file!r}), "
                         f"Run('bad', {nano_file!r}, {{'optimizer.lr': -1.0}}), "
                         f"Run('b', {nano_file!r}), Run('c', {nano_file!r}, {{'seed': 1}})]")
  with open(tmp_path / 'first.txt', 'w') as log:
    proc = subprocess.Popen([sys.executable, '-m', 'loco.sweep', spec, f'--out={out}'],
                            cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
  try:
    _wait_for(lambda: _status(out, 'b').get('state') == 'running', proc)
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  assert _status(out, 'a')['state'] == 'finished'
  assert _status(out, 'c') == {}
  # A failed run does not stop the sweep: b started after it.
  bad = _status(out, 'bad')
  assert bad['state'] == 'failed' and bad['returncode'] == 1
  assert bad['error'] == 'loco: error: optimizer.lr must be positive, got -1.0.'
  kept = {f: os.stat(os.path.join(out, 'a', f)).st_mtime_ns
          for f in ('status.json', 'log.txt', 'metrics.jsonl', 'config.json')}

  again = _sweep_cli(spec, f'--out={out}')
  assert again.returncode == 1, again.stdout + again.stderr   # 'bad' is still failed
  assert {f: os.stat(os.path.join(out, 'a', f)).st_mtime_ns for f in kept} == kept
  assert _status(out, 'a')['attempts'] == 1
  assert _status(out, 'bad') == bad                            # not retried
  assert _status(out, 'b')['state'] == 'finished' and _status(out, 'b')['attempts'] == 2
  assert open(os.path.join(out, 'b', 'log.txt')).read().count('==> loco.sweep attempt') == 2
  assert _status(out, 'c')['state'] == 'finished' and _status(out, 'c')['attempts'] == 1
  lines = again.stdout.splitlines()
  assert lines[0].startswith('skip    a ') and 'finished before' in lines[0]
  assert lines[1].startswith('skip    bad ') and 'optimizer.lr must be positive' in lines[1]
  assert lines[2].split() == ['resume', 'b', 'interrupted']
  assert 'sweep ' + out + ': 4 runs: 2 finished, 2 skipped;' in again.stdout

  report = open(os.path.join(out, 'report.md')).read()
  for name in ('a', 'b', 'c'):
    assert f'| {name} | ddp | finished | ' in report
  assert '| bad | — | failed |' in report
  assert '- `bad` (failed): loco: error: optimizer.lr must be positive, got -1.0.' in report
  assert os.path.exists(os.path.join(out, 'eval_loss_vs_steps.png'))
  with open(os.path.join(out, 'b', 'metrics.jsonl')) as f:
    assert [json.loads(line)['step'] for line in f] == [5, 10]


_RETIMES = """

def get_retimes():
  return {{'slow': {{'network.profile': 'homogeneous', 'network.step_seconds': 1.0,
                    'network.bandwidth': 1e5}},
          'regions': {{'network.profile': 'multi_region', 'network.step_seconds': 1.0}}}}
"""


@pytest.mark.slow
def test_a_sweep_re_times_its_finished_synchronous_runs_once(tmp_path, nano_file):
  out = str(tmp_path / 'sweep')
  spec = _spec(tmp_path, f"[Run('a', {nano_file!r}), Run('bad', {nano_file!r}, "
                         f"{{'optimizer.lr': -1.0}}), Run('async', {nano_file!r}, "
                         "{'num_workers': 4, 'algorithm.name': 'gasloc', "
                         "'algorithm.sync_every': 5, 'network.profile': 'homogeneous', "
                         "'network.mode': 'async'})]")
  with open(spec, 'a') as f:
    f.write(_RETIMES.format())
  first = _sweep_cli(spec, f'--out={out}')
  assert first.returncode == 1, first.stdout + first.stderr     # 'bad' failed
  assert 'retime  async: not re-timed (asynchronous' in first.stdout
  assert 'retime: 2 re-timing(s) written, 0 failed' in first.stdout
  assert sorted(os.listdir(os.path.join(out, 'a', 'retimed'))) == ['regions', 'slow']
  assert not os.path.exists(os.path.join(out, 'async', 'retimed'))
  with open(os.path.join(out, 'a', 'retimed', 'slow', 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  assert [r['step'] for r in rows] == [5, 10] and rows[-1]['sim_seconds'] > 10.0
  assert list(json.load(open(os.path.join(out, 'sweep.json')))['retimes']) == ['slow',
                                                                               'regions']
  report = open(os.path.join(out, 'report.md')).read()
  assert '## Re-timed on other networks' in report
  assert '| run | as trained | slow | regions |' in report   # the async run has a clock
  again = _sweep_cli(spec, f'--out={out}')
  assert 'retime: 0 re-timing(s) written, 0 failed' in again.stdout
  # A bad network in the spec: one line, before anything runs.
  with open(spec, 'a') as f:
    f.write("\n\ndef get_retimes():\n  return {'x': {'network.profile': 'moon'}}\n")
  bad = _sweep_cli(spec, f'--out={tmp_path / "other"}')
  assert bad.returncode == 2
  assert bad.stderr.splitlines() == [
      "loco.sweep: error: re-timing 'x': network.profile must be one of homogeneous, "
      "multi_region, lognormal, slow_links, stragglers, churn, custom, got 'moon'."]
  assert not os.path.exists(tmp_path / 'other')


def test_a_warm_start_is_found_inside_the_run_it_starts_from(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  out = 'sweep'
  runs = [Run('base/seed1', 'c.py'), Run('base/seed10', 'c.py'),
          Run('warm', 'c.py', {'init_from': os.path.join(out, 'base', 'seed1', 'checkpoints',
                                                         '5')}),
          Run('abs', 'c.py', {'init_from': str(tmp_path / out / 'base' / 'seed10')}),
          Run('outside', 'c.py', {'init_from': str(tmp_path / 'elsewhere' / 'base')}),
          Run('self', 'c.py', {'init_from': os.path.join(out, 'self', 'checkpoints')})]
  assert sweep.starts_from(runs, out) == {'warm': {'base/seed1'}, 'abs': {'base/seed10'}}
  # --set init_from applies to every run, after its own keys.
  assert sweep.starts_from(runs[:2], out, {'init_from': os.path.join(out, 'base', 'seed1')}
                           ) == {'base/seed10': {'base/seed1'}}
  todo = [[runs[2]], [runs[0], runs[1]], [runs[3]]]
  needs = sweep.starts_from(runs, out)
  assert sweep._next_ready(todo, {'base/seed1', 'base/seed10'}, needs) == runs[:2]
  assert sweep._next_ready(todo, {'base/seed1', 'base/seed10'}, needs) is None
  assert sweep._next_ready(todo, set(), needs) == [runs[2]]


@pytest.mark.slow
def test_a_parallel_sweep_launches_a_warm_start_after_the_run_it_starts_from(
    tmp_path, nano_file):
  """Listed first and with a free slot, the warm start still waits for its base run to
  end (its checkpoint would not exist yet), then trains from it."""
  out = str(tmp_path / 'sweep')
  spec = _spec(tmp_path, f"[Run('warm', {nano_file!r}, {{'init_from': "
                         f"{os.path.join(out, 'base')!r}}}), Run('base', {nano_file!r})]")
  first = _sweep_cli(spec, f'--out={out}', '--parallel=2', '--no_report',
                     '--progress_every=0')
  assert first.returncode == 0, first.stdout + first.stderr
  said = [x.split()[:2] for x in first.stdout.splitlines()
          if x.startswith(('start ', 'finished '))]      # the summary's lines are indented
  assert said == [['start', 'base'], ['finished', 'base'], ['start', 'warm'],
                  ['finished', 'warm']], first.stdout
  assert 'warm start from' in open(os.path.join(out, 'warm', 'log.txt')).read()


@pytest.mark.slow
def test_batch_runs_trains_compatible_runs_in_one_process(tmp_path, nano_file):
  out = str(tmp_path / 'sweep')
  spec = _spec(tmp_path, f"[Run('a', {nano_file!r}), Run('b', {nano_file!r}, {{'seed': 1}}), "
                         f"Run('bad', {nano_file!r}, {{'optimizer.lr': -1.0}}), "
                         f"Run('c', {nano_file!r}, {{'optimizer.lr': 2e-3}}), "
                         f"Run('d', {nano_file!r}, {{'batch_per_worker': 1}})]")
  first = _sweep_cli(spec, f'--out={out}', '--batch_runs=3')
  assert first.returncode == 1, first.stdout + first.stderr       # 'bad' failed alone
  lines = first.stdout.splitlines()
  assert [x.split()[:2] for x in lines[:3]] == [['start', 'a'], ['start', 'b'],
                                                ['start', 'c']]
  assert all(x.endswith('(batch of 3)') for x in lines[:3])
  for name in ('a', 'b', 'c'):
    status = _status(out, name)
    assert status['state'] == 'finished' and status['batch'] == ['a', 'b', 'c'], status
    assert status['command'][2] == 'loco.main'       # its solo command, for resuming
    log = open(os.path.join(out, name, 'log.txt')).read()
    assert '(batched with 2 other run(s)): ' in log and 'loco.batched --runs=' in log
    assert f'loco.batched: {os.path.join(out, name)}: finished' in log
  for name in ('bad', 'd'):
    assert _status(out, name)['batch'] is None
  assert _status(out, 'd')['state'] == 'finished'
  assert _status(out, 'bad')['error'] == 'loco: error: optimizer.lr must be positive, got -1.0.'
  losses = {n: [json.loads(x)['train_loss'] for x in open(os.path.join(out, n, 'metrics.jsonl'))]
            for n in ('a', 'b', 'c')}
  assert len({tuple(v) for v in losses.values()}) == 3     # their own seeds and lrs
  # Run a trained alone gives the batched run's numbers.
  (tmp_path / 'solo').mkdir()
  solo = _sweep_cli(_spec(tmp_path / 'solo', f"[Run('a', {nano_file!r})]"),
                    f'--out={tmp_path / "solo"}', '--no_report')
  assert solo.returncode == 0, solo.stdout + solo.stderr
  alone = [json.loads(x)['train_loss']
           for x in open(os.path.join(tmp_path, 'solo', 'a', 'metrics.jsonl'))]
  np.testing.assert_allclose(losses['a'], alone, rtol=2e-5)
  again = _sweep_cli(spec, f'--out={out}', '--batch_runs=3', '--no_report')
  assert [x.split()[:2] for x in again.stdout.splitlines()[:5]] == [
      ['skip', name] for name in ('a', 'b', 'bad', 'c', 'd')]


@pytest.mark.slow
def test_a_sweep_of_seeds_trains_them_in_one_batch_reports_them_and_shows_progress(
    tmp_path, nano_file):
  out = str(tmp_path / 'sweep')
  spec = _spec(tmp_path, f"[Run('a', {nano_file!r})]")
  first = _sweep_cli(spec, f'--out={out}', '--seeds=2', '--batch_runs=2',
                     '--progress_every=0.5')
  assert first.returncode == 0, first.stdout + first.stderr
  lines = first.stdout.splitlines()
  assert [x.split() for x in lines[:2]] == [['start', f'a/seed={k}', '(batch', 'of', '2)']
                                           for k in (0, 1)]
  for k in (0, 1):
    workdir = os.path.join(out, 'a', f'seed={k}')
    assert sweep.runs_lib.read_config(workdir)['config']['seed'] == k
    assert _status(out, f'a/seed={k}')['batch'] == ['a/seed=0', 'a/seed=1']
  # Progress off a terminal: a line per running run every 0.5 s, then its last row.
  progress = [x for x in lines if x.startswith('running a/seed=')]
  assert progress and all(re.fullmatch(
      r'running a/seed=[01]  (starting \d:\d\d:\d\d|step (5|10)/10  loss \d\.\d{3}'
      r'(  eval \d\.\d{3})?  eta (\d:\d\d:\d\d|\?))', x) for x in progress), progress
  assert any(' step ' in x for x in progress), progress
  assert lines.index(progress[-1]) < lines.index(next(x for x in lines if x.startswith('finished')))
  report = open(os.path.join(out, 'report.md')).read()
  assert '## Over seeds' in report and '| 2 | 0, 1 |' in report
  # More seeds later: the finished ones are kept.
  more = _sweep_cli(spec, f'--out={out}', '--seeds=3', '--dry_run')
  assert [x.split()[:2] for x in more.stdout.splitlines()[::2][:3]] == [
      ['skip', 'a/seed=0'], ['skip', 'a/seed=1'], ['start', 'a/seed=2']]


@pytest.mark.slow
def test_failed_runs_rerun_only_with_retry_failed_or_a_changed_command(tmp_path, nano_file):
  out = str(tmp_path / 'sweep')
  spec = _spec(tmp_path, f"[Run('bad', {nano_file!r}, {{'optimizer.lr': -1.0}}), "
                         f"Run('bad2', {nano_file!r}, {{'num_workers': 0}})]")
  first = _sweep_cli(spec, f'--out={out}', '--no_report', '--parallel=2')
  assert first.returncode == 1
  assert 'failed  bad   loco: error: optimizer.lr must be positive, got -1.0.' in first.stdout
  assert _status(out, 'bad2')['error'].startswith('loco: error: num_workers must be >= 1')
  assert _sweep_cli(spec, f'--out={out}', '--no_report').returncode == 1
  assert _status(out, 'bad')['attempts'] == 1
  assert _sweep_cli(spec, f'--out={out}', '--no_report', '--retry_failed').returncode == 1
  assert _status(out, 'bad')['attempts'] == 2
  changed = _sweep_cli(spec, f'--out={out}', '--no_report', '--set=optimizer.lr=-2')
  assert 'failed before; its command changed' in changed.stdout
  assert _status(out, 'bad')['attempts'] == 3
  assert _status(out, 'bad')['error'] == 'loco: error: optimizer.lr must be positive, got -2.0.'


# Multi-host: as far as one machine allows.

def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_main_distributed_initializes_and_trains(tmp_path, nano_file):
  """`--distributed` with an explicit coordinator: one process of one, a short run."""
  out = subprocess.run(
      [sys.executable, '-m', 'loco.main', f'--config={nano_file}', f'--workdir={tmp_path / "w"}',
       '--distributed', f'--coordinator_address=localhost:{_free_port()}',
       '--num_processes=1', '--process_id=0', '--config.steps=2', '--config.log_every=2',
       '--config.eval.every=2', '--config.checkpoint.every=2'],
      cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'loco: process 0 of 1, 1 local of 1 devices.' in out.stdout
  with open(tmp_path / 'w' / 'metrics.jsonl') as f:
    assert [json.loads(line)['step'] for line in f] == [2]


_TWO_PROCESSES = ['--config.num_workers=4', '--config.batch_per_worker=4',
                  '--config.mesh.workers=2', '--config.mesh.fsdp=4',
                  '--config.algorithm.name=diloco', '--config.algorithm.sync_every=2',
                  '--config.log_every=2', '--config.eval.every=2',
                  '--config.checkpoint.every=2', '--config.steps=4']


def _two_processes(workdir, port, *flags):
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'loco.main', f'--config={flags[0]}', f'--workdir={workdir}',
       '--distributed', f'--coordinator_address=localhost:{port}', '--num_processes=2',
       f'--process_id={i}', *flags[1:]], cwd=REPO,
      env=dict(ENV, XLA_FLAGS='--xla_force_host_platform_device_count=4'),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), outputs[0][-2000:] + outputs[1][-2000:]
  return outputs


@pytest.mark.slow
def test_two_processes_match_one_process_with_eight_devices(tmp_path, nano_file):
  """Two CPU processes of 4 devices each over Gloo, on a 2 x 4 workers x fsdp mesh (a
  process per row: the workers axis crosses hosts, fsdp stays inside one), each reading
  only its own workers' data, give the one-process, 8-device numbers; a checkpoint
  written by both (every worker's data position gathered) resumes in both."""
  outputs = _two_processes(tmp_path / 'multi', _free_port(), nano_file, *_TWO_PROCESSES[:-1],
                           '--config.steps=2')
  assert 'loco: process 1 of 2, 4 local of 8 devices.' in outputs[1]
  for i, rows in enumerate(['0-1', '2-3']):    # each process reads only its row's workers
    assert f'loco: process {i} reads the data of workers {rows} of 4.' in outputs[i]
  _two_processes(tmp_path / 'multi', _free_port(), nano_file, *_TWO_PROCESSES)   # resumes
  one = subprocess.run(
      [sys.executable, '-m', 'loco.main', f'--config={nano_file}',
       f'--workdir={tmp_path / "one"}', *_TWO_PROCESSES], cwd=REPO,
      env=dict(ENV, XLA_FLAGS='--xla_force_host_platform_device_count=8'),
      capture_output=True, text=True, timeout=300)
  assert one.returncode == 0, one.stderr[-2000:]
  def records(name):
    with open(tmp_path / name / 'metrics.jsonl') as f:
      return [{k: v for k, v in json.loads(line).items() if k != 'tokens_per_second'}
              for line in f]
  multi, one = records('multi'), records('one')   # also: written once, not once per process
  assert [r.keys() for r in multi] == [r.keys() for r in one]
  # Losses and the drift diagnostics (sums over workers) to float rounding: Gloo sums in
  # another order. Steps, tokens and bytes exactly.
  rounded = lambda k: 'loss' in k or k.startswith(('pg_', 'consensus_'))  # noqa: E731
  for a, b in zip(multi, one):
    assert {k: v for k, v in a.items() if not rounded(k)} == {
        k: v for k, v in b.items() if not rounded(k)}
    # atol: a small difference of losses (the eval SE) keeps the losses' own absolute
    # rounding, not its relative size.
    np.testing.assert_allclose([a[k] for k in a if rounded(k)],
                               [b[k] for k in b if rounded(k)], rtol=1e-6, atol=1e-7)
