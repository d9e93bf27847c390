"""`python -m loco.report`: the command (its library: loco.lab.report)."""

from loco import cli
from loco.lab.report import main  # noqa: F401

if __name__ == '__main__':
  cli.exit(main())
