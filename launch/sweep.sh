#!/usr/bin/env bash
# Runs (or resumes) a sweep on this machine: launch/sweep.sh launch/sweeps/NAME.py [--parallel=N] [--seeds=N] [--config.KEY=VALUE ...]
# Output and report.md in runs/sweeps/NAME; re-running skips finished runs and resumes interrupted ones.
set -euo pipefail
spec=${1:?usage: launch/sweep.sh launch/sweeps/NAME.py [--parallel=N] [--seeds=N] [--config.KEY=VALUE ...]}
shift
exec python -m loco.sweep "$spec" --out="runs/sweeps/$(basename "${spec%.py}")" "$@"
