"""The golden cases: `report`, `compare` and `scaling --json` of every sample run and shared trace.

Their outputs, committed beside this file, hold the analysis still while its code moves: a change
that alters one must regenerate it (``python -m tests.golden.cases``) in the same commit and say
why. Fields that differ between two ingests of the same traces (the random run id, temporary
paths) are left out.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
SHARED = Path(os.environ.get("TRACEVIEW_SHARED_TRACES", REPO.parent / "shared" / "traces"))
GOLDEN = Path(__file__).resolve().parent

#: Cases on the samples (always present): name -> command line (paths relative to the repo).
SAMPLE_CASES: dict[str, list[str]] = {
    **{
        f"report-{fw}-{run}": ["report", "--json", f"sample_traces/{fw}/{run}"]
        for fw, runs in {
            "pytorch": [
                "explicit", "ddp", "slowio", "gpu_sync", "gpu_async", "gpu_explicit_nccl",
                "gpu_ddp_nccl", "scaling/ranks-1", "scaling/ranks-2", "scaling/ranks-4",
                "slowfwd", "slowdata", "memory", "leak",
            ],
            "tensorflow": ["explicit", "mwms", "slowio", "memory"],
            "mxnet": [
                "dist_sync", "dist_overlap", "mlp", "local", "dist_sync_bulk", "dist_overlap_bulk",
                "local_bulk", "memory",
            ],
            "chainer": ["mlp"],
        }.items()
        for run in runs
    },
    "compare-frameworks-explicit": [
        "compare", "--json", "sample_traces/pytorch/explicit", "sample_traces/tensorflow/explicit",
        "sample_traces/mxnet/dist_sync",
    ],
    "compare-pytorch-explicit-ddp": [
        "compare", "--json", "sample_traces/pytorch/explicit", "sample_traces/pytorch/ddp",
    ],
    "scaling-pytorch": [
        "scaling", "--json", "--link-gbps", "10", "sample_traces/pytorch/scaling/ranks-1",
        "sample_traces/pytorch/scaling/ranks-2", "sample_traces/pytorch/scaling/ranks-4",
    ],
}  # fmt: skip


def shared_cases() -> dict[str, list[str]]:
    """One report per shared trace (a folder where its files are the ranks of one run)."""
    if not SHARED.exists():
        return {}
    multi_rank = {"hta_sampled_2rank"}
    cases: dict[str, list[str]] = {}
    for path in sorted(SHARED.rglob("*")):
        if not path.is_file() or not path.name.endswith((".json.gz", ".xplane.pb")):
            continue
        folder = path.parent
        if folder.name in multi_rank:
            cases[f"shared-{folder.name}"] = ["report", "--json", str(folder)]
            continue
        stem = path.name.split(".")[0]
        cases[f"shared-{folder.name}-{stem}"] = ["report", "--json", str(path)]
    return cases


def _scrub(value: Any) -> Any:
    """Leave out what two ingests of the same traces do not share."""
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in ("run_id", "path")}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, str):
        return value.replace(str(REPO), "<repo>").replace(str(SHARED), "<shared>")
    return value


def steps_table(argv: list[str]) -> dict[str, list[Any]]:
    """The exact steps table (ns) of a report case's run: finer than the report's rounded ms."""
    from traceview.runs import open_run

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with open_run([Path(p) for p in argv if not p.startswith("-") and p != "report"]) as run:
            return run.steps.sort_by([("rank", "ascending"), ("step", "ascending")]).to_pydict()
    finally:
        os.chdir(cwd)


def run_case(argv: list[str]) -> Any:
    """The command's JSON output, run in this process from the repository root; for a report,
    with the run's steps table."""
    from traceview.cli import main

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        os.chdir(cwd)
    if code != 0:
        raise RuntimeError(f"traceview {' '.join(argv)} exited {code}")
    result = _scrub(json.loads(out.getvalue()))
    if argv[0] == "report":
        return {"json": result, "steps_table": steps_table(argv)}
    return {"json": result}


def golden_diff(got: Any, want: Any, where: str = "$") -> list[str]:
    """Where ``got`` differs from the golden ``want`` (floats to 1e-9): a changed value, a
    missing key, a new key holding something. A new key holding nothing (``_empty``) is a field
    added since the golden was written: no difference (goldens grow)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in want if k not in got]
        out += [f"{where}.{k}: unexpected" for k in got if k not in want and not _empty(got[k])]
        for k in want.keys() & got.keys():
            out += golden_diff(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items, golden {len(want)}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in golden_diff(g, w, f"{where}[{i}]")
        ]
    if isinstance(want, float) or isinstance(got, float):
        numbers = isinstance(want, int | float) and isinstance(got, int | float)
        if numbers and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9):
            return []
    elif got == want and type(got) is type(want):
        return []
    return [f"{where}: {got!r}, golden {want!r}"]


def _empty(value: Any) -> bool:
    """A new field's value that says nothing about this run: null, [] or {}."""
    return value is None or value == [] or value == {}


def golden_path(name: str) -> Path:
    return GOLDEN / f"{name.replace('/', '_')}.json"


def main() -> None:
    names = sys.argv[1:]
    cases = {**SAMPLE_CASES, **shared_cases()}
    for name, argv in cases.items():
        if names and name not in names:
            continue
        result = run_case(argv)
        golden_path(name).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(name)


if __name__ == "__main__":
    main()
