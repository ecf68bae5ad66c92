"""`report --html` and `export --format html`: one self-contained page whose every number is the
report's own (read back from the page's tables and compared with `report --json`), that names
nothing outside itself, escapes every name from a trace, and aggregates many ranks. The page in
a real browser: tests/integration/test_html_browser.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES, needs_xprof, shared_traces
from tests.conftest import run_cli as traceview
from tests.html_page import HOSTILE, MARKUP, OUTSIDE, Page, hostile_run, read_page
from tests.synthetic_jobs import Job, write
from traceview.runs import ingest_run

DDP = SAMPLES / "pytorch" / "ddp"


def page_and_json(
    tmp_path: Path, *paths: Path, name: str = "page"
) -> tuple[Page, dict[str, Any], Path]:
    out = tmp_path / f"{name}.html"
    made = traceview("report", *map(str, paths), "--html", str(out), "--json")
    assert made.code == 0, made.err
    report = json.loads(made.out)
    assert f"{out}: HTML report" in made.err or out.exists()
    return read_page(out), report, out


def close(cell: Any, value: float | None) -> bool:
    return (value is None and cell.value is None) or cell.value == pytest.approx(value, abs=1e-9)


def test_the_pages_numbers_are_the_reports(tmp_path: Path) -> None:
    page, report, _ = page_and_json(tmp_path, DDP)
    summary = report["summary"]
    # the verdict's figures, visible on load
    assert page.figures["step-ms"] == pytest.approx(summary["step_ms"])
    assert page.figures["job-step-ms"] == pytest.approx(report["critical_path"]["step_ms"])
    assert page.figures["hidden"] == pytest.approx(summary["comm_hidden_fraction"] * 100)
    # the step by phase: the run's mean, each rank, each step
    for phase, value in summary["breakdown_ms"].items():
        assert close(page.row("breakdown", phase)["ms"], value), phase
        assert page.row("breakdown", phase)["ms"].text == f"{value:.2f}"
    for rank in report["ranks"]:
        row = page.row("ranks", str(rank["rank"]))
        assert close(row["step"], rank["step_ms"])
        for phase, value in rank["breakdown_ms"].items():
            assert close(row[phase], value), (rank["rank"], phase)
        assert close(row["own work"], rank["busy_ms"])
    steps = {s["step"]: s for s in report["per_step"]}
    for row in page.tables["steps"]:
        step = steps[int(row[0].text)]
        assert close(row[1], step["step_ms"]) and close(row[2], step["min_ms"])
    assert len(page.tables["steps"]) == len(steps)
    # the critical path's blame, in its order; the what-ifs; the operators; communication
    blame = report["critical_path"]["blame"]
    assert [c.value for c in page.column("blame", "ms")] == pytest.approx([b["ms"] for b in blame])
    assert [int(c.text) for c in page.column("blame", "rank")] == [b["rank"] for b in blame]
    whatifs = {w["change"]: w for w in report["whatif"]}
    assert {r[0].text for r in page.tables["whatif"]} == set(whatifs)
    for row in page.tables["whatif"]:
        assert close(row[2], whatifs[row[0].text]["step_ms"])
    ops = {o["op"]: o for o in report["top_ops"]}
    assert len(page.tables["operators"]) == len(ops)
    for row in page.tables["operators"]:
        assert close(row[4], ops[row[0].text]["self_ms_per_step"])
    groups = report["comm_by_group"]
    assert [c.value for c in page.column("comm-by-group", "total")] == pytest.approx(
        [g["total_ms"] for g in groups]
    )
    assert close(page.row("comm", "exposed")["ms per step"], summary["comm_exposed_ms"])
    # every section of this run, in the reader's order
    assert page.sections == [
        "verdict", "step", "critical-path", "communication", "heatmap", "whatif", "operators",
        "warnings",
    ]  # fmt: skip
    # the heatmap's rows: every rank, its steps' times
    assert [r[0].text for r in page.tables["heatmap"]] == [
        f"rank {r['rank']}" for r in report["ranks"]
    ]


def test_the_page_stands_alone_and_is_small(tmp_path: Path) -> None:
    _, _, out = page_and_json(tmp_path, DDP)
    text = out.read_text()
    assert not OUTSIDE.search(text), OUTSIDE.search(text)
    assert "http://" not in text.split("<main>")[0] and "@import" not in text and "url(" not in text
    assert "default-src 'none'" in text  # the browser refuses anything the page might ask for
    assert out.stat().st_size < 2 << 20


def test_names_from_a_trace_are_text_in_the_page(tmp_path: Path) -> None:
    page, report, out = page_and_json(tmp_path, hostile_run(tmp_path))
    text = out.read_text()
    for markup in MARKUP:
        assert markup not in text, markup
    assert "\x1b" not in text
    assert text.count("<script>") == 1  # the page's own
    # shown as the trace wrote them (the terminal's escape as \x1b, as every view shows it)
    ops = [r[0].text for r in page.tables["operators"]]
    assert any(op.startswith("mm</script><script>window.__pwned") for op in ops), ops
    names = [r[-1].text for r in page.tables["operators"]]
    assert any(n.startswith("aten::mm</script><script>") and n.endswith("\\x1b[2J") for n in names)
    groups = {r[0].text for r in page.tables["comm-by-group"]}
    assert any(g.startswith("pg</script>") for g in groups), groups
    warned = " ".join(report["warnings"] + report["remarks"])
    assert '<img src=x onerror="window.__pwned=3">' in warned  # (the file beside the traces)
    assert "&lt;img src=x onerror=&quot;window.__pwned=3&quot;&gt;" in text
    assert HOSTILE not in text


def test_many_ranks_are_drawn_as_percentiles_and_named_ranks(tmp_path: Path) -> None:
    traces = write(Job(ranks=80, steps=6, forward_ms={17: 30.0}), tmp_path / "traces")
    run = tmp_path / "run"
    ingest_run([traces], run)
    page, report, out = page_and_json(tmp_path, run)
    spread = report["rank_spread"]
    assert spread["slowest_ranks"][0] == 17
    assert page.row("rank-spread", "p50")["step"].value == pytest.approx(spread["step_ms"]["p50"])
    assert page.row("rank-spread", "max")["forward"].value == pytest.approx(
        spread["breakdown_ms"]["forward"]["max"]
    )
    heat = [r[0].text for r in page.tables["heatmap"]]
    assert heat[:3] == ["p50 of ranks", "p90 of ranks", "max of ranks"]
    assert "rank 17 (slowest)" in heat and len(heat) <= 3 + 5
    assert len(page.tables["ranks"]) == 80  # every rank still in the folded table
    text = out.read_text()
    assert "rank 17 (slowest)" in text and 'aria-label="the step by phase across ranks"' in text


def test_export_writes_the_page_into_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ingest_run([DDP], run)
    made = traceview("export", str(run), "--format", "html")
    assert made.code == 0, made.err
    assert (run / "report.html").exists() and "report.html: HTML report" in made.out
    page = read_page(run / "report.html")
    assert "verdict" in page.sections and page.figures["step-ms"] > 0
    # a folder where the page should go: one line, exit code 2, nothing written
    refused = traceview("report", str(run), "--html", str(tmp_path))
    assert refused.code == 2 and refused.err.count("\n") == 1, refused.err


def test_a_memory_run_draws_each_ranks_peak(tmp_path: Path) -> None:
    page, report, _ = page_and_json(tmp_path, SAMPLES / "pytorch" / "memory")
    assert "memory" in page.sections
    for rank in report["ranks"]:
        row = page.row("memory", str(rank["rank"]))
        assert close(row["peak MiB"], rank["memory"]["peak_mb"])
        assert row["in phase"].text == (rank["memory"]["peak_phase"] or "")


#: Real traces from other people's runs: PyTorch (gloo CPU, ROCm), TensorFlow (TF1 Timeline, and
#: a multi-worker GPU profile read with xprof), MXNet.
SHARED_PAGES = [
    "pytorch/hta_sampled_2rank", "pytorch/tracelens_mi300_ddp_resnet18",
    "tensorflow/tf1_timeline_mnist_mlp_gpu", "mxnet/mxnet_profiler_demo_mnist_cnn",
    pytest.param("tensorflow/tfprofiler_gpu_multi_worker", marks=needs_xprof),
]  # fmt: skip


@pytest.mark.parametrize("trace", SHARED_PAGES)
def test_shared_traces_pages_hold_the_reports_numbers(tmp_path: Path, trace: str) -> None:
    page, report, out = page_and_json(tmp_path, shared_traces(trace))
    assert page.figures["step-ms"] == pytest.approx(report["summary"]["step_ms"])
    for phase, value in report["summary"]["breakdown_ms"].items():
        assert close(page.row("breakdown", phase)["ms"], value)
    for rank in report["ranks"]:
        assert close(page.row("ranks", str(rank["rank"]))["step"], rank["step_ms"])
    assert not OUTSIDE.search(out.read_text())


def test_a_hung_job_says_so_first_with_where_each_rank_was(tmp_path: Path) -> None:
    """Flight Recorder dumps alone (no trace): ranks 0, 1 and 3 wait in call 11, rank 2 never
    made it. The page says the failure first and lists each rank's state at the end."""
    from tests.integration.test_flight_dumps import _dump, _entry, _write

    done = [_entry(s) for s in range(1, 11)]
    for rank in (0, 1, 3):
        _write(tmp_path / "dumps", rank, _dump([*done, _entry(11, "started")]))
    _write(tmp_path / "dumps", 2, _dump(done))
    page, report, out = page_and_json(tmp_path, tmp_path / "dumps")
    assert report["failure"]["kind"] == "hang" and report["failure"]["rank"] == 2
    text = out.read_text()
    assert text.index('id="failure"') < text.index('data-table="ranks-at-end"')
    states = {int(r[0].text): r[2].text for r in page.tables["ranks-at-end"]}
    assert states == {e["rank"]: e["state"] for e in report["ranks_at_end"]}
    assert states[2] == "stuck" and page.tables["ranks-at-end"][0][0].text == "0"


def test_every_heatmap_cell_is_in_a_table(tmp_path: Path) -> None:
    """The ranks × steps heatmap's cells, each a rank's step time in one step: the steps table
    of the run, to the nanosecond's rounding."""
    import polars as pl

    run = tmp_path / "run"
    ingest_run([DDP], run)
    page, _, _ = page_and_json(tmp_path, run)
    steps = pl.read_parquet(run / "steps.parquet")
    header = page.headers["heatmap-cells"][1:]
    for row in page.tables["heatmap-cells"]:
        rank = int(row[0].text.removeprefix("rank "))
        mine = steps.filter(pl.col("rank") == rank)
        for step, cell in zip(header, row[1:], strict=True):
            wall = mine.filter(pl.col("step") == int(step))["wall_ns"]
            assert cell.value == pytest.approx(wall[0] / 1e6), (rank, step)
