"""Hostile configs: misspelled keys, broken files, wrong types, bad ranges, lists, binaries.

Every mistake is one line that names the key (or the file and line) and what is allowed,
raised before any training: `loco.configs` in-process, and `python -m loco.main` as a
user runs it (exit code 2 for a command line or file that cannot be loaded, 1 for a
config that loads but is wrong).
"""

import glob
import importlib
import json
import os
import subprocess
import sys

import pytest

from loco import algorithms
from loco import configs
from loco.data import corpus
from loco.errors import ConfigError, DataError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, JAX_PLATFORMS='cpu')

_NANO = """
from tests.nano import make_nano_config


def get_config():
  c = make_nano_config({glob!r}, {data_dir!r})
  c.steps = 5
  c.eval.every = 5
  c.checkpoint.every = 5
{extra}
  return c
"""


def _nano_file(tmp_path, small_corpus_glob, data_dir, extra='', name='nano.py') -> str:
  """A nano config file (a 5-step run if nothing stops it); `extra` adds lines."""
  path = tmp_path / name
  path.write_text(_NANO.format(glob=small_corpus_glob, data_dir=data_dir, extra=extra))
  return str(path)


def _main(tmp_path, *args):
  return subprocess.run([sys.executable, '-m', 'loco.main', f'--workdir={tmp_path / "w"}',
                         *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                        timeout=300)


def _load(overrides=None, spec='experiments/tiny_ddp.py'):
  config = configs.load(spec, overrides)
  configs.validate(config)
  return config


# Unknown keys.

@pytest.mark.parametrize('key, message', [
    ('optimizr.lr', 'unknown config key optimizr.lr (did you mean optimizer.lr?)'),
    ('optimizer.learning_rate',
     'unknown config key optimizer.learning_rate (did you mean optimizer.lr?)'),
    ('lr', 'unknown config key lr (did you mean optimizer.lr?)'),
    ('network.speed', 'unknown config key network.speed (did you mean network.speeds or '
                      'network.seed?)'),
    ('model.dmodel', 'unknown config key model.dmodel (did you mean model.d_model?)'),
    ('steps.x', 'unknown config key steps.x: steps is a value, not a group of keys'),
    ('network', 'config key network is a group of keys; set one of them, e.g. '
                'network.bandwidth.'),
])
def test_unknown_keys_name_the_nearest_valid_ones(key, message):
  with pytest.raises(ConfigError) as e:
    _load({key: '1'})
  assert str(e.value) == message


def test_an_unknown_key_without_a_near_one_lists_its_section():
  with pytest.raises(ConfigError) as e:
    _load({'foo': '1'})
  assert str(e.value).startswith('unknown config key foo (the keys at the top level are: '
                                 'algorithm, batch_per_worker, checkpoint, ')


@pytest.mark.slow
def test_cli_unknown_keys_are_one_line(tmp_path):
  """Before: `loco: error: "'foo'"` and a KeyError repr; now the key and its neighbours."""
  for arg, line in [
      ('--config.optimizr.lr=1', 'unknown config key optimizr.lr (did you mean optimizer.lr?)'),
      ('--config.optimizer.learning_rate=1',
       'unknown config key optimizer.learning_rate (did you mean optimizer.lr?)')]:
    out = _main(tmp_path, '--config=experiments/tiny_ddp.py', arg)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f'loco: error: {line}']
  out = _main(tmp_path, '--config=experiments/tiny_ddp.py', '--config.foo=1')
  assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
  assert out.stderr.startswith('loco: error: unknown config key foo (the keys at the top ')
  assert not os.path.exists(tmp_path / 'w')


def test_unknown_keys_set_inside_a_config_file_fail(tmp_path, small_corpus_glob, data_dir):
  """Before: `c.optimizer.learning_rate = 1` was accepted, recorded and ignored."""
  path = _nano_file(tmp_path, small_corpus_glob, data_dir,
                    extra='  c.optimizer.learning_rate = 1.0')
  out = _main(tmp_path, f'--config={path}')
  assert out.returncode == 1, out.stderr[-2000:]
  assert out.stderr.splitlines() == [
      'loco: error: unknown config key optimizer.learning_rate (did you mean optimizer.lr?)']
  assert not os.path.exists(tmp_path / 'w')
  with pytest.raises(ConfigError, match=r'^unknown config key optimizer.learning_rate '
                                        r'\(did you mean optimizer.lr\?\)$'):
    configs.validate(configs.load(path))
  new_section = _nano_file(tmp_path, small_corpus_glob, data_dir, name='section.py',
                           extra='  c.optimizr = type(c)({"lr": 1.0})')
  with pytest.raises(ConfigError, match=r'unknown config key optimizr \(did you mean '
                                        r'optimizer\?\)'):
    configs.validate(configs.load(new_section))


# Broken config files.

@pytest.mark.slow
def test_config_file_errors_name_the_file_and_line(tmp_path):
  """Before: a traceback's last line, library internals for a missing file."""
  syntax = tmp_path / 'syntax.py'
  syntax.write_text('from loco.configs import default\n\n\ndef get_config(:\n  return base\n')
  out = _main(tmp_path, f'--config={syntax}', '--config.steps=3')
  assert out.returncode == 2
  assert out.stderr.splitlines() == [f'loco: error: {syntax} line 4: invalid syntax']

  missing = tmp_path / 'missing.py'
  out = _main(tmp_path, f'--config={missing}', '--config.steps=3')
  assert out.returncode == 2
  assert out.stderr.splitlines() == [f'loco: error: no such config file: {missing}']

  raises = tmp_path / 'raises.py'
  raises.write_text('from loco.configs import default\n\n\ndef get_config():\n'
                    '  c = default.get_config()\n  raise RuntimeError("no such dataset")\n')
  out = _main(tmp_path, f'--config={raises}')
  assert out.returncode == 2
  assert out.stderr.splitlines() == [
      f'loco: error: {raises} line 6: RuntimeError: no such dataset']
  with pytest.raises(ConfigError, match=r'tiny_hetero.py line \d+: ValueError: '
                                        r"tiny_hetero.py takes one of .* got 'x'"):
    configs.load('experiments/tiny_hetero.py:x')
  assert not os.path.exists(tmp_path / 'w')


# Types and ranges.

@pytest.mark.parametrize('overrides, message', [
    ({'checkpoint.keep': '0'}, 'checkpoint.keep must be >= 1, got 0.'),
    ({'steps': '2.5'}, "steps must be an integer, got '2.5'."),
    ({'optimizer.lr': 'abc'}, "optimizer.lr must be a number, got 'abc'."),
    ({'optimizer.lr': 'nan'}, 'optimizer.lr must be a finite number, got nan.'),
    ({'progress': '1'}, "progress must be true or false, got '1'."),
    ({'model.qk_norm': '0'}, "model.qk_norm must be true or false, got '0'."),
    ({'optimizer.b1': '1'}, 'optimizer.b1 must be in [0, 1), got 1.0.'),
    ({'network.mfu': '1.5'}, 'network.mfu must be in (0, 1], got 1.5.'),
    ({'network.seed': '-1'}, 'network.seed must be in [0, 2**32), got -1.'),
    ({'seed': str(2**63)}, f'seed must be in [0, 2**32), got {2**63}.'),
    ({'optimizer.eps': '0'}, 'optimizer.eps must be positive, got 0.0.'),
    ({'steps': True}, 'steps must be an integer, got True.'),
    ({'data.source': 3}, 'data.source must be a string, got 3.'),
    # Between keys, checked here too, so that a sweep refuses the run before it starts.
    ({'log_every': '30', 'eval.every': '200'},
     'eval.every must be a multiple of log_every=30, got 200.'),
    ({'checkpoint.every': '-10', 'log_every': '5'}, 'checkpoint.every must be >= 0, got -10.'),
])
def test_values_are_checked_without_coercion(overrides, message):
  """Before: checkpoint.keep=0 became 1; the others were absl tracebacks or accepted."""
  with pytest.raises(ConfigError) as e:
    _load(overrides)
  assert str(e.value) == message


@pytest.mark.parametrize('overrides, message', [
    ({'algorithm.gossip_step': '0'}, 'algorithm.gossip_step must be in (0, 1], got 0.0.'),
    ({'algorithm.seed': str(2**32)}, f'algorithm.seed must be in [0, 2**32), got {2**32}.'),
    ({'algorithm.sync_every': '0'}, 'algorithm.sync_every must be >= 1, got 0.'),
    ({'algorithm.topk': '64'}, "algorithm 'gasloc' does not take topk; its keys are: "
                               'sync_every, topology, weights, mix, form, outer_optimizer, '
                               'outer_lr, outer_momentum, gossip_step, transport_dtype, seed, '
                               'pairwise, local_steps.'),
    ({'algorithm.name': 'gossip'}, f"algorithm.name must be one of {sorted(algorithms.REGISTRY)}"
                                   ", got 'gossip'."),
    ({'optimizer.name': 'lion'}, "optimizer.name must be one of adamw, muon, sgd, signsgd, "
                                 "got 'lion'."),
])
def test_algorithm_keys_are_checked_by_the_algorithm_spec(overrides, message):
  """The algorithm's keys and ranges come from its spec: one sentence naming the key,
  the algorithm's keys, or the allowed names."""
  with pytest.raises(ConfigError) as e:
    _load(overrides, spec='experiments/tiny_gasloc.py')
  assert str(e.value) == message


def test_wrong_types_set_inside_a_config_file_fail(tmp_path, small_corpus_glob, data_dir,
                                                   monkeypatch):
  monkeypatch.setattr(sys, 'dont_write_bytecode', False)   # as a plain `python` runs
  for extra, message in [('  c.steps = True', 'steps must be an integer, got True.'),
                         ('  c.steps = None', 'steps must be an integer, got None.'),
                         ('  c.checkpoint.keep = 0', 'checkpoint.keep must be >= 1, got 0.')]:
    # One file rewritten in place: the two `steps` lines have the same length, so only
    # a config read from its source (never from Python's bytecode cache, which is valid
    # for the same size and second) sees the second.
    path = _nano_file(tmp_path, small_corpus_glob, data_dir, extra=extra, name='bad.py')
    os.utime(path, ns=(10 ** 18, 10 ** 18))     # the same modification time every time
    with pytest.raises(ConfigError) as e:
      configs.validate(configs.load(path))
    assert str(e.value) == message
  assert not os.path.exists(tmp_path / '__pycache__')


@pytest.mark.slow
def test_cli_bad_values_stop_before_training(tmp_path, small_corpus_glob, data_dir):
  """Before: keep=0 trained (as keep=1); steps=2.5 and lr=abc were absl parser lines."""
  path = _nano_file(tmp_path, small_corpus_glob, data_dir)
  for arg, code, line in [
      ('--config.checkpoint.keep=0', 1, 'checkpoint.keep must be >= 1, got 0.'),
      ('--config.steps=2.5', 2, "steps must be an integer, got '2.5'."),
      ('--config.optimizer.lr=abc', 2, "optimizer.lr must be a number, got 'abc'.")]:
    out = _main(tmp_path, f'--config={path}', arg)
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stderr.splitlines() == [f'loco: error: {line}']
  assert not os.path.exists(tmp_path / 'w')


def test_every_number_has_a_rule():
  """A new numeric key in default.py needs a line in CONSTRAINTS (or a rule between keys);
  a numeric algorithm key, a rule in its `Key`."""
  numeric = {k for k, (kind, _) in configs.schema().items()
             if kind in (int, float) and not k.startswith('algorithm.')}
  assert numeric <= set(configs.CONSTRAINTS)
  assert not [k for k in configs.CONSTRAINTS if k.startswith('algorithm.')]
  unruled = [k for k, key in algorithms.config_keys().items()
             if key.kind in (int, float) and key.rule is None]
  assert not unruled, f'numeric algorithm keys without a rule: {unruled}'
  assert {f'algorithm.{k}' for k in algorithms.config_keys()} | {'algorithm.name'} == {
      k for k in configs.schema() if k.startswith('algorithm.')}


def test_every_experiment_config_loads_and_validates():
  files = sorted(glob.glob(os.path.join(REPO, 'experiments', '*.py')))
  specs = []
  for path in files:
    name = os.path.splitext(os.path.basename(path))[0]
    if name == '__init__':
      continue
    variants = getattr(importlib.import_module(f'experiments.{name}'), 'VARIANTS', [None])
    specs += [f'{path}:{v}' if v else path for v in variants]
  assert len(specs) >= 10
  for spec in specs:
    _load(spec=spec)


# List-valued keys.

def test_list_keys_from_overrides():
  """Before: config_flags refused list-typed keys on the command line."""
  config = _load({'network.speeds': '[1,2,1,1]', 'network.churn': '[[0,10,20]]',
                  'network.bandwidth_matrix': [[0, 1e9], [1e9, 0]]})
  assert config.network.speeds == [1, 2, 1, 1]
  assert config.network.churn == [[0, 10, 20]]
  assert config.network.bandwidth_matrix == [[0, 1e9], [1e9, 0]]
  for text, shown in [('[1,2', "'[1,2'"), ('3', "'3'"), ('[1,"a"]', "[1, 'a']")]:
    with pytest.raises(ConfigError) as e:
      _load({'network.speeds': text})
    assert str(e.value) == f'network.speeds must be a list such as [1, 2, 1, 1], got {shown}.'


@pytest.mark.slow
def test_cli_list_keys(tmp_path, small_corpus_glob, data_dir):
  """A list reaches the run's config.json; a malformed one is one line."""
  path = _nano_file(tmp_path, small_corpus_glob, data_dir)
  out = _main(tmp_path, f'--config={path}', '--config.network.speeds=[1,2')
  assert out.returncode == 2
  assert out.stderr.splitlines() == [
      "loco: error: network.speeds must be a list such as [1, 2, 1, 1], got '[1,2'."]
  out = _main(tmp_path, f'--config={path}', '--config.network.profile=homogeneous',
              '--config.network.speeds=[1,2]', '--config.network.step_seconds=0.1')
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / 'w' / 'config.json') as f:
    assert json.load(f)['config']['network']['speeds'] == [1, 2]


def test_split_argv_reads_every_override_form():
  spec, overrides = configs.split_argv(
      ['prog', '--config', 'x.py:v', '--workdir=w', '--config.steps', '7', '--config.progress',
       '--noconfig.eval.per_worker', '--config.network.speeds=[1,2]'])
  assert spec == 'x.py:v'
  assert overrides == {'steps': '7', 'progress': True, 'eval.per_worker': False,
                       'network.speeds': '[1,2]'}
  with pytest.raises(ConfigError, match='only for a true/false key'):
    configs.split_argv(['--noconfig.steps'])


# Text globs that match binary files.

def test_binary_files_in_a_text_glob_are_skipped_with_one_warning(tmp_path, capsys):
  """Before: binary files were read as text (undecodable bytes replaced), silently."""
  for name in ('a.txt', 'b.txt', 'c.txt'):
    (tmp_path / name).write_text(f'text of {name}\n' * 20)
  (tmp_path / 'cut.txt').write_bytes(b'x' * 8191 + 'é'.encode() + b'\n')   # é cut at 8 KB
  (tmp_path / 'image.txt').write_bytes(b'\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR')
  (tmp_path / 'latin1.txt').write_bytes('caf\xe9 cr\xe8me\n'.encode('latin-1'))
  pattern = str(tmp_path / '*.txt')
  spec = corpus.text_spec(pattern)
  assert spec.files == ('a.txt', 'b.txt', 'c.txt', 'cut.txt')
  err = capsys.readouterr().err
  assert err.splitlines() == [
      f'loco: warning: data.text_glob {pattern!r}: skipped 2 binary file(s) (a NUL byte or '
      f'invalid UTF-8 in the first 8 KB), the first {tmp_path / "image.txt"}.']
  assert corpus.text_spec(pattern).files == spec.files
  assert capsys.readouterr().err == ''   # once per glob, not once per split


def test_a_text_glob_of_only_binary_files_is_a_data_error(tmp_path):
  for i in range(2):
    (tmp_path / f'{i}.bin').write_bytes(bytes(range(256)))
  with pytest.raises(DataError, match=r"matches only binary files \(2, e.g. .*0.bin"):
    corpus.text_spec(str(tmp_path / '*.bin'))
