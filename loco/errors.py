"""Errors a user can cause; `loco.main` prints them as one sentence, no traceback."""


class LocoError(Exception):
  """Base class for errors caused by user input (config, data, topology, checkpoint)."""


class ConfigError(LocoError, ValueError):
  """A config key or value is wrong."""


class DataError(LocoError):
  """A dataset, data directory or tokenizer cannot be used."""


class CheckpointError(LocoError):
  """A checkpoint cannot be read."""


class DivergenceError(LocoError):
  """The training loss became NaN or infinite, or the model exploded."""


class WorkdirError(LocoError):
  """The workdir cannot be used: busy, unwritable, or holding an incompatible run."""


class Interrupted(LocoError):
  """The run was stopped by Ctrl-C or SIGTERM; the same command resumes it."""
