"""Across ranks: matched collectives, communication split into waiting and transfer, the
straggler and its phase, and clocks estimated from collectives.

Three kinds of ground truth. Synthetic Kineto jobs (tests/synthetic_jobs.py) whose every time is
known exactly, with clocks shifted by known offsets and drifts. Real CPU runs (sample_traces/
pytorch/slowfwd, slowdata: one rank does known extra work in one phase, every phase timed on every
rank): a fast rank's wait is its all-reduce timer minus the slow rank's (both wait where the other
is late, so the difference of their waits is compared). And real one-host runs, whose clocks are
one clock: an offset estimated there must come out near zero.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import SAMPLES, for_unit
from tests.synthetic_jobs import Job, write
from traceview.analysis.crossrank import cross_rank, estimate_clocks, match_collectives
from traceview.model.results import RunReport
from traceview.runs import open_run

MULTI_RANK = [
    "pytorch/ddp", "pytorch/explicit", "pytorch/slowio", "pytorch/slowfwd", "pytorch/slowdata",
    "pytorch/scaling/ranks-2", "pytorch/scaling/ranks-4", "tensorflow/mwms", "mxnet/dist_sync",
    "mxnet/dist_overlap",
]  # fmt: skip


def report_of(path: Path) -> RunReport:
    with open_run([path]) as run:
        return run.report()


def rank(report: RunReport, r: int):
    return next(x for x in report.ranks if x.rank == r)


# --- synthetic jobs: every time known -----------------------------------------------------------


def test_wait_and_transfer_are_exact_on_a_job_with_a_slow_forward(tmp_path: Path) -> None:
    job = Job(ranks=3, steps=12, forward_ms={1: 30.0})
    report = report_of(write(job, tmp_path / "job"))
    for r in range(job.ranks):
        row = rank(report, r)
        assert row.comm_wait_ms == pytest.approx(job.wait(r), abs=0.01)
        assert row.comm_transfer_ms == pytest.approx(job.transfer_ms, abs=0.01)
    s = report.summary
    assert s.straggler_rank == 1 and s.straggler_significant
    assert s.straggler_phase == "forward"
    assert s.straggler_phase_ms == pytest.approx(30.0, abs=0.01)
    assert s.straggler_phase_median_ms == pytest.approx(10.0, abs=0.01)
    assert s.straggler_wait_ms == pytest.approx(20.0, abs=0.01)  # per other rank
    # two of three ranks wait 20 ms against 4 ms of transfer: waiting, not the network
    # most of the communication is waiting for rank 1, whose forward the critical path runs
    # through: the bottleneck is that forward (without the path it reads "imbalance")
    assert s.bottleneck == "forward"
    assert s.comm_wait_ms == pytest.approx(40.0 / 3, abs=0.01)
    assert s.comm_transfer_ms == pytest.approx(4.0, abs=0.01)
    [allreduce] = report.collectives
    assert (allreduce.op, allreduce.name, allreduce.last_rank) == (
        "allreduce",
        "gloo:all_reduce",
        1,
    )
    assert allreduce.calls_per_step == 1.0 and allreduce.bytes == 4 << 20
    assert allreduce.skew_ms == pytest.approx(20.0, abs=0.01)
    assert allreduce.transfer_ms == pytest.approx(4.0, abs=0.01)


def test_the_straggler_phase_is_data_loading_when_one_rank_loads_slowly(tmp_path: Path) -> None:
    job = Job(ranks=4, steps=8, io_extra_ms={2: 6.0}, transfer_ms=10.0)
    report = report_of(write(job, tmp_path / "job"))
    s = report.summary
    assert (s.straggler_rank, s.straggler_phase) == (2, "io")
    assert s.straggler_phase_ms == pytest.approx(7.0, abs=0.01)
    assert s.bottleneck == "comm"  # 10 ms transfer against 6 ms of waiting on 3 of 4 ranks
    assert rank(report, 0).comm_wait_ms == pytest.approx(6.0, abs=0.01)


def test_a_balanced_job_has_no_wait_and_no_significant_straggler(tmp_path: Path) -> None:
    report = report_of(write(Job(ranks=2, steps=6), tmp_path / "job"))
    assert report.summary.comm_wait_ms == pytest.approx(0.0, abs=0.01)
    assert report.summary.straggler_significant is False


# --- clocks ---------------------------------------------------------------------------------------

SHIFTED = {
    "offset_ms": {1: 3.7, 2: -12.5, 3: 250.0},
    "drift_ppm": {1: 40.0, 2: -80.0, 3: 15.0},
    "exit_jitter_ms": 0.05,
}


@pytest.mark.parametrize("gap_ms", [0.1, 300.0], ids=["short-profile", "long-profile"])
def test_clocks_shifted_with_drift_and_jitter_are_recovered(tmp_path: Path, gap_ms: float) -> None:
    """Four ranks on four hosts, clocks off by up to 250 ms and drifting by up to 80 ppm, exits
    jittered by 50 µs: the estimate brings every wait back to within 0.2 ms of the truth. Over
    the long profile (60 steps over 19 s) the drift is fitted; over the short one (2.4 s) it is
    not, and costs at most drift x span / 2."""
    job = Job(ranks=4, steps=60, forward_ms={3: 25.0}, gap_ms=gap_ms, **SHIFTED)  # type: ignore[arg-type]
    report = report_of(write(job, tmp_path / "job"))
    clocks = report.run.clocks
    assert clocks is not None and clocks.source == "collectives"
    # the jitter, and on the short profile the drift left unfitted (80 ppm x 2.7 s / 2)
    assert clocks.residual_us is not None and clocks.residual_us < (60 if gap_ms > 1 else 150)
    for r in range(job.ranks):
        row = rank(report, r)
        assert row.clock_offset_us == pytest.approx(job.offset_ms.get(r, 0.0) * 1e3, abs=120)
        assert row.comm_wait_ms == pytest.approx(job.wait(r), abs=0.2)
    if gap_ms > 1:
        assert clocks.max_drift_ppm == pytest.approx(80.0, abs=10)
    assert report.summary.straggler_rank == 3 and report.summary.straggler_phase == "forward"


def test_an_offset_within_the_noise_is_not_applied(tmp_path: Path) -> None:
    """Few calls whose ends spread by up to 8 ms cannot show a 0.3 ms offset: the clocks are
    left as they are (shifting by noise would only add error), and the report says so."""
    job = Job(ranks=2, steps=5, offset_ms={1: 0.3}, exit_jitter_ms=8.0, seed=3)
    report = report_of(write(job, tmp_path / "job"))
    clocks = report.run.clocks
    assert clocks is not None and clocks.source == "collectives"
    assert clocks.max_offset_us == 0 and all(r.clock_offset_us == 0 for r in report.ranks)


def test_unaligned_clocks_would_get_the_waits_wrong(tmp_path: Path) -> None:
    """The same shifted job read without the estimate: the waits are off by the offsets (the
    estimate is what makes them right, not the matching alone)."""
    job = Job(ranks=4, steps=20, forward_ms={3: 25.0}, **SHIFTED)  # type: ignore[arg-type]
    with open_run([write(job, tmp_path / "job")]) as run:
        raw = cross_rank(run.collectives, run.tables["comm"], align_clocks=False)
    waits = raw.waits.group_by("rank").agg(pl.col("wait_ns").mean() / 1e6)
    errors = [abs(w - job.wait(r)) for r, w in waits.iter_rows()]
    assert max(errors) > 2


@pytest.mark.parametrize("sample", [s for s in MULTI_RANK if s.startswith("pytorch")])
def test_clocks_estimated_on_one_host_come_out_near_zero(sample: str) -> None:
    """All ranks of the sample runs shared one host, hence one clock: whatever the estimate
    finds is its error."""
    with open_run([SAMPLES / sample]) as run:
        fit = estimate_clocks(match_collectives(run.collectives))
    assert fit is not None and not fit.unaligned
    assert max(abs(o) for o in fit.offset_ns.values()) < 500_000, fit.offset_ns


def test_one_host_runs_are_not_estimated() -> None:
    report = report_of(SAMPLES / "pytorch" / "slowfwd")
    assert report.run.clocks is not None and report.run.clocks.source == "one host"
    assert all(r.clock_offset_us is None for r in report.ranks)


# --- real runs against their timers -------------------------------------------------------------


def _timers(sample: str) -> tuple[dict, dict[int, dict[str, float]]]:
    truth = json.loads((SAMPLES / "pytorch" / sample / "groundtruth.json").read_text())
    means: dict[int, dict[str, float]] = {}
    for r in range(truth["world_size"]):
        records = [x for x in truth["records"] if x["rank"] == r and x["profiled"]]
        means[r] = {k: statistics.mean(x[k] for x in records) for k in ("allreduce_ms",)}
    return truth, means


@pytest.mark.parametrize("sample", ["slowfwd", "slowdata"])
def test_wait_and_straggler_agree_with_the_timers(sample: str) -> None:
    truth, timers = _timers(sample)
    slow = truth["straggler"]["rank"]
    report = report_of(SAMPLES / "pytorch" / sample)
    s = report.summary
    assert s.straggler_rank == slow and s.straggler_significant
    assert s.straggler_phase == {"data": "io"}.get(truth["straggler"]["phase"], "forward")
    slow_row = rank(report, slow)
    assert slow_row.comm_wait_ms is not None and slow_row.comm_transfer_ms is not None
    for r, t in timers.items():
        if r == slow:
            continue
        row = rank(report, r)
        assert row.comm_wait_ms is not None
        # both wait where the other is late: the difference of their waits is the difference
        # of their all-reduce timers
        expected = t["allreduce_ms"] - timers[slow]["allreduce_ms"]
        got = row.comm_wait_ms - slow_row.comm_wait_ms
        assert got == pytest.approx(expected, abs=max(1.5, 0.15 * expected)), (r, got, expected)
        assert row.comm_wait_ms > 0.25 * (row.comm_exposed_ms)
    # everyone leaves the all-reduce together: the transfer is the same on every rank
    transfers = [r.comm_transfer_ms for r in report.ranks]
    assert max(transfers) - min(transfers) < 0.1 * max(transfers)  # type: ignore[type-var, operator]


def test_a_balanced_run_reports_little_wait() -> None:
    s = report_of(SAMPLES / "pytorch" / "explicit").summary
    assert s.comm_wait_ms is not None and s.comm_wait_ms < 0.1 * s.comm_exposed_ms
    assert s.straggler_significant is False and s.bottleneck == "comm"


def test_wait_hidden_behind_backward_is_not_exposed_wait() -> None:
    """DDP over gloo hides most of its all-reduce behind backward: the waiting in there is in
    the totals, not in the exposed split, and is not a reason for a slow step."""
    s = report_of(SAMPLES / "pytorch" / "ddp").summary
    assert s.comm_wait_total_ms is not None and s.comm_wait_ms is not None
    assert s.comm_wait_total_ms > 2 * s.comm_wait_ms
    assert s.bottleneck == "backward"


def _wait_and_transfer_add_up(sample: str) -> None:
    report = report_of(SAMPLES / sample)
    assert report.collectives, "collectives were matched"
    for r in report.ranks:
        assert r.comm_wait_ms is not None and r.comm_transfer_ms is not None
        assert r.comm_wait_total_ms is not None and r.comm_transfer_total_ms is not None
        assert r.comm_wait_ms + r.comm_transfer_ms == pytest.approx(r.comm_exposed_ms, abs=2e-3)
        assert r.comm_wait_total_ms + r.comm_transfer_total_ms == pytest.approx(
            r.comm_total_ms, abs=2e-3
        )
        assert 0 <= r.comm_wait_ms <= r.comm_wait_total_ms + 1e-3
    s = report.summary
    assert s.comm_wait_ms + s.comm_transfer_ms == pytest.approx(s.comm_exposed_ms, abs=5e-3)  # type: ignore[operator]
    for c in report.collectives:
        assert c.ranks >= 2 and c.skew_ms >= 0 and c.transfer_ms >= 0 and c.wait_ms >= 0


@pytest.mark.parametrize("sample", for_unit(MULTI_RANK, lambda s: (SAMPLES / s,)))
def test_wait_and_transfer_add_up(sample: str) -> None:
    _wait_and_transfer_add_up(sample)


# --- bad input ------------------------------------------------------------------------------------


def test_calls_without_counterparts_are_counted_not_guessed() -> None:
    """Rank 1's last two profiled steps cut off (as a trace cut short): their calls on rank 0
    have no counterpart. They are counted per rank in one warning; the rest is matched."""
    with open_run([SAMPLES / "pytorch" / "slowdata"]) as run:
        collectives = run.collectives
        comm = run.tables["comm"]
        full = match_collectives(collectives)
        steps = sorted(set(pc.unique(collectives.column("step")).to_pylist()))
        cut = pc.and_(pc.equal(collectives.column("rank"), 1),
                      pc.is_in(collectives.column("step"), pa.array(steps[-2:])))  # fmt: skip
        short = collectives.filter(pc.invert(cut))
        matched = match_collectives(short)
        crossed = cross_rank(short, comm)
    per_step = full.calls.filter(pl.col("rank") == 0).height // len(steps)
    assert matched.unmatched == {0: 2 * per_step}
    assert matched.calls.height == full.calls.height - 4 * per_step
    assert crossed.available and crossed.waits.height > 0


def _push(rank: int, start: float, end: float, step: int = 3) -> dict:
    ms = 1_000_000
    return {
        "rank": rank, "step": step, "device": "cpu", "pid": 1, "tid": 9,
        "name": "KVStoreDistDefaultStoragePushPull", "collective": "push", "seq": 0,
        "bytes": None, "start_ns": int(start * ms), "end_ns": int(end * ms),
        "issued_ns": None,
    }  # fmt: skip


def test_a_workers_pushes_of_a_step_are_one_round() -> None:
    """A parameter server's workers push a step's keys at once, each until the server answers,
    in an order of their own; a profile nests them by their times, so one worker shows three
    calls where another shows one. Each worker's pushes of the step are one round, from its
    first push to its last answer, matched with the other's: the server answers the step's
    last key once both pushed it (rank 1 at 5 ms), so rank 0 waits from 1 to 5 and the round
    ends alike (11 ms)."""
    rows = [_push(0, 1, 4), _push(0, 4.5, 9), _push(0, 9.5, 11), _push(1, 5, 11.2)]
    from traceview.model import schema as S

    table = pa.Table.from_pylist(rows)
    table = S.conform(table, S.COLLECTIVES_SCHEMA)  # (the other columns: null)
    matched = match_collectives(table)
    assert matched.unmatched == {}
    calls = matched.calls.sort("rank")
    assert calls["rank"].to_list() == [0, 1]
    assert calls["start_ns"].to_list() == [1_000_000, 5_000_000]
    assert calls["end_ns"].to_list() == [11_000_000, 11_200_000]
    assert calls["last_arrival_ns"].to_list() == [5_000_000, 5_000_000]
    assert calls["last_rank"].to_list() == [1, 1]


def test_an_mxnet_job_whose_pushes_overlap_backward_is_matched_every_step() -> None:
    """``mxnet/dist_overlap``: Trainer.step right after backward, the pushes of the last layers
    overlapping the backward of the first; every worker's every step is answered by the one
    server (dist_sync), so every step has its calls on both workers: none left unmatched, and
    every counted step's critical path complete (it was one of five)."""
    report = report_of(SAMPLES / "mxnet" / "dist_overlap")
    assert not any("unmatched" in w or "left out" in w for w in report.warnings), report.warnings
    path = report.critical_path
    assert path is not None and path.complete_steps == path.steps == 5


def test_the_report_warns_once_with_counts_per_rank(tmp_path: Path) -> None:
    """A real run where one rank's trace holds one step fewer: one warning, counts per rank."""
    job = Job(ranks=3, steps=6, forward_ms={1: 20.0})
    out = write(job, tmp_path / "job")
    # rank 2's profile starts a step later: drop its first step's events
    import gzip

    path = out / "rank-2.pt.trace.json.gz"
    trace = json.loads(gzip.decompress(path.read_bytes()))
    first = next(e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#0")
    cut = first["ts"] + first["dur"]
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ts", cut) >= cut]
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    report = report_of(out)
    [warning] = [w for w in report.warnings if "counterpart" in w]
    assert "rank 0: 1" in warning and "rank 1: 1" in warning and "rank 2" not in warning
    assert rank(report, 0).comm_wait_ms == pytest.approx(10.0, abs=0.01)
