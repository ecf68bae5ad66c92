#!/usr/bin/env bash
# Refresh the pinned versions on purpose: rebuild every environment with the newest releases
# that pyproject.toml and the side environments allow, run the whole suite as CI does, and only
# if it passes write the versions it passed with into constraints/*.txt (review the diff, then
# commit it with the suite's result). Rebuilds .venv, .venv-mxnet, .venv-chainer and .venv-mpich.
#   constraints/refresh.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .venv-mxnet .venv-chainer .venv-mpich
TRACEVIEW_UNPINNED=1 bash .ci/run

freeze() {  # VENV DESCRIPTION [EXTRA...]: the venv's exact versions, traceview itself left out
    local venv=$1 description=$2
    shift 2
    echo "# $description"
    echo "# Written by constraints/refresh.sh from an environment whose whole suite passed; never edit by hand."
    { "$venv/bin/python" -m pip freeze 2>/dev/null | grep -v '^-e \|^traceview\|@ file\|^# Editable' \
        | sed 's/^\(torch==[0-9.]*\)+cpu$/\1/'
      for extra in "$@"; do "$venv/bin/python" -m pip freeze --all 2>/dev/null | grep -i "^$extra=="; done
    } | LC_ALL=C sort -f
}
freeze .venv "The test and CI environment (.venv): every package's exact version, for .ci/run and CONTRIBUTING.md." > constraints/ci.txt
freeze .venv-mxnet "The MXNet side environment (.venv-mxnet, tests/workloads/mxnet/make_venv.sh)." > constraints/mxnet.txt
freeze .venv-chainer "The Chainer side environment (.venv-chainer, tests/make_envs.sh)." setuptools wheel > constraints/chainer.txt
freeze .venv-mpich "The MPICH side environment (.venv-mpich, tests/make_envs.sh)." > constraints/mpich.txt
git --no-pager diff --stat -- constraints
