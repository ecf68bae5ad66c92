"""Issue 51 at the command line: `watch` and `profile` on what is not a running job are refused in
one line (exit 2), `watch` writes nothing into the run it looks at, hostile records are read as
far as they go, and `--window` on a run without such a window is refused.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from tests.conftest import SAMPLES, run_cli
from traceview.collectors import rankside_record as W


def _run(tmp: Path, ranks: int = 2, steps: int = 30) -> Path:
    """A run directory as collect leaves it while the job runs: each rank's record written by
    the rank side's own writer, and live.json naming a collect process that lives (this one)."""
    run = tmp / "run"
    records = [W.StepRecord(run / "raw" / f"rank-{r:05d}") for r in range(ranks)]
    op = W.op_index("all_reduce")
    for _ in range(steps):
        for rec in records:
            slot = rec.call_begin(op, rec.group("0"), 64)
            rec.call_end(slot, 0)
            rec.step_end()
    for rec in records:
        rec.flush()
    said = {"collect_pid": os.getpid(), "host": socket.gethostname(), "stall_s": 60,
            "started": "2026-12-03T10:00:00+0000", "steps": 3, "warmup": 1}  # fmt: skip
    (run / "live.json").write_text(json.dumps(said))
    return run


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def _one_line_refusal(result: object, words: str) -> None:
    assert result.code == 2, (result.out, result.err)  # type: ignore[attr-defined]
    lines = result.err.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.err, lines  # type: ignore[attr-defined]


def test_watch_and_profile_refuse_what_is_not_a_collect_run(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank-0.json").write_text("{}")
    for argv in (("watch", tmp_path / "traces", "--once"), ("profile", tmp_path / "traces")):
        _one_line_refusal(run_cli(*argv), "not a run traceview collect is writing")
    _one_line_refusal(run_cli("watch", tmp_path / "nowhere", "--once"), "no such run directory")
    _one_line_refusal(run_cli("watch", tmp_path / "traces", "--json"), "give --once")


def test_a_look_writes_nothing_into_the_run_and_reads_the_job_as_running(tmp_path: Path) -> None:
    run = _run(tmp_path)
    before = _tree(run)
    result = run_cli("watch", run, "--once", "--json")
    assert result.code == 0, result.err
    look = json.loads(result.out)
    assert look["job"]["state"] == "running" and look["job"]["steps"] == 30
    assert [(r["rank"], r["step"], r["state"]) for r in look["ranks"]] == [
        (0, 30, "running"),
        (1, 30, "running"),
    ]
    text = run_cli("watch", run, "--once")
    assert text.code == 0 and "running" in text.out and "2 ranks" in text.out
    # the live screen outside a terminal: refused at once, not drawn into a file for ever
    _one_line_refusal(run_cli("watch", run), "the live screen needs a terminal")
    assert _tree(run) == before, "watch wrote into the run it looked at"


def test_profile_writes_one_request_and_only_that(tmp_path: Path) -> None:
    run = _run(tmp_path)
    before = _tree(run)
    result = run_cli("profile", run, "--steps", 2)
    assert result.code == 0, result.err
    after = _tree(run)
    added = sorted(set(after) - set(before))
    assert added == ["requests", "requests/profile-1.json"], added
    asked = json.loads((run / "requests" / "profile-1.json").read_text())
    assert asked["steps"] == 2 and asked["warmup"] == 1 and asked["start_step"] > 30
    assert not list((run / "requests").glob(".*")), "a temporary file was left"
    _one_line_refusal(run_cli("profile", run, "--steps", 0), "--steps must be between")


def test_hostile_records_are_read_as_far_as_they_go(tmp_path: Path) -> None:
    run = _run(tmp_path, ranks=3)
    raw = run / "raw"
    (raw / "rank-00001" / "steps.bin").write_bytes(b"\x1b]0;pwned\x07" + os.urandom(300))
    (raw / "rank-00002" / "calls.bin").write_bytes(os.urandom(50))
    (raw / "rank-00002" / "end.json").write_text(
        json.dumps({"state": "exception", "detail": "\x1b[2J[red]boom[/red]", "t_ns": 1})
    )
    (raw / "rank-00009").mkdir()  # (a folder of no record)
    (raw / "rank-x").mkdir()
    # FIFOs where files are read: never waited on
    os.mkfifo(raw / "rank-00000" / "end.json")
    os.mkfifo(raw / "rank-00000" / "status.json")
    (run / "requests").mkdir()
    os.mkfifo(run / "requests" / "profile-1.json")
    result = run_cli("watch", run, "--once")
    assert result.code == 0, result.err
    assert "\x1b" not in result.out and "pwned" not in result.out
    assert "rank 1: its steps.bin does not read; set aside" in result.out
    look = json.loads(run_cli("watch", run, "--once", "--json").out)
    assert [r["rank"] for r in look["ranks"]] == [0, 1, 2]
    assert {r["rank"]: r["state"] for r in look["ranks"]}[2] == "crashed"


def test_window_options_on_a_run_without_windows(tmp_path: Path) -> None:
    run = _run(tmp_path)
    for argv in (
        ("report", run, "--window", 3),
        ("export", run, "--window", 3),
        ("tui", run, "--window", 3),
    ):
        result = run_cli(*argv)
        assert result.code == 2 and "no profile window 3" in result.err, result.err


def test_collect_live_needs_a_terminal(tmp_path: Path) -> None:
    result = run_cli("collect", "--live", "-o", tmp_path / "run", "--", "true")
    _one_line_refusal(result, "--live shows a screen")
    assert not (tmp_path / "run").exists()


def test_the_live_screen_shows_the_ranks_and_p_asks_for_a_window(tmp_path: Path) -> None:
    import asyncio

    from rich.console import Console

    from traceview.tui.live import LiveApp

    run = _run(tmp_path, ranks=3, steps=40)
    (run / "job.log").write_text("epoch 1 loss 0.5\n\x1b[2Jepoch 2 loss 0.4\n")
    seen: dict[str, str] = {}

    def text(app: LiveApp, widget: str) -> str:
        console = Console(width=120, record=True)
        console.print(app.query_one(widget).content)
        return console.export_text()

    async def drive() -> None:
        app = LiveApp(run, interval=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(50):
                await pilot.pause(0.1)
                if app.look is not None:
                    break
            seen["job"], seen["ranks"] = text(app, "#job"), text(app, "#ranks")
            seen["log"] = text(app, "#log")
            await pilot.press("p")
            for _ in range(50):
                await pilot.pause(0.1)
                if (run / "requests" / "profile-1.json").exists():
                    break
            await pilot.press("q")

    asyncio.run(drive())
    assert "running" in seen["job"] and "3 ranks" in seen["job"] and "step 40" in seen["job"]
    assert [line.split()[:3] for line in seen["ranks"].splitlines()[1:4]] == [
        ["0", "40", "0"], ["1", "40", "0"], ["2", "40", "0"],
    ]  # fmt: skip
    assert "epoch 2 loss 0.4" in seen["log"] and "\x1b" not in seen["log"]
    asked = json.loads((run / "requests" / "profile-1.json").read_text())
    assert asked["steps"] == 3  # (collect's --steps, from live.json)


def test_a_window_folder_that_links_out_of_the_run_is_refused(tmp_path: Path) -> None:
    """RUN/windows a link to a folder elsewhere holding a window's traces: a report would
    ingest it, and cache its analysis, there; refused in one line, nothing written there."""
    import shutil

    run = _run(tmp_path)
    outside = tmp_path / "outside"
    shutil.copytree(SAMPLES / "pytorch" / "slowio", outside / "1" / "raw" / "rank-00000")
    status = {"rank": 0, "trace_files": ["rank-0.pt.trace.json.gz"], "state": "ok"}
    (outside / "1" / "raw" / "rank-00000" / "status.json").write_text(json.dumps(status))
    (run / "windows").symlink_to(outside, target_is_directory=True)
    before = _tree(outside)
    for argv in (("report", run, "--window", 1), ("report", run), ("export", run, "--window", 1)):
        _one_line_refusal(run_cli(*argv), "a link out of the run")
    assert _tree(outside) == before
