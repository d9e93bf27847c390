#!/usr/bin/env bash
# Prepares what travels to a GPU host without network: the wheels loco imports at run
# time that the host's image lacks, for its Python (3.12, manylinux x86-64), pinned,
# into .whl/ (git-ignored), then checks that they and the working tree fit the 64 MiB
# that travel with a call. Run it where pip reaches PyPI; the study then starts with
# scripts/device/gpu_study.sh on the host (README, "GPU").
#
#   bash scripts/device/prepare_wheels.sh [--python-version=3.12] [--dest=.whl]
#
# The image has jax, flax, optax, orbax-checkpoint, chex, absl-py, etils, numpy,
# sentencepiece, protobuf, psutil, pyarrow, requests, pyyaml, tqdm, wrapt, attrs, six,
# cloudpickle and tensorstore. What loco.main, the data pipeline and the study import
# besides (found by running the study's dry run in a venv without them,
# tests/test_gpu_study.py) is WHEELS; every other Requires-Dist of these packages
# (tfds's simple-parsing, termcolor, ...) is imported only on paths loco never takes.
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(
  ml-collections==1.1.0        # the configs (loco/configs, loco.main's flags)
  tensorflow-datasets==4.9.10  # the corpus as a TFDS ArrayRecord dataset (loco/data)
  grain==0.2.18                # the data pipeline (loco/data/pipeline.py)
  array-record==0.8.6          # grain's and tfds's file format
  tensorboardX==2.6.5          # metrics' TensorBoard sink (loco/metrics.py)
  portpicker==1.6.0            # imported by grain
  dm-tree==0.1.10              # imported by tfds
  immutabledict==4.3.1         # imported by tfds
  tensorflow-metadata==1.21.0  # imported by tfds (its protos need protobuf >= 6.31.1)
  toml==0.10.2                 # imported by tfds
)
SDIST_ONLY=(promise==2.3)      # imported by tfds; PyPI has no wheel: built here (pure Python)
# Installed on the host only if its protobuf is older than tensorflow-metadata's protos
# need (scripts/device/gpu_study.sh checks); kept apart so that .whl/*.whl skips it.
FALLBACK=(protobuf==6.33.5)
LIMIT=$((64 * 1024 * 1024))

PYVER=3.12
DEST=.whl
for arg in "$@"; do
  case "$arg" in
    --python-version=*) PYVER="${arg#*=}" ;;
    --dest=*) DEST="${arg#*=}" ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "prepare_wheels.sh: error: unknown argument '$arg' (takes --python-version=X.Y and --dest=DIR)" >&2; exit 2 ;;
  esac
done
if ! [[ "$PYVER" =~ ^3\.[0-9]+$ ]]; then
  echo "prepare_wheels.sh: error: --python-version must look like 3.12, got '$PYVER'" >&2
  exit 2
fi
PY="${PYTHON:-python3}"
mkdir -p "$DEST" "$DEST/fallback"
rm -f "$DEST"/*.whl "$DEST"/fallback/*.whl
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
download() {   # DIR SPEC...
  local dir="$1"; shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp "${PLATFORMS[@]}" -d "$dir" "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }
}
download "$DEST" "${WHEELS[@]}"
download "$DEST/fallback" "${FALLBACK[@]}"
"$PY" -m pip wheel -q --no-deps -w "$DEST" "${SDIST_ONLY[@]}" 2>&1 | { grep -v '^WARNING: Location' || true; }

"$PY" - "$DEST" "$LIMIT" "${#WHEELS[@]}" "${#SDIST_ONLY[@]}" <<'EOF'
import glob, os, subprocess, sys
dest, limit, wanted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) + int(sys.argv[4])
wheels = sorted(glob.glob(os.path.join(dest, '*.whl')))
fallback = sorted(glob.glob(os.path.join(dest, 'fallback', '*.whl')))
if len(wheels) != wanted:
  sys.exit(f'prepare_wheels.sh: error: {len(wheels)} wheels in {dest}, {wanted} expected.')
# What travels: the working tree (tracked files and untracked ones git does not ignore)
# and the wheels folder.
files = subprocess.run(['git', 'ls-files', '-z', '-co', '--exclude-standard'], text=True,
                       capture_output=True, check=True).stdout.split('\0')
tree = sum(os.path.getsize(f) for f in files if f and os.path.isfile(f))
size = lambda paths: sum(os.path.getsize(p) for p in paths)
mib = lambda n: f'{n / 2**20:.1f} MiB'
for w in wheels + fallback:
  print(f'  {os.path.relpath(w, dest):72s} {os.path.getsize(w) / 2**20:6.2f} MiB')
total = tree + size(wheels) + size(fallback)
print(f'wheels: {len(wheels)} in {dest}, {mib(size(wheels))} (+ fallback {mib(size(fallback))}); '
      f'working tree: {mib(tree)}; together {mib(total)} of {mib(limit)}')
if total > limit:
  sys.exit(f'prepare_wheels.sh: error: {mib(total)} is over the {mib(limit)} that travel.')
EOF
