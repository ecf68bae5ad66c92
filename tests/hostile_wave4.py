"""The hostile-input corpus's cases for the inputs the fourth wave added (issue 55): Flight
Recorder dumps, the step records of a run being written (and `watch` and `profile` on them),
profile requests, per-device XPlane profiles, several trace files per rank, and names that
reach the HTML report (the run being written, its records and requests: tests/hostile_live.py).
``tests/hostile_corpus.py``'s ``all_cases()`` holds them; every run is
held to ``tests/hostile_run.py``'s contract, and beyond it, where a case says so:

- a pickle's code never runs: the file it would make never appears (``Plan.absent``);
- nothing is written into what is read (``Plan.frozen``): a folder of dumps or traces, a run
  `watch` looks at; `profile` adds its one request there, nothing else, and never outside it;
- a command that waits is bounded: ``watch --once``, ``profile --wait --timeout``; the live
  screen outside a terminal is refused;
- a record that grows or vanishes while it is read is made so by a program running beside
  the commands (``Plan.background``).

Every input is generated (deterministic, seeded): from the samples, from the dump format
PyTorch documents, from the rank side's own record layout, from the XSpace protobuf schema.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from tests.hostile_corpus import (
    ESCAPES,
    KINETO_GZ,
    MXNET,
    SAMPLES,
    WIDE,
    WRONG,
    Case,
    Plan,
    Run,
    _names,
    copy_run,
    dumps,
    events_of,
    flip_bits,
    gzip_bytes,
    nested,
    trace_runs,
    varint,
    walk_strings,
)

T0 = 1_790_000_000_000_000_000  # ns: the dumps' and records' clock
#: what a pickle that ran its code would make (in the case's folder: the commands' cwd)
RAN = "ran"
#: a name that is markup in a browser, in every way the HTML report could let one through
HTML = (
    '</script><script>window.__pwned=1</script></svg><svg onload="window.__pwned=2">'
    '</style><style>*{display:none}</style><!--<img src=x onerror="window.__pwned=3">'
    ']]><![CDATA[<a href="javascript:alert(1)">x</a>"\'\u202eevil\u2066\u001b[2J\u001b]0;t\u0007'
)


def wave4_cases() -> list[Case]:
    from tests.hostile_live import live_cases

    cases = [
        *_flight_cases(),
        *live_cases(),
        *_xdev_cases(),
        *_multi_cases(),
        *_html_cases(),
    ]
    return cases


# --- Flight Recorder dumps ---------------------------------------------------------------------


def fr_entry(
    seq: int,
    state: str = "completed",
    op: str = "all_reduce",
    group: tuple[str, str] = ("0", "default_pg"),
    t0: int = T0,
) -> dict[str, Any]:
    """One entry as NCCL's Flight Recorder writes it (torch/csrc/distributed/c10d)."""
    created = t0 + seq * 1_000_000
    return {
        "record_id": seq - 1, "pg_id": 0, "process_group": group,
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": f"nccl:{op}", "time_created_ns": created,
        "input_sizes": [[1 << 18]], "input_dtypes": ["Float"],
        "output_sizes": [[1 << 18]], "output_dtypes": ["Float"], "state": state,
        "time_discovered_started_ns": created + 1000 if state != "scheduled" else None,
        "time_discovered_completed_ns": created + 500_000 if state == "completed" else None,
        "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False,
        "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
    }  # fmt: skip


def fr_dump(entries: list[dict[str, Any]], world: int = 4) -> dict[str, Any]:
    return {
        "version": "2.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "pg_status": {"0": {"last_enqueued_collective": len(entries)}},
        "entries": entries,
        "nccl_comm_state": {},
        "comm_lib_version": "2.21.5",
    }


def hang_dumps(world: int = 4, stuck: int = 2) -> dict[int, dict[str, Any]]:
    """Every rank's dump of a job that hangs: ``stuck`` finished 10 calls, the others wait in
    the 11th."""
    done = [fr_entry(s) for s in range(1, 11)]
    return {
        r: fr_dump(done if r == stuck else [*done, fr_entry(11, "started")], world)
        for r in range(world)
    }


def write_dumps(folder: Path, dumps_: dict[int, Any], protocol: int = 2) -> None:
    for rank, dump in dumps_.items():
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=protocol))


class Payload:
    """What a pickle runs where its reader builds what it names: ``fn(*args)``."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.fn, self.args)


_TOUCH = f"touch {RAN}"
_OPEN = f"open({RAN!r}, 'w').close()"


def _spliced(dump: dict[str, Any], code: bytes) -> bytes:
    """``dump`` as a protocol-2 pickle (a dump's head: readers tell one by it) whose
    ``nccl_comm_state`` is ``code``: pickle opcodes written by hand (INST, persistent ids,
    extension codes: what ``pickle.dumps`` does not write)."""
    body = pickle.dumps({**dump, "nccl_comm_state": "PLACEHOLDER"}, protocol=0)
    assert body.count(b"VPLACEHOLDER\n") == 1
    return b"\x80\x02" + body.replace(b"VPLACEHOLDER\n", code)


#: pickles that try to run code, each in rank 2's dump of a hang: every way a pickle names
#: something to call
_EVIL: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "reduce-system-p2": lambda d: pickle.dumps(
        {**d, "nccl_comm_state": Payload(os.system, _TOUCH)}, protocol=2
    ),
    "reduce-system-p4": lambda d: pickle.dumps(
        {**d, "nccl_comm_state": Payload(os.system, _TOUCH)}, protocol=4
    ),
    "reduce-exec-p5": lambda d: pickle.dumps({**d, "pg_status": Payload(exec, _OPEN)}, protocol=5),
    "reduce-subprocess": lambda d: pickle.dumps(
        {**d, "version": Payload(subprocess.call, ["touch", RAN])}, protocol=2
    ),
    "reduce-in-entries": lambda d: pickle.dumps(
        {**d, "entries": [*d["entries"][:5], Payload(os.system, _TOUCH), *d["entries"][5:]]},
        protocol=2,
    ),
    "reduce-as-rank": lambda d: pickle.dumps({**d, "rank": Payload(os.system, _TOUCH)}, protocol=2),
    "reduce-eval-first": lambda d: pickle.dumps(
        [Payload(eval, f"__import__('os').system({_TOUCH!r})"), d], protocol=2
    ),
    "inst-opcode": lambda d: _spliced(d, b"(S'" + _TOUCH.encode() + b"'\nios\nsystem\n"),
    "obj-opcode": lambda d: _spliced(d, b"(cos\nsystem\nS'" + _TOUCH.encode() + b"'\no"),
    "persistent-id": lambda d: _spliced(d, b"S'" + _TOUCH.encode() + b"'\nQ"),
    "persistent-id-p0": lambda d: _spliced(d, b"P" + _TOUCH.encode() + b"\n"),
    "ext-code": lambda d: _spliced(d, b"\x82\x01"),
}


def _flight_cases() -> Iterator[Case]:
    def case(name: str, fill: Callable[[Path], object], timeout: float = 120.0) -> Case:
        def build(d: Path) -> Plan:
            folder = d / "dumps"
            folder.mkdir()
            fill(folder)
            inputs = max(len(os.listdir(folder)), 1)
            return Plan(
                trace_runs([folder], d / "OUT"),
                inputs=inputs,
                absent=[d / RAN],
                frozen={folder: ""},
            )

        return Case(f"flight-{name}", build, timeout=timeout)

    def with_rank(rank: int, content: Callable[[dict[str, Any]], bytes], world: int = 4,
                  name: str | None = None) -> Callable[[Path], None]:  # fmt: skip
        def fill(folder: Path) -> None:
            job = hang_dumps(world)
            write_dumps(folder, {r: d for r, d in job.items() if r != rank})
            (folder / (name or f"nccl_trace_rank_{rank}")).write_bytes(content(job[rank]))

        return fill

    yield case("good", lambda f: write_dumps(f, hang_dumps()))
    yield case("good-json", lambda f: [
        (f / f"dump_{r}.json").write_bytes(dumps(d)) for r, d in hang_dumps().items()
    ] and None)  # fmt: skip
    # pickles that try to run code: refused, never run (the marker never appears)
    for label, evil in _EVIL.items():
        yield case(f"pickle-{label}", with_rank(2, evil))
    yield case(
        "pickle-only-evil",
        lambda f: (f / "nccl_trace_rank_0").write_bytes(_EVIL["reduce-system-p2"](hang_dumps()[0])),
    )
    # cut short, damaged
    for frac in (0.01, 0.5, 0.99):
        yield case(
            f"pickle-truncate-{frac}",
            with_rank(0, functools.partial(_cut, frac=frac)),
        )
    yield case("json-truncate-0.5", with_rank(
        0, lambda d: (b := dumps(d))[: len(b) // 2], name="dump_0.json"))  # fmt: skip
    for seed in range(3):
        yield case(
            f"pickle-bitflip-{seed}",
            with_rank(1, functools.partial(_flipped, seed=seed)),
        )

    # dumps of other runs
    def other_run(folder: Path) -> None:
        write_dumps(folder, hang_dumps())
        later = [fr_entry(s, t0=T0 + 86_400 * 10**9) for s in range(1, 30)]
        (folder / "dump_1.json").write_bytes(dumps(fr_dump(later, world=8)))

    yield case("other-run", other_run)
    yield case(
        "other-run-every-rank-claims-0",
        lambda f: (
            [
                (f / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps({**d, "rank": 0}, 2))
                for r, d in hang_dumps().items()
            ]
            and None
        ),
    )
    # sequence numbers that go backwards
    yield case(
        "seq-backwards",
        with_rank(0, lambda d: pickle.dumps(
            {**d, "entries": [*d["entries"], *[fr_entry(s) for s in (3, 4, 2)]]}, 2)),
    )  # fmt: skip
    yield case(
        "seq-reversed",
        with_rank(3, lambda d: pickle.dumps({**d, "entries": d["entries"][::-1]}, 2)),
    )
    yield case(
        "seq-reversed-every-rank",
        lambda f: write_dumps(f, {r: {**d, "entries": d["entries"][::-1]}
                                  for r, d in hang_dumps().items()}),
    )  # fmt: skip
    # ranks missing
    yield case(
        "ranks-missing",
        lambda f: write_dumps(f, {r: d for r, d in hang_dumps(world=64).items() if r in (0, 5)}),
    )
    yield case(
        "pg-ranks-1m",
        with_rank(1, lambda d: pickle.dumps(
            {**d, "pg_config": {"0": {"ranks": str(list(range(1_000_000)))}}}, 2)),
    )  # fmt: skip
    yield case(
        "pg-ranks-deep",
        with_rank(1, lambda d: pickle.dumps(
            {**d, "pg_config": {"0": {"ranks": nested(100_000)}}}, 2)),
    )  # fmt: skip
    yield case(
        "pg-ranks-wide",
        with_rank(1, lambda d: pickle.dumps(
            {**d, "pg_config": {"0": {"ranks": [WIDE, -WIDE, 2**62, 0, 1]}}}, 2)),
    )  # fmt: skip
    yield case(
        "pg-config-100k-groups",
        with_rank(1, lambda d: pickle.dumps(
            {**d, "pg_config": {str(i): {"ranks": [i % 4]} for i in range(100_000)}}, 2)),
    )  # fmt: skip
    # the dump's own rank
    for label, value in (("wide", WIDE), ("neg", -1), ("1e9", 10**9), ("bool", True),
                         ("str", "2"), ("float", 2.0), ("2e62", 2**62)):  # fmt: skip
        yield case(
            f"rank-{label}",
            with_rank(2, _pickled(rank=value)),
        )
    yield case("rank-from-name-wide", with_rank(
        2, lambda d: pickle.dumps(d, 2), name=f"nccl_trace_rank_{WIDE}"))  # fmt: skip
    # entries of every wrong type, and many
    keys = ("collective_seq_id", "time_created_ns", "profiling_name", "process_group",
            "input_sizes", "input_dtypes", "state", "frames", "time_discovered_completed_ns")  # fmt: skip
    wrong: dict[str, Any] = {**WRONG, "wide": WIDE, "neg": -WIDE}
    for key in keys:
        for kind, value in wrong.items():
            yield case(
                f"entry-{key}-{kind}",
                with_rank(0, functools.partial(_entries_with, key=key, value=value)),
            )
    yield case(
        "entry-sizes-huge",
        with_rank(0, lambda d: pickle.dumps({**d, "entries": [
            {**e, "input_sizes": [[2**31] * 64] * 1000} for e in d["entries"]]}, 2)),
    )  # fmt: skip
    yield case("entries-memo-1m", with_rank(0, lambda d: _memo_entries(d, 1_000_000)))
    yield case("entries-memo-10m", with_rank(0, lambda d: _memo_entries(d, 10_000_000)),
               timeout=240)  # fmt: skip
    yield case(
        "entries-distinct-120k",
        with_rank(0, lambda d: pickle.dumps(
            {**d, "entries": [fr_entry(s) for s in range(1, 120_001)]}, 2)),
        timeout=240,
    )  # fmt: skip
    yield case(
        "entries-deep",
        with_rank(0, lambda d: pickle.dumps({**d, "entries": [json.loads(nested(400))]}, 2)),
    )
    yield case("entries-deep-pickle", with_rank(0, lambda d: _deep_entries(d, 200_000)))
    # names from the dump in the report: escapes, markup, HTML
    for kind in ("csi", "osc", "bidi", "c1", "markup"):
        yield case(f"escape-{kind}", functools.partial(_escaped, payload=ESCAPES[kind]))
    yield case("escape-html", functools.partial(_escaped, payload=HTML))
    # what is not a regular file among them
    yield case("fifo", lambda f: _fill_then(f, lambda: os.mkfifo(f / "nccl_trace_rank_3")),
               timeout=60)  # fmt: skip
    yield case(
        "devzero-link",
        lambda f: _fill_then(f, lambda: (f / "nccl_trace_rank_3").symlink_to("/dev/zero")),
        timeout=60,
    )
    yield case("sparse-300mb", _sparse_dump)
    yield case("plus-traces", _dumps_and_traces)


def _cut(dump: dict[str, Any], frac: float) -> bytes:
    data = pickle.dumps(dump, 2)
    return data[: int(len(data) * frac)]


def _flipped(dump: dict[str, Any], seed: int) -> bytes:
    return flip_bits(pickle.dumps(dump, 2), seed, 1 + seed * 3, start=2)


def _pickled(**changes: Any) -> Callable[[dict[str, Any]], bytes]:
    """A dump with ``changes`` to its items, as a protocol-2 pickle."""
    return lambda dump: pickle.dumps({**dump, **changes}, 2)


def _entries_with(dump: dict[str, Any], key: str, value: Any) -> bytes:
    return pickle.dumps({**dump, "entries": [{**e, key: value} for e in dump["entries"]]}, 2)


def _escaped(folder: Path, payload: str) -> None:
    """Every rank's dump of a hang, ``payload`` after every string in it."""
    job = hang_dumps()
    write_dumps(
        folder, {r: walk_strings(d, lambda s: s + payload, frozenset()) for r, d in job.items()}
    )


def _fill_then(folder: Path, then: Callable[[], object]) -> None:
    write_dumps(folder, {r: d for r, d in hang_dumps().items() if r != 3})
    then()


def _sparse_dump(folder: Path) -> None:
    """Rank 3's dump, then zeros to 300 MB (a sparse file: over what a dump may be)."""
    job = hang_dumps()
    write_dumps(folder, job)
    with open(folder / "nccl_trace_rank_3", "r+b") as f:
        f.truncate(300 << 20)


def _dumps_and_traces(folder: Path) -> None:
    """The slowio traces (ranks 0 and 1) and dumps of ranks 0, 1 and 7 of an 8-rank job."""
    for name in ("rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"):
        shutil.copy(SAMPLES / "pytorch/slowio" / name, folder / name)
    write_dumps(folder, {r: d for r, d in hang_dumps(world=8, stuck=7).items() if r in (0, 1, 7)})


def _last(dump: dict[str, Any], key: str) -> dict[str, Any]:
    """``dump`` with ``key`` its last item (a pickle of it ends with that item's value)."""
    return {**{k: v for k, v in dump.items() if k != key}, key: dump[key]}


def _memo_entries(dump: dict[str, Any], count: int) -> bytes:
    """``dump`` whose entries are ``count`` references to one entry (a few bytes each: the
    pickle's memo), built without a list of ``count`` in memory here."""
    one = dump["entries"][0]
    data = pickle.dumps(_last({**dump, "entries": [one, one]}, "entries"), protocol=2)
    assert data.endswith(b"eu.")  # (..., the second reference, APPENDS, SETITEMS, STOP)
    get = data[-5:-3] if data[-5:-4] == b"h" else data[-8:-3]  # (BINGET or LONG_BINGET)
    assert get[:1] in (b"h", b"j")
    return data[:-3] + get * (count - 2) + b"eu."


def _deep_entries(dump: dict[str, Any], depth: int) -> bytes:
    """``dump`` whose entries are one list nested ``depth`` deep (EMPTY_LIST opcodes, then
    APPENDs: the unpickler nests without recursing)."""
    data = pickle.dumps(_last({**dump, "entries": []}, "entries"), protocol=2)
    at = data.rindex(b"entries") + len(b"entries")
    return data[:at] + b"]" * depth + b"a" * (depth - 1) + b"u."


# --- per-device XPlane profiles (one process, several devices) ---------------------------------

_XPROF = find_spec("xprof")
#: reading .xplane.pb needs xprof (the cases are skipped where it is absent)
XPROF = Path(_XPROF.origin).parent if _XPROF and _XPROF.origin else Path("/nonexistent/xprof")


def _key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def _pb_int(number: int, value: int) -> bytes:
    return _key(number, 0) + varint(value & (2**64 - 1))


def _pb_bytes(number: int, data: bytes) -> bytes:
    return _key(number, 2) + varint(len(data)) + data


def _pb_str(number: int, text: str) -> bytes:
    return _pb_bytes(number, text.encode("utf-8", "surrogatepass"))


def _xstat(metadata_id: int, value: Any) -> bytes:
    """tsl.profiler.XStat (xspace_synth's rule: strings, int64, double)."""
    out = _pb_int(1, metadata_id)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return out + _pb_str(5, str(value))
    if isinstance(value, int):
        return out + _pb_int(4, value)
    return out + _key(2, 1) + struct.pack("<d", value)


XEvent = tuple[str, float, float, dict[str, Any]]


def xspace(
    planes: dict[str, dict[str, list[XEvent]]], start_ns: int = T0, first_line: int = 1
) -> bytes:
    """An XSpace (tsl/profiler/protobuf/xplane.proto) as tests/xspace_synth.py writes it with
    TensorFlow's messages, written here without them: plane -> line -> events ``(name,
    start_us, duration_us, stats)`` from ``start_ns``; a "Task Environment" plane with it. A
    plane's lines are numbered from ``first_line`` (their ids as uint64: 2**64 - 1 at most)."""
    out = b""
    for plane_id, (plane_name, lines) in enumerate(planes.items()):
        names: dict[str, int] = {}
        stat_names: dict[str, int] = {}
        body = _pb_int(1, plane_id) + _pb_str(2, plane_name)
        for line_id, (line_name, events) in enumerate(lines.items()):
            number = (first_line + line_id) % 2**64
            line = _pb_int(1, number) + _pb_str(2, line_name) + _pb_int(3, start_ns)
            for name, start_us, dur_us, stats in events:
                meta = names.setdefault(name, len(names) + 1)
                event = _pb_int(1, meta) + _pb_int(2, round(start_us * 1e6))
                event += _pb_int(3, round(dur_us * 1e6))
                for key, value in stats.items():
                    sid = stat_names.setdefault(key, len(stat_names) + 1)
                    event += _pb_bytes(4, _xstat(sid, value))
                line += _pb_bytes(4, event)
            body += _pb_bytes(3, line + _pb_int(10, number))
        for name, mid in names.items():
            entry = _pb_int(1, mid) + _pb_bytes(2, _pb_int(1, mid) + _pb_str(2, name))
            body += _pb_bytes(4, entry)
        for name, sid in stat_names.items():
            entry = _pb_int(1, sid) + _pb_bytes(2, _pb_int(1, sid) + _pb_str(2, name))
            body += _pb_bytes(5, entry)
        out += _pb_bytes(1, body)
    env = _pb_int(1, len(planes)) + _pb_str(2, "Task Environment")
    env += _pb_bytes(
        5, _pb_int(1, 1) + _pb_bytes(2, _pb_int(1, 1) + _pb_str(2, "profile_start_time"))
    )
    env += _pb_bytes(6, _pb_int(1, 1) + _pb_int(3, start_ns))
    return out + _pb_bytes(1, env)


def tpu_lines(slow: float = 1.0, steps: int = 4, own_steps: bool = True,
              name: str = "fusion.1") -> dict[str, list[XEvent]]:  # fmt: skip
    """A TPU's plane as JAX's profiles lay it out (tests/integration/test_devices.py's)."""
    ops: list[XEvent] = []
    for s in range(steps):
        t = s * 10_000.0 + 500
        ops.append((name, t, 3000.0 * slow, {"hlo_op": name, "hlo_module": "jit_step"}))
        t += 3000.0 * slow + 100
        ops.append(
            ("all-reduce.3", t, 1000.0, {"hlo_op": "all-reduce.3", "hlo_module": "jit_step"})
        )
    lines: dict[str, list[XEvent]] = {
        "XLA Modules": [("jit_step(1)", s * 10_000.0 + 400, 8000.0, {}) for s in range(steps)],
        "XLA Ops": ops,
    }
    if own_steps:
        lines["Steps"] = [(str(s), s * 10_000.0 + 400, 8000.0, {}) for s in range(steps)]
    return lines


def host_lines(steps: int = 4) -> dict[str, list[XEvent]]:
    return {"python3": [("train", s * 10_000.0, 9000.0, {"step_num": s}) for s in range(steps)]}


def _xdev_cases() -> Iterator[Case]:
    def case(name: str, planes: Callable[[], dict[str, dict[str, list[XEvent]]]],
             timeout: float = 120.0, files: int = 1, start_ns: int = T0,
             first_line: int = 1) -> Case:  # fmt: skip
        def build(d: Path) -> Plan:
            folder = d / "xspace"
            folder.mkdir()
            paths = []
            for k in range(files):
                path = folder / f"host{k}.xplane.pb"
                path.write_bytes(xspace(planes(), start_ns, first_line))
                paths.append(path)
            return Plan(trace_runs(paths, d / "OUT"), inputs=files + 1, frozen={folder: ""})

        return Case(f"xdev-{name}", build, timeout=timeout, needs=XPROF)

    host = host_lines()
    yield case("good", lambda: {"/host:CPU": host, "/device:TPU:0": tpu_lines(),
                                "/device:TPU:1": tpu_lines(2.0)})  # fmt: skip
    yield case("planes-without-events", lambda: {
        "/host:CPU": host, **{f"/device:TPU:{i}": {} for i in range(4)}})  # fmt: skip
    yield case("lines-without-events", lambda: {
        "/host:CPU": {"python3": []},
        **{f"/device:TPU:{i}": {"XLA Ops": [], "Steps": []} for i in range(4)}})  # fmt: skip
    yield case("only-planes-without-events", lambda: {
        f"/device:GPU:{i}": {} for i in range(8)})  # fmt: skip
    yield case("steps-on-some-devices", lambda: {
        "/host:CPU": host, "/device:TPU:0": tpu_lines(),
        "/device:TPU:1": tpu_lines(1.5, own_steps=False),
        "/device:TPU:2": tpu_lines(own_steps=False)})  # fmt: skip
    yield case("steps-on-some-devices-no-host", lambda: {
        "/device:TPU:0": tpu_lines(), "/device:TPU:1": tpu_lines(own_steps=False)})  # fmt: skip
    yield case("steps-differ-per-device", lambda: {
        "/host:CPU": host, "/device:TPU:0": tpu_lines(steps=4),
        "/device:TPU:1": tpu_lines(steps=9), "/device:TPU:2": tpu_lines(steps=1)})  # fmt: skip
    yield case("steps-names-odd", lambda: {
        "/host:CPU": host,
        "/device:TPU:0": {**tpu_lines(own_steps=False), "Steps": [
            (str(WIDE), 400.0, 8000.0, {}), ("-3", 10_400.0, 8000.0, {}),
            ("x\x1b[2J", 20_400.0, 8000.0, {}), ("9" * 5000, 30_400.0, 8000.0, {})]},
        "/device:TPU:1": tpu_lines()})  # fmt: skip
    yield case("device-number-wide", lambda: {
        "/host:CPU": host, f"/device:TPU:{WIDE}": tpu_lines(),
        f"/device:TPU:{'9' * 400}": tpu_lines(), "/device:TPU:0": tpu_lines()})  # fmt: skip
    yield case("device-numbers-repeat", lambda: {
        "/host:CPU": host, "/device:TPU:1": tpu_lines(), "/device:TPU:01": tpu_lines(),
        "/device:TPU:001": tpu_lines(2.0)})  # fmt: skip
    yield case("devices-512", lambda: {
        "/host:CPU": host, **{f"/device:TPU:{i}": tpu_lines(steps=2) for i in range(512)}},
        timeout=300)  # fmt: skip
    yield case("device-stats-wide", lambda: {
        "/host:CPU": {"python3": [("train", 0.0, 9000.0, {"step_num": WIDE % 2**63}),
                                  ("Execute", 10.0, 50.0, {"device_ordinal": 2**62,
                                                           "correlation_id": -1,
                                                           "run_id": 2**63 - 1})]},
        "/device:TPU:0": tpu_lines()})  # fmt: skip
    yield case("private-thread-wide", lambda: {
        "/host:CPU": {**host, f"tf_gpu_private_{'9' * 40}": [("Launch", 100.0, 5.0, {})],
                      "tf_gpu_private_7": [("Launch", 100.0, 5.0, {"correlation_id": 1})]},
        "/device:GPU:0": {"Stream #1(Compute)": [("kernel", 200.0, 50.0, {"correlation_id": 1})]}})  # fmt: skip
    yield case("names-escape-html", lambda: {
        "/host:CPU": {"python3" + HTML: [("train" + HTML, s * 10_000.0, 9000.0, {"step_num": s})
                                         for s in range(4)]},
        "/device:TPU:0": tpu_lines(name="fusion" + HTML),
        "/device:TPU:1": {f"XLA Ops{ESCAPES['csi']}": tpu_lines(name=ESCAPES["bidi"])["XLA Ops"]}})  # fmt: skip
    yield case("two-files-same-devices", lambda: {
        "/host:CPU": host, "/device:TPU:0": tpu_lines(), "/device:TPU:1": tpu_lines()},
        files=2)  # fmt: skip
    # TensorFlow's memory records (read from the XSpace itself, beside xprof), and start times
    # that are no time: a line's time and the profile's start both at the edge of int64
    memory = {"/host:CPU": {**host, "allocator": _memory_records()}}
    yield case("memory-records", lambda: memory)
    yield case("start-past-int64", lambda: memory, start_ns=2**63 - 1000)
    yield case("start-negative", lambda: memory, start_ns=-(2**62))
    # threads (line ids) past int64, copies whose size is past int64, ids that are no number
    wide = {
        "/host:CPU": {**host, "tf_Compute": [
            ("MatMul", s * 10_000.0 + 10, 50.0,
             {"long_name": "m/MatMul:MatMul", "memcpy_details": "size:" + "9" * 30})
            for s in range(4)]},
        "/device:GPU:0": {"Stream #1(Compute)": [
            ("MemcpyH2D", s * 10_000.0 + 100, 5.0,
             {"memcpy_details": "size:" + "9" * 25, "correlation_id": "x"}) for s in range(4)]},
    }  # fmt: skip
    yield case("ids-past-int64", lambda: wide, first_line=2**64 - 2)


def _memory_records() -> list[XEvent]:
    """BFC allocator records, good and hostile: totals negative, huge, not numbers, missing,
    allocators named by odd names, a record every microsecond."""
    out: list[XEvent] = []
    for i in range(2000):
        stats: dict[str, Any] = {"allocator_name": "GPU_0_bfc", "bytes_allocated": i * 256,
                                 "allocation_bytes": 256, "bytes_reserved": 0}  # fmt: skip
        if i % 7 == 1:
            stats["bytes_allocated"] = -5
        elif i % 7 == 2:
            stats["bytes_allocated"] = 2**62
        elif i % 7 == 3:
            stats["bytes_allocated"] = "many"
        elif i % 7 == 4:
            del stats["bytes_allocated"]
        elif i % 7 == 5:
            stats["allocator_name"] = "GPU_" + "9" * 300 + "_bfc" + ESCAPES["csi"]
        name = "MemoryDeallocation" if i % 5 == 0 else "MemoryAllocation"
        out.append((name, float(i), 0.0, stats))
    return out


# --- several trace files per rank ---------------------------------------------------------------


def _kineto_window(shift_us: float, step_offset: int = 0, pid: int | None = None) -> bytes:
    """The slowio sample's rank 0, its times moved by ``shift_us`` and its step numbers by
    ``step_offset`` (another profiler window of the same process, or not)."""
    import re

    doc = KINETO_GZ.doc()
    step = re.compile(r"^ProfilerStep#(\d+)$")
    for e in events_of(doc):
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += shift_us
        name = e.get("name")
        if step_offset and isinstance(name, str) and (m := step.match(name)):
            e["name"] = f"ProfilerStep#{int(m[1]) + step_offset}"
        if pid is not None and "pid" in e and isinstance(e["pid"], int) and e["pid"] > 100:
            e["pid"] = pid
    return gzip_bytes(dumps(doc))


#: the slowio sample's rank 0 trace spans about 0.6 s: a window after it starts this much later
_AFTER_US = 2_000_000.0


def _multi_cases() -> Iterator[Case]:
    def case(name: str, windows: list[tuple[float, int, int | None]], rank1: bool = True,
             timeout: float = 120.0) -> Case:  # fmt: skip
        def build(d: Path) -> Plan:
            folder = d / "traces"
            folder.mkdir()
            for k, (shift, offset, pid) in enumerate(windows):
                (folder / f"rank-0.w{k:03d}.pt.trace.json.gz").write_bytes(
                    _kineto_window(shift, offset, pid)
                )
            if rank1:
                name = "rank-1.pt.trace.json.gz"
                shutil.copy(SAMPLES / "pytorch/slowio" / name, folder / name)
            n = len(windows) + rank1
            return Plan(trace_runs([folder], d / "OUT"), inputs=n, frozen={folder: ""})

        return Case(f"multi-{name}", build, timeout=timeout)

    yield case("windows-good", [(0.0, 0, None), (_AFTER_US, 10, None)])
    yield case("overlap-half", [(0.0, 0, None), (300_000.0, 10, None)])
    yield case("overlap-copies", [(0.0, 0, None), (0.0, 0, None)])
    yield case("repeat-steps", [(0.0, 0, None), (_AFTER_US, 0, None)])
    yield case("repeat-some-steps", [(0.0, 0, None), (_AFTER_US, 3, None)])
    yield case("steps-go-back", [(0.0, 10, None), (_AFTER_US, 0, None)])
    yield case("repeat-steps-3-windows", [(0.0, 0, None), (_AFTER_US, 0, None),
                                          (2 * _AFTER_US, 0, None)])  # fmt: skip
    yield case("repeat-steps-no-rank-1", [(0.0, 0, None), (_AFTER_US, 0, None)], rank1=False)
    yield case("other-process", [(0.0, 0, None), (_AFTER_US, 10, 777_777)])
    yield case("windows-40", [(k * _AFTER_US, 10 * k, None) for k in range(40)], timeout=240)
    yield case("far-apart", [(0.0, 0, None), (3.6e9 * 24 * 365, 10, None)])


# --- names that reach the HTML report ----------------------------------------------------------


#: what a run's manifest holds that makes it the run it is (its id, formats, versions): kept, so
#: that the names around them (hosts, the command, thread names) reach the page
_RUN_KEYS = frozenset(
    {"run_id", "schema_version", "analysis_version", "framework", "format", "status", "source",
     "trace_files", "training_thread", "inputs"}
)  # fmt: skip


def _manifest_names(doc: dict[str, Any]) -> dict[str, Any]:
    """``HTML`` after the names a run's manifest holds: the command, each rank's host, thread
    and process-group names, its trace's name."""
    doc["command"] = [str(a) + HTML for a in doc.get("command") or []]
    for rank in doc.get("ranks") or []:
        rank["host"] = str(rank.get("host")) + HTML
        rank["threads"] = {k: str(v) + HTML for k, v in (rank.get("threads") or {}).items()}
        meta = rank.get("meta") or {}
        meta["trace_name"] = str(meta.get("trace_name")) + HTML
        for group in meta.get("process_groups") or []:
            group["name"], group["desc"] = group["name"] + HTML, group["desc"] + HTML
    return doc


def _event_names(doc: Any) -> Any:
    """``HTML`` after the name of every event but the process and thread names (MXNet's tell
    its traces apart: cpu/0, gpu/1)."""
    for e in events_of(doc):
        if e.get("ph") != "M" and isinstance(e.get("name"), str):
            e["name"] += HTML
    return doc


def _html_cases() -> Iterator[Case]:
    def trace(name: str, base: Any, mutate: Callable[[Any], Any]) -> Case:
        def build(d: Path) -> Plan:
            p = base.write(d, dumps(mutate(base.doc())))
            return Plan([Run(["report", "--html", str(d / "page.html"), str(p)]),
                         *trace_runs([p], d / "OUT")])  # fmt: skip

        return Case(f"html-{name}", build)

    yield trace("kineto-names", KINETO_GZ, lambda doc: _names(doc, lambda s: s + HTML))
    yield trace("kineto-every-string", KINETO_GZ,
                lambda doc: walk_strings(doc, lambda s: s + HTML, frozenset({"ph"})))  # fmt: skip
    yield trace("kineto-names-only-markup", KINETO_GZ, lambda doc: _names(doc, lambda s: HTML))
    yield trace("mxnet-names", MXNET, _event_names)

    def rundir(d: Path, keep: frozenset[str] = frozenset(), names: bool = False) -> Plan:
        run = copy_run(d)
        doc = json.loads((run / "manifest.json").read_bytes())
        doc = _manifest_names(doc) if names else walk_strings(doc, lambda s: s + HTML, keep)
        (run / "manifest.json").write_bytes(dumps(doc))
        page = str(d / "page.html")
        return Plan([Run(["report", "--html", page, str(run)]),
                     Run(["report", "--json", "--html", page, str(run)])], inputs=6)  # fmt: skip

    yield Case("html-rundir-manifest", rundir)
    yield Case("html-rundir-manifest-group-ranks", functools.partial(rundir, keep=_RUN_KEYS))
    yield Case("html-rundir-manifest-names", functools.partial(rundir, names=True))

    def dumps_page(d: Path) -> Plan:
        folder = d / "dumps"
        folder.mkdir()
        job = hang_dumps()
        write_dumps(folder, {r: walk_strings(dd, lambda s: s + HTML, frozenset())
                             for r, dd in job.items()})  # fmt: skip
        return Plan([Run(["report", "--html", str(d / "page.html"), str(folder)])], inputs=4)

    yield Case("html-flight-names", dumps_page)
