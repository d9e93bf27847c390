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


class UsageError(LocoError):
  """A command line or sweep spec a command cannot use; its boundary exits with 2."""
  exit_code = 2


class RunFileError(LocoError):
  """A file of a run directory is damaged (not JSON, a bad row, cut short): one sentence
  naming the file and, where it has lines, the line."""


class Interrupted(LocoError):
  """The run was stopped by Ctrl-C or SIGTERM; the same command resumes it."""
