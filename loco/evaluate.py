"""`python -m loco.evaluate`: the command (its library: loco.run.evaluate)."""

from loco import cli
from loco.run.evaluate import main  # noqa: F401

if __name__ == '__main__':
  cli.exit(main())
