"""The nano config of the end-to-end tests (importable by config files and subprocesses:
no side effects on import)."""


def make_nano_config(text_glob: str, data_dir: str):
  """A config that trains the nano model for a few steps in seconds."""
  from loco.configs import default
  c = default.get_config()
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
