#!/usr/bin/env bash
# Runs one experiment on this machine: launch/local.sh CONFIG [WORKDIR] [--config.key=value ...]
# The workdir defaults to runs/<config name>; re-running resumes it.
set -euo pipefail
config=${1:?usage: launch/local.sh experiments/NAME.py [WORKDIR] [--config.key=value ...]}
shift
workdir="runs/$(basename "${config%.py}")"
if [[ $# -gt 0 && $1 != --* ]]; then workdir=$1; shift; fi
exec python -m loco.main --config="$config" --workdir="$workdir" "$@"
