"""The hostile-input corpus's cases of a run being written (issue 55; tests/hostile_wave4.py
lists them with the other inputs of the fourth wave): the step records `collect` keeps (cut
mid-row, growing, replaced, vanishing while they are read, numbers that jump or go back),
`watch` and `profile` on them and on what is no such run (a folder of traces, a run of another
host, a job that has ended), and profile requests (a flood of them, unreadable ones, a request
folder that links outside the run). Every look is bounded (``watch --once``, ``profile --wait
--timeout``); nothing is written into the run but the one request `profile` makes.
"""

from __future__ import annotations

import copy
import functools
import os
import random
import shutil
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.hostile_corpus import (
    ESCAPES,
    SAMPLES,
    STATUS,
    WIDE,
    Case,
    Plan,
    Run,
    copy_run,
    dumps,
    flip_bits,
    nested,
)
from tests.hostile_wave4 import HTML, T0


def live_cases() -> list[Case]:
    return [*_record_cases(), *_not_a_run_cases(), *_request_cases()]


# --- step records of a run being written -------------------------------------------------------


def _rec() -> Any:
    from traceview.collectors import rankside_record as W

    return W


def step_row(step: int, ms: float = 10.0) -> tuple[int, ...]:
    start = T0 + step * 20_000_000
    return (step, 1, start, start + int(ms * 1e6), 0, 1_000_000)


def steps_bin(rows: Sequence[tuple[int, ...]]) -> bytes:
    W = _rec()
    return W.MAGIC_STEPS + b"".join(W.STEP_ROW.pack(*r) for r in rows)


def calls_bin(step: int, calls: int = 8, capacity: int = 64, phase: int = 2, op: int = 1) -> bytes:
    """A rank's calls.bin: its header (in a call since its last one began) and ``calls``
    all-reduces, the last still running."""
    W = _rec()
    rows = b""
    for i in range(calls):
        start = T0 + i * 20_000_000 + 5_000_000
        end = 0 if i == calls - 1 else start + 1_000_000
        rows += W.CALL_ROW.pack(start, end, 4096, i + 1, i, 0, op, 0, -1)
    rows += b"\0" * (W.CALL_ROW.size * (capacity - calls))
    last = T0 + (calls - 1) * 20_000_000 + 5_000_000
    head = W.CALLS_HEAD.pack(W.MAGIC_CALLS, capacity, 4242, calls, step, phase, last, last)
    return head + b"\0" * (W.HEAD_SIZE - len(head)) + rows


def live_json(host: str | None = None, pid: int = 1, **extra: Any) -> bytes:
    """collect's live.json: its process (pid 1 lives on every host: a job running), its host
    (this one, unless said)."""
    said = {"collect_pid": pid, "host": host or socket.gethostname(), "stall_s": 60,
            "started": "2026-12-03T10:00:00+0000", "steps": 3, "warmup": 1, **extra}  # fmt: skip
    return dumps(said)


def collect_run(d: Path, ranks: int = 2, steps: int = 40, traces: bool = True,
                live: bytes | None = None) -> Path:  # fmt: skip
    """A run directory as `collect` leaves it while the job runs: each rank's step record,
    calls, status and (``traces``) its first window's trace; live.json."""
    run = d / "RUN"
    for r in range(ranks):
        folder = run / "raw" / f"rank-{r:05d}"
        folder.mkdir(parents=True)
        (folder / "steps.bin").write_bytes(steps_bin([step_row(s) for s in range(steps)]))
        (folder / "calls.bin").write_bytes(calls_bin(steps))
        status = {**copy.deepcopy(STATUS), "rank": r, "trace_files": []}
        if traces:
            name = f"rank-{r % 2}.pt.trace.json.gz"
            shutil.copy(SAMPLES / "pytorch/slowio" / name, folder / name)
            status["trace_files"] = [name]
        (folder / "status.json").write_bytes(dumps(status))
    (run / "live.json").write_bytes(live if live is not None else live_json())
    return run


#: what `profile` may add to a run: its request, in the run's requests folder
ASKED = r"requests(/profile-\d+\.json)?"


def live_runs(run: Path, steps: str = "2", report: bool = True) -> list[Run]:
    """A look, a look as JSON, the live screen (no terminal here: refused), a request, and
    (``report``) the report of what it holds."""
    runs = [
        Run(["watch", str(run), "--once"]),
        Run(["watch", str(run), "--once", "--json"]),
        Run(["watch", str(run), "--interval", "0.05"], must_fail=True),
        Run(["profile", str(run), "--steps", steps]),
    ]
    if report:
        runs.append(Run(["report", "--json", str(run)]))
    return runs


def _record_cases() -> Iterator[Case]:
    def case(name: str, mutate: Callable[[Path], Any], timeout: float = 120.0,
             background: tuple[str, ...] = (), allowed: str = ASKED,
             report: bool = True, **kw: Any) -> Case:  # fmt: skip
        def build(d: Path) -> Plan:
            run = collect_run(d, **kw)
            mutate(run)
            return Plan(
                live_runs(run, report=report),
                inputs=4,
                frozen={run: allowed},
                background=list(background),
            )

        return Case(f"record-{name}", build, timeout=timeout)

    def steps(rank: int, data: bytes | Callable[[bytes], bytes]) -> Callable[[Path], object]:
        def mutate(run: Path) -> None:
            path = run / "raw" / f"rank-{rank:05d}" / "steps.bin"
            path.write_bytes(data(path.read_bytes()) if callable(data) else data)

        return mutate

    def both(data: bytes) -> Callable[[Path], object]:
        return lambda run: [steps(r, data)(run) for r in (0, 1)] and None

    def put(rel: str, data: bytes) -> Callable[[Path], object]:
        return lambda run: (run / rel).write_bytes(data)

    row = _rec().STEP_ROW.size
    magic = len(_rec().MAGIC_STEPS)
    yield case("good", lambda run: None)
    # cut mid-row, cut in the magic, empty, garbage
    for label, cut in (("mid-row", magic + 10 * row + row // 2), ("one-byte-row", magic + 1),
                       ("in-magic", 4), ("empty", 0)):  # fmt: skip
        yield case(f"steps-cut-{label}", steps(1, functools.partial(_head, size=cut)))
    yield case("steps-garbage", steps(0, random.Random(4).randbytes(4000)))
    yield case("steps-escape", steps(0, b"\x1b]0;pwned\x07" + ESCAPES["csi"].encode() * 50))
    yield case("steps-bitflip", steps(0, lambda b: flip_bits(b, 2, 40, start=magic)))
    # step numbers: far apart, backwards, repeated
    span = [step_row(0), step_row(2**32 - 1)]
    yield case("steps-span-u32", both(steps_bin(span)))
    yield case("steps-span-2e31", both(steps_bin([step_row(0), step_row(2**31)])))
    yield case("steps-span-one-rank", steps(1, steps_bin(span)))
    yield case("steps-backwards", both(steps_bin([step_row(s) for s in range(40, 0, -1)])))
    yield case("steps-repeated", both(steps_bin([step_row(s % 5) for s in range(40)])))
    yield case("steps-one-number", both(steps_bin([step_row(7)] * 40)))
    # times: the end before the start, at the ends of int64, a comm longer than the step
    wild = [(s, 1, T0 + s, T0 + s - 5, -1, 2**62) for s in range(20)]
    yield case("steps-times-backwards", both(steps_bin(wild)))
    extreme = [(s, 2**32 - 1, 2**62 + s, 2**63 - 1, 2**63 - 1, -(2**63)) for s in range(20)]
    yield case("steps-times-extreme", both(steps_bin(extreme)))
    # big: a sparse file of zeros past its rows, a million rows
    yield case("steps-sparse-4gb", lambda run: _sparse(run / "raw/rank-00000/steps.bin", 4 << 30))
    yield case(
        "steps-1m-rows",
        both(steps_bin([step_row(s, 10 + s % 7) for s in range(1_000_000)])),
        timeout=240,
        report=False,
    )
    # calls.bin and end.json
    W = _rec()
    head = W.CALLS_HEAD
    for label, fields in (
        ("capacity-huge", (W.MAGIC_CALLS, 2**32 - 1, 1, 2**62, 5, 2, T0, T0)),
        ("written-wide", (W.MAGIC_CALLS, 64, 1, 2**63 - 1, 5, 2, T0, T0)),
        ("phase-wide", (W.MAGIC_CALLS, 64, 1, 3, 2**32 - 1, 2**32 - 1, -1, 2**63 - 1)),
        ("step-wide", (W.MAGIC_CALLS, 64, 2**32 - 1, 3, 2**32 - 1, 0, 2**63 - 1, -(2**63))),
    ):
        yield case(f"calls-{label}", put("raw/rank-00000/calls.bin",
                                          head.pack(*fields) + b"\xff" * 9000))  # fmt: skip
    yield case("calls-cut", put("raw/rank-00001/calls.bin", calls_bin(40)[:100]))
    yield case("calls-garbage", put("raw/rank-00001/calls.bin", random.Random(6).randbytes(9000)))
    yield case("calls-op-index-wide", put("raw/rank-00001/calls.bin", calls_bin(40, op=255)))
    for label, content in (
        ("escape", dumps({"state": "exception", "detail": ESCAPES["csi"] + HTML, "t_ns": 1})),
        ("wide", dumps({"state": "signal", "detail": WIDE, "t_ns": WIDE})),
        ("deep", nested(100_000).encode()),
        ("garbage", random.Random(8).randbytes(300)),
        ("huge", b'{"detail": "' + b"x" * (4 << 20) + b'"}'),
    ):
        yield case(f"end-{label}", put("raw/rank-00001/end.json", content))
    # live.json: what collect says of the job
    for label, content in (
        ("garbage", random.Random(10).randbytes(200)),
        ("deep", b'{"host":' + nested(100_000).encode() + b"}"),
        ("pid-wide", live_json(pid=WIDE)),
        ("pid-2e31", live_json(pid=2**31)),
        ("pid-2e63", live_json(pid=2**63)),
        ("pid-neg", live_json(pid=-1)),
        ("pid-float", live_json(pid=1.5)),  # type: ignore[arg-type]
        ("exit-code-wide", live_json(exit_code=WIDE)),
        ("stall-nan", live_json(stall_s=float("nan"))),
        ("stall-inf", live_json(stall_s=1e308 * 10)),
        ("stall-neg", live_json(stall_s=-5)),
        ("steps-wide", live_json(steps=WIDE, warmup=WIDE)),
        ("escape", live_json(started=ESCAPES["csi"] + ESCAPES["bidi"], host=ESCAPES["osc"])),
        ("html", live_json(started=HTML)),
    ):
        yield case(f"live-{label}", put("live.json", content))
    # what is not a regular file where files are read; rank folders of every shape
    yield case("fifos", _fifos, timeout=60)
    yield case("devzero-links", _devzero_links, timeout=60)
    yield case("rank-folders-odd", _odd_rank_folders)
    yield case("rank-folders-1000-empty", _empty_rank_folders)
    yield case("rank-folders-1024", lambda run: None, ranks=1024, steps=50, traces=False,
               timeout=240)  # fmt: skip
    yield case("steps-link-outside", _link_outside)
    # a record that grows, a file that vanishes, while the commands read it
    yield case("growing", lambda run: None, background=(_GROW,), allowed=r"raw(/.*)?|" + ASKED)
    yield case("vanishing", lambda run: None, background=(_VANISH,),
               allowed=r"raw(/.*)?|" + ASKED)  # fmt: skip
    yield case("replaced", lambda run: None, background=(_REPLACE,),
               allowed=r"raw(/.*)?|" + ASKED)  # fmt: skip
    yield case("no-traces", lambda run: None, traces=False)


def _head(data: bytes, size: int) -> bytes:
    return data[:size]


def _empty_rank_folders(run: Path) -> None:
    """1,000 rank folders of no record beside the two ranks' (an older run's, or just made)."""
    for r in range(2, 1002):
        (run / "raw" / f"rank-{r:05d}").mkdir()


def _sparse(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _fifos(run: Path) -> None:
    folder = run / "raw" / "rank-00001"
    for name in ("steps.bin", "calls.bin", "end.json", "status.json"):
        (folder / name).unlink(missing_ok=True)
        os.mkfifo(folder / name)
    (run / "requests").mkdir()
    os.mkfifo(run / "requests" / "profile-1.json")
    (run / "live.json").unlink()
    os.mkfifo(run / "live.json")


def _devzero_links(run: Path) -> None:
    folder = run / "raw" / "rank-00001"
    for name in ("steps.bin", "calls.bin", "end.json", "status.json"):
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to("/dev/zero")
    (run / "requests").mkdir()
    (run / "requests" / "profile-1.json").symlink_to("/dev/zero")


def _odd_rank_folders(run: Path) -> None:
    raw = run / "raw"
    shutil.copytree(raw / "rank-00000", raw / "rank-99999999")  # (8 digits)
    shutil.copytree(raw / "rank-00000", raw / f"rank-{WIDE}")
    shutil.copytree(raw / "rank-00000", raw / "rank-\x1b[31m1")
    (raw / "rank-00007").write_bytes(b"a file named as a rank's folder")
    (raw / "rank-00008").symlink_to("/")
    (raw / "rank-00009").symlink_to(raw, target_is_directory=True)


def _link_outside(run: Path) -> None:
    """Rank 1's record a link to a file outside the run (read, never written)."""
    outside = run.parent / "outside.bin"
    outside.write_bytes(steps_bin([step_row(s) for s in range(40)]))
    (run / "raw/rank-00001/steps.bin").unlink()
    (run / "raw/rank-00001/steps.bin").symlink_to(outside)


# (programs run beside the commands, in the case's folder: RUN is the run)
_GROW = f"""
import os, struct, time
row = struct.Struct("<IIqqqq")
path = "RUN/raw/rank-00000/steps.bin"
step, t0 = 40, {T0}
with open(path, "r+b") as f:
    while True:
        f.seek(0, 2)
        start = t0 + step * 20_000_000
        data = row.pack(step, 1, start, start + 10_000_000, 0, 1_000_000)
        f.write(data[:17]); f.flush()  # (a row cut short, then the rest of it)
        f.write(data[17:]); f.flush()
        step += 1
        if step % 64 == 0:
            time.sleep(0.005)
"""
_VANISH = """
import os, shutil, time
raw = "RUN/raw"
keep = open(raw + "/rank-00001/steps.bin", "rb").read()
while True:
    shutil.rmtree(raw + "/rank-00001", ignore_errors=True)
    time.sleep(0.003)
    os.makedirs(raw + "/rank-00001", exist_ok=True)
    with open(raw + "/rank-00001/steps.bin", "wb") as f:
        f.write(keep[: len(keep) // 3])
    time.sleep(0.003)
"""
_REPLACE = """
import os, time
path = "RUN/raw/rank-00000/steps.bin"
keep = open(path, "rb").read()
n = 0
while True:
    n += 1
    with open(path + ".new", "wb") as f:
        f.write(keep[: 8 + 40 * (n % 40)] + b"\\x07" * (n % 3))
    os.replace(path + ".new", path)
    time.sleep(0.002)
"""


# --- `watch` and `profile` on what is not a run collect writes ---------------------------------


def _not_a_run_cases() -> Iterator[Case]:
    def case(name: str, make: Callable[[Path], Path]) -> Case:
        def build(d: Path) -> Plan:
            target = make(d)
            runs = [
                Run(["watch", str(target), "--once"], must_fail=True),
                Run(["watch", str(target), "--once", "--json"], must_fail=True),
                Run(["profile", str(target)], must_fail=True),
                Run(["profile", str(target), "--wait", "--timeout", "3"], must_fail=True),
            ]
            return Plan(runs, frozen={d: r"\.(out|err)-\d+"})

        return Case(f"notrun-{name}", build, timeout=60)

    def folder(d: Path) -> Path:
        (d / "empty").mkdir()
        return d / "empty"

    def traces(d: Path) -> Path:
        shutil.copytree(SAMPLES / "pytorch/slowio", d / "traces")
        return d / "traces"

    def fifo(d: Path) -> Path:
        os.mkfifo(d / "fifo")
        return d / "fifo"

    def a_file(d: Path) -> Path:
        (d / "notes.txt").write_bytes(b"x")
        return d / "notes.txt"

    def raw_without_steps(d: Path) -> Path:  # (rank folders, but no record in them)
        run = collect_run(d, live=b"")
        (run / "live.json").unlink()
        for p in run.glob("raw/*/steps.bin"):
            p.unlink()
        return run

    def steps_dir(d: Path) -> Path:  # (steps.bin a folder)
        run = raw_without_steps(d)
        (run / "raw/rank-00000/steps.bin").mkdir()
        return run

    def live_dir(d: Path) -> Path:
        run = raw_without_steps(d)
        (run / "live.json").mkdir()
        return run

    def link_loop(d: Path) -> Path:
        (d / "loop").symlink_to(d / "loop")
        return d / "loop"

    yield case("empty-folder", folder)
    yield case("traces-folder", traces)
    yield case("ingested-run", lambda d: copy_run(d))
    yield case("fifo", fifo)
    yield case("regular-file", a_file)
    yield case("missing", lambda d: d / "nowhere")
    yield case("raw-without-records", raw_without_steps)
    yield case("steps-is-a-folder", steps_dir)
    yield case("live-is-a-folder", live_dir)
    yield case("symlink-loop", link_loop)
    yield case("name-escape", lambda d: d / "RUN\x1b[2J\x07\u202e")
    yield case("devnull", lambda d: Path("/dev/null"))


# --- profile requests --------------------------------------------------------------------------


def request(window: int, start: int = 10_000, steps: int = 2, warmup: int = 1) -> bytes:
    return dumps({"window": window, "start_step": start, "steps": steps, "warmup": warmup,
                  "asked_ns": T0})  # fmt: skip


def _request_cases() -> Iterator[Case]:
    def case(name: str, make: Callable[[Path], Plan], timeout: float = 120.0) -> Case:
        return Case(f"request-{name}", make, timeout=timeout)

    def flood(content: Callable[[int], bytes], count: int = 1000) -> Callable[[Path], Plan]:
        def build(d: Path) -> Plan:
            run = collect_run(d)
            (run / "requests").mkdir()
            for k in range(1, count + 1):
                (run / "requests" / f"profile-{k}.json").write_bytes(content(k))
            return Plan(live_runs(run), inputs=4, frozen={run: ASKED})

        return build

    # a flood of requests already there: pending ones refuse a new one, unreadable ones are not
    # overwritten
    yield case("flood-1000-pending", flood(request))
    yield case("flood-1000-passed", flood(lambda k: request(k, start=0)))
    yield case("flood-1000-garbage", flood(lambda k: random.Random(k).randbytes(50)))
    yield case("flood-1000-wrong-window", flood(lambda k: request(k + 5000)))
    yield case("flood-20k-names", flood(lambda k: b"", count=20_000), timeout=240)

    def asks(d: Path) -> Plan:
        """Eight asks in a row: four pending at most, the rest refused in one line."""
        run = collect_run(d)
        runs = [Run(["profile", str(run), "--steps", "2"], must_fail=k >= 4) for k in range(8)]
        return Plan(runs, inputs=4, frozen={run: r"requests(/profile-[1-4]\.json)?"})

    yield case("asks-8", asks)

    def ended(live: bytes | None = None, manifest: bool = False,
              ends: bool = False) -> Callable[[Path], Plan]:  # fmt: skip
        def build(d: Path) -> Plan:
            run = collect_run(d, live=live)
            if manifest:
                (run / "manifest.json").write_bytes(dumps({"collect": {"exit_code": 0}}))
            if ends:
                for r in (0, 1):
                    (run / f"raw/rank-{r:05d}/end.json").write_bytes(
                        dumps({"state": "ok", "detail": None, "t_ns": T0 + 10**9})
                    )
            runs = [
                Run(["profile", str(run), "--steps", "2"], must_fail=True),
                Run(["profile", str(run), "--wait", "--timeout", "5"], must_fail=True),
                Run(["watch", str(run), "--once", "--json"]),
            ]
            return Plan(runs, inputs=4, frozen={run: ""})

        return build

    yield case("job-ended-exit-code", ended(live=live_json(exit_code=0)))
    yield case("job-ended-exit-code-1", ended(live=live_json(exit_code=1)))
    yield case("job-ended-manifest", ended(manifest=True))
    yield case("job-ended-collect-dead", ended(live=live_json(pid=4_194_305)))  # (> pid_max)
    yield case("job-ended-every-rank-ended", ended(ends=True))
    yield case("job-ended-other-host", ended(live=live_json(host="elsewhere.example", exit_code=0)))

    def other_host(d: Path) -> Plan:
        """The job runs on another host that shares the run directory: looked at, asked."""
        run = collect_run(d, live=live_json(host="elsewhere.example", pid=4_194_305))
        runs = [*live_runs(run), Run(["profile", str(run), "--wait", "--timeout", "2"],
                                     must_fail=True)]  # fmt: skip
        return Plan(runs, inputs=4, frozen={run: ASKED})

    yield case("other-host", other_host)

    def hostile_files(d: Path) -> Plan:
        run = collect_run(d)
        req = run / "requests"
        req.mkdir()
        os.mkfifo(req / "profile-1.json")
        (req / "profile-2.json").mkdir()
        (req / "profile-3.json").symlink_to("/dev/zero")
        (req / "profile-4.json").write_bytes(b"{" + b" " * (10 << 20) + b"}")
        (req / "profile-5.json").write_bytes(b'{"window":' + nested(100_000).encode() + b"}")
        (req / "profile-6.json").write_bytes(dumps({"window": WIDE, "start_step": WIDE,
                                                    "steps": WIDE, "warmup": WIDE}))  # fmt: skip
        (req / "profile-7.json").write_bytes(request(7, steps=-1, warmup=-1))
        (req / "profile-8.json").write_bytes(request(8)[:20])
        (req / f"profile-{WIDE}.json").write_bytes(request(9))
        (req / "profile-\x1b[2J.json").write_bytes(request(10))
        return Plan(live_runs(run), inputs=4, frozen={run: ASKED})

    yield case("files-hostile", hostile_files, timeout=60)

    def folder_is_file(d: Path) -> Plan:
        run = collect_run(d)
        (run / "requests").write_bytes(b"not a folder")
        return Plan([Run(["profile", str(run)], must_fail=True)], frozen={run: ""})

    yield case("folder-is-a-file", folder_is_file)

    def folder_outside(d: Path) -> Plan:
        """RUN/requests a link to a folder outside the run: nothing is written there."""
        run = collect_run(d)
        (d / "outside").mkdir()
        (run / "requests").symlink_to(d / "outside", target_is_directory=True)
        return Plan(live_runs(run), frozen={d / "outside": ""})

    yield case("folder-links-outside", folder_outside)

    def windows_outside(d: Path) -> Plan:
        """RUN/windows a link to a folder outside the run, holding a window's traces: read,
        never written into."""
        run = collect_run(d)
        (d / "outside" / "1").mkdir(parents=True)
        shutil.copytree(run / "raw", d / "outside" / "1" / "raw")
        (run / "windows").symlink_to(d / "outside", target_is_directory=True)
        (run / "requests").mkdir()
        (run / "requests" / "profile-1.json").write_bytes(request(1))
        runs = [*live_runs(run), Run(["report", str(run), "--window", "1"]),
                Run(["export", str(run), "-o", str(d / "EXPORT")])]  # fmt: skip
        return Plan(runs, frozen={d / "outside": ""})

    yield case("windows-link-outside", windows_outside)
