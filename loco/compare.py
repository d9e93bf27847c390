"""`python -m loco.compare`: the command (its library: loco.lab.compare)."""

from loco import cli
from loco.lab.compare import main  # noqa: F401

if __name__ == '__main__':
  cli.exit(main())
