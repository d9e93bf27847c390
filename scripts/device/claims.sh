#!/usr/bin/env bash
# The claims page's runs (launch/claims.py) on a GPU host without network, for as many
# minutes as the lease allows; the same command on a CPU machine resumes them (it skips
# finished runs) and writes docs/claims.md.
#
#   bash scripts/device/claims.sh --out=DIR [--minutes=8] [--runs=DIR] \
#       [--from=.whl/claims_from.tgz] [launch.claims flags, e.g. --parallel=12 --batch_runs=6]
#
# --from continues this machine's study there: the ended runs packed here
# (`python scripts/device/runs_pack.py pack --runs=runs/claims70 --dest=.whl/claims_from.tgz`,
# carried with .whl) are unpacked first, so the host trains what is left (the rest of the
# tuning, then the finals, a warm start after its DDP run), in runs/claims70 as here
# (--runs' default with --from; /tmp/loco_runs/claims70 without). After --minutes the finished
# finals are scored there (their models do not travel), and only the runs that ended
# there come back; `runs_pack.py merge --src OUT/claims_runs*.tgz` adds them here (stop
# launch.claims first).
#
# Before, where pip and the published corpus are: scripts/device/prepare_wheels.py (the
# wheels the image lacks) and scripts/device/pack_stdlib.py (CPython 3.11's stdlib and its
# fingerprint, into .whl/). Here: the stdlib is unpacked and read through LOCO_STDLIB, and
# the run stops before training if the corpus's sha256 differs from the packed one. The
# device trains at float32 matmul precision (JAX_DEFAULT_MATMUL_PRECISION=highest, not the
# H100's TF32 default; docs/gpu.md measures both against the CPU). After --minutes the
# runs are interrupted as by Ctrl-C; the runs that ended (finished or diverged; a final
# once scored), without checkpoints or event files, are packed into DIR/claims_runs.tgz
# (then claims_runs-2.tgz, ... past 15 MB each) with the log (DIR/claims.log) and the
# host's facts.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT='' MINUTES=8 RUNS='' FROM='' PASS=()
for arg in "$@"; do
  case "$arg" in
    --out=*) OUT="${arg#--out=}" ;;
    --minutes=*) MINUTES="${arg#--minutes=}" ;;
    --runs=*) RUNS="${arg#--runs=}" ;;
    --from=*) FROM="${arg#--from=}" ;;
    *) PASS+=("$arg") ;;
  esac
done
if [[ -z "$OUT" ]]; then echo "claims.sh: error: --out=DIR is required." >&2; exit 2; fi
if ! [[ "$MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "claims.sh: error: --minutes must be a number, got '$MINUTES'." >&2; exit 2
fi
if [[ -n "$FROM" && ! -f "$FROM" ]]; then
  echo "claims.sh: error: --from $FROM is not a file." >&2; exit 2
fi
# Going on from this machine's runs, the runs live where they do here: a warm start's
# init_from names that path, and a final trained with another would not match its keys.
if [[ -z "$RUNS" ]]; then
  if [[ -n "$FROM" ]]; then RUNS=runs/claims70; else RUNS=/tmp/loco_runs/claims70; fi
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

mkdir -p "$RUNS"
if [[ -n "$FROM" ]]; then
  "$PY" scripts/device/runs_pack.py merge --runs="$RUNS" --src="$FROM"
fi
stamp="$OUT/.started"
touch "$stamp"
start=$(date +%s)
set +e
timeout -s INT -k 30 "${MINUTES}m" "$PY" -m launch.claims --out="$RUNS" "${PASS[@]}" \
  > "$OUT/claims.log" 2>&1
code=$?
echo "claims.sh: launch.claims ended with $code after $(( $(date +%s) - start )) s" \
  "(124 or 130: stopped at --minutes)" | tee -a "$OUT/claims.log"
# Score the finals that finished (no training; a final left unscored stays here and
# trains again where the study goes on). The page and its figures stay out of OUT.
timeout -s INT -k 10 90s "$PY" -m launch.claims --out="$RUNS" --page_only \
  --page=/tmp/loco_claims_page/claims.md "${PASS[@]}" >> "$OUT/claims.log" 2>&1
echo "claims.sh: scoring ended with $? (1: the tuning has not finished)" \
  | tee -a "$OUT/claims.log"
set -e
"$PY" scripts/device/runs_pack.py pack --runs="$RUNS" --dest="$OUT/claims_runs.tgz" \
  --newer="$stamp"
rm -f "$stamp"
ls -la "$OUT"
tail -5 "$OUT/claims.log"
