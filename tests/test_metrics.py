"""Metric sinks: metrics.jsonl first, then TensorBoard, W&B (a fake module) and user sinks.

Every row reaches every sink; an OS error in any of them surfaces from
`MetricsWriter.write` as an OSError, after the row is in metrics.jsonl (the record).
"""

import errno
import glob
import importlib.machinery
import json
import math
import os
import struct
import sys
import types

import pytest

from loco.configs import default
from loco import configs
from loco.files import metrics
from loco.files import workdir as workdir_lib
from loco.errors import ConfigError, WorkdirError
from loco.files.metrics import MetricsWriter, SinkConfig, read_metrics

ROWS = [
    dict(step=5, tokens=320, train_loss=4.5, bytes_sent=0, syncs=0, sim_seconds=0.0,
         tokens_per_second=1234.5),
    # Lists (a user's key), NaN and booleans are not scalars.
    dict(step=10, tokens=640, train_loss=4.25, eval_loss=4.3, losses=[4.2, 4.4],
         worker_spread=float('nan'), flag=True, tokens_per_second=1300.0),
]


def _events(logdir, index=0):
  """The Events of logdir's event files (the index-th, oldest first), read as TensorBoard
  does: TFRecord frames (length, its CRC, data, its CRC) of serialized Event protos."""
  from tensorboardX.proto import event_pb2
  # Names sort by time: events.out.tfevents.<seconds>.<host>[.<n>].
  path = sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*')))[index]
  data = open(path, 'rb').read()
  events, at = [], 0
  while at < len(data):
    (length,) = struct.unpack('<Q', data[at:at + 8])
    events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
    at += 12 + length + 4
  assert events[0].file_version == 'brain.Event:2'
  return events[1:]


def _scalars(logdir):
  """(step, {tag: value}) of each row in logdir's only event file."""
  [_] = glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))
  return [(e.step, {v.tag: v.simple_value for v in e.summary.value}) for e in _events(logdir)]


def test_jsonl_and_tensorboard_write_the_same_scalars(tmp_path):
  workdir = str(tmp_path)
  writer = MetricsWriter(workdir)
  for row in ROWS:
    writer.write(row)
  writer.close()
  assert read_metrics(workdir) == json.loads(json.dumps(ROWS))   # NaN round-trips
  events = _scalars(os.path.join(workdir, 'tensorboard'))
  assert [step for step, _ in events] == [5, 10]
  for (_, values), row in zip(events, ROWS):
    expected = {k: v for k, v in row.items()
                if k != 'step' and type(v) in (int, float) and math.isfinite(v)}
    assert values == pytest.approx(expected), values   # simple_value is float32


def test_a_resumed_run_hides_the_redone_steps_in_tensorboard(tmp_path):
  from tensorboardX.proto import event_pb2
  workdir = str(tmp_path)
  writer = MetricsWriter(workdir)
  for row in ROWS:
    writer.write(row)
  writer.close()
  writer = MetricsWriter(workdir, resume_step=5)   # within the same second, often
  writer.write(ROWS[1])
  writer.close()
  assert read_metrics(workdir) == json.loads(json.dumps(ROWS))
  logdir = os.path.join(workdir, 'tensorboard')
  assert [e.step for e in _events(logdir, index=0)] == [5, 10]   # not overwritten
  purge, row = _events(logdir, index=1)
  # TensorBoard drops the first file's events from this step on (step 10, redone).
  assert purge.step == 6 and purge.session_log.status == event_pb2.SessionLog.START
  assert row.step == 10


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='needs /dev/full (Linux)')
def test_a_full_disk_under_tensorboard_surfaces_from_write(tmp_path, monkeypatch):
  from tensorboardX import record_writer
  workdir = str(tmp_path)
  writer = MetricsWriter(workdir)
  # Reopen the event file on /dev/full: every flush fails with ENOSPC, as on a full disk.
  sink = writer.sinks[0]
  monkeypatch.setattr(record_writer, 'open_file', lambda path: open('/dev/full', 'wb'))
  sink._writer = record_writer.RecordWriter(sink.path)
  with pytest.raises(OSError) as raised:
    writer.write(ROWS[0])
  assert raised.value.errno == errno.ENOSPC
  assert raised.value.filename == sink.path     # the message names the event file
  assert read_metrics(workdir) == [ROWS[0]]      # the record was written first


def test_an_os_error_in_any_sink_surfaces_from_write(tmp_path):
  class ReadOnly:
    def write(self, record):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), 'elsewhere/log')

    def close(self):
      pass

  writer = MetricsWriter(str(tmp_path), sinks=[ReadOnly()])
  with pytest.raises(OSError, match='Read-only file system'):
    writer.write(ROWS[0])
  assert read_metrics(str(tmp_path)) == [ROWS[0]]
  writer.close()


def test_a_user_sink_gets_every_row_and_is_closed(tmp_path):
  class Collect:
    def __init__(self):
      self.rows, self.closed = [], False

    def write(self, record):
      self.rows.append(record)

    def close(self):
      self.closed = True

  mine = Collect()
  writer = MetricsWriter(str(tmp_path), sinks=[*metrics.make_sinks(str(tmp_path), SinkConfig()),
                                                mine])
  for row in ROWS:
    writer.write(row)
  writer.close()
  assert mine.rows == ROWS and mine.closed
  assert [step for step, _ in _scalars(str(tmp_path / 'tensorboard'))] == [5, 10]


def test_every_sink_is_closed_when_one_fails_to_close(tmp_path):
  closed = []

  class Sink:
    def __init__(self, fail):
      self.fail = fail

    def write(self, record):
      pass

    def close(self):
      closed.append(self)
      if self.fail:
        raise OSError(errno.EIO, 'I/O error')

  sinks = [Sink(True), Sink(False)]
  writer = MetricsWriter(str(tmp_path), sinks=sinks)
  with pytest.raises(OSError, match='I/O error'):
    writer.close()
  assert closed == sinks


# Weights & Biases, against a fake module (CI does not install the wandb extra).

@pytest.fixture
def fake_wandb(monkeypatch):
  calls = types.SimpleNamespace(init=[], log=[], finished=0)

  class Run:
    def log(self, data, step=None):
      calls.log.append((step, data))

    def finish(self):
      calls.finished += 1

  def init(**kwargs):
    calls.init.append(kwargs)
    return Run()

  module = types.ModuleType('wandb')
  module.__spec__ = importlib.machinery.ModuleSpec('wandb', None)
  module.init = init
  module.errors = types.SimpleNamespace(Error=type('Error', (Exception,), {}))
  monkeypatch.setitem(sys.modules, 'wandb', module)
  return calls


def test_wandb_sink_logs_each_row_offline_under_the_workdir(tmp_path, fake_wandb):
  workdir = str(tmp_path / 'run')
  os.makedirs(workdir)
  config = SinkConfig(tensorboard=False, wandb_project='loco-test')
  writer = MetricsWriter(workdir, sinks=metrics.make_sinks(workdir, config, {'steps': 10}))
  for row in ROWS:
    writer.write(row)
  writer.close()
  [init] = fake_wandb.init
  assert init['project'] == 'loco-test' and init['mode'] == 'offline'
  assert init['dir'] == workdir and init['resume'] == 'allow' and init['entity'] is None
  assert init['config'] == {'steps': 10}
  assert [step for step, _ in fake_wandb.log] == [5, 10]
  assert fake_wandb.log[1][1] == {'tokens': 640.0, 'train_loss': 4.25, 'eval_loss': 4.3,
                                  'tokens_per_second': 1300.0}
  assert fake_wandb.finished == 1


def test_a_resumed_run_continues_its_wandb_run(tmp_path, fake_wandb):
  config = SinkConfig(tensorboard=False, wandb_project='p', wandb_entity='team',
                      wandb_mode='online')
  for workdir in ('a', 'a', 'b'):
    for sink in metrics.make_sinks(str(tmp_path / workdir), config):
      sink.close()
  ids = [init['id'] for init in fake_wandb.init]
  assert ids[0] == ids[1] != ids[2]
  assert ids[0].startswith('a-') and ids[2].startswith('b-')
  assert {init['entity'] for init in fake_wandb.init} == {'team'}
  assert {init['mode'] for init in fake_wandb.init} == {'online'}


def test_a_wandb_run_that_cannot_start_is_one_config_error(tmp_path, fake_wandb,
                                                          monkeypatch):
  wandb = sys.modules['wandb']

  def no_key(**kwargs):
    raise wandb.errors.Error('No API key configured. Use `wandb login` to log in.')

  monkeypatch.setattr(wandb, 'init', no_key)
  with pytest.raises(ConfigError) as raised:
    metrics.make_sinks(str(tmp_path), SinkConfig(wandb_project='p', wandb_mode='online'))
  assert str(raised.value) == (
      'metrics.wandb_mode=online: W&B could not start the run: No API key configured. Use '
      '`wandb login` to log in; metrics.wandb_mode=offline needs no account or network.')


def test_wandb_is_imported_only_when_configured(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)   # any `import wandb` fails
  assert metrics.make_sinks(str(tmp_path), SinkConfig(tensorboard=False)) == []
  assert metrics.make_sinks(str(tmp_path), SinkConfig(
      tensorboard=False, wandb_project='p', wandb_mode='disabled')) == []


# The metrics.* keys.

def _config(**metrics_keys):
  c = default.get_config()
  for key, value in metrics_keys.items():
    c.metrics[key] = value
  return c


def test_wandb_without_the_extra_is_one_config_error(monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)
  with pytest.raises(ConfigError) as raised:
    configs.validate(_config(wandb_project='p'))
  assert str(raised.value) == ("metrics.wandb_project is set but wandb is not installed: "
                               "pip install -e '.[wandb]'")
  configs.validate(_config(wandb_project='p', wandb_mode='disabled'))
  configs.validate(_config())


def test_a_wrong_wandb_mode_is_one_config_error(fake_wandb):
  with pytest.raises(ConfigError, match=r"^metrics.wandb_mode must be one of offline, "
                                        r"online, disabled, got 'offlin'\.$"):
    configs.validate(_config(wandb_project='p', wandb_mode='offlin'))
  configs.validate(_config(wandb_project='p', wandb_mode='online'))


def test_metrics_keys_may_change_on_resume(tmp_path):
  old = default.get_config().to_dict()
  del old['metrics']                     # a run written before the metrics.* keys
  workdir_lib.write_json(str(tmp_path / workdir_lib.CONFIG), {'config': old})
  new = _config(wandb_project='p', wandb_mode='offline').to_dict()
  assert workdir_lib.Workdir(str(tmp_path)).check_resume(new, 10) == []
  new['seed'] = 1
  with pytest.raises(WorkdirError, match='seed'):
    workdir_lib.Workdir(str(tmp_path)).check_resume(new, 10)


def test_the_progress_bar_blanks_its_line_for_a_line_printed_under_it():
  """On a terminal the bar redraws one line with \\r; a line printed while it shows (the
  first eval's seconds) would run on after it, so `clear` blanks the bar first."""
  import io

  class Terminal(io.StringIO):
    def isatty(self):
      return True

  bar = metrics.ProgressBar(100)
  bar.stream, bar.tty = Terminal(), True
  bar.update(10, 3.0, 1000.0, step_seconds=0.1)
  drawn = bar.stream.getvalue()
  assert drawn.startswith('\r[##') and 'step 10/100' in drawn
  bar.clear()
  assert bar.stream.getvalue() == drawn + '\r' + ' ' * (len(drawn) - 1) + '\r'
  bar.clear()                                   # nothing drawn since: nothing written
  assert bar.stream.getvalue() == drawn + '\r' + ' ' * (len(drawn) - 1) + '\r'
