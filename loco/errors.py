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
  """The training loss became NaN or infinite."""
