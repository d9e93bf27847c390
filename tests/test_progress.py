"""Progress lines of running runs: the text from metrics rows, following a growing
metrics.jsonl, and the display on a terminal and off it."""

import io
import json
import os

import pytest

from loco.run import progress
from loco.files.workdir import write_json


def _row(step, loss, tokens_per_second=100.0, **more):
  return dict(step=step, tokens=step * 10, train_loss=loss,
              tokens_per_second=tokens_per_second, **more)


def test_the_line_shows_step_loss_eval_and_an_eta_that_counts_down():
  t = progress.Tracker(started=1000.0, total_steps=100)
  assert t.text(1035.0) == 'starting 0:00:35'
  t.add(_row(10, 3.4567), now=1040.0)
  # One row: its own speed, (100 - 10) steps x 10 tokens / 100 tokens/s = 9 s.
  assert t.text(1040.0) == 'step 10/100  loss 3.457  eta 0:00:09'
  t.add(_row(20, 3.2, eval_loss=3.3), now=1060.0)
  # Two rows: what this process saw, 20 s per 10 steps (evals included), 80 steps left.
  assert t.text(1060.0) == 'step 20/100  loss 3.200  eval 3.300  eta 0:02:40'
  assert t.text(1070.0) == 'step 20/100  loss 3.200  eval 3.300  eta 0:02:30'
  t.add(_row(30, 3.1), now=1080.0)
  assert t.text(1080.0) == 'step 30/100  loss 3.100  eval 3.300  eta 0:02:20'   # last eval
  t.add(_row(100, 2.9), now=1300.0)
  assert t.text(1400.0) == 'step 100/100  loss 2.900  eval 3.300  eta 0:00:00'


def test_rows_read_at_once_give_no_rate_and_a_rewritten_file_starts_again():
  t = progress.Tracker(started=0.0, total_steps=100)
  for step in (10, 20, 30):           # a resumed run's earlier rows, read together
    t.add(_row(step, 3.0, tokens_per_second=0.0), now=50.0)
  assert t.text(50.0) == 'step 30/100  loss 3.000  eta ?'    # no speed known yet
  t.add(_row(40, 3.0), now=60.0)
  assert t.eta(60.0) == pytest.approx(60.0)     # 10 s per 10 steps since step 30
  t.add(_row(20, 3.0), now=100.0)     # the resume dropped rows after its checkpoint
  t.add(_row(30, 3.0), now=110.0)
  assert t.eta(110.0) == pytest.approx(70.0)


def test_asynchronous_runs_count_ticks_and_progress_by_tokens():
  t = progress.Tracker(started=0.0, total_steps=100, total_tokens=2000, ticks=True)
  t.add(dict(step=150, tokens=500, train_loss=3.0), now=10.0)
  t.add(dict(step=300, tokens=1000, train_loss=2.5), now=20.0)
  assert t.text(20.0) == 'tick 300 (50%)  loss 2.500  eta 0:00:20'   # 10 s per 25%


def test_a_follower_reads_what_the_run_appends_and_a_rewrite(tmp_path):
  wd = str(tmp_path)
  f = progress.Follower(wd, started=0.0)
  f.poll(5.0)
  assert f.text(5.0) == 'starting 0:00:05'           # no files yet
  write_json(os.path.join(wd, 'config.json'), dict(config=dict(
      steps=100, num_workers=2, batch_per_worker=2, seq_len=5, network=dict(mode='sync'))))
  path = os.path.join(wd, 'metrics.jsonl')
  with open(path, 'w') as out:
    out.write(json.dumps(dict(step=10, tokens=200, train_loss=3.5)) + '\n')
    out.write('{"step": 20, "tok')                   # half-written: not read yet
  f.poll(10.0)
  assert f.text(10.0) == 'step 10/100  loss 3.500  eta ?'
  assert f.tracker.total_tokens == 2000
  with open(path, 'a') as out:
    out.write('ens": 400, "train_loss": 3.25}\nnot json\n')
  f.poll(20.0)
  assert f.text(20.0) == 'step 20/100  loss 3.250  eta 0:01:20'
  os.replace(_write(tmp_path / 'new', [dict(step=10, tokens=200, train_loss=3.5)]), path)
  f.poll(30.0)                                       # a resume rewrote it, shorter
  assert f.text(30.0).startswith('step 10/100  loss 3.500')


def _write(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def test_off_a_terminal_lines_are_printed_every_interval():
  out = io.StringIO()
  board = progress.Board(out, every=30.0, now=0.0)
  assert not board.tty
  board.show(['running a  step 1/10'], now=10.0)
  board.say('start   b')
  assert out.getvalue() == 'start   b\n'
  board.show(['running a  step 2/10', 'running b  starting 0:00:20'], now=30.0)
  board.show(['running a  step 3/10'], now=45.0)
  board.show(['running a  step 4/10'], now=50.0, force=True)
  board.close()
  assert out.getvalue().splitlines() == [
      'start   b', 'running a  step 2/10', 'running b  starting 0:00:20',
      'running a  step 4/10']
  quiet = io.StringIO()
  off = progress.Board(quiet, every=0, now=0.0)
  off.show(['x'], now=100.0, force=True)
  off.say('finished a')
  assert quiet.getvalue() == 'finished a\n'


def test_on_a_terminal_lines_are_redrawn_in_place_below_what_was_said():
  out = io.StringIO()
  board = progress.Board(out, every=30.0, tty=True, now=0.0)
  board.say('start   a')
  board.show(['a  step 1', 'b  step 1'], now=0.1)
  assert out.getvalue() == 'start   a\na  step 1\nb  step 1\n'
  board.show(['a  step 1', 'b  step 1'], now=0.5)           # unchanged, < 1 s: no redraw
  board.show(['a  step 2'], now=0.6)
  board.say('finished b')
  board.close()
  up2, up1 = '\x1b[2A\r\x1b[J', '\x1b[1A\r\x1b[J'
  assert out.getvalue() == ('start   a\na  step 1\nb  step 1\n'
                            f'{up2}a  step 2\n'
                            f'{up1}finished b\na  step 2\n'
                            f'{up1}')
  # What stays on the screen: the lines said, then nothing.
  assert _screen(out.getvalue()) == ['start   a', 'finished b']


def _screen(text):
  """The lines a terminal shows after `text` (only \\n, cursor up + \\r, clear below)."""
  lines, row = [''], 0
  i = 0
  while i < len(text):
    if text.startswith('\x1b[', i):
      end = i + 2
      while not text[end].isalpha():
        end += 1
      code, arg = text[end], text[i + 2:end]
      if code == 'A':
        row -= int(arg or 1)
      elif code == 'J':
        del lines[row + 1:]
        lines[row] = ''
      i = end + 1
    elif text[i] == '\r':
      i += 1
    elif text[i] == '\n':
      row += 1
      if row == len(lines):
        lines.append('')
      i += 1
    else:
      lines[row] += text[i]
      i += 1
  return [line for line in lines if line]


def test_batched_runs_print_one_line_each_at_evals_and_every_interval():
  out = io.StringIO()
  p = progress.RunsProgress(['runs/s/a/seed=0', 'runs/s/a/seed=1', 'runs/s/b'], 100,
                            every=10.0, stream=out)
  start = p.board._last
  p.update({0: _row(10, 3.0), 1: _row(10, 3.1), 2: _row(10, 3.2)}, now=start + 1)
  assert out.getvalue() == ''                                 # not yet 10 s
  p.update({0: _row(20, 2.9, eval_loss=3.0), 2: _row(20, 3.1, eval_loss=3.2)}, now=start + 2)
  assert out.getvalue().splitlines() == [
      'a/seed=0  step 20/100  loss 2.900  eval 3.000  eta 0:00:08',
      'a/seed=1  step 10/100  loss 3.100  eta 0:00:08',
      'b         step 20/100  loss 3.100  eval 3.200  eta 0:00:08']
  p.close()
  quiet = io.StringIO()
  off = progress.RunsProgress(['a', 'b'], 10, enabled=False, stream=quiet)
  off.update({0: _row(10, 3.0)}, now=1e12)
  assert quiet.getvalue() == ''
  assert progress.short_names(['x/a']) == ['a']
  assert progress.short_names(['/r/x/seed=0', '/r/x/seed=1']) == ['x/seed=0', 'x/seed=1']
  assert progress.short_names(['x/seed=0']) == ['x/seed=0']
