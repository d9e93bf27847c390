"""The nano config as a config file for subprocess tests (its corpus and data dir from
$NANO_GLOB and $NANO_DATA)."""

import os

from tests.nano import make_nano_config


def get_config():
  return make_nano_config(os.environ['NANO_GLOB'], os.environ['NANO_DATA'])
