"""GPU runs (an H100, PyTorch 2.11, made by sample_traces/pytorch/make_gpu_traces.py).

On GPU runs traceview measures the device: a phase is the time its kernels and copies keep the
GPU busy. In the synchronized runs each phase ended in torch.cuda.synchronize(), so its timer
holds the phase's GPU work plus the host's launch latency before it and the synchronize after
it: device time is below the timer, but not far below (75 % of it or more for forward, backward
and the host-to-device copy). The optimizer's kernels take microseconds on the device while its
timer measures the host launching them; the GPU is idle meanwhile, and traceview says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SAMPLES
from tests.test_groundtruth import steps_with_timers
from traceview import rundir as R
from traceview import schema as S
from traceview.analysis.summary import summarize
from traceview.manifest import Manifest
from traceview.runs import ingest_run

RUNS = ("gpu_sync", "gpu_async", "gpu_ddp_nccl", "gpu_explicit_nccl")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gpu")
    return {name: ingest_run([SAMPLES / "pytorch" / name], out / name) for name in RUNS}


def joined(run: Path, name: str) -> pl.DataFrame:
    df = steps_with_timers(run, SAMPLES / "pytorch" / name)
    assert df.height == 5
    assert (df[S.TIMELINE] == S.DEVICE_GPU).all()
    return df


@pytest.mark.parametrize("name", RUNS)
def test_step_windows_match_the_step_timers(runs: dict[str, Path], name: str) -> None:
    df = joined(runs[name], name)
    assert ((df["wall_tv"] - df["step_ms"]).abs() <= 0.005 * df["step_ms"]).all()


@pytest.mark.parametrize("name", ["gpu_sync", "gpu_ddp_nccl", "gpu_explicit_nccl"])
def test_synchronized_phases_are_device_time(runs: dict[str, Path], name: str) -> None:
    df = joined(runs[name], name)
    for ours, timer in (
        ("h2d_tv", "h2d_ms"),
        ("forward_tv", "forward_ms"),
        ("backward_tv", "backward_ms"),
    ):
        ratio = df[ours] / df[timer]
        assert ratio.is_between(0.75, 1.0).all(), f"{ours}/{timer}: {ratio.to_list()}"
    assert (df["update_tv"] <= df["optimizer_ms"]).all()
    # Data loading happens on the host while the GPU waits: io is exactly the DataLoader's
    # region in the trace, and never more than its timer. (In the last profiled step of every
    # run the region ends 2-3 ms before the timer does, with nothing recorded in between.)
    events = pl.from_arrow(R.read_events(runs[name]))
    assert isinstance(events, pl.DataFrame)
    loader = (
        events.filter(pl.col(S.NAME).cast(pl.String).str.starts_with("enumerate(DataLoader)"))
        .group_by(S.STEP)
        .agg((pl.col(S.DUR_NS).sum() / 1e6).alias("region_ms"))
    )
    df = df.join(loader, on=S.STEP)
    assert ((df["io_tv"] - df["region_ms"]).abs() < 1e-3).all()
    assert (df["io_tv"] <= df["data_ms"] + 0.1).all()


def test_unsynchronized_run_shows_the_gpu_behind_the_host(runs: dict[str, Path]) -> None:
    sync = joined(runs["gpu_sync"], "gpu_sync")
    lagging = joined(runs["gpu_async"], "gpu_async")
    # Same model, same batches: the device needs the same time per phase...
    for phase in ("forward_tv", "backward_tv"):
        assert lagging[phase].mean() == pytest.approx(sync[phase].mean(), rel=0.05)
    # ...while the host only launches the work: its forward/backward timers are far shorter.
    assert (lagging["forward_ms"] < 0.7 * lagging["forward_tv"]).all()
    assert (lagging["backward_ms"] < 0.5 * lagging["backward_tv"]).all()


def test_explicit_allreduce_with_one_nccl_rank(runs: dict[str, Path]) -> None:
    """NCCL with a single rank launches no kernels for an in-place all-reduce (the groundtruth
    file records zero NCCL kernels in the trace); what remains is the host-side call."""
    truth = json.loads((SAMPLES / "pytorch" / "gpu_explicit_nccl" / "groundtruth.json").read_text())
    assert truth["nccl_kernels_in_trace"] == 0
    df = joined(runs["gpu_explicit_nccl"], "gpu_explicit_nccl")
    assert ((df["comm_total_tv"] - df["allreduce_ms"]).abs() <= 0.2 * df["allreduce_ms"]).all()
    assert (df["comm_hidden_fraction"] < 0.05).all()
    report = summarize(
        R.read_steps(runs["gpu_explicit_nccl"]), R.read_ops(runs["gpu_explicit_nccl"]), Manifest()
    )
    assert report.summary.hidden == "no"


def test_host_to_device_copies_are_h2d(runs: dict[str, Path]) -> None:
    events = pl.from_arrow(R.read_events(runs["gpu_sync"]))
    assert isinstance(events, pl.DataFrame)
    copies = events.filter(pl.col(S.NAME).cast(pl.String).str.starts_with("Memcpy HtoD"))
    assert copies.height >= 5 and set(copies[S.PHASE].cast(pl.String)) == {S.H2D}
    # one batch of 256 x 3 x 96 x 96 float32 per step (plus the small label tensor)
    assert copies[S.BYTES].max() == 256 * 3 * 96 * 96 * 4
