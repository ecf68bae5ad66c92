"""Memory: the peak per rank and device, the phase and operator at it, the growth across steps
and the imbalance across ranks, held to known sizes.

Ground truth: sample_traces/pytorch/memory and leak (made by make_memory_traces.py: CPU PyTorch,
DDP over gloo, 2 ranks under mpirun, profile_memory=True). In ``memory`` rank 0 allocates an
extra 256 MiB tensor in forward and holds it to the end of backward, and the gradients are
allocated in backward while it is held; in ``leak`` rank r appends (r + 1) * 2 MiB to a list at
every step. Both ranks run the same model on the same batch size, so everything else they
allocate is the same: the peaks differ by the extra tensor to within 1 MiB. On GPU, the shared
traces' own "Total Allocated" and "Total Reserved" records are the truth.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import SAMPLES, run_cli, shared_traces
from traceview.model import schema as S

MIB = 1 << 20


def truth(scenario: str) -> dict[str, Any]:
    return json.loads((SAMPLES / "pytorch" / scenario / "groundtruth.json").read_text())


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mem") / "run"
    result = run_cli("ingest", SAMPLES / "pytorch" / "memory", "-o", out)
    assert result.code == 0, result.err
    return out


def report(*args: str | Path) -> dict[str, Any]:
    result = run_cli("report", *args, "--json")
    assert result.code == 0, result.err
    data: dict[str, Any] = json.loads(result.out)
    return data


def test_extra_activation_on_one_rank_shows_as_its_peak_in_backward(memory_run: Path) -> None:
    known = truth("memory")["extra"]
    data = report(memory_run)
    ranks = {r["rank"]: r["memory"] for r in data["ranks"]}
    extra, other = ranks[known["rank"]], ranks[1 - known["rank"]]
    difference = (extra["peak_mb"] - other["peak_mb"]) * MIB
    assert abs(difference - known["bytes"]) <= 1 * MIB, (
        f"rank {known['rank']} holds {known['bytes'] / MIB:.0f} MiB more than the other, but its "
        f"peak is {difference / MIB:.1f} MiB above"
    )
    assert extra["peak_phase"] == known["peak_phase"], extra
    assert extra["device"] == "cpu" and extra["since_profiling_started"] is True
    assert extra["reserved_peak_mb"] is None, "the CPU allocator keeps no reserve: null, not 0"
    assert extra["by_device"]["cpu"]["reserved_peak_mb"] is None
    # nothing grows from step to step here
    for memory in ranks.values():
        assert memory["growth"] == "steady" and abs(memory["growth_mb_per_step"]) < 0.1
    summary = data["summary"]["memory"]
    assert summary["peak_rank"] == known["rank"] and summary["imbalanced"] is True
    assert abs(summary["excess_mb"] * MIB - known["bytes"]) <= 1 * MIB
    assert any(w.startswith(f"memory: rank {known['rank']} peaks") for w in data["warnings"]), data[
        "warnings"
    ]


def test_memory_section_and_warning_in_the_text_report(memory_run: Path) -> None:
    result = run_cli("report", memory_run)
    assert result.code == 0, result.err
    assert "Memory (MiB allocated, CPU: since profiling started)" in result.out
    assert "warning: memory: rank 0 peaks at" in result.out


def test_leak_per_step_is_the_leaked_size() -> None:
    known = truth("leak")["leak"]["bytes_per_step"]
    data = report(SAMPLES / "pytorch" / "leak")
    for rank in data["ranks"]:
        memory = rank["memory"]
        expected = known[str(rank["rank"])] / MIB
        assert abs(memory["growth_mb_per_step"] - expected) <= 0.1, (
            f"rank {rank['rank']} leaks {expected} MiB per step; reported "
            f"{memory['growth_mb_per_step']}"
        )
        assert memory["growth"] == "leak"
        steps = memory["by_device"]["cpu"]["steps"]
        ends = [s["end_mb"] for s in steps]
        assert all(abs((b - a) - expected) <= 0.1 for a, b in itertools.pairwise(ends))
        assert all(
            abs(s["start_mb"] - prev) <= 0.1 for s, prev in zip(steps[1:], ends, strict=False)
        )
    assert data["summary"]["memory"]["leaking_ranks"] == [0, 1]
    assert sum("grows" in w and "a leak?" in w for w in data["warnings"]) == 2


def test_memory_table_in_the_run_and_export(memory_run: Path, tmp_path: Path) -> None:
    table = pq.read_table(memory_run / "memory.parquet")
    assert table.schema.remove_metadata().equals(S.MEMORY_SCHEMA.remove_metadata())
    assert sorted(set(table.column(S.RANK).to_pylist())) == [0, 1]
    # CPU: Total Reserved is 0 in the trace, null in the table
    assert table.column(S.RESERVED_BYTES).null_count == table.num_rows
    extra = truth("memory")["extra"]["bytes"]
    assert extra in table.column(S.BYTES).to_pylist()  # the allocation itself
    out = tmp_path / "export"
    result = run_cli("export", memory_run, "-o", out)
    assert result.code == 0, result.err
    exported = pq.read_table(out / "memory.parquet")
    assert exported.num_rows == table.num_rows


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_an_unreadable_memory_table_leaves_memory_out_not_the_ranks(
    memory_run: Path, tmp_path: Path, damage: str
) -> None:
    """memory.parquet (every rank's memory records, in one file) damaged: each rank's events
    are still analysed and reported as before, memory absent, with one warning naming the
    file (each rank was left out over it before)."""
    import shutil

    whole = report(memory_run)
    assert whole["summary"]["memory"] is not None
    run = tmp_path / "run"
    shutil.copytree(memory_run, run)
    table = run / "memory.parquet"
    data = table.read_bytes()
    if damage == "truncated":
        table.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        table.write_bytes(data[:middle] + b"\xff" * 64 + data[middle + 64 :])
    for kept in run.glob("*.cache.json"):  # (computed again, as after any change)
        kept.unlink()
    data = report(run)
    assert data["run"]["ranks"] == 2 and [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["summary"]["breakdown_ms"] == whole["summary"]["breakdown_ms"]
    assert data["summary"]["memory"] is None and all(r["memory"] is None for r in data["ranks"])
    warned = [w for w in data["warnings"] if "memory.parquet" in w]
    assert len(warned) == 1 and "memory records left out" in warned[0], data["warnings"]
    text = run_cli("report", run)
    assert text.code == 0 and "memory records left out" in text.out, text.err


def test_trace_without_memory_records_reports_memory_absent_not_zero() -> None:
    data = report(SAMPLES / "pytorch" / "ddp")
    assert data["summary"]["memory"] is None
    assert all(r["memory"] is None for r in data["ranks"])
    notes = [n for n in data["remarks"] if n.startswith("memory:")]
    assert len(notes) == 1 and "no memory records" in notes[0]


def _kineto_memory(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e["args"] for e in events if e.get("name") == "[memory]"]


def test_gpu_peak_is_the_traces_largest_total_allocated() -> None:
    folder = shared_traces("pytorch/hta_df_index_resolver")
    records = _kineto_memory(next(folder.glob("*.json.gz")))
    gpu = [a for a in records if a["Device Type"] == 1]
    data = report(folder)
    (rank,) = data["ranks"]
    memory = rank["memory"]
    device = f"cuda:{gpu[0]['Device Id']}"
    assert memory["device"] == device, "a GPU rank's figures are its GPU's"
    assert memory["peak_mb"] == round(max(a["Total Allocated"] for a in gpu) / MIB, 3)
    assert memory["reserved_peak_mb"] == round(max(a["Total Reserved"] for a in gpu) / MIB, 3)
    assert memory["since_profiling_started"] is False
    assert memory["by_device"]["cpu"]["reserved_peak_mb"] is None
    assert memory["peak_phase"] in ("forward", "backward", "update")


def _allocator_steps(scenario: str) -> dict[int, dict[str, int]]:
    """The CUDA caching allocator's own figures per iteration (make_gpu_memory_traces.py)."""
    steps = truth(scenario)["steps"]
    return {int(k): v for k, v in steps.items() if k != "what"}


@pytest.mark.parametrize("scenario", ["gpu_memory", "gpu_leak"])
def test_gpu_steps_agree_with_the_cuda_allocators_statistics(scenario: str, tmp_path: Path) -> None:
    """A live H100 run: every profiled step's peak, start and end allocated memory, and the
    reserved peak, are what torch.cuda.max_memory_allocated / memory_allocated /
    max_memory_reserved said in the script (peak statistics reset at each iteration's start)."""
    allocator = _allocator_steps(scenario)
    memory = report(SAMPLES / "pytorch" / scenario)["ranks"][0]["memory"]
    assert memory["device"] == "cuda:0" and memory["since_profiling_started"] is False
    steps = memory["by_device"]["cuda:0"]["steps"]
    assert [s["step"] for s in steps] == [2, 3, 4, 5, 6]  # the profiler's active steps
    for step in steps:
        known = allocator[step["step"]]  # ProfilerStep#N is iteration N
        for field in ("start", "end", "peak"):
            assert abs(step[f"{field}_mb"] * MIB - known[f"{field}_bytes"]) <= 0.001 * MIB, (
                f"step {step['step']}: {field} {step[f'{field}_mb']} MiB, the allocator said "
                f"{known[f'{field}_bytes'] / MIB:.3f}"
            )
        assert step["peak_phase"] == "backward"  # the gradients arrive while activations live
    profiled = [allocator[s["step"]] for s in steps]
    assert memory["peak_mb"] == round(max(k["peak_bytes"] for k in profiled) / MIB, 3)
    assert memory["reserved_peak_mb"] == round(
        max(k["reserved_peak_bytes"] for k in profiled) / MIB, 3
    )
    if scenario == "gpu_leak":
        leak = truth(scenario)["leak"]["bytes_per_step"] / MIB
        assert memory["growth"] == "leak" and abs(memory["growth_mb_per_step"] - leak) <= 0.01
    else:
        assert memory["growth"] == "steady" and abs(memory["growth_mb_per_step"]) <= 0.01
        result = run_cli("ingest", SAMPLES / "pytorch" / scenario, "-o", tmp_path / "run")
        assert result.code == 0, result.err
        table = pq.read_table(tmp_path / "run" / "memory.parquet").to_pydict()
        cuda = [b for b, d in zip(table[S.BYTES], table[S.DEVICE], strict=True) if d == "cuda:0"]
        assert truth(scenario)["extra"]["bytes"] in cuda  # the extra tensor, allocated in forward


def test_collected_gpu_job_has_the_allocators_peak_and_no_growth() -> None:
    """`traceview collect` around a live CUDA job (make_gpu_memory_traces.py --no-profiler):
    every recorded step peaks where the allocator said every iteration peaked, and nothing
    grows. The last step ends where collect's profiler stopped, inside the optimizer's step,
    before the script's zero_grad frees the gradients (128 MiB more allocated than at the other
    step boundaries): growth is measured between steps, so it does not read that as a leak."""
    allocator = _allocator_steps("gpu_collect")
    steady = {k["peak_bytes"] for i, k in allocator.items() if i > 0}
    assert len(steady) == 1  # the same peak at every iteration after the first
    (peak,) = steady
    memory = report(SAMPLES / "pytorch" / "gpu_collect")["ranks"][0]["memory"]
    assert memory["device"] == "cuda:0"
    steps = memory["by_device"]["cuda:0"]["steps"]
    assert len(steps) == 5
    assert all(abs(s["peak_mb"] * MIB - peak) <= 0.001 * MIB for s in steps), steps
    assert all(s["peak_phase"] == "backward" for s in steps)
    assert memory["growth"] == "steady" and abs(memory["growth_mb_per_step"]) <= 0.01, memory
    gradients = truth("gpu_collect")["gradient_bytes"]
    assert abs((steps[-1]["end_mb"] - steps[-2]["end_mb"]) * MIB - gradients) <= 1 * MIB


def test_old_kineto_totals_are_summed_from_sizes() -> None:
    folder = shared_traces("pytorch/kineto_resnet50_num_workers_0")
    records = _kineto_memory(next(folder.glob("*.json.gz")))
    assert not any("Total Allocated" in a for a in records)  # the 2021 format
    total = peak = 0
    for a in records:  # in file order, which is time order in this trace
        if a["Device Type"] == 1:
            total += a["Bytes"]
            peak = max(peak, total)
    memory = report(folder)["ranks"][0]["memory"]
    assert memory["device"] == "cuda:0"
    assert memory["peak_mb"] == round(peak / MIB, 3)
    assert memory["since_profiling_started"] is True  # counted from the profiler's start
    assert memory["reserved_peak_mb"] is None  # the trace does not say


def test_impossible_memory_records_are_dropped_with_a_count(tmp_path: Path) -> None:
    source = SAMPLES / "pytorch" / "memory" / "rank-1.pt.trace.json.gz"
    with gzip.open(source) as f:
        trace = json.load(f)
    memory = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    real_peak = max(e["args"]["Total Allocated"] for e in memory)
    # a wrapped counter (2**64 - 1 read as a huge number), a negative total, a cut record
    memory[3]["args"]["Total Allocated"] = 2**64 - 1
    memory[5]["args"]["Total Allocated"] = -4096
    del memory[7]["args"]["Total Allocated"]
    target = tmp_path / "rank-1.pt.trace.json.gz"
    with gzip.open(target, "wt") as f:
        json.dump(trace, f)
    data = report(target)
    dropped = [w for w in data["warnings"] if "memory record(s) dropped" in w]
    assert len(dropped) == 1 and ": 3 memory record(s) dropped" in dropped[0], data["warnings"]
    assert data["ranks"][0]["memory"]["peak_mb"] == round(real_peak / MIB, 3)


def _mxnet_storage(path: Path) -> dict[str, int]:
    """The largest value of each of the trace's MXNet storage counters (``Memory: gpu/0``)."""
    with gzip.open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    peaks: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "C" and e.get("cat") == "Device Storage":
            value = e["args"][e["name"]]
            peaks[e["name"]] = max(peaks.get(e["name"], 0), value)
    return peaks


def test_mxnet_storage_counters_give_each_devices_peak() -> None:
    folder = SAMPLES / "mxnet" / "dist_overlap"
    data = report(folder)
    for rank in data["ranks"]:
        peaks = _mxnet_storage(folder / f"rank-{rank['rank']}.mxnet.json.gz")
        memory = rank["memory"]
        assert memory["device"] == "cpu"
        assert memory["peak_mb"] == round(peaks["Memory: cpu/0"] / MIB, 3)
        assert memory["reserved_peak_mb"] is None  # MXNet states no reserve


def test_mxnet_storage_counters_survive_a_record_the_typed_decode_rejects(
    tmp_path: Path,
) -> None:
    """One operator with a string time sends its part of the file down the slow path: the
    storage counters there are still read (they were lost with the part's arguments)."""
    source = SAMPLES / "mxnet" / "dist_overlap" / "rank-0.mxnet.json.gz"
    peaks = _mxnet_storage(source)
    with gzip.open(source) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    bad = next(e for e in events if e.get("ph") == "B" and e.get("cat") == "operator")
    bad["ts"] = str(bad["ts"])
    target = tmp_path / "rank-0.mxnet.json.gz"
    with gzip.open(target, "wt") as f:
        json.dump(data, f)
    memory = report(target)["ranks"][0]["memory"]
    assert memory["peak_mb"] == round(peaks["Memory: cpu/0"] / MIB, 3)


def test_mxnet_gpu_storage_counter_is_the_main_device() -> None:
    folder = shared_traces("mxnet/mxnet_profiler_demo_mnist_cnn")
    peaks = _mxnet_storage(next(folder.glob("*.json.gz")))
    memory = report(folder)["ranks"][0]["memory"]
    assert memory["device"] == "gpu:0"
    assert memory["peak_mb"] == round(peaks["Memory: gpu/0"] / MIB, 3)
    assert memory["by_device"]["cpu"]["peak_mb"] == round(peaks["Memory: cpu/0"] / MIB, 3)


def test_compare_puts_peak_memory_side_by_side() -> None:
    result = run_cli(
        "compare", SAMPLES / "pytorch" / "memory", SAMPLES / "pytorch" / "leak",
        SAMPLES / "pytorch" / "ddp", "--json",
    )  # fmt: skip
    assert result.code == 0, result.err
    runs = {r["label"]: r for r in result.json()["runs"]}
    extra = truth("memory")["extra"]
    leak = truth("leak")["leak"]["bytes_per_step"]
    assert runs["memory"]["memory_peak_rank"] == extra["rank"]
    assert runs["memory"]["memory_peak_phase"] == extra["peak_phase"]
    # leak: rank 1 leaks the most, and 5 steps of it are held at its peak
    assert runs["leak"]["memory_peak_rank"] == 1
    assert runs["leak"]["memory_peak_mb"] >= 5 * leak["1"] / MIB
    assert runs["ddp"]["memory_peak_mb"] is None  # no memory records: null, not 0
    highlights = result.json()["highlights"]
    assert any(h.startswith("memory peaks at") and "in backward" in h for h in highlights)


def test_tensorflow_gpu_memory_profile_peaks_as_xprof_says() -> None:
    """The GPU XSpace's memory profile, through xprof: each GPU rank's BFC allocator peaks where
    xprof's own summary says (peakStats: heap + stack bytes in use at the peak)."""
    xprof = pytest.importorskip("xprof.convert.raw_to_tool_data", reason="'.[tensorflow]'")
    folder = shared_traces("tensorflow/tfprofiler_gpu_multi_worker")
    path = next(folder.glob("*.xplane.pb"))
    result = xprof.xspace_to_tool_data([str(path)], "memory_profile", {})
    profile = json.loads(result[0] if isinstance(result, tuple) else result)
    peaks = {}
    for name, body in profile["memoryProfilePerAllocator"].items():
        stats = body["profileSummary"]["peakStats"]
        if name.startswith("GPU_"):
            device = f"gpu:{name.split('_')[1]}"
            peaks[device] = int(stats["heapAllocatedBytes"]) + int(stats["stackReservedBytes"])
    data = report(folder)
    # each GPU of the process a rank of its own (docs/frameworks/jax.md), with its allocator
    seen = set()
    for rank in data["ranks"]:
        device = rank["device"].lower()
        memory = rank["memory"]
        assert memory["by_device"][device]["peak_mb"] == round(peaks[device] / MIB, 3), device
        assert memory["device"] == device
        assert memory["reserved_peak_mb"] is None  # the profile states no reserve
        seen.add(device)
    assert seen == {"gpu:4", "gpu:6"} and seen <= set(peaks), peaks


def test_tensorflow_cpu_run_has_no_memory_profile_and_says_why() -> None:
    """TensorFlow's memory profile comes from its BFC allocators, off on CPU by default (and
    traceview does not switch the job's allocator): absent, with one note saying so."""
    pytest.importorskip("xprof", reason="'.[tensorflow]'")
    data = report(SAMPLES / "tensorflow" / "explicit")
    assert data["summary"]["memory"] is None
    notes = [n for n in data["remarks"] if n.startswith("memory:")]
    assert len(notes) == 1 and "BFC" in notes[0]


def test_mxnet_extra_array_on_one_worker_shows_as_its_peak() -> None:
    """sample_traces/mxnet/memory (make_traces.py memory): worker 0 holds an extra 256 MiB
    array from forward to after backward; both workers train the same model on the same batch
    size, so their peaks differ by the array, to within 1 MiB."""
    folder = SAMPLES / "mxnet" / "memory"
    known = json.loads((folder / "groundtruth.json").read_text())["extra"]
    data = report(folder)
    ranks = {r["rank"]: r["memory"] for r in data["ranks"]}
    extra, other = ranks[known["rank"]], ranks[1 - known["rank"]]
    assert abs((extra["peak_mb"] - other["peak_mb"]) * MIB - known["bytes"]) <= 1 * MIB
    assert extra["peak_phase"] in ("forward", "backward")  # while the array is held
    assert data["summary"]["memory"]["peak_rank"] == known["rank"]
    assert data["summary"]["memory"]["imbalanced"] is True


def test_tensorflow_extra_tensor_on_one_worker_with_bfc_on_cpu() -> None:
    """sample_traces/tensorflow/memory (make_traces.py memory, TF_CPU_ALLOCATOR_USE_BFC=true set
    by the script): worker 0 holds an extra 256 MiB tensor through forward and backward. The
    peaks do not differ by exactly 256 MiB here: worker 1's own peak (46 MiB) comes in another
    phase than the window where worker 0 holds the tensor. What holds: worker 0's peak is its
    BFC allocator's own peak_bytes_in_use (its high-water mark, stated in every record), at
    least 256 MiB, and far above worker 1's."""
    pytest.importorskip("xprof", reason="'.[tensorflow]'")
    from xprof.profile_data import ProfileData

    folder = SAMPLES / "tensorflow" / "memory"
    known = json.loads((folder / "groundtruth.json").read_text())["extra"]
    data = report(folder)
    ranks = {r["rank"]: r["memory"] for r in data["ranks"]}
    stated = 0
    for plane in ProfileData.from_file(str(folder / f"rank-{known['rank']}.xplane.pb")).planes:
        for line in plane.lines:
            for event in line.events:
                if event.name == "MemoryAllocation":
                    stated = max(stated, int(dict(event.stats)["peak_bytes_in_use"]))
    extra = ranks[known["rank"]]
    assert extra["device"] == "cpu"
    # the allocator's high-water mark may fall between two records (they state the bytes in use
    # after each one): 33 KB apart here
    assert abs(extra["peak_mb"] - stated / MIB) <= 0.1
    assert extra["peak_mb"] * MIB >= known["bytes"]
    assert ranks[1 - known["rank"]]["peak_mb"] * MIB < known["bytes"] / 4
    assert data["summary"]["memory"]["peak_rank"] == known["rank"]


def test_what_runs_at_an_instant_is_the_innermost_covering_event(tmp_path: Path) -> None:
    """The phase and operator at a peak come from walking up the call tree from the last event
    to start (a search, not a scan of every event per step): checked against a scan at every
    memory record's time and thread of a real GPU trace (151k events, 28k records)."""
    import numpy as np

    from traceview.analysis.memory import _HostEvents
    from traceview.runs import ingest_run
    from traceview.store import rundir as R

    run = ingest_run([shared_traces("pytorch/hta_df_index_resolver")], tmp_path / "run")
    rank = R.event_ranks(run)[0]
    host = _HostEvents.of(R.read_events(run, [rank]))
    records = R.read_side(run, "memory", [rank])
    assert records is not None and records.num_rows > 1000
    other = host.phases.index(S.OTHER) if S.OTHER in host.phases else -2

    def scan(ts: int, pid: int, tid: int) -> tuple[str | None, str | None]:
        covering = (host.ts <= ts) & (host.end >= ts)
        phase = op = None
        for p, t in [(pid, tid), *([host.training] if host.training != (pid, tid) else [])]:
            if p is None:
                continue
            rows = np.flatnonzero(covering & (host.pid == p) & (host.tid == t))
            rows = rows[np.lexsort((host.ts[rows], host.depth[rows]))]  # innermost last
            phased = rows[(host.phase[rows] != other) & (host.phase[rows] >= 0)]
            if phase is None and phased.size:
                phase = str(host.phases[host.phase[phased[-1]]])
            ops = rows[host.is_op[rows]]
            if op is None and ops.size:
                op = str(host.names[host.name[ops[-1]]])
        if phase is None and covering.any():
            phase = S.OTHER
        return phase, op

    ts = records.column(S.TS_NS).to_numpy()
    pid, tid = records.column(S.PID).to_numpy(), records.column(S.TID).to_numpy()
    picked = np.linspace(0, len(ts) - 1, 400).astype(int)
    found = [host.at(int(ts[i]), int(pid[i]), int(tid[i])) for i in picked]
    assert found == [scan(int(ts[i]), int(pid[i]), int(tid[i])) for i in picked]
    assert sum(op is not None for _, op in found) > 100  # the instants do fall in operators
