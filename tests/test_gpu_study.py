"""launch.gpu_study: the comparison, the page, the caps, what travels and bad input
(fast); the whole study's dry run through scripts/device/gpu_study.sh (slow)."""

import json
import os
import re
import subprocess
import sys
import time
import tomllib

import pytest

from launch import gpu_study
from scripts.device import prepare_wheels

ROOT = gpu_study.ROOT


def _command(args, **env):
  return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, PYTHON=sys.executable, **env))


def _one_line(out):
  assert out.returncode != 0
  assert 'Traceback' not in out.stderr, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr
  return lines[0]


@pytest.mark.slow
def test_the_dry_run_writes_every_phase_with_numbers(tmp_path):
  page = tmp_path / 'gpu.md'
  before = os.path.exists(os.path.join(ROOT, 'docs', 'gpu.md'))
  out = _command(['bash', 'scripts/device/gpu_study.sh', '--dry_run', f'--out={page}',
                  f'--work={tmp_path / "work"}'])
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert os.path.exists(os.path.join(ROOT, 'docs', 'gpu.md')) == before   # not touched
  for phase in gpu_study.PHASES:     # each phase's wall time, printed as it ended
    assert re.search(rf'^phase {phase}: ok in [0-9.]+ s$', out.stdout, re.M), out.stdout
  check_dry_page(page.read_text())


def check_dry_page(text):
  """What a dry run's page must hold: every phase with its numbers."""
  assert 'every phase finished' in text and 'Not measured' not in text
  for phase in gpu_study.PHASES:
    assert re.search(rf'^\| {phase} \| ok \| [0-9.,]+ \| [0-9]+ \|$', text, re.M), phase

  # The main job on the "device" (here the CPU again) against the CPU: one row per
  # logged step, the losses within the tolerance, every byte counter and record equal.
  assert '| step | train loss CPU | device | abs diff | eval loss CPU |' in text
  rows = re.findall(r'^\| (\d+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.e+-]+) \|.*'
                    r'\| ([0-9,]+) \| (yes|\*\*no\*\*) \|$', text, re.M)
  assert [int(r[0]) for r in rows] == [2, 4]
  for _, cpu, device, diff, sent, equal in rows:
    assert abs(float(cpu) - float(device)) <= gpu_study.TOLERANCE['default']
    assert float(diff) <= gpu_study.TOLERANCE['default'] and 2 < float(cpu) < 7
    assert int(sent.replace(',', '')) > 0 and equal == 'yes'
  assert 'within the tolerance 0.01' in text and 'not within' not in text
  assert re.search(r'Bytes: equal on every row .* the [1-9]\d* comms\.jsonl records', text)

  def table(header):
    section = text.split(header, 1)[1].split('\n\n', 1)[0]
    return [line.split(' | ') for line in section.splitlines()[2:] if line.startswith('|')]
  throughput = table('| model | weights |')
  assert [r[0] for r in throughput] == ['| nano (bfloat16)', '| micro (bfloat16)']
  for r in throughput:      # ms/step, tokens/s, compile s are numbers; MFU vs the matmul
    assert float(r[3]) > 0 and float(r[4].replace(',', '')) > 0 and float(r[8]) > 0
    assert r[6] == 'n/a' and r[7].endswith('%')        # no datasheet peak for a CPU
  mesh = table('| placement | compile s |')
  assert [r[0] for r in mesh] == ['| no mesh', '| 1 x 1 mesh']
  assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in mesh)
  assert re.search(r'between the two over the timed chunks: [0-9.]+e[+-]\d+ nats', text)
  batched = table('| case | runs |')
  assert [r[0] for r in batched] == ['| solo', '| batched 1', '| batched 2']
  assert all(float(r[2].replace(',', '')) > 0 and r[3].endswith('x') for r in batched)


def _run(loss, sent=100.0, comms=None):
  rows = [{'step': 10, 'train_loss': loss, 'bytes_sent': sent, 'bytes_received': sent,
           'peak_bytes': sent, 'syncs': 1.0},
          {'step': 20, 'train_loss': loss - 0.5, 'eval_loss': loss - 0.4,
           'eval_loss_workers': loss - 0.3, 'bytes_sent': 2 * sent,
           'bytes_received': 2 * sent, 'peak_bytes': sent, 'syncs': 2.0}]
  return {'exit': 0, 'seconds': 1.0, 'rows': rows,
          'comms': comms or {'10': {'step': 10, 'sent': [sent]}}}


def test_the_comparison_holds_losses_to_the_tolerance_and_bytes_to_equality():
  cpu = _run(3.0)
  same = gpu_study.compare_runs(cpu, _run(3.0 + 4e-4), tolerance=1e-3)
  assert same['losses_within'] and same['bytes_equal'] and same['comms_equal']
  assert same['max_diff'] == pytest.approx(4e-4) and same['comms_records'] == 1
  far = gpu_study.compare_runs(cpu, _run(3.002), tolerance=1e-3)
  assert not far['losses_within'] and far['bytes_equal']
  # One byte more in a counter, or another record in comms.jsonl, is not equal.
  assert not gpu_study.compare_runs(cpu, _run(3.0, sent=101.0), 1e-3)['bytes_equal']
  other = _run(3.0, comms={'10': {'step': 10, 'sent': [99.0]}})
  c = gpu_study.compare_runs(cpu, other, 1e-3)
  assert c['bytes_equal'] and not c['comms_equal']
  nan = gpu_study.compare_runs(cpu, _run(float('nan')), tolerance=1e-3)
  assert not nan['losses_within'] and nan['max_diff'] == float('inf')
  failed = {'exit': 1, 'seconds': 2.0, 'error': 'loco: error: out of memory'}
  assert 'out of memory' in gpu_study.compare_runs(cpu, failed, 1e-3)['error']


def _meta(**kw):
  return dict(dict(dry_run=False, phases=list(gpu_study.PHASES), command='bash x.sh',
                   date='today', precisions=['default', 'highest'],
                   batched_presets=['micro', 'tiny']), **kw)


def test_a_partial_page_says_what_is_missing_and_keeps_what_was_measured():
  cpu = _run(3.0)
  results = {
      'env': {'device': {'platform': 'gpu', 'kind': 'NVIDIA H100 80GB HBM3', 'count': 1,
                         'memory_bytes': 80e9}, 'commit': 'abc1234',
              'nvidia_smi': {'driver_version': '580.1', 'cuda': '13.0'},
              'versions': {'jax': '0.11.2'}, 'host': {'cpus': 16}},
      'parity': {'command': 'python -m loco.main ...', 'cpu': cpu,
                 'device_default': _run(3.005),
                 'compare_default': gpu_study.compare_runs(cpu, _run(3.005), 1e-2)},
      # Stopped at its cap after the first shape: the row it finished is on the page.
      'throughput': {'datasheet': ['H100', 989e12], 'matmul_bf16': 700e12, 'matmul_n': 8192,
                     'tiny': {'shape': 'tiny', 'params': 3.2e6, 'workers': 8, 'batch': 32,
                              'seq': 512, 'dtype': 'bfloat16', 'grad_mode': 'vmap',
                              'step_seconds': 0.01, 'tokens_per_s': 13.1e6,
                              'flops_per_token': 25e6, 'compile_seconds': 20.0,
                              'memory_bytes': 2 ** 30}}}
  status = {'env': {'state': 'ok', 'seconds': 3.0, 'cap': 45},
            'parity': {'state': 'ok', 'seconds': 80.0, 'cap': 150},
            'throughput': {'state': 'timed out', 'seconds': 120.0, 'cap': 120,
                           'error': 'stopped at its cap of 120 s'}}
  text = gpu_study.render(results, status, _meta())
  assert '**partial**: throughput, mesh, batched not finished' in text
  assert '| throughput | timed out: stopped at its cap of 120 s | 120.0 | 120 |' in text
  assert '| mesh | not run | n/a | n/a |' in text
  assert '- device_highest: not finished' in text
  assert '| 20 | 2.500000 | 2.505000 | 5.0e-03 | 2.600000 | 2.605000 | 5.0e-03 | 200 | yes |' \
      in text
  # 13.1M tokens/s x 25 MFLOP = 327.5 TFLOP/s: 33.1% of the H100's 989, 46.8% of 700.
  assert '| 327.50 | 33.1% | 46.8% | 20.0 | 1.00 |' in text
  assert 'the dense bf16 datasheet figure of the H100' in text
  assert text.count('Not measured.') == 2          # the mesh and the batched sections
  assert 'driver | 580.1, CUDA 13.0' in text


def test_the_datasheet_peak_is_the_device_kinds():
  assert gpu_study.datasheet_peak('NVIDIA H100 80GB HBM3') == ('H100', 989e12)
  assert gpu_study.datasheet_peak('NVIDIA H100 PCIe') == ('H100 PCIe', 756e12)
  assert gpu_study.datasheet_peak('NVIDIA H200') == ('H200', 989e12)
  assert gpu_study.datasheet_peak('cpu') is None


_OVERRUN = '''
import json, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
with open(sys.argv[1], 'w') as f:
  json.dump({'child': child.pid, 'first': 1.5}, f)
time.sleep(120)
'''


def test_a_phase_over_its_cap_is_stopped_with_the_processes_it_started(tmp_path):
  results = str(tmp_path / 'phase.json')
  start = time.perf_counter()
  s = gpu_study.run_capped([sys.executable, '-c', _OVERRUN, results], 3.0, results)
  assert time.perf_counter() - start < 20
  assert s['state'] == 'timed out' and s['error'] == 'stopped at its cap of 3 s'
  kept = json.loads(open(results).read())
  assert kept['first'] == 1.5        # what it wrote before the cap is kept
  deadline = time.time() + 10
  while time.time() < deadline:      # its child went with it (the process group)
    try:
      os.kill(kept['child'], 0)
    except ProcessLookupError:
      break
    with open(f'/proc/{kept["child"]}/stat') as f:   # a zombie waiting for init is gone
      if f.read().split()[2] == 'Z':
        break
    time.sleep(0.1)
  else:
    pytest.fail('the phase\'s child outlived the cap')


def test_a_failed_phase_is_its_error_line(tmp_path):
  results = str(tmp_path / 'phase.json')
  script = ('import json, sys; json.dump({"_error": "ValueError: no device"}, '
            'open(sys.argv[1], "w")); sys.exit(1)')
  s = gpu_study.run_capped([sys.executable, '-c', script, results], 30.0, results)
  assert s['state'] == 'failed' and s['error'] == 'ValueError: no device'


@pytest.mark.parametrize('args, says', [
    (['--phases=env,bogus'], '--phases takes names from env,parity'),
    (['--phases=,'], '--phases takes names'),
    (['--minutes=-1'], "argument --minutes: '-1' must be positive"),
    (['--minutes=nan'], "argument --minutes: 'nan' must be a finite number"),
    (['--minutes=soon'], "argument --minutes: 'soon' is not a number"),
    (['--bogus'], 'unrecognized arguments: --bogus'),
    (['--out=docs'], '--out docs is a directory'),
    (['--out=README.md/gpu.md'], 'README.md is a file, not a directory'),
])
def test_bad_arguments_are_one_line_and_a_non_zero_exit(args, says):
  line = _one_line(_command([sys.executable, '-m', 'launch.gpu_study', *args]))
  assert line.startswith('launch.gpu_study: error: ') and says in line, line


def test_the_shell_command_answers_bad_arguments_in_one_line():
  line = _one_line(_command(['bash', 'scripts/device/gpu_study.sh', '--phases=gpu']))
  assert line.startswith('launch.gpu_study: error: --phases takes names'), line
  line = _one_line(_command([sys.executable, 'scripts/device/prepare_wheels.py',
                             '--python-version=three']))
  assert line.startswith('prepare_wheels.py: error: --python-version must look like'), line


def test_the_claims_command_answers_bad_arguments_in_one_line(tmp_path):
  line = _one_line(_command(['bash', 'scripts/device/claims.sh', '--minutes=8']))
  assert line == 'claims.sh: error: --out=DIR is required.', line
  line = _one_line(_command(['bash', 'scripts/device/claims.sh', f'--out={tmp_path}',
                             '--minutes=soon']))
  assert line == "claims.sh: error: --minutes must be a number, got 'soon'.", line
  line = _one_line(_command([sys.executable, 'scripts/device/pack_stdlib.py', '--bad']))
  assert line.startswith('pack_stdlib.py: error: '), line


@pytest.mark.slow
def test_the_claims_command_checks_the_corpus_and_packs_what_finished(tmp_path):
  """On this machine (no GPU): a wrong packed fingerprint stops it before training; the
  right one trains for the minutes given, stops as Ctrl-C does and packs the runs with
  their host, without checkpoints."""
  wheels = tmp_path / 'whl'
  out = _command([sys.executable, 'scripts/device/pack_stdlib.py', f'--dest={wheels}'])
  assert out.returncode == 0, out.stderr
  record = json.loads((wheels / 'stdlib.json').read_text())
  (wheels / 'stdlib.json').write_text(json.dumps(dict(record, sha256='0' * 64)))
  env = dict(LOCO_WHEELS=str(wheels), LOCO_DATA_DIR=str(tmp_path / 'data'),
             LOCO_HOST='the test')
  out = _command(['bash', 'scripts/device/claims.sh', f'--out={tmp_path / "a"}',
                  f'--runs={tmp_path / "runs_a"}', '--quick'], **env)
  assert out.returncode != 0 and 'DIFFERS' in out.stdout, out.stdout + out.stderr
  assert 'the corpus here is not the packed one' in out.stderr
  assert not (tmp_path / 'runs_a').exists()
  (wheels / 'stdlib.json').write_text(json.dumps(record))
  out = _command(['bash', 'scripts/device/claims.sh', f'--out={tmp_path / "b"}',
                  f'--runs={tmp_path / "runs_b"}', '--minutes=1.5', '--quick'], **env)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  assert f'corpus sha256 {record["sha256"][:16]} (as packed)' in out.stdout
  assert 'stopped at --minutes' in out.stdout
  import tarfile
  with tarfile.open(tmp_path / 'b' / 'claims_runs.tgz') as tar:
    names = tar.getnames()
    statuses = [json.load(tar.extractfile(n)) for n in names if n.endswith('status.json')]
  assert not any('checkpoints' in n or 'tensorboard' in n for n in names)
  finished = [s for s in statuses if s['state'] == 'finished']
  assert finished and all(s['host'] == 'the test' for s in finished)
  # --from: another lease goes on from those runs; they are not trained again, and only
  # what ended in this lease comes back.
  out = _command(['bash', 'scripts/device/claims.sh', f'--out={tmp_path / "c"}',
                  f'--runs={tmp_path / "runs_c"}', '--minutes=0.5', '--quick',
                  f'--from={tmp_path / "b" / "claims_runs.tgz"}'], **env)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  assert f'{len(statuses)} runs added' in out.stdout, out.stdout
  log = (tmp_path / 'c' / 'claims.log').read_text()
  skipped = {line.split()[1] for line in log.splitlines() if line.startswith('skip ')}
  packed = {n.rsplit('/', 1)[0].split('/', 1)[1] for n in names if n.endswith('status.json')}
  assert packed <= skipped, packed - skipped
  with tarfile.open(tmp_path / 'c' / 'claims_runs.tgz') as tar:
    again = {n for n in tar.getnames() if n.endswith('status.json')}
  assert not again & {n for n in names if n.endswith('status.json')}
  line = _one_line(_command(['bash', 'scripts/device/claims.sh', f'--out={tmp_path / "d"}',
                             f'--from={tmp_path / "none.tgz"}']))
  assert line == f'claims.sh: error: --from {tmp_path / "none.tgz"} is not a file.', line


def test_what_travels_covers_every_dependency_the_image_lacks():
  # pyproject.toml's run-time dependencies that the GPU image lacks are wheels that travel.
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    requires = tomllib.load(f)['project']['dependencies']
  needed = {re.split(r'[<>=!~ ;\[]', line.strip())[0].lower() for line in requires}
  image = {n.lower() for n in prepare_wheels.IMAGE}
  wheels = {n.lower() for n in prepare_wheels.WHEELS}
  assert needed - image <= wheels, needed - image - wheels
  assert not wheels & image
  assert all(re.fullmatch(r'\d+(\.\d+)+', v) for v, _ in prepare_wheels.WHEELS.values())
  assert set(prepare_wheels.SDIST_ONLY) <= set(prepare_wheels.WHEELS)


def test_without_an_accelerator_the_study_stops_after_env(tmp_path):
  # A host whose GPU backend fails falls back to the CPU: its numbers must not fill the
  # page as an accelerator's.
  page = tmp_path / 'gpu.md'
  out = _command([sys.executable, '-m', 'launch.gpu_study', '--phases=env,throughput',
                  f'--out={page}', f'--work={tmp_path / "work"}'], JAX_PLATFORMS='cpu')
  assert out.returncode == 1 and 'Traceback' not in out.stderr, out.stderr
  assert out.stderr.strip().splitlines()[-1] == (
      'launch.gpu_study: error: phases not finished: env, throughput (the page has the '
      'rest).')
  text = page.read_text()
  assert '| env | failed: jax sees no accelerator, only the CPU' in text
  assert '| throughput | skipped: no accelerator (the env phase failed) | n/a | 0 |' in text
  assert 'Not measured.' in text.split('## Throughput and MFU')[1]
