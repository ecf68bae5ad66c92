#!/usr/bin/env bash
# Regenerate the PyTorch sample traces (ddp, explicit, slowio) with 2 ranks under Open MPI, the
# stragglers (slowfwd on 3 ranks, slowdata on 2), and the scaling set (ddp on 1, 2 and 4 ranks).
# Run from anywhere with the project venv active (or set PYTHON=/path/to/python).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
py="${PYTHON:-python}"
mpi_flags=()
if [ "$(id -u)" -eq 0 ]; then
  mpi_flags=(--allow-run-as-root --oversubscribe)
fi
for scenario in ddp explicit slowio; do
  out="sample_traces/pytorch/$scenario"
  cmd=(mpirun ${mpi_flags[@]+"${mpi_flags[@]}"} -np 2 "$py" sample_traces/pytorch/make_traces.py "$scenario" "$out")
  rm -f "$out"/rank-*.pt.trace.json* "$out"/groundtruth.json
  echo "+ ${cmd[*]}" >&2
  SAMPLE_TRACE_COMMAND="${cmd[*]}" "${cmd[@]}"
done
# The stragglers: rank 1 runs its forward three times (3 ranks), or loads each batch 15 ms slower
# (2 ranks). --bind-to none as below.
for spec in slowfwd:3 slowdata:2; do
  scenario="${spec%%:*}" n="${spec##*:}"
  out="sample_traces/pytorch/$scenario"
  mkdir -p "$out"
  cmd=(mpirun ${mpi_flags[@]+"${mpi_flags[@]}"} --bind-to none -np "$n" "$py" sample_traces/pytorch/make_traces.py "$scenario" "$out")
  rm -f "$out"/rank-*.pt.trace.json* "$out"/groundtruth.json
  echo "+ ${cmd[*]}" >&2
  SAMPLE_TRACE_COMMAND="${cmd[*]}" "${cmd[@]}"
done
# The scaling set: the ddp job on 1, 2 and 4 ranks. --bind-to none: Open MPI would otherwise
# bind oversubscribed ranks to one core, and the compute of 2 ranks would already double.
for n in 1 2 4; do
  out="sample_traces/pytorch/scaling/ranks-$n"
  mkdir -p "$out"
  cmd=(mpirun ${mpi_flags[@]+"${mpi_flags[@]}"} --bind-to none -np "$n" "$py" sample_traces/pytorch/make_traces.py ddp "$out")
  rm -f "$out"/rank-*.pt.trace.json* "$out"/groundtruth.json
  echo "+ ${cmd[*]}" >&2
  SAMPLE_TRACE_COMMAND="${cmd[*]}" "${cmd[@]}"
done
ls -l sample_traces/pytorch/*/ sample_traces/pytorch/scaling/*/
