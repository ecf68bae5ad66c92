#!/usr/bin/env python3
"""One measurement of one in-process loader; run by bench_ingest.py in a fresh interpreter.

    python _ingest_worker.py LOADER RESULT.json TRACE_DIR TRACE_FILE...

Imports the loader's modules, records the RSS after imports (the baseline), loads every
trace file (the way the tool does it for a directory), keeps what the tool keeps, and
writes one JSON object to RESULT.json. Standalone on purpose (stdlib only), so it can run
under another interpreter (--competitor-python) than the harness.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read()
    return gzip.decompress(data) if path.endswith(".gz") else data


# Each loader: setup() does the imports and returns load(trace_dir, files) -> summary dict.
def _setup_json() -> Callable[[str, list[str]], dict[str, Any]]:
    def load(trace_dir: str, files: list[str]) -> dict[str, Any]:
        n = 0
        for f in files:  # one file at a time: decompressed bytes -> json.loads -> dropped
            doc = json.loads(_read_bytes(f))
            n += len(doc["traceEvents"])
            del doc
        return {"events": n}

    return load


def _setup_hta(backend: str | None) -> Callable[[str, list[str]], dict[str, Any]]:
    import hta
    from hta.common.trace_parser import set_default_trace_parsing_backend
    from hta.configs.parser_config import ParserBackend
    from hta.trace_analysis import TraceAnalysis

    info: dict[str, Any] = {"hta_version": getattr(hta, "__version__", None)}
    try:
        from hta.version import __version__ as v

        info["hta_version"] = v
    except Exception:
        pass
    if backend is not None:
        set_default_trace_parsing_backend(ParserBackend(backend))
        import ijson

        info["ijson_backend"] = ijson.backend
    info["parser_backend"] = backend or "default (json)"

    def load(trace_dir: str, files: list[str]) -> dict[str, Any]:
        # TraceAnalysis(trace_dir=...) is HTA's documented entry point: it finds the rank of
        # every .json/.gz file in the directory, parses them (a fork pool of
        # min(cpu_count, ranks) processes when there are several) and aligns them.
        global _keep
        ta = TraceAnalysis(trace_dir=trace_dir)
        _keep = ta  # HTA keeps every rank's DataFrame; so do we until RSS is read
        rows = {int(r): len(df) for r, df in ta.t.traces.items()}
        return {"rows": sum(rows.values()), "ranks": len(rows), **info}

    return load


def _setup_tb() -> Callable[[str, list[str]], dict[str, Any]]:
    import tempfile

    from torch_tb_profiler import consts
    from torch_tb_profiler.profiler.data import RunProfileData

    def load(trace_dir: str, files: list[str]) -> dict[str, Any]:
        # RunProfileData.parse is what torch-tb-profiler's RunLoader runs for each
        # "<worker>.pt.trace.json[.gz]" file (in one child process per file): read,
        # json.loads, build its event objects, EventParser trees, aggregations, analysis.
        # We run it sequentially in this process and drop each result (its children
        # exit after handing back the much smaller generated view).
        cache = tempfile.mkdtemp(prefix="tbcache-")
        n_events = 0
        steps = 0
        for f in files:
            m = consts.WORKER_PATTERN.match(os.path.basename(f))
            worker = m.group(1) if m else os.path.basename(f)
            data = RunProfileData.parse(worker, None, f, cache)
            n_events += len(data.events)
            steps += len(data.steps_names or [])
            del data
        return {"parsed_events": n_events, "steps": steps}

    return load


LOADERS: dict[str, Callable[[], Callable[[str, list[str]], dict[str, Any]]]] = {
    "json": _setup_json,
    "hta": lambda: _setup_hta(None),
    "hta_ijson": lambda: _setup_hta("ijson_batch_and_compress"),
    "tb": _setup_tb,
}

_keep: Any = None


def main() -> int:
    name, result_path, trace_dir, *files = sys.argv[1:]
    t_start = time.perf_counter()
    load = LOADERS[name]()
    t_imported = time.perf_counter()
    baseline_kb = _status_kb("VmRSS")
    import_hwm_kb = _status_kb("VmHWM")
    t0 = time.perf_counter()
    summary = load(trace_dir, files)
    t1 = time.perf_counter()
    out = {
        "loader": name,
        "import_s": t_imported - t_start,
        "load_s": t1 - t0,
        "baseline_rss_kb": baseline_kb,
        "import_hwm_kb": import_hwm_kb,
        "end_rss_kb": _status_kb("VmRSS"),
        # VmHWM, not ru_maxrss: ru_maxrss survives execve and starts at the RSS of the
        # process that spawned us
        "peak_rss_self_kb": _status_kb("VmHWM"),
        "peak_rss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        "summary": summary,
        "python": sys.version.split()[0],
    }
    with open(result_path, "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
