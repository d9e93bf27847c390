# Sourced by the scripts here: makes $PY import loco's run-time dependencies on a GPU host
# without network. Where the host's Python lacks them, the wheels in $WHL (made by
# scripts/device/prepare_wheels.py) are installed into $SITE first (nothing is fetched;
# loco is imported from the working tree); with loco installed (pip install -e .) nothing
# happens. PYTHON picks the interpreter (default python3), LOCO_WHEELS the wheels' folder
# (default .whl), LOCO_SITE the install folder (default /tmp/site).
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
    echo "${0##*/}: error: $PY lacks loco's dependencies and $WHL/ has no wheels: run" \
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
    echo "${0##*/}: $PY's protobuf is missing or older than 6.31.1, which" \
         "tensorflow-metadata needs: installed $WHL/fallback's"
  fi
  echo "${0##*/}: installed $(ls "$WHL"/*.whl | wc -l) wheels into $SITE in" \
       "$(( ($(date +%s%N) - start) / 1000000 )) ms"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
