"""`python -m loco.retime`: the command (its library: loco.lab.retime)."""

from loco import cli
from loco.lab.retime import main  # noqa: F401

if __name__ == '__main__':
  cli.exit(main())
