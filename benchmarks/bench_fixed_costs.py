#!/usr/bin/env python3
"""Fixed costs (issue 54), side by side in one run, each command a fresh process measured by
_measure.py (wall seconds, CPU seconds, peak RSS of the process tree; interpreter start and
imports included), median of --repeat runs:

- a look at an ingested run: ``traceview report`` and ``report --json`` of the run's kept
  report (runs/finished.py), at 2 ranks (the DDP sample) and 1,024 ranks (the synthetic
  data-parallel job of tests/synthetic_jobs.py, 3 steps), beside ``python -c pass``,
  ``traceview --help``, reading and decoding the kept file alone, and ``report --json``
  computed from the run's cached tables (the kept report removed first: what every look cost
  before);
- tiny steps: ``traceview ingest`` of a trace of --steps steps (a Kineto trace: a
  ProfilerStep and three operators a step; a TF1 Timeline: a Session.run's _SOURCE node and
  three ops a step) beside ``json.loads`` and the typed decode of its seven fields
  (``_typed_decode.py``) of the same file, and beside ``traceview ingest`` of the same events
  in a hundredth as many steps (a marker every 100 groups, the others plain annotations or
  NoOps): what is paid per step, and what per event.

    python benchmarks/bench_fixed_costs.py [--repeat 5] [--steps 100000]
        [--before /path/to/other/python --before-label COMMIT]

``--before``: the python of another install (a wrapper script that sets its PYTHONPATH); its
``traceview ingest`` of the tiny steps is measured beside this tree's, the two alternated.

Results go to benchmarks/results/fixed_costs.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _measure import compiled  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MEASURE = HERE / "_measure.py"
TYPED_DECODE = HERE / "_typed_decode.py"
#: The tiny steps' events again, a step marker every FEWER groups: what the events cost alone.
FEWER = 100
DDP = REPO / "sample_traces" / "pytorch" / "ddp"
KEPT = "report.cache.json"

_DECODE_KEPT = """
import sys, msgspec
from traceview.model.results import RunReport
doc = msgspec.json.decode(open(sys.argv[1], "rb").read())
msgspec.convert(doc[1], RunReport)
"""
_JSON_LOADS = "import json, sys; json.loads(open(sys.argv[1], 'rb').read())"


def measure(argv: list[str], before: Path | None = None, cwd: Path = REPO) -> dict[str, float]:
    """One run of ``argv`` (``before``: a file removed first) in ``cwd`` (another install's
    ``python -m traceview`` run in the repository would import the repository's)."""
    if before is not None:
        before.unlink(missing_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result = Path(fh.name)
    try:
        done = subprocess.run(
            [sys.executable, str(MEASURE), str(result), "--", *argv],
            capture_output=True, text=True, cwd=cwd,
        )  # fmt: skip
        got = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    if got["rc"] != 0:
        raise SystemExit(f"{argv} failed ({got['rc']}): {done.stderr[-2000:]}")
    return {
        "wall_s": got["proc_s"],
        "cpu_s": got["user_s"] + got["sys_s"],
        "rss_mb": max(got["maxrss_kb"], got["tree_rss_peak_kb"]) / 1024,
        # (the pages a forked child shares with its parent counted once)
        "pss_mb": max(got["maxrss_kb"], got["tree_pss_peak_kb"]) / 1024,
    }


class Table:
    """Rows of commands measured ``repeat`` times each (medians), written as OUT.{json,md}."""

    def __init__(self, repeat: int, before: str | None = None) -> None:
        self.repeat = repeat
        self.before = before  # (another install's python: named BEFORE_PYTHON in the command)
        self.rows: list[dict[str, Any]] = []

    def row(self, group: str, what: str, argv: list[str], before: Path | None = None) -> None:
        self.add(group, what, [measure(argv, before) for _ in range(self.repeat)])

    def rows_alternated(self, group: str, commands: dict[str, tuple[list[str], Path]]) -> None:
        """Each of ``commands`` (what: argv and the folder it runs in) once a round, ``repeat``
        rounds."""
        got: dict[str, list[dict[str, float]]] = {what: [] for what in commands}
        for _ in range(self.repeat):
            for what, (argv, cwd) in commands.items():
                got[what].append(measure(argv, cwd=cwd))
        for what, runs in got.items():
            self.add(group, what, runs)

    def add(self, group: str, what: str, got: list[dict[str, float]]) -> None:
        self.rows.append(
            {"group": group, "what": what,
             **{k: round(statistics.median(g[k] for g in got), 3) for k in got[0]}, "runs": got}
        )  # fmt: skip
        print(f"{group:44} {what:44} {self.rows[-1]['wall_s']:7.3f} s", flush=True)

    def write(
        self, out: Path, memory: str, header: str, cells: Callable[[dict[str, Any]], str]
    ) -> None:
        """``header``: the table's first line (its columns), ``cells``: a row's cells after its
        group and command; ``memory``: what its memory figures are."""
        info = {
            "command": " ".join([Path(sys.executable).name, *sys.argv])
            .replace(str(REPO) + "/", "")
            .replace(self.before or "\0", "BEFORE_PYTHON"),
            "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
            "repeat": self.repeat,
            "rows": self.rows,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
        columns = header.count("|") - 1
        lines = [
            f"Command: `{info['command']}`",
            "",
            f"Machine: {info['machine']}; median of {self.repeat} runs, each a fresh process "
            f"(interpreter start and imports included); {memory}",
            "",
            header,
            "|---|---|" + "---:|" * (columns - 2),
            *(f"| {r['group']} | {r['what']} | {cells(r)} |" for r in self.rows),
        ]
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def kineto_trace(path: Path, steps: int, every: int = 1) -> None:
    """A Kineto trace of ``steps`` groups of an annotation and three operators (10 µs), the
    annotation a ProfilerStep (covering ``every`` groups) at every ``every``-th group and a
    plain region at the others: the same events in ``steps / every`` steps."""
    with open(path, "w") as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [\n')
        for s in range(steps):
            t = 1000.0 + 10 * s
            marker = not s % every
            annotation = (
                (f"ProfilerStep#{s // every}", 10.0 * every - 1) if marker else ("region", 9.0)
            )
            ops = (
                ("user_annotation", annotation[0], t, annotation[1]),
                ("cpu_op", "aten::linear", t + 0.5, 3.0),
                ("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", t + 4, 2.0),
                ("cpu_op", "Optimizer.step#SGD.step", t + 6.5, 2.0),
            )
            events = [
                {"ph": "X", "cat": c, "name": n, "pid": 1, "tid": 1, "ts": ts, "dur": d}
                for c, n, ts, d in ops
            ]
            tail = ",\n" if s < steps - 1 else "\n"
            fh.write(",\n".join(json.dumps(e) for e in events) + tail)
        fh.write('], "traceName": "tiny"}\n')


def timeline_trace(path: Path, steps: int, every: int = 1) -> None:
    """A TF1 Timeline (``tf.profiler`` RunMetadata as Chrome JSON) of ``steps`` groups of a NoOp
    and three ops (10 µs), the NoOp a Session.run's _SOURCE node at every ``every``-th group:
    the same events in ``steps / every`` Session.runs."""
    with open(path, "w") as fh:
        fh.write('{"traceEvents": [\n')
        fh.write(
            json.dumps({"name": "process_name", "ph": "M", "pid": 1,
                        "args": {"name": "/job:localhost/replica:0/task:0/device:CPU:0 Compute"}})
        )  # fmt: skip
        for s in range(steps):
            t = 1000 + 10 * s
            source = "_SOURCE" if not s % every else "init/NoOp"
            nodes = (("NoOp", source, t, 1), ("MatMul", "dense/MatMul", t + 1, 4),
                     ("Relu", "dense/Relu", t + 5, 2), ("ApplyGradientDescent",
                     "GradientDescent/update_dense/kernel/ApplyGradientDescent", t + 7, 2))  # fmt: skip
            for op, name, ts, dur in nodes:
                fh.write(",\n")
                fh.write(
                    json.dumps({"ph": "X", "cat": "Op", "name": op, "pid": 1, "tid": 0,
                                "ts": ts, "dur": dur, "args": {"name": name, "op": op}})
                )  # fmt: skip
        fh.write("\n]}\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--out", type=Path, default=HERE / "results" / "fixed_costs")
    p.add_argument("--before", help="python of another install: its ingest of the tiny steps")
    p.add_argument("--before-label", default="another install", help="what it is (a commit)")
    args = p.parse_args()
    compiled(sys.executable)  # (as an install from a wheel has it)
    tv = [sys.executable, "-m", "traceview"]
    table = Table(args.repeat, args.before)
    row = table.row
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as tmp:
        folder = Path(tmp)
        runs = {"2 ranks": folder / "ddp"}
        subprocess.run([*tv, "ingest", str(DDP), "-o", str(runs["2 ranks"])], check=True)
        sys.path.insert(0, str(REPO))
        from tests.synthetic_jobs import Job, write

        many = write(Job(ranks=args.ranks, steps=3), folder / "many-traces")
        runs[f"{args.ranks} ranks"] = folder / "many"
        subprocess.run(
            [*tv, "ingest", str(many), "-o", str(runs[f"{args.ranks} ranks"])], check=True
        )
        row("start", "python -c pass", [sys.executable, "-c", "pass"])
        row("start", "traceview --help", [*tv, "--help"])
        for label, run in runs.items():
            group = f"ingested run, {label}"
            kept = run / KEPT
            row(group, "read and decode the kept report alone",
                [sys.executable, "-c", _DECODE_KEPT, str(kept)])  # fmt: skip
            row(group, "report (kept)", [*tv, "report", str(run)])
            row(group, "report --json (kept)", [*tv, "report", "--json", str(run)])
            row(group, "report --json computed (no kept report)",
                [*tv, "report", "--json", str(run)], before=kept)  # fmt: skip
        for fmt, make, name in (
            ("Kineto", kineto_trace, "tiny.pt.trace.json"),
            ("TF1 Timeline", timeline_trace, "tiny.timeline.json"),
        ):
            trace, fewer = folder / name, folder / f"fewer-{name}"
            make(trace, args.steps)
            make(fewer, args.steps, FEWER)
            group = f"{args.steps:,} steps, {fmt} ({trace.stat().st_size / 1e6:.0f} MB)"
            row(group, "json.loads", [sys.executable, "-c", _JSON_LOADS, str(trace)])
            row(group, "typed decode of the seven fields",
                [sys.executable, str(TYPED_DECODE), str(trace)])  # fmt: skip
            out = folder / f"{name}.run"
            commands = {
                "traceview ingest": ([*tv, "ingest", str(trace), "-o", str(out)], REPO),
                f"traceview ingest, the same events in {args.steps // FEWER:,} steps": (
                    [*tv, "ingest", str(fewer), "-o", str(out)],
                    REPO,
                ),
            }
            if args.before:
                commands[f"traceview ingest ({args.before_label})"] = (
                    [args.before, "-m", "traceview", "ingest", str(trace), "-o", str(out)], folder
                )  # fmt: skip
            table.rows_alternated(group, commands)
            shutil.rmtree(out, ignore_errors=True)
    table.write(
        args.out,
        "RSS: peak of the process tree.",
        "| case | command | wall s | CPU s | peak MB |",
        lambda r: f"{r['wall_s']:.3f} | {r['cpu_s']:.3f} | {r['rss_mb']:.0f}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
