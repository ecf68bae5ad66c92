"""The generic path: any Chrome-trace JSON read with a user's rules file (`--rules FILE`).

- A trace written here by a small script of our own: every event's duration is known, so each
  phase, step and operator of the report is known exactly.
- A real trace of a framework traceview has no parser for: JAX on CPU (jax.profiler's Perfetto
  JSON, examples/jax, made by make_trace.py there with the loop's own timers) read with
  examples/rules/jax.toml, the README's worked example.
- Bad rules files: one line naming the file's line, exit 2.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli

JAX = REPO / "examples" / "jax"
JAX_RULES = REPO / "examples" / "rules" / "jax.toml"

# (name, µs) in the order they run, per step, on one thread: a step of 13.0 ms plus its data.
PHASES = [
    ("LoadBatch", "io", None),
    ("Dense/fwd", "forward", 3000),
    ("Relu/fwd", "forward", 200),
    ("Dense/bwd", "backward", 6000),
    ("NCCL AllReduce", "comm", 2500),
    ("SGDUpdate", "update", 800),
]
RULES_FILE = REPO / "examples" / "rules" / "inhouse.toml"  # the README's worked example
RULES = RULES_FILE.read_text()


def line_of(text: str, body: str) -> int:
    """The line of ``text`` that holds ``body`` (1-based)."""
    return next(i for i, line in enumerate(body.splitlines(), 1) if text in line)


def write_trace(path: Path, steps: int = 4) -> list[dict[str, float]]:
    """An in-house tool's Chrome trace: per step a marker ``iteration N`` around six events
    back to back (the data load grows 10 µs a step). Returns each step's phases in ms."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "trainer"}}
    ]
    now = 1_000_000.0
    truth = []
    for step in range(steps):
        marker = {"ph": "X", "name": f"iteration {step}", "cat": "marker", "pid": 7, "tid": 1}
        marker["ts"] = now
        events.append(marker)
        phases: dict[str, float] = {}
        for name, phase, dur in PHASES:
            us = dur if dur is not None else 500 + 10 * step
            events.append(
                {"ph": "X", "name": name, "cat": "work", "pid": 7, "tid": 1, "ts": now, "dur": us}
            )
            now += us
            phases[phase] = phases.get(phase, 0.0) + us / 1e3
        marker["dur"] = now - marker["ts"]
        truth.append(phases)
    path.write_text(json.dumps({"traceEvents": events}))
    return truth


def report(trace: Path, rules: Path) -> dict[str, Any]:
    result = run_cli("report", trace, "--rules", rules, "--json")
    assert result.code == 0, result.err
    data: dict[str, Any] = result.json()
    return data


def test_a_trace_of_our_own_with_its_rules(tmp_path: Path) -> None:
    """The README's worked example: every phase of every step is what the script wrote."""
    trace = tmp_path / "inhouse.json"
    truth = write_trace(trace)
    data = report(trace, RULES_FILE)
    assert data["run"]["framework"] == "chrome"
    steps = data["per_step"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    for step, phases in zip(steps, truth, strict=True):
        breakdown = step["breakdown_ms"]
        for phase, ms in phases.items():
            assert breakdown[phase] == pytest.approx(ms, abs=1e-3), (step["step"], phase)
        assert breakdown["other"] == breakdown["idle"] == 0
        assert step["step_ms"] == pytest.approx(sum(phases.values()), abs=1e-3)
    ops = {o["op"]: o for o in data["top_ops"]}
    assert {"data_loader", "fully_connected", "allreduce", "weights_update"} <= set(ops)
    assert ops["allreduce"]["phase"] == "comm"
    # Relu/fwd has no rule: an operator before backward at the top of the thread is forward
    assert ops["Relu/fwd"]["phase"] == "forward"


@pytest.mark.parametrize("marker", ["step#{}", "Iteration_{}", "train step {}", "ProfilerStep#{}"])
def test_markers_the_defaults_know_are_numbered_by_their_names(tmp_path: Path, marker: str) -> None:
    """A rules file without ``[step]``: the defaults' common marker names give their own numbers
    (the steps here begin at 5, so numbering by position would give 0-3), with no warning."""
    trace = tmp_path / "inhouse.json"
    write_trace(trace)
    doc = json.loads(trace.read_text())
    for event in doc["traceEvents"]:
        if event["name"].startswith("iteration "):
            event["name"] = marker.format(int(event["name"].split()[1]) + 5)
    trace.write_text(json.dumps(doc))
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES.replace("[step]", "[_unused]").replace("pattern = '^iteration", "# '"))
    result = run_cli("report", trace, "--rules", rules, "--json")
    assert result.code == 0, result.err
    data = result.json()
    assert [s["step"] for s in data["per_step"]] == [5, 6, 7, 8]
    assert not data["warnings"], data["warnings"]

    # a pattern whose first group is not the number: numbered by position, and told why
    rules.write_text(
        RULES.replace(r"pattern = '^iteration (\d+)$'", r"pattern = '^(it)eration \d+$'")
    )
    write_trace(trace)
    result = run_cli("report", trace, "--rules", rules, "--json")
    assert result.code == 0, result.err
    data = result.json()
    assert [s["step"] for s in data["per_step"]] == [0, 1, 2, 3]
    told = [w for w in data["warnings"] if "first group reads 'it', not a number" in w]
    assert len(told) == 4, data["warnings"]


def test_without_rules_a_trace_of_nobody_we_know_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "inhouse.json"
    write_trace(trace)
    for path in (trace, JAX / "perfetto_trace.json.gz"):
        result = run_cli("report", path)
        assert result.code == 2 and len(result.err.strip().splitlines()) == 1
        assert "not a trace traceview can read" in result.err and "--rules" in result.err


def test_jax_on_cpu_with_the_readme_rules() -> None:
    """A real JAX trace: 5 steps, each as long as the loop timed it; data loading never more
    than its timer (compute outranks io where XLA's threads still run while the next batch
    loads), the jitted step at least its timer; the operators under their canonical names."""
    truth = json.loads((JAX / "groundtruth.json").read_text())["records"]
    data = report(JAX / "perfetto_trace.json.gz", JAX_RULES)
    steps = data["per_step"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4]
    for step, timer in zip(steps, truth, strict=True):
        assert step["step_ms"] == pytest.approx(timer["step_ms"], abs=0.5, rel=0.05)
        breakdown = step["breakdown_ms"]
        assert breakdown["io"] + breakdown["h2d"] <= timer["data_ms"] + 0.5
        assert breakdown["forward"] >= timer["compute_ms"] - 0.5
        assert breakdown["other"] + breakdown["idle"] < 0.5
    forward = statistics.mean(s["breakdown_ms"]["forward"] for s in steps)
    assert forward >= 0.85 * statistics.mean(t["step_ms"] for t in truth)
    ops = {o["op"]: o["phase"] for o in data["top_ops"]}
    assert ops["train_step"] == "forward" and ops["matmul"] == "forward"


BAD = RULES.replace("match = 'AllReduce'", "match = 'All(Reduce'")
UNKNOWN = RULES.replace('phase = "update"', 'phase = "updates"')


@pytest.mark.parametrize(
    ("body", "line", "fragment"),
    [
        ("[step]\npattern = '^iteration (\\d+$'\n", 2, "bad pattern"),
        (BAD, line_of("All(Reduce", BAD), "bad pattern"),
        (UNKNOWN, line_of('"updates"', UNKNOWN), "unknown phase 'updates'"),
        ('[kinds]\nmarker = "annotations"\n', 2, "unknown kind 'annotations'"),
        ("[[rule]]\nmatch = 'x'\ncollective = 'allreduced'\n", 3, "unknown collective"),
    ],
)
def test_a_bad_rules_file_is_one_line_naming_its_line(
    tmp_path: Path, body: str, line: int, fragment: str
) -> None:
    trace, rules = tmp_path / "inhouse.json", tmp_path / "bad.toml"
    write_trace(trace)
    rules.write_text(body)
    result = run_cli("report", trace, "--rules", rules)
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err
    assert f"{rules}:{line}: " in lines[0] and fragment in lines[0], lines[0]
