"""loco.evaluate: a finished run scored again from its checkpoint, and paired differences."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loco.run import evaluate
from loco.run import train
from loco.files.metrics import read_metrics


@pytest.mark.slow
def test_rescoring_a_run_on_its_own_eval_windows_gives_its_logged_eval_loss(
    nano_config, tmp_path, capsys):
  """The mean model of the last checkpoint on the run's eval windows is the run's last
  logged eval (the same windows, the same averaged model); more windows differ."""
  c = nano_config
  c.num_workers = 2
  c.algorithm.name = 'diloco'
  c.algorithm.sync_every = 5
  c.steps = 10
  workdir = str(tmp_path / 'run')
  train.run(c, workdir)
  logged = [r for r in read_metrics(workdir) if 'eval_loss' in r][-1]
  again = evaluate.evaluate_run(workdir, batches=c.eval.batches, batch_size=c.eval.batch_size)
  assert again['step'] == logged['step'] == c.steps
  assert again['loss'] == pytest.approx(logged['eval_loss'], abs=1e-5)
  if again['documents'] > 1:
    assert again['se'] == pytest.approx(logged['eval_loss_se'], rel=1e-3)
  else:   # one document: no clustered SE, in the log or here
    assert again['se'] is None and 'eval_loss_se' not in logged
  more = evaluate.evaluate_run(workdir, batches=8, batch_size=4)
  assert len(more['per_batch']) == 8 and more['loss'] != again['loss']
  assert np.asarray(more['window_losses']).shape == np.asarray(more['window_docs']).shape == (8, 4)
  assert more['loss'] == pytest.approx(np.mean(more['window_losses']), abs=1e-9)
  assert more['documents'] == len(set(np.ravel(more['window_docs'])))
  path = evaluate.result_path(workdir, c.data.eval_split, 8, 4)
  assert evaluate.main([workdir, '--batches=8', '--batch_size=4']) == 0
  assert json.load(open(path))['per_batch'] == pytest.approx(more['per_batch'], abs=1e-6)
  assert json.load(open(path))['diverged'] is None
  # A run that diverged is scored at its last good checkpoint, and says so.
  with open(os.path.join(workdir, 'diverged.json'), 'w') as f:
    json.dump({'step': 12, 'message': 'train loss nan at step 12'}, f)
  assert evaluate.main([workdir, '--batches=8', '--batch_size=4']) == 0
  assert json.load(open(path))['diverged'] == {'step': 12,
                                               'message': 'train loss nan at step 12'}
  line = capsys.readouterr().out.splitlines()[-1]
  assert line.startswith(f'{workdir}: step 10, its last good checkpoint (the run diverged '
                         'at step 12: not a finished run), eval loss '), line


@pytest.mark.slow
def test_the_eval_keeps_each_windows_loss_and_clusters_its_se_by_document():
  """The in-loop evaluator scores the mean of the workers' models window by window; its
  SE is the CR1 document-clustered one, computed here by hand."""
  from loco import data as data_lib, model as model_lib
  cfg = model_lib.model_config('nano', vocab_size=64)
  graphdef, params = model_lib.init_params(cfg, jax.random.key(0))
  other = jax.tree.map(lambda x: x * 0.9, params)
  stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, other)
  mean = jax.tree.map(lambda x: x.mean(0), stacked)
  tokens = np.asarray(jax.random.randint(jax.random.key(1), (3, 2, 17), 0, 64), np.int32)
  docs = np.array([[0, 0], [1, 1], [2, 0]], np.int32)
  windows = data_lib.EvalWindows(tokens, docs, documents_read=3, split_documents=3)
  out = evaluate.make_evaluator(cfg, graphdef, per_worker=True)(stacked, windows)
  per_window = np.array([[float(model_lib.loss_fn(cfg, graphdef, mean, tokens[i, j:j + 1])[1]['ce'])
                          for j in range(2)] for i in range(3)])
  assert out['eval_loss'] == pytest.approx(per_window.mean(), rel=1e-5)
  # CR1 by hand: residual sums per document, G = 3 documents, n = 6 windows.
  r = per_window - per_window.mean()
  sums = [r[0, 0] + r[0, 1] + r[2, 1], r[1, 0] + r[1, 1], r[2, 0]]
  se = math.sqrt(3 / 2 * sum(x * x for x in sums) / 36)
  assert out['eval_loss_se'] == pytest.approx(se, rel=1e-4)
  own = [np.mean([float(model_lib.loss_fn(cfg, graphdef, p, tokens[i])[1]['ce'])
                  for i in range(3)]) for p in (params, other)]
  assert out['eval_loss_workers'] == pytest.approx(np.mean(own), rel=1e-5)
  assert out['worker_spread'] > 0
  one_doc = data_lib.EvalWindows(tokens, np.zeros_like(docs), 1, 1)
  assert 'eval_loss_se' not in evaluate.make_evaluator(cfg, graphdef, False)(stacked, one_doc)


def test_bad_batch_counts_are_one_line_and_write_nothing(nano_config, tmp_path, capsys):
  for bad in ('0', '-3', 'x'):
    with pytest.raises(SystemExit) as e:
      evaluate.main([str(tmp_path), f'--batches={bad}'])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('loco.evaluate: error: argument --batches')
  assert not os.path.exists(tmp_path / 'evals')


def test_a_directory_that_is_not_a_run_is_one_line(tmp_path, capsys):
  assert evaluate.main([str(tmp_path)]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'loco.evaluate: error: {tmp_path} is not a loco run (no readable config.json).']


def _one_line(capsys, code, expected):
  err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
  assert code == expected and len(err) == 1 and 'Traceback' not in err[0], err
  return err[0]


def test_damaged_or_foreign_runs_are_one_line(tmp_path, capsys):
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'config.json').write_text('{"config": ')
  line = _one_line(capsys, evaluate.main([str(run)]), 1)
  assert line.startswith('loco.evaluate: error:') and 'config.json' in line
  (run / 'config.json').write_text('{"config": {"steps": 3}}')   # no model: foreign
  assert 'not a loco run' in _one_line(capsys, evaluate.main([str(run)]), 1)
  (tmp_path / 'file').write_text('x')
  assert 'is not a directory' in _one_line(capsys, evaluate.main([str(tmp_path / 'file')]), 1)
  assert not (run / 'evals').exists()


def test_a_full_disk_and_ctrl_c_are_one_line(tmp_path, capsys, monkeypatch):
  import errno

  def full(run, *args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(run, 'evals', 'x.json'))
  monkeypatch.setattr(evaluate, 'evaluate_run', full)
  line = _one_line(capsys, evaluate.main([str(tmp_path)]), 1)
  assert line == f'loco.evaluate: error: {tmp_path}/evals/x.json: the disk is full'

  def interrupted(*args):
    raise KeyboardInterrupt
  monkeypatch.setattr(evaluate, 'evaluate_run', interrupted)
  assert _one_line(capsys, evaluate.main([str(tmp_path)]), 130).startswith(
      'loco.evaluate: stopped: interrupted')


def test_scoring_in_chunks_equals_one_call_and_pads_the_last_chunk():
  """Chunks of CHUNK_BATCHES batches (the last padded, its padding dropped) give the
  losses of one call over all batches, in order."""
  calls = []

  def scorer(params, tokens):
    calls.append(tokens.shape)
    return jnp.mean(tokens.astype(jnp.float32), axis=-1) * params

  tokens = np.arange(37 * 2 * 5).reshape(37, 2, 5)
  got = evaluate._score_in_chunks(scorer, 2.0, tokens)
  np.testing.assert_allclose(got, np.asarray(scorer(2.0, jnp.asarray(tokens))))
  assert calls[:-1] == [(evaluate.CHUNK_BATCHES, 2, 5)] * 3 and got.shape == (37, 2)
  calls.clear()
  assert evaluate._score_in_chunks(scorer, 1.0, tokens[:3]).shape == (3, 2)
  assert calls == [(3, 2, 5)]
