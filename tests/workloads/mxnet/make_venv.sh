#!/usr/bin/env bash
# Create the MXNet environment that the MXNet tests and sample scripts run in (idempotent).
#   tests/workloads/mxnet/make_venv.sh [VENV]        default: .venv-mxnet in the repository
# MXNet 1.9.1 is the last release on PyPI; it imports only with numpy < 1.24 (np.bool).
# traceview itself never imports mxnet; the training jobs run in this environment.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VENV="${1:-.venv-mxnet}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import mxnet, traceview.collectors" >/dev/null 2>&1; then
    echo "$VENV: mxnet $("$VENV/bin/python" -c 'import mxnet; print(mxnet.__version__)') already there"
    exit 0
fi
# at the versions in constraints/mxnet.txt (TRACEVIEW_UNPINNED=1: the newest allowed)
PIN=(-c constraints/mxnet.txt)
[ -z "${TRACEVIEW_UNPINNED:-}" ] || PIN=()
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "${PIN[@]}" "mxnet==1.9.1" "numpy<1.24"
# traceview too, without its dependencies, for scripts that mark their own steps (import
# traceview.collectors: the standard library only). Its command line needs pyarrow and
# NumPy >= 1.26, which MXNet cannot import beside: run it from .venv.
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
echo "$VENV: mxnet $("$VENV/bin/python" -c 'import mxnet; print(mxnet.__version__)') installed"
