"""`python -m loco.calibrate`: the command (its library: loco.lab.calibrate)."""

from loco import cli
from loco.lab.calibrate import main  # noqa: F401

if __name__ == '__main__':
  cli.exit(main())
