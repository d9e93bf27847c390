#!/usr/bin/env bash
# The accelerator study (launch/gpu_study.py): writes docs/gpu.md in about 8 minutes on
# one H100. On a host without network, from a copy of the working tree with .whl/
# (scripts/device/prepare_wheels.sh): where the host's Python lacks loco's run-time
# dependencies, the wheels are installed into /tmp/site first (nothing is fetched, loco is
# imported from the working tree); with loco installed (pip install -e .) it runs as is.
#
#   bash scripts/device/gpu_study.sh [--out=docs/gpu.md] [--phases=...] [--minutes=8] [--dry_run]
#
# PYTHON picks the interpreter (default python3), LOCO_WHEELS the wheels' folder (default
# .whl), LOCO_SITE the install folder (default /tmp/site).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/setup.sh
LOCO_STUDY_SH=1 exec "$PY" -m launch.gpu_study "$@"
