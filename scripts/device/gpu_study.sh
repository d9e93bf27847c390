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
PY="${PYTHON:-python3}"
SITE="${LOCO_SITE:-/tmp/site}"
WHL="${LOCO_WHEELS:-.whl}"
NEEDED='import ml_collections, tensorflow_datasets, grain, array_record, tensorboardX'

install() {   # WHEEL...: into $SITE, offline; without pip, a wheel is a zip to unpack
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$@"
  else
    "$PY" -c 'import sys, zipfile
for w in sys.argv[2:]: zipfile.ZipFile(w).extractall(sys.argv[1])' "$SITE" "$@"
  fi
}

start=$(date +%s%N)
if ! "$PY" -c "$NEEDED" 2>/dev/null; then
  if ! ls "$WHL"/*.whl >/dev/null 2>&1; then
    echo "gpu_study.sh: error: $PY lacks loco's dependencies and $WHL/ has no wheels: run" \
         "scripts/device/prepare_wheels.sh where pip works (or pip install -e . here)." >&2
    exit 1
  fi
  install "$WHL"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  # tensorflow-metadata's protos need protobuf >= 6.31.1; an older image gets the spare.
  if ! "$PY" -c 'import sys; from google.protobuf import __version__ as v
sys.exit(tuple(int(x) for x in v.split(".")[:3]) < (6, 31, 1))' 2>/dev/null \
      && ls "$WHL"/fallback/protobuf-*.whl >/dev/null 2>&1; then
    install "$WHL"/fallback/protobuf-*.whl
    echo "gpu_study.sh: $PY's protobuf is missing or older than 6.31.1, which" \
         "tensorflow-metadata needs: installed $WHL/fallback's"
  fi
  echo "gpu_study.sh: installed $(ls "$WHL"/*.whl | wc -l) wheels into $SITE in" \
       "$(( ($(date +%s%N) - start) / 1000000 )) ms"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
LOCO_STUDY_SH=1 exec "$PY" -m launch.gpu_study "$@"
