"""`python -m loco.sweep`: the command (its library: loco.lab.sweep)."""

from loco import cli
from loco.lab.sweep import Run, grid, main  # noqa: F401

if __name__ == '__main__':
  cli.exit(main())
