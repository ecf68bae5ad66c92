#!/usr/bin/env bash
# Regenerate sample_traces/chainer/mlp: a real ChainerMN run (2 ranks, naive communicator, CPU)
# profiled by traceview collect.
#   sample_traces/chainer/make_all.sh     (needs the main .venv and .venv-chainer: tests/make_envs.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
CHPY="${TRACEVIEW_CHAINER_PYTHON:-$PWD/.venv-chainer/bin/python}"
MPIRUN="$(dirname "$CHPY")/mpirun"  # the mpirun of the Open MPI that mpi4py was built against
export PATH="$PWD/.venv/bin:$PATH"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root --oversubscribe)
# Open MPI busy-polls while a rank waits in a collective: on 2 shared cores the waiting rank
# takes the core from the one still computing (the all-reduce then measured 3-7x longer).
yield=(--mca mpi_yield_when_idle 1)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
traceview collect --no-report -o "$work/run" -- \
    "$MPIRUN" "${root[@]}" "${yield[@]}" -np 2 "$CHPY" sample_traces/chainer/make_traces.py mlp "$work/mlp"
out=sample_traces/chainer/mlp
rm -rf "$out" && mkdir -p "$out"
cp "$work/mlp/groundtruth.json" "$out/"
cp "$work"/run/raw/rank-*/rank-*.chainer.json.gz "$out/"
ls -l "$out"
