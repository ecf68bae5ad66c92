#!/usr/bin/env bash
# Regenerate sample_traces/mxnet/{dist_sync,dist_overlap,mlp,local} and their *_bulk runs
# ({dist_sync,dist_overlap,local}_bulk, with MXNet's bulk execution on): real MXNet runs
# profiled by traceview collect.
#   sample_traces/mxnet/make_all.sh               (needs the main .venv and .venv-mxnet, see README)
#   SCENARIOS=mlp sample_traces/mxnet/make_all.sh  (only some of them)
set -euo pipefail
cd "$(dirname "$0")/../.."
MXPY="${TRACEVIEW_MXNET_PYTHON:-$PWD/.venv-mxnet/bin/python}"
export PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for scenario in ${SCENARIOS:-dist_sync dist_overlap mlp local dist_sync_bulk dist_overlap_bulk local_bulk memory}; do
    if [ "${scenario%_bulk}" != local ]; then
        launcher=(traceview-dmlc -n 2 -s 1)
    else
        launcher=()
    fi
    traceview collect --no-report -o "$work/$scenario-run" -- \
        "${launcher[@]}" "$MXPY" sample_traces/mxnet/make_traces.py train "$scenario" "$work/$scenario"
    "$MXPY" sample_traces/mxnet/make_traces.py merge "$work/$scenario"
    out="sample_traces/mxnet/$scenario"
    rm -rf "$out" && mkdir -p "$out"
    cp "$work/$scenario/groundtruth.json" "$out/"
    for trace in "$work/$scenario-run"/raw/rank-*/rank-*.mxnet.json.gz; do
        cp "$trace" "$out/"
    done
    ls -l "$out"
done
