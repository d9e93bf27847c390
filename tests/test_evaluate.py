"""loco.evaluate: a finished run scored again from its checkpoint, and paired differences."""

import json
import math

import numpy as np
import pytest

from loco import evaluate
from loco import train
from loco.metrics import read_metrics


def test_rescoring_a_run_on_its_own_eval_windows_gives_its_logged_eval_loss(
    nano_config, tmp_path):
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
  assert again['se'] == pytest.approx(logged['eval_loss_se'], rel=1e-3)
  more = evaluate.evaluate_run(workdir, batches=8, batch_size=4)
  assert len(more['per_batch']) == 8 and more['loss'] != again['loss']
  path = evaluate.result_path(workdir, c.data.eval_split, 8, 4)
  assert evaluate.main([workdir, '--batches=8', '--batch_size=4']) == 0
  assert json.load(open(path))['per_batch'] == pytest.approx(more['per_batch'], abs=1e-6)


def test_paired_differences_remove_what_two_models_share():
  rng = np.random.default_rng(0)
  difficulty = rng.normal(2.0, 0.5, size=400)       # batches differ a lot
  a = difficulty + rng.normal(0, 0.01, 400)
  b = difficulty + 0.02 + rng.normal(0, 0.01, 400)
  d, se = evaluate.paired(a, b)
  assert d == pytest.approx(-0.02, abs=0.003)
  assert se == pytest.approx(math.sqrt(2) * 0.01 / 20, rel=0.15)
  assert se < np.std(a, ddof=1) / 20 / 10           # far below either run's own SE
  with pytest.raises(ValueError):
    evaluate.paired([1.0, 2.0], [1.0])


def test_a_directory_that_is_not_a_run_is_one_line(tmp_path, capsys):
  assert evaluate.main([str(tmp_path)]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'loco.evaluate: error: {tmp_path} is not a loco run (no readable config.json).']
