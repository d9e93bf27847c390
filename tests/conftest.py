"""Shared fixtures: a small text corpus and a fast base config for end-to-end runs."""

import glob
import os
import sysconfig

import pytest
from absl import logging

logging.set_verbosity(logging.WARNING)


@pytest.fixture(scope='session')
def small_corpus_glob() -> str:
  """About 400 KB of real text: the json and email packages of the standard library."""
  stdlib = sysconfig.get_paths()['stdlib']
  return os.path.join(stdlib, 'email', '*.py')


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp('tfds'))


def make_nano_config(text_glob: str, data_dir: str):
  """A config that trains the nano model for a few steps in seconds."""
  from experiments import base
  c = base.get_config()
  c.num_workers = 2
  c.steps = 20
  c.batch_per_worker = 2
  c.seq_len = 32
  c.model.preset = 'nano'
  c.data.source = 'text'
  c.data.text_glob = text_glob
  c.data.data_dir = data_dir
  c.optimizer.warmup_steps = 2
  c.log_every = 5
  c.eval.every = 10
  c.eval.batches = 2
  c.eval.batch_size = 4
  c.checkpoint.every = 10
  c.progress = False
  return c


@pytest.fixture
def nano_config(small_corpus_glob, data_dir):
  return make_nano_config(small_corpus_glob, data_dir)
