#!/usr/bin/env bash
# The claims page's runs (launch/claims.py) on a GPU host without network, for as many
# minutes as the lease allows; the same command on a CPU machine resumes them (it skips
# finished runs) and writes docs/claims.md.
#
#   bash scripts/device/claims.sh --out=DIR [--minutes=8] [--runs=/tmp/loco_runs/claims70] \
#       [launch.claims flags, e.g. --parallel=12 --batch_runs=6]
#
# Before, where pip and the published corpus are: scripts/device/prepare_wheels.py (the
# wheels the image lacks) and scripts/device/pack_stdlib.py (CPython 3.11's stdlib and its
# fingerprint, into .whl/). Here: the stdlib is unpacked and read through LOCO_STDLIB, and
# the run stops before training if the corpus's sha256 differs from the packed one. The
# device trains at float32 matmul precision (JAX_DEFAULT_MATMUL_PRECISION=highest, not the
# H100's TF32 default; docs/gpu.md measures both against the CPU). After --minutes the
# runs are interrupted as by Ctrl-C; finished runs, without checkpoints or event files,
# are packed into DIR/claims_runs.tgz with the log (DIR/claims.log) and the host's facts.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT='' MINUTES=8 RUNS=/tmp/loco_runs/claims70 PASS=()
for arg in "$@"; do
  case "$arg" in
    --out=*) OUT="${arg#--out=}" ;;
    --minutes=*) MINUTES="${arg#--minutes=}" ;;
    --runs=*) RUNS="${arg#--runs=}" ;;
    *) PASS+=("$arg") ;;
  esac
done
if [[ -z "$OUT" ]]; then echo "claims.sh: error: --out=DIR is required." >&2; exit 2; fi
if ! [[ "$MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "claims.sh: error: --minutes must be a number, got '$MINUTES'." >&2; exit 2
fi
mkdir -p "$OUT"
source scripts/device/setup.sh

if [[ -f "$WHL/stdlib.tar.xz" ]]; then
  lib=/tmp/loco_stdlib
  rm -rf "$lib" && mkdir -p "$lib"
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$WHL/stdlib.tar.xz" "$lib"   # Python's tarfile: the host may lack xz
  export LOCO_STDLIB="$lib/stdlib"
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest
# status.json's host: the page costs these runs apart from the CPU machine's.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
export LOCO_HOST="${LOCO_HOST:-one ${gpu:-$(hostname)} (scripts/device/claims.sh)}"
# No GEMM autotuning: with a dozen runs compiling at once on one H100, autotuning alone
# took 2-3 minutes per fusion and no run passed its first step in 8 minutes (the micro
# model's matmuls are far too small for the choice of kernel to matter).
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=0"
# The corpus, prepared once here (not by the parallel runs at once), and checked.
"$PY" - "$WHL/stdlib.json" <<'PYEOF'
import json, os, sys
import loco.data as ld
from loco.data.config import DataConfig
got = ld.dataset_fingerprint(DataConfig())['sha256']
want = json.load(open(sys.argv[1]))['sha256'] if os.path.exists(sys.argv[1]) else None
print(f'claims.sh: corpus sha256 {got[:16]} ({"as packed" if got == want else "no packed one" if want is None else "DIFFERS"})')
if want is not None and got != want:
  sys.exit(f'claims.sh: error: the corpus here is not the packed one ({got[:16]} != {want[:16]}).')
PYEOF
{ nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
  "$PY" -c 'import jax, sys; print(sys.version.split()[0], jax.__version__, jax.devices())'
} > "$OUT/host.txt" 2>&1 || true

start=$(date +%s)
set +e
timeout -s INT -k 30 "${MINUTES}m" "$PY" -m launch.claims --out="$RUNS" "${PASS[@]}" \
  > "$OUT/claims.log" 2>&1
code=$?
set -e
echo "claims.sh: launch.claims ended with $code after $(( $(date +%s) - start )) s" \
  "(124 or 130: stopped at --minutes)" | tee -a "$OUT/claims.log"
tar czf "$OUT/claims_runs.tgz" --exclude=checkpoints --exclude=tensorboard --exclude=.lock \
  -C "$RUNS" .
ls -la "$OUT"
tail -5 "$OUT/claims.log"
