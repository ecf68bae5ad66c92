"""Holistic Trace Analysis's critical path of one step of a single-rank Kineto GPU trace, as JSON.

  python -m tests.hta_critical_path TRACE [--step N] [--top 10]

Runs HTA's own CriticalPathAnalysis (``TraceAnalysis.critical_path_analysis(rank, "ProfilerStep",
instance)``) on ProfilerStep#N (default: the middle step HTA loads; HTA itself advises against the
first, and leaves the trace's last ProfilerStep out) and prints

  {"trace", "rank", "step", "step_ms" (the ProfilerStep's own duration), "total_ms" (the sum of the
   path's edge weights), "path_start_ms", "path_end_ms" (its first and last node, from the
   ProfilerStep's start), "by_bound": {HTA's bound_by: ms}, "edges": {edge type: count},
   "top": [{"name", "kind", "ms"}], "path": [{"name", "kind", "correlation", "ms"}]}

``top``: the path's time per event name (the name as the trace spells it, not HTA's shortened
one), largest first; kind "kernel" (a GPU kernel, memcpy or memset), "cpu_op" (a CPU operator's
own time between its children, or a runtime call), "launch" (launch delay: the runtime call's start
to its kernel's start, on an idle stream), "kernel_gap" (the gap since the previous kernel on the
stream). ``path``: every edge of the path with time, with the event's correlation id (kernels and
runtime calls; null for CPU operators) so that a reader can name it as its own tool does. Zero-weight
edges (dependencies and synchronizations) carry no time and are left out.

What HTA's path holds (hta 0.5.0, analyzers/critical_path_analysis.py):
- nodes: the start and end of every event of cat cpu_op, cuda_runtime or cuda_driver that starts
  inside the ProfilerStep's window with a positive duration (ProfilerStep itself is a
  user_annotation: not a node), and of every GPU event whose launching runtime call does;
- edges inside one CPU thread's call stack, weighted by the time between the two nodes: parent
  start -> first child start -> child end -> next child start ... -> parent end (a parent's self
  time, attributed to it); between two consecutive top-level operators of a thread a
  zero-weight "dependency" edge: the thread's idle gaps between top-level operators count nothing;
  the time into the end of a blocking call (cudaDeviceSynchronize, cudaStreamSynchronize,
  cudaEventQuery/Synchronize, cudaMemcpy, cudaMemcpyAsync) has zero weight;
- no edge between two CPU threads (the autograd thread's backward is not tied to the main
  thread) and none for collectives across ranks (one rank only);
- kernel start -> end (its duration); a launch-delay edge (runtime start -> kernel start) where the
  stream was empty when launched, else a kernel-kernel edge (previous kernel's end on the stream
  -> kernel start, the gap); zero-weight sync edges: kernel end -> the CPU's synchronize call's
  end (stream, context and event synchronizations), and kernel -> kernel across streams
  (cudaStreamWaitEvent);
- the path: networkx.dag_longest_path by weight over that graph. Its span is therefore not the
  ProfilerStep's: it starts at the first node of the heaviest chain and ends at its last node,
  which on a GPU-bound step is the last of the step's kernels, running after the ProfilerStep
  ended (the CPU runs ahead); the total excludes zero-weight gaps.

HTA 0.5.0 calls DataFrame.drop(axis=1, columns=...), which pandas 3 refuses; `_pandas3_drop`
drops the redundant ``axis`` in those calls (same meaning) so it runs on this environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any


def _pandas3_drop() -> None:
    import pandas as pd

    inner = pd.DataFrame.drop
    if getattr(inner, "_tv_shim", False):
        return

    def drop(self: Any, labels: Any = None, *, axis: Any = 0, index: Any = None,
             columns: Any = None, **kw: Any) -> Any:  # fmt: skip
        if index is not None or columns is not None:
            return inner(self, labels, index=index, columns=columns, **kw)
        return inner(self, labels, axis=axis, **kw)

    drop._tv_shim = True  # type: ignore[attr-defined]
    pd.DataFrame.drop = drop  # type: ignore[method-assign]


KINDS = {
    "critical_path_operator": None,  # kernel or cpu_op, by the event's stream
    "critical_path_kernel_launch_delay": "launch",
    "critical_path_kernel_kernel_delay": "kernel_gap",
}


def hta_critical_path(trace: Path, step: int | None = None, top: int = 10) -> dict[str, Any]:
    """HTA's critical path of ProfilerStep#``step`` of ``trace`` (one rank's Kineto JSON)."""
    _pandas3_drop()
    logging.disable(logging.WARNING)  # HTA logs every unmatched sync event
    warnings.filterwarnings("ignore")  # and pandas warns about HTA's calls
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as tmp:
        # HTA reads a folder of traces; a link keeps the shared file as it is
        (Path(tmp) / trace.name).symlink_to(trace.resolve())
        analysis = TraceAnalysis(trace_dir=tmp)
    rank = next(iter(analysis.t.traces))
    df = analysis.t.get_trace(rank)
    names = analysis.t.symbol_table.get_sym_table()
    is_step = df["name"].map(lambda i: str(names[i]).startswith("ProfilerStep#"))
    steps = df[is_step].sort_values("ts")
    numbers = [int(str(names[i]).split("#")[1]) for i in steps["name"]]
    if not numbers:
        raise SystemExit(f"{trace}: no ProfilerStep in the trace")
    if step is None:
        step = numbers[len(numbers) // 2]
    if step not in numbers:
        raise SystemExit(f"{trace}: HTA loads ProfilerStep {numbers}, not {step}")
    instance = numbers.index(step)
    marker = steps.iloc[instance]
    found = analysis.critical_path_analysis(rank, "ProfilerStep", instance)
    if found is None or not found[1]:
        raise SystemExit(f"{trace}: HTA's critical path failed on ProfilerStep#{step}")
    graph = found[0]
    nodes = [graph.node_list[n] for n in graph.critical_path_nodes]
    per_name: dict[tuple[str, str], float] = defaultdict(float)
    by_bound: dict[str, float] = defaultdict(float)
    edges: dict[str, int] = defaultdict(int)
    path: list[dict[str, Any]] = []
    for e in graph.critical_path_edges_set:
        edges[e.type.value] += 1
        if e.weight <= 0:
            continue
        event = graph.get_event_attribution_for_edge(e)
        row = df.loc[event] if event is not None and event >= 0 else None
        kind = KINDS.get(e.type.value)
        if kind is None:
            kind = "kernel" if row is not None and row["stream"] >= 0 else "cpu_op"
        name = str(names[row["name"]]) if row is not None else "?"
        per_name[(name, kind)] += e.weight / 1e3
        corr = int(row["correlation"]) if row is not None and row["correlation"] >= 0 else None
        path.append({"name": name, "kind": kind, "correlation": corr, "ms": e.weight / 1e3})
        bound = "gpu_kernel_kernel_overhead" if kind == "kernel_gap" else (
            "gpu_kernel_launch_overhead" if kind == "launch" else (
                "cpu_bound" if kind == "cpu_op" else "gpu"))  # fmt: skip
        by_bound[bound] += e.weight / 1e3
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1])
    start = float(marker["ts"])
    return {
        "trace": str(trace),
        "rank": int(rank),
        "step": step,
        "step_ms": float(marker["dur"]) / 1e3,
        "total_ms": sum(per_name.values()),
        "path_start_ms": (nodes[0].ts - start) / 1e3,
        "path_end_ms": (nodes[-1].ts - start) / 1e3,
        "by_bound": dict(by_bound),
        "edges": dict(edges),
        "top": [{"name": n, "kind": k, "ms": ms} for (n, k), ms in ranked[:top]],
        "path": path,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument(
        "--step", type=int, default=None, help="ProfilerStep#N (default: the middle one)"
    )
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    try:
        import hta  # noqa: F401
    except ImportError:
        print(
            "HolisticTraceAnalysis is not installed (pip install HolisticTraceAnalysis)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    print(json.dumps(hta_critical_path(args.trace, args.step, args.top), indent=1))


if __name__ == "__main__":
    main()
