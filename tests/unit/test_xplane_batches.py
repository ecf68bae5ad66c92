"""An XSpace of many GPU planes converted a batch of planes at a time (parsers/xplane_batches.py,
issue 55), and native code run in a child whose death is one line (parsers/native_child.py).

The cut is checked at the wire level on XSpaces written by hand here; the conversion, against
xprof converting the whole (skipped where xprof or TensorFlow, which writes the synthetic
profiles, is absent): batch by batch, the trace events and the parsed events are the whole's.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from traceview.parsers import native_child as N
from traceview.parsers import xplane_batches as XB

needs_fork = pytest.mark.skipif(not N.forks(), reason="the child is forked (Linux)")


def _varint(value: int) -> bytes:
    return XB._varint_bytes(value)


def _plane(plane_id: int, name: str, body: bytes = b"") -> bytes:
    raw = name.encode()
    content = b"\x08" + _varint(plane_id) + b"\x12" + _varint(len(raw)) + raw + body
    return b"\x0a" + _varint(len(content)) + content


def _space(gpus: int, *, first_id: int = 1) -> bytes:
    host = _plane(0, "/host:CPU", b"\x1a\x02\x08\x01")  # (a line: id 1)
    planes = [_plane(first_id + n, f"/device:GPU:{n}") for n in range(gpus)]
    return host + b"".join(planes) + b"\x22\x04host"  # (hostnames: "host")


# --- the cut -------------------------------------------------------------------------------------


def test_few_gpu_planes_are_converted_whole() -> None:
    assert XB.batches(_space(8), 8) is None
    assert XB.batches(_space(0), 8) is None


def test_many_gpu_planes_are_cut_into_batches_each_with_every_other_plane() -> None:
    data = _space(10)
    plan = XB.batches(data, 4)
    assert plan is not None and len(plan) == 3
    names: list[str] = []
    for batch in plan:
        space = XB.xspace(data, batch)
        top = list(XB._fields(space, 0, len(space)))
        heads = [XB._plane_head(space, *f.payload) for f in top if f.number == 1 and f.payload]
        assert heads[0] == (0, "/host:CPU")
        gpus = [(i, n) for i, n in heads[1:]]
        assert len(gpus) <= 4
        # fresh ids (none the host's), each GPU plane's pid mapped to its pid in the whole
        assert [i for i, _ in gpus] == [1 + n for n in range(len(gpus))]
        assert batch.pids == {
            2 + n: 1 + (1 + int(name.rpartition(":")[2])) for n, (_, name) in enumerate(gpus)
        }
        assert any(f.number == 4 for f in top)  # the XSpace's other fields, as written
        names += [str(n) for _, n in gpus]
    assert names == [f"/device:GPU:{n}" for n in range(10)]


def test_a_gpu_plane_whose_pid_would_be_the_hosts_gets_one_of_its_own() -> None:
    """xprof's pid of a device plane is 1 + its id, its host threads' 701: a plane of id 700
    would share the host's process."""
    plan = XB.batches(_space(6, first_id=698), 4)
    assert plan is not None
    pids = {p for b in plan for p in b.pids.values()}
    assert XB.HOST_PID not in pids and XB.FAR_PID + 700 in pids
    assert {699, 700, 702, 703} <= pids


@pytest.mark.parametrize(
    "data",
    [b"", b"\x0a\xff\xff\xff\xff\x0f", b"\x08" + b"\xff" * 100, b"\x0b" * 50, b"\x0a\x05ab"],
    ids=["empty", "length-past-end", "varint-endless", "groups", "truncated"],
)
def test_what_is_no_well_formed_xspace_is_left_to_xprof(data: bytes) -> None:
    assert XB.batches(data, 1) is None


def test_batch_size_keeps_the_stacks_of_one_batchs_threads_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def stack(size: int) -> None:
        monkeypatch.setattr(resource, "getrlimit", lambda _: (size, resource.RLIM_INFINITY))

    stack(8 * 1024 * 1024)
    assert XB.batch_size() == 32
    stack(resource.RLIM_INFINITY)
    assert XB.batch_size() == 32
    stack(1024 * 1024)
    assert XB.batch_size() == XB.MAX_BATCH
    stack(1024**3)
    assert XB.batch_size() == XB.MIN_BATCH


# --- the child -----------------------------------------------------------------------------------


@needs_fork
def test_the_childs_documents_come_back_whole() -> None:
    big = "é€" * (N._CHUNK // 2 + 17)  # several pieces, characters of several bytes
    docs, logged = N.run(lambda: iter([b"", "{}", big]))
    assert [bytes(d) for d in docs] == [b"", b"{}", big.encode()]
    assert logged == []


@needs_fork
def test_an_exception_in_the_child_is_its_message() -> None:
    def work() -> Any:
        yield "first"
        raise ValueError("bad XSpace")

    with pytest.raises(N.NativeFailed, match=r"^bad XSpace$"):
        N.run(work)


@needs_fork
@pytest.mark.parametrize("number", [signal.SIGABRT, signal.SIGSEGV, signal.SIGKILL])
def test_a_child_dead_of_a_signal_is_one_line_with_the_fatal_line_it_logged(number: int) -> None:
    def work() -> Any:
        os.write(2, b"I0000 00:00:1.0 1 a.cc:1] fine\n")
        os.write(2, b"F0000 00:00:1.0 1 env.cc:93] Check failed: ret == 0 (11 vs. 0)\x1b\n")
        os.kill(os.getpid(), number)
        yield b""

    with pytest.raises(N.NativeDied) as caught:
        N.run(work)
    text = str(caught.value)
    assert text.startswith(f"killed by {signal.Signals(number).name}")
    assert text.endswith(": Check failed: ret == 0 (11 vs. 0) ") and "\n" not in text


@needs_fork
def test_what_the_child_logs_is_handed_back_and_the_parents_stderr_is_its_own() -> None:
    def work() -> Any:
        os.write(2, b"E0000 00:00:1.0 1 x.cc:2] no such plane\n")
        yield b"x"

    before = os.fstat(2)
    _, logged = N.run(work)
    assert logged == ["E0000 00:00:1.0 1 x.cc:2] no such plane"]
    assert (os.fstat(2).st_ino, os.fstat(2).st_dev) == (before.st_ino, before.st_dev)


def test_where_no_child_is_forked_the_work_runs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(N, "forks", lambda: False)
    pid = os.getpid()
    docs, _ = N.run(lambda: iter([str(os.getpid())]))
    assert docs == [str(pid)]
    with pytest.raises(N.NativeFailed, match="nope"):
        N.run(lambda: (_ for _ in ()).throw(OSError("nope")))


@needs_fork
def test_what_is_read_meanwhile_is_read_here_while_the_child_works(tmp_path: Path) -> None:
    """``meanwhile`` runs in this process while the child still works: the child waits for a
    file that only ``meanwhile`` writes."""
    flag = tmp_path / "written"
    here = os.getpid()
    seen: list[int] = []

    def work() -> Any:
        for _ in range(2000):  # (20 s at most)
            if flag.exists():
                yield f"{os.getpid()}"
                return
            time.sleep(0.01)
        yield "never"

    def meanwhile() -> None:
        seen.append(os.getpid())
        flag.write_text("x")

    docs, _ = N.run(work, meanwhile)
    assert seen == [here] and int(docs[0]) != here


def test_where_no_child_is_forked_meanwhile_runs_before_the_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(N, "forks", lambda: False)
    order: list[str] = []
    N.run(lambda: (order.append("work"), iter(["x"]))[1], lambda: order.append("meanwhile"))
    assert order == ["meanwhile", "work"]


@needs_fork
def test_work_left_while_waiting_is_done_once_here_while_a_child_works() -> None:
    done: list[int] = []
    N.while_waiting("test", lambda: done.append(os.getpid()))
    N.while_waiting("fails", lambda: 1 / 0)  # (left for the work itself to meet)
    docs, _ = N.run(lambda: iter([str(os.getpid())]))
    assert done == [os.getpid()] and int(docs[0]) != os.getpid()
    N.run(lambda: iter(["again"]))
    assert done == [os.getpid()]


@needs_fork
def test_in_two_runs_the_second_part_in_another_process_at_once(tmp_path: Path) -> None:
    """Each half waits for the other's file: they can only both finish side by side."""
    if N.cores() < 2:
        pytest.skip("one core: both halves run here, one after the other")

    def part(mine: str, theirs: str) -> bytes:
        (tmp_path / mine).write_text("x")
        for _ in range(2000):
            if (tmp_path / theirs).exists():
                return f"{mine}:{os.getpid()}".encode()
            time.sleep(0.01)
        return b"alone"

    a, b = N.in_two(lambda: part("a", "b"), lambda: part("b", "a"))
    assert a == f"a:{os.getpid()}".encode()
    assert b.startswith(b"b:") and b != f"b:{os.getpid()}".encode()


@needs_fork
def test_in_two_runs_the_second_part_here_where_its_process_died() -> None:
    here = os.getpid()

    def there() -> bytes:
        if os.getpid() != here:
            os.kill(os.getpid(), signal.SIGKILL)
        return b"x" * (1 << 21)  # (more than a pipe holds)

    assert N.in_two(lambda: b"first", there) == (b"first", b"x" * (1 << 21))


@pytest.mark.parametrize("where", ["no fork", "one core"])
def test_where_no_child_is_forked_in_two_runs_both_here(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "no fork":
        monkeypatch.setattr(N, "forks", lambda: False)
    else:
        monkeypatch.setattr(N, "cores", lambda: 1)
    assert N.in_two(lambda: str(os.getpid()).encode(), lambda: b"2") == (
        str(os.getpid()).encode(),
        b"2",
    )


# --- against xprof -------------------------------------------------------------------------------


@pytest.fixture
def synth(tmp_path: Path) -> Any:
    pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof")
    pytest.importorskip("tensorflow", reason="the synthetic XSpaces are written with TensorFlow")
    from tests.xspace_synth import write_xspace

    def make(gpus: int, steps: int = 3, events: bool = True) -> Path:
        """An XSpace as TensorFlow writes one (not yet grouped into steps): step markers on
        the host, kernel launches to every GPU, each GPU's kernels by correlation id."""
        host: list[Any] = []
        devices: dict[str, dict[str, list[Any]]] = {}
        corr = 1
        for d in range(gpus):
            devices[f"/device:GPU:{d}"] = {"Stream #1(Compute)": []}
        for s in range(steps if events else 0):
            t0 = s * 1000.0
            host.append(("train", t0, 900.0, {"step_num": s, "_r": 1}))
            for d in range(gpus):
                launch = {"correlation_id": corr, "device_id": d}
                host.append(("cudaLaunchKernel", t0 + 10 + d * 0.5, 0.3, launch))
                kernel = {"correlation_id": corr, "tf_op": f"model/dense_{d % 3}/MatMul:MatMul"}
                devices[f"/device:GPU:{d}"]["Stream #1(Compute)"].append(
                    ("volta_sgemm", t0 + 20 + d, 50.0 + d % 7, kernel)
                )
                corr += 1
        if not events:
            host.append(("train", 0.0, 900.0, {"step_num": 0, "_r": 1}))
        return write_xspace(
            tmp_path / f"gpus-{gpus}.xplane.pb", {"/host:CPU": {"python": host}, **devices}
        )

    return make


def _converted(path: Path, size: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    from traceview.parsers import tensorflow as T

    monkeypatch.setattr(XB, "batch_size", lambda: size)
    return XB.trace_events(T._require_xprof, path, T._native_error)


def _same(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    """The same metadata and events (an arg's column in any order)."""
    return all(
        x.select(sorted(x.column_names)).equals(y.select(sorted(y.column_names)))
        for x, y in zip(a, b, strict=True)
    )


def test_batch_by_batch_the_trace_events_are_the_wholes(
    synth: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = synth(10)
    whole = _converted(path, 64, monkeypatch)
    assert whole[1].column(XB.ARG + "group_id").null_count < whole[1].num_rows  # (grouped)
    assert _same(_converted(path, 3, monkeypatch), whole)


def test_an_xspace_that_names_its_host_converts_batch_by_batch_as_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorFlow's sample names its host ("vm", not its file's name): xprof checks a batch's
    host against the name it is given, so a batch is given none."""
    pytest.importorskip("xprof", reason="reading .xplane.pb needs xprof")
    from tests.conftest import SAMPLES

    raw = (SAMPLES / "tensorflow" / "mwms" / "rank-0.xplane.pb").read_bytes()
    path = tmp_path / "rank-0.xplane.pb"
    path.write_bytes(raw + b"".join(_plane(100 + n, f"/device:GPU:{n}") for n in range(10)))
    whole = _converted(path, 64, monkeypatch)
    assert "/device:GPU:9" in whole[0].column("name").to_pylist()
    assert _same(_converted(path, 3, monkeypatch), whole)


def test_batch_by_batch_the_parsed_profile_is_the_wholes(
    synth: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from traceview.parsers import tensorflow as T

    path = synth(6)
    parser = T.XPlaneParser()

    def parsed(size: int) -> list[Any]:
        monkeypatch.setattr(XB, "batch_size", lambda: size)
        T._read_whole.cache_clear()
        devices = parser.identify(path).devices or [None]
        out = []
        for device in devices:
            p = parser.parse(path, device)
            out.append((device, p.events, p.meta, p.notes.warnings, p.notes.remarks, p.threads))
        return out

    whole, cut = parsed(64), parsed(4)
    assert len(whole) == 6
    for a, b in zip(whole, cut, strict=True):
        assert a[0] == b[0] and a[1].equals(b[1]) and a[2:] == b[2:]


def test_a_thousand_gpu_planes_keep_the_hosts_process_their_own(
    synth: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """xprof would name GPU:699's process as the host's threads (pid 701 both): batch by batch
    each keeps its own."""

    path = synth(1000, events=False)
    meta, _ = _converted(path, XB.batch_size(), monkeypatch)
    names = {
        p: n
        for p, t, n in zip(
            *(meta.column(c).to_pylist() for c in ("pid", "tid", "name")), strict=True
        )
        if t is None
    }
    assert len(names) == 1001 and names[XB.HOST_PID] == "/host:CPU"
    assert sorted(names.values()) == sorted(
        ["/host:CPU", *(f"/device:GPU:{n}" for n in range(1000))]
    )


def test_the_columns_are_xprofs_own_events_event_for_event(synth: Any, tmp_path: Path) -> None:
    """``_trace_columns`` reads xprof's trace viewer events into columns (xprof's own Python
    encodes each as a JSON object with json.dumps): they hold exactly the events of xprof's
    JSON, field for field and in order (less its fake last event), the metadata its process
    and thread names, on a real profile and on ones with kernels, arguments and an instant
    event (no duration)."""
    import json

    from xprof.convert import raw_to_tool_data as tools

    from tests.conftest import REPO
    from tests.xspace_synth import write_xspace

    host = [("train", 0.0, 90.0, {"step_num": 0}), ("mark", 5.0, 0.0, {"note": "x"})]
    instant = write_xspace(tmp_path / "instant.xplane.pb", {"/host:CPU": {"python": host}})
    instants = 0
    for path in (REPO / "sample_traces/tensorflow/mwms/rank-0.xplane.pb", synth(3), instant):
        theirs = tools.xspace_to_tool_data([str(path)], "trace_viewer", {})
        document = json.loads(theirs[0] if isinstance(theirs, tuple) else theirs)
        native = tools._pywrap_profiler_plugin.xspace_to_tools_data([str(path)], *XB._TRACE)
        meta, events = XB.columns(XB._trace_columns(native))
        assert document["traceEvents"][-1] == {}  # xprof's fake last event
        expected = document["traceEvents"][:-1]
        names = [(e["pid"], e.get("tid"), e["args"]["name"]) for e in expected if e["ph"] == "M"
                 and e["name"] in ("process_name", "thread_name")]  # fmt: skip
        rows = zip(*(meta.column(c).to_pylist() for c in ("pid", "tid", "name")), strict=True)
        assert [row for row in rows if row[2]] == names
        expected = [e for e in expected if e["ph"] != "M"]
        got = events.to_pylist()
        assert len(got) == len(expected) > 1
        for event, row in zip(expected, got, strict=True):
            assert event["ph"] == ("X" if row["dur_ps"] else "i")
            assert (event["name"], event["pid"], event["tid"]) == (
                row["name"],
                row["pid"],
                row["tid"],
            )
            assert event["ts"] == row["ts_ps"] / 1e6
            assert event.get("dur") == (row["dur_ps"] / 1e6 if row["dur_ps"] else None)
            args = {
                k[len(XB.ARG) :]: v
                for k, v in row.items()
                if k.startswith(XB.ARG) and v is not None
            }
            assert args == {k: v for k, v in event.get("args", {}).items() if k in XB.ARGS}
        instants += sum(not row["dur_ps"] for row in got)
    assert instants > 0
    assert XB._trace_columns((b"", False)) == b""


def test_frames_join_into_one_table_an_arg_absent_from_a_frame_null_there() -> None:
    import pyarrow as pa

    meta = pa.table({"pid": pa.array([1], pa.int64()), "tid": pa.array([None], pa.uint64()),
                     "name": ["/host:CPU"]})  # fmt: skip
    base = {"name": ["a"], "pid": pa.array([1], pa.int64()), "tid": pa.array([2], pa.uint64()),
            "ts_ps": pa.array([5], pa.uint64()), "dur_ps": pa.array([7], pa.uint64())}  # fmt: skip
    first = pa.table({**base, XB.ARG + "step_num": ["3"]})
    second = pa.table({**base, XB.ARG + "run_id": ["9"]})
    doc = b"".join(XB._frame(meta) + XB._frame(first) + XB._frame(second))
    got_meta, events = XB.columns(doc)
    assert got_meta.equals(meta)
    assert events.column(XB.ARG + "step_num").to_pylist() == ["3", None]
    assert events.column(XB.ARG + "run_id").to_pylist() == [None, "9"]
    assert XB.columns(b"".join(XB._frame(meta)))[1].num_rows == 0
    for cut in (doc[:-1], doc[:5], b""):
        with pytest.raises(ValueError):
            XB.columns(cut)
