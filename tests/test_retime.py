"""Re-timing finished runs (loco.retime): its own network reproduces the run's clock
exactly; another network changes it as a hand computation says; bad input is one line."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from loco.sim import network
from loco.lab import report
from loco.lab import retime
from loco.run import train
from loco.errors import LocoError
from loco.files.metrics import read_metrics
from tests.nano import make_nano_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M = 4
# 4 workers; the links into and out of worker 3 are 20x slower, worker 0 -> 1 2x.
MATRIX = [[0.0 if i == j else 2e6 / (20 if 3 in (i, j) else 2 if (i, j) == (0, 1) else 1)
           for j in range(M)] for i in range(M)]
CLOCKED = ('sim_seconds', 'utilization', 'idle_seconds')

# name: (algorithm keys, network keys): every kind of collective and schedule.
RUNS = {
    'ddp': (dict(name='ddp'), dict(profile='lognormal', sigma=1.0, bandwidth=1e6)),
    'diloco': (dict(name='diloco', sync_every=5),
               dict(profile='multi_region', inter_bandwidth=1e5, inter_latency=0.2)),
    'streaming': (dict(name='streaming_diloco', sync_every=8, num_fragments=1,
                       overlap_steps=2),
                  dict(profile='slow_links', slow_workers=1, slow_factor=50.0,
                       bandwidth=1e5)),
    'gasloc_matching': (dict(name='gasloc', sync_every=2, topology='matching'),
                        dict(profile='custom', bandwidth_matrix=MATRIX, latency=0.01)),
    'sparseloco': (dict(name='sparseloco', sync_every=2),
                   dict(profile='stragglers', bandwidth=1e5)),
    'ddp_overlap': (dict(name='ddp'), dict(profile='homogeneous', bandwidth=1e5,
                                           overlap='backward')),
    'diloco_dropout': (dict(name='diloco', sync_every=5),
                       dict(profile='homogeneous', bandwidth=1e5, dropout=0.4,
                            churn=[[1, 3, 12]], straggler_fraction=0.25,
                            straggler_factor=2.0)),
}


class _Trained(dict):
  """{name: workdir} of the RUNS, each trained on first use (nano, 4 workers, 20 steps),
  so the default tier trains only the runs its tests read."""

  def __init__(self, root, small_corpus_glob, data_dir):
    super().__init__()
    self._root, self._glob, self._data_dir = root, small_corpus_glob, data_dir

  def __missing__(self, name):
    algorithm, net = RUNS[name]
    c = make_nano_config(self._glob, self._data_dir)
    c.num_workers = M
    for key, value in algorithm.items():
      c.algorithm[key] = value
    c.network.step_seconds = 0.5
    for key, value in net.items():
      c.network[key] = value
    workdir = str(self._root / name)
    train.run(c, workdir)
    self[name] = workdir
    return workdir


@pytest.fixture(scope='module')
def runs(tmp_path_factory, small_corpus_glob, data_dir):
  return _Trained(tmp_path_factory.mktemp('runs'), small_corpus_glob, data_dir)


# The runs the default tier's other tests read; the rest re-time under pytest -m slow.
_DEFAULT = {'ddp', 'diloco', 'diloco_dropout', 'sparseloco'}


def _own(workdir):
  with open(os.path.join(workdir, 'config.json')) as f:
    net = json.load(f)['config']['network']
  return {f'network.{k}': v for k, v in net.items() if v is not None}


@pytest.mark.slow
@pytest.mark.parametrize('name', list(RUNS))
def test_retiming_on_its_own_network_reproduces_the_run_exactly(runs, name):
  out = retime.retime(runs[name], _own(runs[name]), 'own')
  assert out == os.path.join(runs[name], 'retimed', 'own')
  rows, again = read_metrics(runs[name]), read_metrics(out)
  assert [r['step'] for r in rows] == [5, 10, 15, 20]
  assert rows[-1]['sim_seconds'] > 20 * 0.5           # communication took time
  for a, b in zip(rows, again):
    assert a == b                                     # every key, == on the floats
  # loco.report reads it like a run.
  row = report.summarize([out])[0]
  assert row['status'] == 'finished' and row['sim_seconds'] == rows[-1]['sim_seconds']


def test_another_network_changes_the_time_as_computed_by_hand(runs):
  """DiLoCo, H=5, 4 workers, on 1 s steps and links of B bytes/s, L s: every 5th step a
  ring all-reduce of the 4P-byte pseudo-gradient: 2(M-1) = 6 phases of a 4P/M chunk."""
  workdir = runs['diloco']
  with open(os.path.join(workdir, 'config.json')) as f:
    params = json.load(f)['model']['param_count']
  bandwidth, latency = 1e5, 0.05
  out = retime.retime(workdir, {'network.profile': 'homogeneous', 'network.step_seconds': '1',
                                'network.bandwidth': str(bandwidth),
                                'network.latency': str(latency)}, 'slow')
  sync = 6 * (latency + 4 * params / M / bandwidth)
  for row, new in zip(read_metrics(workdir), read_metrics(out)):
    step = row['step']
    assert new['sim_seconds'] == pytest.approx(step + step // 5 * sync, rel=1e-12)
    assert new['utilization'] == pytest.approx(step / new['sim_seconds'], rel=1e-12)
    assert new['idle_seconds'] == [pytest.approx(step // 5 * sync, abs=1e-6)] * M
    assert new['sim_seconds'] != row['sim_seconds']
    assert {k: v for k, v in new.items() if k not in CLOCKED} == {
        k: v for k, v in row.items() if k not in CLOCKED}
  with open(os.path.join(out, 'config.json')) as f:
    stored = json.load(f)
  assert stored['config']['network']['profile'] == 'homogeneous'
  assert stored['config']['network']['inter_bandwidth'] is None
  assert stored['retimed_from']['network']['profile'] == 'multi_region'
  assert stored['retimed_from']['step'] == 20
  assert stored['model']['param_count'] == params
  assert retime.is_current(workdir, {'network.profile': 'homogeneous',
                                     'network.step_seconds': '1',
                                     'network.bandwidth': str(bandwidth),
                                     'network.latency': str(latency)}, 'slow')
  assert not retime.is_current(workdir, {'network.profile': 'homogeneous'}, 'slow')


def test_a_step_time_from_flops_is_the_formula_by_hand(runs):
  """With no step_seconds the step takes FLOPs / (peak x MFU). The nano model (d 32, 2
  layers of 2 heads of 16, d_ff 64, gelu, vocab V, tied head), 2 sequences of 32 tokens
  per worker and step: matmul weights 2 (32 x 4 x 32 + 2 x 32 x 64) + 32 V, FLOPs per
  token 6 x that + 12 x 2 x 2 x 16 x 32 (attention); on a 1e9 FLOP/s device at 50% and
  a network too fast to see, 20 steps take 20 x 64 x FLOPs / 5e8 seconds."""
  with open(os.path.join(runs['diloco'], 'config.json')) as f:
    model = json.load(f)['model']
  vocab = model['vocab_size']
  flops = 6 * (2 * (32 * 4 * 32 + 2 * 32 * 64) + 32 * vocab) + 12 * 2 * 2 * 16 * 32
  assert model['flops_per_token'] == flops
  out = retime.retime(runs['diloco'], {'network.profile': 'homogeneous',
                                       'network.device_flops': 1e9, 'network.mfu': 0.5,
                                       'network.bandwidth': 1e18, 'network.latency': 0.0},
                      'flops')
  rows = read_metrics(out)
  assert rows[-1]['sim_seconds'] == pytest.approx(20 * 64 * flops / 5e8, rel=1e-9)
  assert rows[0]['sim_seconds'] == pytest.approx(5 * 64 * flops / 5e8, rel=1e-9)


def test_the_command_line(runs):
  workdir = runs['ddp']
  proc = subprocess.run(
      [sys.executable, '-m', 'loco.retime', workdir, '--network.profile=custom',
       f'--network.bandwidth_matrix={json.dumps(MATRIX)}', '--network.step_seconds=2',
       '--name=matrix'], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  out = os.path.join(workdir, 'retimed', 'matrix')
  assert proc.stdout.strip().endswith(f': {out}')
  last = read_metrics(out)[-1]
  assert last['sim_seconds'] > 20 * 2.0
  before = read_metrics(workdir)[-1]['sim_seconds']
  first, second = proc.stdout.splitlines()
  assert first == 'step time 2 s per inner step: network.step_seconds (as named)'
  assert second.startswith(
      f'step 20: simulated {before:,.1f} s -> {last["sim_seconds"]:,.1f} s')


def _slower(own):
  """The run's network with every link 10 times slower and 10 ms more latent; nothing
  on the compute side named."""
  cfg = network.parse_network({k.removeprefix('network.'): v for k, v in own.items()})
  out = {'network.profile': cfg.profile, 'network.bandwidth': cfg.bandwidth / 10,
         'network.latency': cfg.latency * 10 + 0.01}
  for key in ('dropout', 'churn', 'dropout_mode', 'overlap'):
    if f'network.{key}' in own:
      out[f'network.{key}'] = own[f'network.{key}']
  if cfg.profile == 'multi_region':
    out.update({'network.inter_bandwidth': cfg.inter_bandwidth / 10,
                'network.inter_latency': cfg.inter_latency * 10 + 0.01})
  if cfg.profile == 'lognormal':
    out['network.sigma'] = cfg.sigma
  if cfg.profile == 'slow_links':
    out.update({'network.slow_workers': cfg.slow_workers,
                'network.slow_factor': cfg.slow_factor})
  if cfg.profile == 'custom':
    out['network.bandwidth_matrix'] = [[b / 10 for b in row] for row in cfg.bandwidth_matrix]
    if cfg.latency_matrix is not None:
      out['network.latency_matrix'] = [[t * 10 + 0.01 for t in row]
                                       for row in cfg.latency_matrix]
  return out


@pytest.mark.parametrize('name', [n if n in _DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in RUNS])
def test_a_run_retimed_on_a_slower_network_never_gets_faster(runs, name):
  """Only links named: the run's step time, speeds, stragglers and seed stay its own, so
  slower links can only add time, at every row; the compute part of the clock is the
  run's own (its utilization x its time is the same busy time or less)."""
  own = _own(runs[name])
  out = retime.retime(runs[name], _slower(own), 'slower')
  rows, slow = read_metrics(runs[name]), read_metrics(out)
  for a, b in zip(rows, slow):
    assert b['sim_seconds'] >= a['sim_seconds']
    assert b['utilization'] <= a['utilization']
  assert slow[-1]['sim_seconds'] > rows[-1]['sim_seconds']   # every run communicated
  with open(os.path.join(out, 'config.json')) as f:
    stored = json.load(f)
  assert stored['retimed_from']['step_time'] == {
      'seconds': 0.5, 'source': "network.step_seconds (the run's)"}
  for key in ('straggler_fraction', 'straggler_factor', 'step_seconds'):
    run_value = own.get(f'network.{key}', network.profile_default(own['network.profile'], key))
    assert stored['config']['network'][key] == run_value


def test_the_readme_example_keeps_the_runs_step_time(runs, capsys):
  """A run trained at network.step_seconds=0.5 on 1e5 B/s links, with stragglers,
  re-timed with only --network.profile=multi_region (its slower links between regions):
  the run's 0.5 s steps and its stragglers are kept, so it takes longer, not less (before
  the fix the default device's FLOPs replaced the run's step time: 10.6 s became 3.0)."""
  workdir = runs['diloco_dropout']
  args = [workdir, '--network.profile=multi_region', '--network.bandwidth=1e5',
          '--network.inter_bandwidth=1e4', '--network.dropout=0.4',
          '--network.churn=[[1, 3, 12]]']
  assert retime.main(args) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ("step time 0.5 s per inner step: network.step_seconds (the run's); "
                      "the run's network.straggler_fraction, network.straggler_factor kept")
  out = os.path.join(workdir, 'retimed', 'multi_region')
  assert read_metrics(out)[-1]['sim_seconds'] > read_metrics(workdir)[-1]['sim_seconds']
  # Links too fast to see: what is left is the run's compute, stragglers included, the
  # same on any profile.
  fast = {'network.bandwidth': 1e18, 'network.latency': 0.0, 'network.dropout': 0.4,
          'network.churn': [[1, 3, 12]]}
  a = retime.retime(workdir, {'network.profile': 'homogeneous', **fast}, 'fast_h')
  b = retime.retime(workdir, {'network.profile': 'multi_region', 'network.inter_latency': 0.0,
                              'network.inter_bandwidth': 1e18, **fast}, 'fast_m')
  assert read_metrics(a)[-1]['sim_seconds'] == pytest.approx(
      read_metrics(b)[-1]['sim_seconds'], rel=1e-12)
  assert read_metrics(a)[-1]['sim_seconds'] > 20 * 0.5     # stragglers wait for the slowest
  c = retime.retime(workdir, {'network.profile': 'homogeneous', **fast,
                              'network.straggler_fraction': 0.0}, 'no_stragglers')
  assert read_metrics(c)[-1]['sim_seconds'] < read_metrics(a)[-1]['sim_seconds']


def test_a_profiles_stragglers_stay_the_runs_on_another_profile(runs):
  """The 'stragglers' profile gives the run 25% of workers 3x slower; re-timed on
  'homogeneous' they stay, as the run's (not the new profile's zero)."""
  fast = {'network.bandwidth': 1e18, 'network.latency': 0.0}
  a = retime.retime(runs['sparseloco'], {'network.profile': 'stragglers', **fast}, 'fs')
  b = retime.retime(runs['sparseloco'], {'network.profile': 'homogeneous', **fast}, 'fh')
  assert [r['sim_seconds'] for r in read_metrics(a)] == [
      r['sim_seconds'] for r in read_metrics(b)]
  with open(os.path.join(b, 'config.json')) as f:
    net = json.load(f)['config']['network']
  assert (net['straggler_fraction'], net['straggler_factor']) == (0.25, 3.0)


def test_naming_the_device_times_steps_by_flops_and_keeps_the_runs_other_half():
  own = {'profile': 'homogeneous', 'step_seconds': 0.1, 'mfu': 0.3, 'speeds': [1, 2],
         'seed': 7}
  section = {'step_seconds': None, 'device_flops': 1e12, 'mfu': None, 'speeds': None,
             'straggler_fraction': None, 'straggler_factor': None, 'seed': None}
  origin = retime.keep_compute(section, own, {'network.profile': 'multi_region',
                                              'network.device_flops': 1e12})
  assert section == {'step_seconds': None, 'device_flops': 1e12, 'mfu': 0.3,
                     'speeds': [1, 2], 'straggler_fraction': None,
                     'straggler_factor': None, 'seed': 7}
  assert origin == {'device_flops': 'as named', 'mfu': "the run's", 'speeds': "the run's",
                    'seed': "the run's"}
  section = dict.fromkeys(retime.COMPUTE_KEYS)
  origin = retime.keep_compute(section, own, {'network.profile': 'multi_region',
                                              'network.seed': 3})
  assert section['step_seconds'] == 0.1 and section['mfu'] == 0.3
  assert section['seed'] is None and origin['seed'] == 'as named'


def test_the_overlap_model_hides_communication_behind_the_backward_pass(runs, tmp_path,
                                                                        capsys):
  """DDP, 4 workers, on 0.5 s steps and 1e5 B/s links of 10 us: each step all-reduces
  the 4P-byte gradient, 6 phases of a P-byte chunk. 'none': 0.5 + 6 (1e-5 + P / 1e5) per
  step. 'backward' (loco.overlap_model's model): 128 pieces of 6 (1e-5 + P / 128 / 1e5) s
  (each pays the latency) from the first release, 0.5 (1/3 + 2/3 / 128) s into the
  step, back to back (a piece is longer than the release interval). DiLoCo (H = 5)
  gains as much on each sync."""
  with open(os.path.join(runs['ddp'], 'config.json')) as f:
    params = json.load(f)['model']['param_count']
  net = {'network.profile': 'homogeneous', 'network.step_seconds': '0.5',
         'network.bandwidth': '1e5', 'network.latency': '1e-5'}
  times = {}
  for name in ('ddp', 'diloco'):
    for overlap in ('none', 'backward'):
      out = retime.retime(runs[name], {**net, 'network.overlap': overlap}, overlap)
      times[name, overlap] = read_metrics(out)
      stored = json.load(open(os.path.join(out, 'config.json')))
      assert stored['config']['network']['overlap'] == overlap
  none, backward = 0.5 + 6 * (1e-5 + params / 1e5), (
      0.5 * (1 / 3 + 2 / 3 / 128) + 128 * 6 * (1e-5 + params / 128 / 1e5))
  assert 0.5 * 2 / 3 / 128 < 6 * (1e-5 + params / 128 / 1e5)   # back to back
  for a, b in zip(times['ddp', 'none'], times['ddp', 'backward']):
    assert a['sim_seconds'] == pytest.approx(a['step'] * none, rel=1e-12)
    assert b['sim_seconds'] == pytest.approx(b['step'] * backward, rel=1e-12)
    assert b['utilization'] == pytest.approx(0.5 / backward, rel=1e-12)
    assert b['sim_seconds'] < a['sim_seconds'] and b['utilization'] > a['utilization']
  for a, b in zip(times['diloco', 'none'], times['diloco', 'backward']):
    assert b['sim_seconds'] == pytest.approx(a['sim_seconds'] - (none - backward) * (
        a['step'] // 5), rel=1e-12)
  # The command line: the default name says the overlap; a bad value writes nothing.
  workdir = _copy(runs['ddp'], tmp_path / 'run')
  assert retime.main([workdir, '--network.profile=homogeneous',
                      '--network.overlap=backward']) == 0
  assert capsys.readouterr().out.strip().endswith(
      os.path.join(workdir, 'retimed', 'homogeneous+backward'))
  # loco.main's override form names the same keys (--network.KEY is its alias).
  with open(os.path.join(workdir, 'retimed', 'homogeneous+backward', 'metrics.jsonl')) as f:
    alias = f.read()
  shutil.rmtree(os.path.join(workdir, 'retimed'))
  assert retime.main([workdir, '--config.network.profile=homogeneous',
                      '--config.network.overlap=backward']) == 0
  capsys.readouterr()
  with open(os.path.join(workdir, 'retimed', 'homogeneous+backward', 'metrics.jsonl')) as f:
    assert f.read() == alias
  shutil.rmtree(os.path.join(workdir, 'retimed'))
  assert _error(capsys, workdir, '--config.network.profile=homogeneous',
                '--config.steps=3') == (
      '--config.steps=3: re-timing sets only network keys (--config.network.KEY=VALUE); '
      'the rest of the run is its own.')
  assert _error(capsys, workdir, '--network.profile=homogeneous',
                '--network.overlap=forward') == (
      "network.overlap must be one of ('none', 'backward') with network.mode='sync', "
      "got 'forward'.")
  assert _error(capsys, workdir, '--network.profile=homogeneous',
                '--network.overlap=1').startswith('network.overlap must be one of')
  assert _error(capsys, workdir, '--network.profile=homogeneous', '--network.overlap=backward',
                '--network.overlap_buckets=0').startswith('network.overlap_buckets must be')
  assert _error(capsys, workdir, '--network.profile=homogeneous',
                '--network.overlap_buckets=8') == (
      "network.overlap_buckets is read only with network.overlap='backward'.")
  assert not os.path.exists(os.path.join(workdir, 'retimed'))


def _copy(workdir, to):
  shutil.copytree(workdir, to, ignore=shutil.ignore_patterns('retimed'))
  return str(to)


def _error(capsys, *args):
  code = retime.main(list(args))
  err = capsys.readouterr().err
  assert code != 0 and len(err.splitlines()) == 1 and err.startswith('loco.retime: error: ')
  return err.strip().removeprefix('loco.retime: error: ')


def test_an_asynchronous_run_is_refused(runs, tmp_path, capsys):
  workdir = _copy(runs['diloco'], tmp_path / 'async')
  path = os.path.join(workdir, 'config.json')
  stored = json.load(open(path))
  stored['config']['network']['mode'] = 'async'
  json.dump(stored, open(path, 'w'))
  assert _error(capsys, workdir, '--network.profile=homogeneous') == (
      f"the run in {workdir} was simulated asynchronously (network.mode='async'): its "
      'schedule depended on its network; train it again.')
  assert not os.path.exists(os.path.join(workdir, 'retimed'))


def test_bad_input_is_one_line(runs, tmp_path, capsys):
  workdir = _copy(runs['diloco_dropout'], tmp_path / 'run')
  assert _error(capsys, str(tmp_path / 'nope'), '--network.profile=homogeneous') == (
      f'no such workdir: {tmp_path / "nope"}')
  (tmp_path / 'empty').mkdir()
  assert _error(capsys, str(tmp_path / 'empty'), '--network.profile=homogeneous') == (
      f'{tmp_path / "empty"} is not a loco run (no readable config.json).')
  copy = _copy(workdir, tmp_path / 'nolog')
  os.remove(os.path.join(copy, 'comms.jsonl'))
  assert _error(capsys, copy, '--network.profile=homogeneous') == (
      f'{copy} has no comms.jsonl (runs trained before the communication log cannot be '
      're-timed).')
  assert _error(capsys, workdir, '--network.profile=moon').startswith(
      'network.profile must be one of homogeneous, multi_region')
  assert _error(capsys, workdir, '--network.profile=homogeneous', '--network.sigmaa=1') == (
      'unknown config key network.sigmaa (did you mean network.sigma?)')
  assert _error(capsys, workdir, '--network.profile=homogeneous', '--network.sigma=1') == (
      "network.sigma is not read by network.profile='homogeneous' (it reads: no extra keys).")
  assert _error(capsys, workdir, '--network.profile=homogeneous',
                '--network.bandwidth=fast') == "network.bandwidth must be a number, got 'fast'."
  assert _error(capsys, workdir, '--network.profile=homogeneous',
                '--network.bandwidth=-1') == 'network.bandwidth must be positive, got -1.0.'
  assert _error(capsys, workdir, '--network.profile=custom',
                '--network.bandwidth_matrix=[[0,1],[1,0]]') == (
      'the bandwidth matrix must be 4 x 4 (num_workers), got shape (2, 2).')
  assert _error(capsys, workdir, '--network.profile=homogeneous', '--network.mode=async') == (
      'network.mode, local_work, peer_choice and overlap=compute belong to the asynchronous '
      'mode, which cannot be re-timed.')
  assert _error(capsys, workdir, '--network.profile=homogeneous',
                '--network.dropout=0.1').startswith(
      "network.dropout=0.1 differs from the run's 0.4: it decided which work")
  assert _error(capsys, workdir, '--network.bandwidth=1').startswith(
      '--config.network.profile=PROFILE is required')
  assert _error(capsys, workdir, '--network.profile=homogeneous', '--name=a/b') == (
      "the re-timing name 'a/b' must be letters, digits and _.,=+-.")
  assert _error(capsys, workdir, workdir, '--network.profile=homogeneous').startswith(
      'takes one WORKDIR')
  assert _error(capsys, workdir, '--profile=homogeneous').startswith('takes one WORKDIR')
  with pytest.raises(LocoError, match='optimizer.lr is not a network key'):
    retime.retime(workdir, {'network.profile': 'homogeneous', 'optimizer.lr': 1.0})
  assert not os.path.exists(os.path.join(workdir, 'retimed'))
  # The run's own dropout and churn are kept when not given (the log has their schedule).
  out = retime.retime(workdir, {'network.profile': 'multi_region'})
  net = json.load(open(os.path.join(out, 'config.json')))['config']['network']
  assert (net['dropout'], net['churn']) == (0.4, [[1, 3, 12]])
  assert out.endswith(os.path.join('retimed', 'multi_region'))
