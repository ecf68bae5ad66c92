#!/usr/bin/env bash
# The side environments some tests run jobs in (idempotent; tests skip, saying why, without them):
#   .venv-mxnet  MXNet 1.9.1, which imports only with numpy<1.24 (tests/workloads/mxnet/make_venv.sh)
#   .venv-mpich  MPICH's Hydra mpiexec (the `mpich` wheel), kept apart so that it does not shadow
#                Open MPI's mpirun in .venv
set -euo pipefail
cd "$(dirname "$0")/.."
tests/workloads/mxnet/make_venv.sh .venv-mxnet
if ! .venv-mpich/bin/mpiexec --version >/dev/null 2>&1; then
    python3 -m venv --clear .venv-mpich
    .venv-mpich/bin/python -m pip install --quiet "mpich>=4"
fi
echo ".venv-mpich: $(.venv-mpich/bin/mpiexec --version | grep -m1 Version: | tr -s ' ')"
