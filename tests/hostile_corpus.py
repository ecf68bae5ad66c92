"""The hostile-input corpus (issue 14): cases made from the sample traces by mutation.

Nothing here is committed as a blob: every input is generated at test time from
``sample_traces/`` (and, for the TF1 Timeline, which the samples lack, from the shared traces
beside the repository), seeded and deterministic, so a case id names the same bytes on every run.

A case builds its inputs into a folder and says which commands to run on them
(``report``, ``report --json``, ``ingest -o``, and on some ``export``, ``compare``, ``scaling``);
``tests/hostile_run.py`` runs them (tests/integration/test_hostile.py, tests/fuzz/test_hostile.py) and holds every run to the same contract.

Rebuild one case and print its commands (the reproducer)::

    python -m tests.hostile_corpus CASE_ID [FOLDER]
"""

from __future__ import annotations

import copy
import functools
import gzip
import io
import json
import os
import random
import shutil
import struct
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
SHARED = Path(os.environ.get("TRACEVIEW_SHARED_TRACES", REPO.parent / "shared" / "traces"))
TF1_SHARED = (
    SHARED / "tensorflow" / "tf1_timeline_mnist_mlp_cpu" / "timeline_03_merged_5_runs.json.gz"
)

WIDE = 2**70  # wider than any 64-bit integer
BOMB_BYTES = 2 * 1024**3  # what a bomb inflates to


# --- the commands ------------------------------------------------------------------------------


@dataclass
class Run:
    """One command line of a case (arguments after ``python -m traceview``)."""

    argv: list[str]
    # run the child as nobody (root ignores a read-only folder's mode)
    as_nobody: bool = False
    # RLIMIT_FSIZE for the child, in bytes
    fsize: int | None = None
    # RLIMIT_AS for the child (its address space, as `ulimit -v` sets it), in bytes
    vsize: int | None = None
    # SIGKILL the child just before its n-th os.replace/os.rename (kill-at-rename cases)
    kill_at_rename: int | None = None
    # SIGKILL the child after this many seconds
    kill_after: float | None = None
    # True where this run is expected to fail on purpose (exit 2 required, 0 not accepted)
    must_fail: bool = False


@dataclass
class Plan:
    """What a built case runs, and what must hold afterwards beyond the common contract."""

    runs: list[Run]
    inputs: int = 1  # input files: bounds the stderr lines
    # files whose bytes must be unchanged after every run (a user's file that -o named)
    keep: dict[Path, bytes] = field(default_factory=dict)
    # run directories that must still be readable (report exits 0) after every run
    survive: list[Path] = field(default_factory=list)
    # paths that must not exist after the runs (a marker a hostile input would make if it ran)
    absent: list[Path] = field(default_factory=list)
    # folders nothing may be written into: folder -> a regex (re.fullmatch) of the paths in it,
    # relative, that may appear or change all the same ("" none)
    frozen: dict[Path, str] = field(default_factory=dict)
    # Python programs (``python -c``) run in the case's folder while its runs run, ended after
    # the last (a record that grows, files that vanish)
    background: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Path], Plan]
    timeout: float = 120.0  # wall seconds per run
    needs: Path | None = None  # a shared trace the case needs (skipped when absent)


def trace_runs(paths: list[Path], out: Path, extra: tuple[str, ...] = ()) -> list[Run]:
    """report, report --json (writing the HTML page too) and ingest -o on the same inputs."""
    args = [str(p) for p in paths]
    return [
        Run(["report", *args]),
        Run(["report", "--json", "--html", str(out.parent / "page.html"), *args]),
        Run(["ingest", *args, "-o", str(out)]),
        *[Run([*e.split(), *args]) for e in extra],
    ]


# --- the samples -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """A sample trace of one format: its file name and (decompressed) content."""

    name: str  # file name to write (the suffix decides the format)
    gz: bool
    path: Path

    @functools.cached_property
    def raw(self) -> bytes:
        data = self.path.read_bytes()
        return gzip.decompress(data) if self.path.suffix == ".gz" else data

    def doc(self) -> Any:
        return json.loads(self.raw)

    def write(self, folder: Path, content: bytes, name: str | None = None) -> Path:
        path = folder / (name or self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip_bytes(content) if self.gz else content)
        return path


def gzip_bytes(content: bytes) -> bytes:
    # mtime 0: the same content gives the same bytes
    return gzip.compress(content, compresslevel=6, mtime=0)


KINETO_GZ = Base(
    "rank-0.pt.trace.json.gz", True, SAMPLES / "pytorch/slowio/rank-0.pt.trace.json.gz"
)
KINETO_JSON = Base(
    "rank-0.pt.trace.json", False, SAMPLES / "pytorch/slowio/rank-0.pt.trace.json.gz"
)
MXNET = Base("rank-0.mxnet.json.gz", True, SAMPLES / "mxnet/dist_sync/rank-0.mxnet.json.gz")
XPLANE = Base("rank-0.xplane.pb", False, SAMPLES / "tensorflow/mwms/rank-0.xplane.pb")
TF1 = Base("rank-0.timeline.json.gz", True, TF1_SHARED)

JSON_BASES = {"kineto": KINETO_GZ, "kineto-json": KINETO_JSON, "mxnet": MXNET, "tf1": TF1}
ALL_BASES = {**JSON_BASES, "xplane": XPLANE}


def _needs(base: Base) -> Path | None:
    return base.path if base is TF1 else None


# --- mutations of bytes ------------------------------------------------------------------------

FRACTIONS = (0.0, 0.01, 0.1, 0.37, 0.5, 0.75, 0.9, 0.999)


def flip_bits(data: bytes, seed: int, flips: int, start: int = 0) -> bytes:
    rng = random.Random(seed)
    buf = bytearray(data)
    for _ in range(flips):
        at = rng.randrange(start, len(buf))
        buf[at] ^= 1 << rng.randrange(8)
    return bytes(buf)


def splice(data: bytes, seed: int) -> bytes:
    """A random stretch copied over another place (records cut in the middle, repeated)."""
    rng = random.Random(seed)
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.randrange(1, 4096))
    c = rng.randrange(len(data))
    return data[:c] + data[a:b] + data[c + rng.randrange(0, 64) :]


def _byte_cases(fmt: str, base: Base) -> Iterator[Case]:
    needs = _needs(base)
    main = fmt == "kineto"  # the other formats get fewer points of each mutation
    fractions = FRACTIONS if main else (0.01, 0.37, 0.75, 0.999)
    seeds = 6 if main else 2
    if base.gz:
        for frac in fractions:

            def gz_cut(d: Path, frac: float = frac) -> Plan:
                packed = gzip_bytes(base.raw)
                p = d / base.name
                p.write_bytes(packed[: int(len(packed) * frac)])
                return Plan(trace_runs([p], d / "OUT"))

            yield Case(f"{fmt}-truncate-gz-{frac}", gz_cut, needs=needs)

        def gz_no_trailer(d: Path) -> Plan:
            p = d / base.name
            p.write_bytes(gzip_bytes(base.raw)[:-8])
            return Plan(trace_runs([p], d / "OUT"))

        yield Case(f"{fmt}-truncate-gz-trailer", gz_no_trailer, needs=needs)
        for seed in range(seeds):

            def gz_flip(d: Path, seed: int = seed) -> Plan:
                p = d / base.name
                p.write_bytes(flip_bits(gzip_bytes(base.raw), seed, 1 + seed % 4, start=10))
                return Plan(trace_runs([p], d / "OUT"))

            yield Case(f"{fmt}-bitflip-gz-{seed}", gz_flip, needs=needs)

        def gz_two_members(d: Path) -> Plan:
            p = d / base.name
            p.write_bytes(gzip_bytes(base.raw) + gzip_bytes(base.raw))
            return Plan(trace_runs([p], d / "OUT"))

        yield Case(f"{fmt}-gz-two-members", gz_two_members, needs=needs)

        def gz_trailing_garbage(d: Path) -> Plan:
            p = d / base.name
            p.write_bytes(gzip_bytes(base.raw) + bytes(random.Random(1).randbytes(777)))
            return Plan(trace_runs([p], d / "OUT"))

        yield Case(f"{fmt}-gz-trailing-garbage", gz_trailing_garbage, needs=needs)

        def not_gz(d: Path) -> Plan:  # a .gz name on plain content
            p = d / base.name
            p.write_bytes(base.raw)
            return Plan(trace_runs([p], d / "OUT"))

        yield Case(f"{fmt}-gz-name-plain-content", not_gz, needs=needs)
    for frac in fractions:

        def cut(d: Path, frac: float = frac) -> Plan:
            p = base.write(d, base.raw[: int(len(base.raw) * frac)])
            return Plan(trace_runs([p], d / "OUT"))

        yield Case(f"{fmt}-truncate-{frac}", cut, needs=needs)
    for seed in range(seeds):

        def flip(d: Path, seed: int = seed) -> Plan:
            p = base.write(d, flip_bits(base.raw, seed, 1 + seed % 8))
            return Plan(trace_runs([p], d / "OUT"))

        yield Case(f"{fmt}-bitflip-{seed}", flip, needs=needs)
    for seed in range(seeds if main else 1):

        def spl(d: Path, seed: int = seed) -> Plan:
            p = base.write(d, splice(base.raw, seed))
            return Plan(trace_runs([p], d / "OUT"))

        yield Case(f"{fmt}-splice-{seed}", spl, needs=needs)

    def zero_fill(d: Path) -> Plan:
        n = len(base.raw)
        p = base.write(d, base.raw[: n // 3] + b"\0" * (n // 3) + base.raw[2 * n // 3 :])
        return Plan(trace_runs([p], d / "OUT"))

    yield Case(f"{fmt}-zero-fill-middle", zero_fill, needs=needs)


# --- mutations of JSON traces ------------------------------------------------------------------

ESCAPES = {
    "csi": "\x1b[31mRED\x1b[0m\x1b[2J",
    "osc": "\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\",
    "bel": "\x07\x07",
    "cr": "\rOVERWRITTEN",
    "markup": "[bold red]MARKUP[/][link=http://evil.example]L[/link]",
    "bidi": "\u202eevil\u2066x\u2069\u202c",
    "c1": "\x9b31m\x85\x90",
    "nul": "a\x00b",
    "backspace": "abc\x08\x08\x08xyz\x7f",
}


def walk_strings(value: Any, fn: Callable[[str], str], skip_keys: frozenset[str]) -> Any:
    """``value`` with ``fn`` applied to every string (keys in ``skip_keys`` kept)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [walk_strings(v, fn, skip_keys) for v in value]
    if isinstance(value, dict):
        return {
            k: (v if k in skip_keys else walk_strings(v, fn, skip_keys)) for k, v in value.items()
        }
    return value


def events_of(doc: Any) -> list[dict]:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def timed(doc: Any) -> list[dict]:
    """The events with a duration (X) or, for MXNet's B/E pairs, the begin events."""
    evs = [e for e in events_of(doc) if e.get("ph") == "X"]
    return evs or [e for e in events_of(doc) if e.get("ph") in ("B", "b")]


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


WRONG = {"str": "x", "null": None, "obj": {"a": 1}, "float": 1.5}


def _json_doc_cases(fmt: str, base: Base) -> Iterator[Case]:
    """Mutations of the parsed document, written back as JSON."""
    needs = _needs(base)

    def case(name: str, mutate: Callable[[Any], Any], timeout: float = 120.0) -> Case:
        def build(d: Path) -> Plan:
            doc = mutate(base.doc())
            content = doc if isinstance(doc, bytes) else dumps(doc)
            p = base.write(d, content)
            return Plan(trace_runs([p], d / "OUT"))

        return Case(f"{fmt}-{name}", build, timeout=timeout, needs=needs)

    # wide and huge numbers
    def set_all(key: str, value: Any, only_one: bool = False) -> Callable[[Any], Any]:
        def mutate(doc: Any) -> Any:
            evs = timed(doc)
            for e in evs[len(evs) // 2 : len(evs) // 2 + 1] if only_one else evs:
                e[key] = value
            return doc

        return mutate

    def args_value(value: Any) -> Callable[[Any], Any]:
        def mutate(doc: Any) -> Any:
            for e in timed(doc):
                args = e.setdefault("args", {})
                if isinstance(args, dict):
                    for k in list(args)[:3] or ["extra"]:
                        args[k] = value
            return doc

        return mutate

    for sign, wide in (("", WIDE), ("neg-", -WIDE)) if fmt == "kineto" else (("", WIDE),):
        yield case(f"wideint-{sign}args", args_value(wide))
        for key in ("ts", "dur", "pid", "tid"):
            yield case(f"wideint-{sign}{key}", set_all(key, wide, only_one=True))
    yield case("wideint-ids", lambda doc: _set_ids(doc, WIDE))
    yield case("wideint-step-number", lambda doc: _step_numbers(doc, str(WIDE)))
    yield case("step-number-digits-5000", lambda doc: _step_numbers(doc, "9" * 5000))
    yield case("dur-1e18-all", set_all("dur", 1e18))
    yield case("dur-1e18-one", set_all("dur", 1e18, only_one=True))
    yield case("dur-negative", set_all("dur", -5.0, only_one=True))
    yield case("ts-1e18-one", set_all("ts", 1e18, only_one=True))
    yield case("ts-1e300-one", set_all("ts", 1e300, only_one=True))
    yield case("float-1e308-args", args_value(1e308))
    yield case(
        "nonstandard-nan-infinity",
        lambda doc: (
            dumps(doc)
            .replace(b'"dur":', b'"dur":NaN,"x":', 1)
            .replace(b'"ts":', b'"ts":Infinity,"y":', 1)
        ),
    )
    # wrong types in event fields
    keys = (
        ("ts", "dur", "pid", "tid", "name", "cat", "ph", "args")
        if fmt == "kineto"
        else ("ts", "dur", "name", "args")
    )
    for key in keys:
        for kind, value in WRONG.items():
            if fmt == "kineto" or kind != "float":
                yield case(f"type-{key}-{kind}-one", set_all(key, value, only_one=True))
        yield case(f"type-{key}-str-all", set_all(key, "x"))
    # wrong shapes of the document
    shapes: dict[str, Callable[[Any], Any]] = {
        "top-list-of-events": lambda doc: events_of(doc),
        "top-empty-object": lambda doc: {},
        "top-empty-list": lambda doc: [],
        "top-null": lambda doc: None,
        "top-string": lambda doc: "traceEvents",
        "top-number": lambda doc: WIDE,
        "events-object": lambda doc: {**doc, "traceEvents": {"a": events_of(doc)[0]}},
        "events-null": lambda doc: {**doc, "traceEvents": None},
        "events-string": lambda doc: {**doc, "traceEvents": "x"},
        "events-empty": lambda doc: {**doc, "traceEvents": []},
        "events-of-numbers": lambda doc: {**doc, "traceEvents": [1, 2, 3]},
        "events-of-lists": lambda doc: {**doc, "traceEvents": [[e] for e in events_of(doc)]},
        "events-duplicated": lambda doc: {**doc, "traceEvents": events_of(doc) * 2},
        "events-reversed": lambda doc: {**doc, "traceEvents": events_of(doc)[::-1]},
        "metadata-only": lambda doc: {
            **doc,
            "traceEvents": [e for e in events_of(doc) if e.get("ph") == "M"],
        },
    }
    if fmt == "kineto":
        for name, mutate in shapes.items():
            yield case(f"shape-{name}", mutate)
    # deep nesting
    deep = 100_000
    yield case(
        "deep-args",
        lambda doc: dumps(doc).replace(
            b'"args":{', b'"args":{"deep":' + nested(deep).encode() + b",", 1
        ),
    )
    yield case("deep-top", lambda doc: nested(deep).encode())
    yield case(
        "deep-event",
        lambda doc: dumps(doc).replace(
            b'"traceEvents":[', b'"traceEvents":[' + nested(deep).encode() + b",", 1
        ),
    )
    yield case(
        "deep-objects",
        lambda doc: dumps(doc).replace(
            b'"traceEvents":[', b'"traceEvents":[' + b'{"a":' * deep + b"1" + b"}" * deep + b",", 1
        ),
    )
    # one event repeated: each copy nested in the one before (a collective walked up 50,000
    # levels took 40 s), and a TF1 Session.run's start 100,000 times (100,000 steps)
    if fmt in ("kineto", "kineto-json"):
        yield case(
            "one-event-50k",
            lambda doc: {**doc, "traceEvents": [*events_of(doc), *[timed(doc)[0]] * 50_000]},
            timeout=60,
        )
    if fmt == "tf1":

        def sources(doc: Any) -> Any:
            evs = events_of(doc)
            source = next(e for e in evs if (e.get("args") or {}).get("name") == "_SOURCE")
            many = [{**source, "ts": source["ts"] + 10 * i} for i in range(100_000)]
            return {**doc, "traceEvents": [*evs, *many]}

        yield case("source-100k", sources, timeout=120)
    # huge and many names
    yield case("name-16mb", set_all("name", "n" * (16 * 1024 * 1024), only_one=True))
    yield case(
        "names-distinct-50k",
        lambda doc: _distinct_names(doc, 50_000),
        timeout=240,
    )
    # escapes and markup in every string field
    for kind, payload in ESCAPES.items():
        if fmt != "kineto" and kind in ("bel", "nul", "backspace"):
            continue
        yield case(
            f"escape-{kind}-every-string",
            lambda doc, p=payload: walk_strings(doc, lambda s: s + p, frozenset({"ph"})),
        )
        if fmt == "kineto" and kind in ("csi", "markup", "bidi"):
            yield case(
                f"escape-{kind}-names",
                lambda doc, p=payload: _names(doc, lambda s: s + p),
            )
    yield case(
        "escape-csi-keys",
        lambda doc: _rekey(doc, lambda k: k + ESCAPES["csi"]),
    )
    yield case(
        "invalid-utf8", lambda doc: dumps(doc).replace(b'"name":"', b'"name":"\xff\xfe\xc3', 50)
    )
    yield case(
        "lone-surrogate", lambda doc: dumps(doc).replace(b'"name":"', b'"name":"\\ud800', 50)
    )


def _distinct_names(doc: Any, count: int) -> Any:
    """``count`` more events, copies of the first timed one, each of its own name."""
    first = timed(doc)[0]
    extra = [{**first, "name": f"distinct-{i:06d}-" + "x" * 80} for i in range(count)]
    return {**doc, "traceEvents": events_of(doc) + extra}


def _names(doc: Any, fn: Callable[[str], str]) -> Any:
    for e in events_of(doc):
        if isinstance(e.get("name"), str):
            e["name"] = fn(e["name"])
        args = e.get("args")
        if isinstance(args, dict) and isinstance(args.get("name"), str):
            args["name"] = fn(args["name"])  # process and thread names (M records)
    return doc


def _rekey(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, list):
        return [_rekey(v, fn) for v in value]
    if isinstance(value, dict):
        return {
            (fn(k) if k not in ("ph", "traceEvents") else k): _rekey(v, fn)
            for k, v in value.items()
        }
    return value


def _set_ids(doc: Any, value: int) -> Any:
    for e in events_of(doc):
        if "id" in e:
            e["id"] = value
        args = e.get("args")
        if isinstance(args, dict):
            for k in ("External id", "correlation", "Record function id", "Ev Idx"):
                if k in args:
                    args[k] = value
    return doc


def _step_numbers(doc: Any, number: str) -> Any:
    import re

    pat = re.compile(r"^(ProfilerStep#|step#|Iteration#)\d+$")
    for e in events_of(doc):
        if isinstance(e.get("name"), str) and pat.match(e["name"]):
            e["name"] = pat.sub(lambda m: m.group(1) + number, e["name"])
    return doc


def _kineto_header_cases() -> Iterator[Case]:
    base = KINETO_GZ

    def case(name: str, mutate: Callable[[dict], Any], timeout: float = 120.0) -> Case:
        def build(d: Path) -> Plan:
            doc = base.doc()
            mutate(doc)
            p = base.write(d, dumps(doc))
            return Plan(trace_runs([p], d / "OUT"))

        return Case(f"kineto-header-{name}", build, timeout=timeout)

    def dist(key: str, value: Any) -> Callable[[dict], Any]:
        return lambda doc: doc["distributedInfo"].__setitem__(key, value)

    for key in ("rank", "world_size"):
        for label, value in (
            ("wide", WIDE),
            ("neg-wide", -WIDE),
            ("1e7", 10**7),
            ("1e10", 10**10),
            ("neg", -1),
            ("str", "x"),
            ("float", 1.5),
            ("list", [0]),
            ("null", None),
        ):
            yield case(f"{key}-{label}", dist(key, value))
    for label, value in (
        ("wide", WIDE),
        ("neg", -WIDE),
        ("str", "x"),
        ("1e30", 1e30),
        ("list", []),
    ):
        yield case(
            f"basetime-{label}", lambda doc, v=value: doc.__setitem__("baseTimeNanoseconds", v)
        )
    for label, value in (("str", "x"), ("list", []), ("null", None), ("wide", WIDE)):
        yield case(f"distinfo-{label}", lambda doc, v=value: doc.__setitem__("distributedInfo", v))
    yield case(
        "pg-ranks-wide",
        lambda doc: doc["distributedInfo"]["pg_config"][0].__setitem__("ranks", [WIDE, -WIDE]),
    )
    yield case(
        "pg-config-deep",
        lambda doc: doc["distributedInfo"].__setitem__("pg_config", json.loads(nested(900))),
    )
    yield case(
        "device-properties-garbage",
        lambda doc: doc.__setitem__(
            "deviceProperties", [{"id": WIDE, "name": ESCAPES["csi"], "totalGlobalMem": "x"}]
        ),
    )
    yield case("schema-version-wide", lambda doc: doc.__setitem__("schemaVersion", WIDE))
    for kind, payload in ESCAPES.items():
        yield case(
            f"escape-{kind}-header",
            lambda doc, p=payload: doc.update(
                {
                    k: walk_strings(v, lambda s: s + p, frozenset())
                    for k, v in doc.items()
                    if k != "traceEvents"
                }
            ),
        )


# --- TensorFlow .xplane.pb ---------------------------------------------------------------------


def _ascii_runs(data: bytes, least: int = 12) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, b in enumerate(data):
        if 0x20 <= b < 0x7F:
            if start is None:
                start = i
        else:
            if start is not None and i - start >= least:
                runs.append((start, i))
            start = None
    return runs


def xplane_escape(data: bytes, payload: str) -> bytes:
    """Every printable string of at least 12 bytes in the protobuf starts with ``payload``
    (same length, so the message stays well formed)."""
    p = payload.encode()
    buf = bytearray(data)
    for a, b in _ascii_runs(data):
        if b - a >= len(p):
            buf[a : a + len(p)] = p
    return bytes(buf)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _xplane_cases() -> Iterator[Case]:
    base = XPLANE

    def case(name: str, content: Callable[[], bytes]) -> Case:
        def build(d: Path) -> Plan:
            p = base.write(d, content())
            return Plan(trace_runs([p], d / "OUT"))

        return Case(f"xplane-{name}", build)

    for kind, payload in ESCAPES.items():
        yield case(f"escape-{kind}-every-string", lambda p=payload: xplane_escape(base.raw, p))
    yield case("empty", lambda: b"")
    yield case("garbage", lambda: random.Random(7).randbytes(80_000))
    yield case("claimed-length-huge", lambda: b"\x0a" + varint(2**40) + base.raw[:1000])
    yield case("claimed-length-64bit", lambda: b"\x0a" + varint(2**64 - 1) + base.raw[:1000])
    yield case("varint-endless", lambda: b"\x08" + b"\xff" * 100_000)
    yield case("deep-groups", lambda: b"\x0b" * 100_000)  # start-group tags, nested
    yield case("deep-messages", lambda: _deep_pb(20_000))
    yield case("doubled", lambda: base.raw + base.raw)
    yield Case("xplane-gpu-planes-1000-in-4g", _many_gpu_planes)


def _many_gpu_planes(d: Path) -> Plan:
    """The sample with 1,000 GPU planes more, without events, read in 4 GB of address space
    (issue 55: xprof derives each GPU plane's lines on a thread of its own, each with a stack
    of 8 MB, the usual RLIMIT_STACK; one plane has id 700, whose process xprof gives the
    host's threads too)."""
    planes = []
    for n in range(1000):
        name = f"/device:GPU:{n}".encode()
        plane = b"\x08" + varint(100 + n) + b"\x12" + varint(len(name)) + name
        planes.append(b"\x0a" + varint(len(plane)) + plane)
    path = XPLANE.write(d, XPLANE.raw + b"".join(planes))
    runs = trace_runs([path], d / "OUT")
    for run in runs:
        run.vsize = 4 * 1024**3
    return Plan(runs)


def _deep_pb(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = b"\x0a" + varint(len(inner)) + inner
    return inner


# --- bombs -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def gzip_bomb(prefix: bytes, fill: bytes, total: int = BOMB_BYTES) -> bytes:
    """A gzip file of ``prefix`` then ``fill`` repeated to ``total`` bytes, built without
    deflating gigabytes: after a full flush the deflater starts afresh, so one compressed block
    of fill repeats."""
    block = fill * (1024 * 1024 // len(fill))
    count = (total - len(prefix)) // len(block)
    head = zlib.compressobj(6, zlib.DEFLATED, -15)
    first = head.compress(prefix) + head.flush(zlib.Z_FULL_FLUSH)
    body = zlib.compressobj(6, zlib.DEFLATED, -15)
    chunk = body.compress(block) + body.flush(zlib.Z_FULL_FLUSH)
    end = zlib.compressobj(6, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)
    crc = zlib.crc32(prefix)
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    size = len(prefix) + count * len(block)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + first + chunk * count + end + struct.pack("<II", crc, size & 0xFFFFFFFF)


def _bomb_start(base: Base) -> bytes:
    """A valid trace head cut after its first timed event: ``...,{event},``."""
    doc = base.doc()
    meta = [e for e in events_of(doc) if e.get("ph") == "M"][:3]
    one = timed(doc)[:1]
    head = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    return dumps({**head, "traceEvents": [*meta, *one]})[:-2] + b","


def _bomb_cases() -> Iterator[Case]:
    # the base is read when a case runs, not when the corpus is listed: a shared trace may be
    # absent (a user's clone), and its cases are then skipped, not an error of the collection
    fills = {
        "spaces": (b"", b" "),
        "zeros": (b"", b"0"),
        "nul-bytes": (b"", b"\0"),
        "endless-name": (b'{"ph":"X","name":"', b"a"),
        "open-brackets": (b"", b"["),
        "open-objects": (b"", b'{"a":'),
    }
    for fmt, base in (("kineto", KINETO_GZ), ("mxnet", MXNET), ("tf1", TF1)):
        for name, (after, fill) in fills.items():

            def build(d: Path, after: bytes = after, fill: bytes = fill, base: Base = base) -> Plan:
                p = d / base.name
                p.write_bytes(gzip_bomb(_bomb_start(base) + after, fill))
                return Plan(trace_runs([p], d / "OUT"))

            yield Case(f"{fmt}-bomb-{name}", build, timeout=300, needs=_needs(base))


# --- folders of traces -------------------------------------------------------------------------


def _do(*effects: object) -> None:
    """Nothing: a lambda's way to run several effects in order."""


def _kineto_rank(rank: int, world: int = 2, src: Path | None = None) -> bytes:
    doc = json.loads(gzip.decompress((src or KINETO_GZ.path).read_bytes()))
    doc["distributedInfo"]["rank"] = rank
    doc["distributedInfo"]["world_size"] = world
    return dumps(doc)


def _folder_cases() -> Iterator[Case]:
    good = SAMPLES / "pytorch/slowio"

    def case(
        name: str,
        fill: Callable[[Path], int | None],
        timeout: float = 120.0,
        extra: tuple[str, ...] = (),
    ) -> Case:
        def build(d: Path) -> Plan:
            folder = d / "traces"
            folder.mkdir()
            n = fill(folder) or len(list(folder.iterdir()))
            return Plan(trace_runs([folder], d / "OUT", extra), inputs=n)

        return Case(f"folder-{name}", build, timeout=timeout)

    def with_good(extra: Callable[[Path], None]) -> Callable[[Path], None]:
        def fill(f: Path) -> None:
            shutil.copy(good / "rank-0.pt.trace.json.gz", f)
            extra(f)

        return fill

    yield case(
        "good-plus-empty", with_good(lambda f: (f / "rank-1.pt.trace.json.gz").write_bytes(b""))
    )
    yield case(
        "good-plus-empty-json", with_good(lambda f: (f / "rank-1.pt.trace.json").write_bytes(b""))
    )
    yield case(
        "good-plus-corrupt-gz",
        with_good(
            lambda f: (f / "rank-1.pt.trace.json.gz").write_bytes(
                flip_bits((good / "rank-1.pt.trace.json.gz").read_bytes(), 3, 40, 20)
            )
        ),
    )
    yield case(
        "good-plus-eventless",
        with_good(
            lambda f: (f / "rank-1.pt.trace.json.gz").write_bytes(
                gzip_bytes(dumps({**json.loads(_kineto_rank(1)), "traceEvents": []}))
            )
        ),
    )
    yield case(
        "good-plus-garbage-xplane",
        with_good(lambda f: (f / "rank-1.xplane.pb").write_bytes(random.Random(5).randbytes(4096))),
    )
    yield case(
        "good-plus-truncated",
        with_good(
            lambda f: (f / "rank-1.pt.trace.json.gz").write_bytes(
                (good / "rank-1.pt.trace.json.gz").read_bytes()[:9000]
            )
        ),
    )
    yield case(
        "good-plus-garbage-json",
        with_good(
            lambda f: (f / "rank-1.pt.trace.json").write_bytes(
                b'{"traceEvents": [{"ph": "X", "name": 3}'
            )
        ),
    )
    yield case(
        "good-plus-escape-filename",
        with_good(lambda f: (f / "rank-1\x1b[31m\x07.pt.trace.json.gz").write_bytes(b"garbage")),
    )
    yield case(
        "good-plus-nonutf8-filename",
        with_good(
            lambda f: Path(
                os.fsdecode(bytes(f) + b"/rank-1-\xff\xfe.pt.trace.json.gz")
            ).write_bytes(b"x")
        ),
    )
    yield case(
        "good-plus-wide-rank-filename",
        with_good(
            lambda f: shutil.copy(
                good / "rank-1.pt.trace.json.gz", f / f"rank-{WIDE}.pt.trace.json.gz"
            )
        ),
    )
    yield case(
        "good-plus-fifo",
        with_good(lambda f: os.mkfifo(f / "rank-1.pt.trace.json")),
        timeout=60,
    )
    yield case(
        "good-plus-dir-named-like-trace",
        with_good(lambda f: (f / "rank-1.pt.trace.json.gz").mkdir()),
    )
    yield case(
        "good-plus-symlink-loop",
        with_good(lambda f: (f / "loop").symlink_to(f, target_is_directory=True)),
        timeout=60,
    )
    yield case(
        "good-plus-dangling-symlink",
        with_good(lambda f: (f / "rank-1.pt.trace.json.gz").symlink_to(f / "nowhere")),
    )
    yield case(
        "good-plus-devzero-link",
        with_good(lambda f: (f / "rank-1.pt.trace.json").symlink_to("/dev/zero")),
        timeout=60,
    )
    yield case(
        "duplicate-rank",
        lambda f: _do(
            shutil.copy(good / "rank-0.pt.trace.json.gz", f / "rank-0.pt.trace.json.gz"),
            shutil.copy(good / "rank-0.pt.trace.json.gz", f / "rank-0-again.pt.trace.json.gz"),
        ),
    )
    yield case(
        "duplicate-rank-header",
        lambda f: _do(
            shutil.copy(good / "rank-0.pt.trace.json.gz", f / "a.pt.trace.json.gz"),
            shutil.copy(good / "rank-0.pt.trace.json.gz", f / "b.pt.trace.json.gz"),
        ),
    )
    yield case(
        "missing-ranks",
        lambda f: _do(
            (f / "rank-0.pt.trace.json.gz").write_bytes(gzip_bytes(_kineto_rank(0, 8))),
            (f / "rank-5.pt.trace.json.gz").write_bytes(
                gzip_bytes(_kineto_rank(5, 8, good / "rank-1.pt.trace.json.gz"))
            ),
        ),
    )
    yield case(
        "rank-beyond-world",
        lambda f: _do(
            shutil.copy(good / "rank-0.pt.trace.json.gz", f / "rank-0.pt.trace.json.gz"),
            (f / "rank-7.pt.trace.json.gz").write_bytes(
                gzip_bytes(_kineto_rank(7, 2, good / "rank-1.pt.trace.json.gz"))
            ),
        ),
    )
    yield case(
        "world-size-disagrees",
        lambda f: _do(
            (f / "rank-0.pt.trace.json.gz").write_bytes(gzip_bytes(_kineto_rank(0, 2))),
            (f / "rank-1.pt.trace.json.gz").write_bytes(
                gzip_bytes(_kineto_rank(1, 10**10, good / "rank-1.pt.trace.json.gz"))
            ),
        ),
    )
    yield case(
        "mixed-frameworks",
        lambda f: _do(
            shutil.copy(good / "rank-0.pt.trace.json.gz", f / "rank-0.pt.trace.json.gz"),
            shutil.copy(MXNET.path, f / "rank-1.mxnet.json.gz"),
        ),
    )
    yield case("empty", lambda f: 1)
    yield case(
        "only-non-traces",
        lambda f: _do(
            (f / "README.md").write_text("hello"), (f / "x.bin").write_bytes(b"\0" * 100)
        ),
    )
    yield case(
        "nested-subfolders",
        lambda f: (
            [
                (f / "a" / "b").mkdir(parents=True),
                shutil.copy(good / "rank-0.pt.trace.json.gz", f / "a" / "rank-0.pt.trace.json.gz"),
                shutil.copy(
                    good / "rank-1.pt.trace.json.gz", f / "a" / "b" / "rank-1.pt.trace.json.gz"
                ),
            ]
            and 2
        ),
    )
    yield case(
        "many-empty-files",
        lambda f: [(f / f"rank-{i}.pt.trace.json").write_bytes(b"") for i in range(200)] and 200,
    )
    yield case(
        "slowio-plus-scaling",
        lambda f: [shutil.copy(p, f) for p in sorted(good.glob("*.gz"))] and None,
        extra=(f"scaling {SAMPLES / 'pytorch/scaling/ranks-1'}",),
    )


# --- rank status files -------------------------------------------------------------------------

STATUS = {
    "rank": 0,
    "world_size": 2,
    "local_rank": 0,
    "rank_source": "RANK",
    "host": "vm",
    "pid": 1234,
    "argv": ["python", "train.py"],
    "framework": "pytorch",
    "framework_version": "2.13.0",
    "state": "ok",
    "detail": None,
    "started_ns": 1790857026000000000,
    "ended_ns": 1790857036000000000,
    "clock": {"offset_ns": 1000, "uncertainty_ns": 50, "method": "tcp", "probes": 5},
    "trace_files": ["rank-0.pt.trace.json.gz"],
    "profiled_steps": 5,
    "user_profiler": False,
    "notes": [],
}


def _status_cases() -> Iterator[Case]:
    def case(name: str, content: Callable[[], bytes]) -> Case:
        def build(d: Path) -> Plan:
            folder = d / "raw" / "rank-00000"
            folder.mkdir(parents=True)
            shutil.copy(KINETO_GZ.path, folder / KINETO_GZ.name)
            (folder / "status.json").write_bytes(content())
            return Plan(trace_runs([d / "raw"], d / "OUT"), inputs=2)

        return Case(f"status-{name}", build)

    def with_(path: tuple[str, ...], value: Any) -> Callable[[], bytes]:
        def content() -> bytes:
            doc = copy.deepcopy(STATUS)
            target: Any = doc
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            return dumps(doc)

        return content

    yield case("good", lambda: dumps(STATUS))
    yield case("empty", lambda: b"")
    yield case("garbage", lambda: random.Random(3).randbytes(300))
    yield case("nonutf8", lambda: dumps(STATUS).replace(b'"vm"', b'"v\xffm"'))
    yield case("list", lambda: b"[1, 2]")
    yield case("null", lambda: b"null")
    yield case("deep", lambda: b'{"clock":' + nested(100_000).encode() + b"}")
    yield case("truncated", lambda: dumps(STATUS)[:50])
    fields: dict[str, tuple[str, ...]] = {
        "rank": ("rank",),
        "world-size": ("world_size",),
        "pid": ("pid",),
        "started": ("started_ns",),
        "ended": ("ended_ns",),
        "clock-offset": ("clock", "offset_ns"),
        "clock-uncertainty": ("clock", "uncertainty_ns"),
        "profiled-steps": ("profiled_steps",),
        "state": ("state",),
        "host": ("host",),
        "argv": ("argv",),
        "trace-files": ("trace_files",),
        "notes": ("notes",),
        "clock": ("clock",),
    }
    for name, path in fields.items():
        for label, value in (("wide", WIDE), ("str", "x")):
            yield case(f"{name}-{label}", with_(path, value))
    yield case("world-size-1e10", with_(("world_size",), 10**10))
    yield case("rank-1e10", with_(("rank",), 10**10))
    yield case("rank-neg", with_(("rank",), -1))
    yield case("clock-offset-1e18", with_(("clock", "offset_ns"), 10**18))
    yield case("clock-offset-neg-1e18", with_(("clock", "offset_ns"), -(10**18)))
    for kind, payload in ESCAPES.items():
        yield case(
            f"escape-{kind}-every-string",
            lambda p=payload: dumps(
                walk_strings(STATUS, lambda s: s + p, frozenset({"trace_files"}))
            ),
        )


# --- run directories ---------------------------------------------------------------------------


class Runs:
    """Run directories ingested once per session from the samples (by the real CLI); the pool's
    threads build each once, one at a time (two ingests into one run directory at once: the
    second stops, exit 2)."""

    root: Path | None = None
    building = threading.Lock()

    @classmethod
    def base(cls, name: str = "slowio") -> Path:
        with cls.building:
            return cls._base(name)

    @classmethod
    def _base(cls, name: str) -> Path:
        if cls.root is None:
            import atexit
            import tempfile

            cls.root = Path(tempfile.mkdtemp(prefix="traceview-hostile-"))
            atexit.register(shutil.rmtree, cls.root, True)
        run = cls.root / name
        if not (run / "manifest.json").exists():
            import subprocess

            src = {
                "slowio": SAMPLES / "pytorch/slowio",
                "ranks-1": SAMPLES / "pytorch/scaling/ranks-1",
            }[name]
            subprocess.run(
                [sys.executable, "-m", "traceview", "ingest", str(src), "-o", str(run)],
                check=True,
                capture_output=True,
            )
        return run


def copy_run(d: Path, name: str = "slowio") -> Path:
    run = d / "RUN"
    shutil.copytree(Runs.base(name), run)
    return run


def run_runs(run: Path, d: Path, compare: bool = False) -> list[Run]:
    runs = [
        Run(["report", str(run)]),
        Run(["report", "--json", str(run)]),
        Run(["export", str(run), "-o", str(d / "EXPORT")]),
    ]
    if compare:
        runs.append(Run(["compare", str(Runs.base()), str(run)]))
        runs.append(Run(["scaling", str(Runs.base("ranks-1")), str(run)]))
    return runs


def _parquet_bytes(columns: dict[str, list[Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def _recast_to_strings(path: Path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    table = pa.table(
        {
            n: pa.array([str(v) for v in c.to_pylist()], pa.string())
            for n, c in zip(table.column_names, table.columns, strict=True)
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _empty_like(path: Path) -> bytes:
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pq.read_table(path).slice(0, 0), sink)
    return sink.getvalue()


def _rundir_cases() -> Iterator[Case]:
    def case(name: str, mutate: Callable[[Path], None], compare: bool = False) -> Case:
        def build(d: Path) -> Plan:
            run = copy_run(d)
            mutate(run)
            return Plan(run_runs(run, d, compare), inputs=6)

        return Case(f"rundir-{name}", build)

    def manifest(fn: Callable[[dict], Any]) -> Callable[[Path], None]:
        def mutate(run: Path) -> None:
            doc = json.loads((run / "manifest.json").read_bytes())
            out = fn(doc)
            (run / "manifest.json").write_bytes(
                out if isinstance(out, bytes) else dumps(doc if out is None else out)
            )

        return mutate

    def write(rel: str, content: bytes | Callable[[Path], bytes]) -> Callable[[Path], None]:
        def mutate(run: Path) -> None:
            path = run / rel
            data = content(path) if callable(content) else content
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        return mutate

    yield case("good", lambda run: None, compare=True)
    yield case("manifest-missing", lambda run: (run / "manifest.json").unlink())
    yield case("manifest-empty", write("manifest.json", b""))
    yield case("manifest-garbage", write("manifest.json", random.Random(9).randbytes(500)))
    yield case(
        "manifest-nonutf8", manifest(lambda doc: dumps(doc).replace(b'"vm"', b'"v\xff\xfem"'))
    )
    yield case("manifest-truncated", manifest(lambda doc: dumps(doc)[:300]))
    yield case(
        "manifest-deep", write("manifest.json", b'{"ranks":' + nested(100_000).encode() + b"}")
    )
    yield case(
        "manifest-deep-meta",
        manifest(
            lambda doc: dumps(doc).replace(
                b'"meta":{', b'"meta":{"deep":' + nested(100_000).encode() + b",", 1
            )
        ),
    )
    for label, value in (
        ("list", []),
        ("null", None),
        ("string", "x"),
        ("number", 3),
        ("empty-object", {}),
    ):
        yield case(f"manifest-shape-{label}", write("manifest.json", dumps(value)))
    top = (
        "schema_version",
        "run_id",
        "framework",
        "world_size",
        "ranks_present",
        "missing_ranks",
        "ranks",
        "notes",
        "analysis_version",
        "collect",
        "inputs",
        "command",
        "created",
        "ingest_seconds",
    )
    for key in top:
        for label, value in (("str", "x"), ("wide", WIDE)):
            yield case(
                f"manifest-{key}-{label}",
                manifest(lambda doc, k=key, v=value: doc.__setitem__(k, v)),
            )
    per_rank = (
        "rank",
        "source",
        "format",
        "status",
        "events",
        "bytes_read",
        "steps",
        "training_thread",
        "threads",
        "clock_offset_ns",
        "clock",
        "meta",
        "host",
        "skipped_records",
        "seconds",
    )
    for key in per_rank:
        for label, value in (("str", "x"), ("wide", WIDE)):
            yield case(
                f"manifest-rank-{key}-{label}",
                manifest(lambda doc, k=key, v=value: doc["ranks"][0].__setitem__(k, v)),
            )
    yield case(
        "manifest-world-size-1e10", manifest(lambda doc: doc.__setitem__("world_size", 10**10))
    )
    yield case("manifest-world-size-neg", manifest(lambda doc: doc.__setitem__("world_size", -1)))
    yield case(
        "manifest-ranks-present-1e10",
        manifest(lambda doc: doc.__setitem__("ranks_present", [0, 1, 10**10])),
    )
    yield case(
        "manifest-missing-ranks-1m",
        manifest(lambda doc: doc.__setitem__("missing_ranks", list(range(2, 1_000_000)))),
    )
    yield case("manifest-ranks-empty", manifest(lambda doc: doc.__setitem__("ranks", [])))
    yield case(
        "manifest-ranks-duplicated",
        manifest(lambda doc: doc.__setitem__("ranks", doc["ranks"] * 2)),
    )
    yield case(
        "manifest-schema-version-future",
        manifest(lambda doc: doc.__setitem__("schema_version", "999")),
    )
    yield case(
        "manifest-analysis-version-old",
        manifest(lambda doc: doc.__setitem__("analysis_version", "0")),
    )
    yield case(
        "manifest-clock-offset-1e18",
        manifest(lambda doc: doc["ranks"][1].__setitem__("clock_offset_ns", 10**18)),
    )
    for kind, payload in ESCAPES.items():
        yield case(
            f"manifest-escape-{kind}-every-string",
            manifest(lambda doc, p=payload: walk_strings(doc, lambda s: s + p, frozenset())),
        )
    tables = {
        "steps": "steps.parquet",
        "ops": "ops.parquet",
        "collectives": "collectives.parquet",
        "comm": "comm.parquet",
        "segments": "segments.parquet",
        "events": "events/rank=0/part-0.parquet",
    }
    for label, rel in tables.items():
        yield case(f"{label}-missing", lambda run, r=rel: (run / r).unlink())
        yield case(f"{label}-empty", write(rel, b""))
        yield case(f"{label}-garbage", write(rel, random.Random(11).randbytes(2000)))
        yield case(
            f"{label}-truncated", write(rel, lambda p: p.read_bytes()[: p.stat().st_size // 2])
        )

        yield case(
            f"{label}-wrong-shape", write(rel, _parquet_bytes({"x": [1, 2], "y": ["a", "b"]}))
        )
        yield case(f"{label}-wrong-types", write(rel, _recast_to_strings))
        yield case(f"{label}-no-rows", write(rel, _empty_like))
        yield case(
            f"{label}-is-a-folder",
            lambda run, r=rel: _do((run / r).unlink(), (run / r).mkdir()),
        )

    yield case("steps-is-ops", lambda run: shutil.copy(run / "ops.parquet", run / "steps.parquet"))
    yield case("ops-is-steps", lambda run: shutil.copy(run / "steps.parquet", run / "ops.parquet"))
    yield case(
        "steps-stale-and-garbage",
        lambda run: _do(
            manifest(lambda doc: doc.__setitem__("analysis_version", "0"))(run),
            write("steps.parquet", b"junk")(run),
        ),
    )
    for label, name in (
        ("abc", "rank=abc"),
        ("wide", f"rank={WIDE}"),
        ("neg", "rank=-1"),
        ("extra", "rank=5"),
        ("empty-name", "rank="),
    ):
        yield case(
            f"events-dir-{label}",
            lambda run, n=name: shutil.copytree(run / "events/rank=0", run / "events" / n),
        )
    yield case("events-folder-missing", lambda run: shutil.rmtree(run / "events"))
    yield case(
        "events-rank-folder-empty",
        lambda run: shutil.rmtree(run / "events/rank=1") or (run / "events/rank=1").mkdir(),
    )
    yield case(
        "events-strings-escape",
        write(
            "events/rank=0/part-0.parquet",
            lambda p: _escape_events(p, ESCAPES["csi"] + ESCAPES["c1"]),
        ),
    )
    yield case("raw-status-garbage", lambda run: _raw(run, random.Random(2).randbytes(100)))
    yield case("raw-status-wide-rank", lambda run: _raw(run, dumps({**STATUS, "rank": WIDE})))
    yield case(
        "raw-status-escape",
        lambda run: _raw(
            run,
            dumps(walk_strings(STATUS, lambda s: s + ESCAPES["csi"], frozenset({"trace_files"}))),
        ),
    )


def _raw(run: Path, status: bytes) -> None:
    folder = run / "raw" / "rank-00000"
    folder.mkdir(parents=True)
    shutil.copy(KINETO_GZ.path, folder / KINETO_GZ.name)
    (folder / "status.json").write_bytes(status)


def _escape_events(path: Path, payload: str) -> bytes:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    cols = []
    for col in table.columns:
        if pa.types.is_dictionary(col.type) or pa.types.is_string(col.type):
            col = pc.binary_join_element_wise(col.cast(pa.string()), payload, "")
        cols.append(col)
    sink = io.BytesIO()
    pq.write_table(pa.table(dict(zip(table.column_names, cols, strict=True))), sink)
    return sink.getvalue()


# --- output locations --------------------------------------------------------------------------


def _output_cases() -> Iterator[Case]:
    src = KINETO_GZ.path

    def case(name: str, build: Callable[[Path], Plan]) -> Case:
        return Case(f"output-{name}", build)

    def regular_file(d: Path) -> Plan:
        user = d / "notes.txt"
        user.write_bytes(b"the user's notes\n")
        return Plan(
            [Run(["ingest", str(src), "-o", str(user)], must_fail=True)],
            keep={user: user.read_bytes()},
        )

    def under_regular_file(d: Path) -> Plan:
        user = d / "notes.txt"
        user.write_bytes(b"x")
        return Plan(
            [Run(["ingest", str(src), "-o", str(user / "RUN")], must_fail=True)], keep={user: b"x"}
        )

    def nonrun_folder(d: Path) -> Plan:
        folder = d / "mine"
        folder.mkdir()
        (folder / "thesis.tex").write_bytes(b"years of work\n")
        return Plan(
            [Run(["ingest", str(src), "-o", str(folder)])],
            keep={folder / "thesis.tex": b"years of work\n"},
        )

    def readonly(d: Path) -> Plan:
        ro = d / "ro"
        ro.mkdir()
        os.chmod(d, 0o755)
        os.chmod(ro, 0o555)
        trace = d / KINETO_GZ.name
        shutil.copy(src, trace)
        os.chmod(trace, 0o644)
        return Plan(
            [Run(["ingest", str(trace), "-o", str(ro / "RUN")], as_nobody=True, must_fail=True)]
        )

    def readonly_export(d: Path) -> Plan:
        run = copy_run(d)
        os.chmod(d, 0o755)
        for p in [run, *run.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        ro = d / "ro"
        ro.mkdir()
        os.chmod(ro, 0o555)
        return Plan(
            [
                Run(["export", str(run), "-o", str(ro / "EXPORT")], as_nobody=True, must_fail=True),
                Run(
                    ["export", str(run), "--format", "chrome", "-o", str(ro / "t.json.gz")],
                    as_nobody=True,
                    must_fail=True,
                ),
            ]
        )

    def readonly_run(d: Path) -> Plan:  # a stale cache in a run the user cannot write
        run = copy_run(d)
        doc = json.loads((run / "manifest.json").read_bytes())
        doc["analysis_version"] = "0"
        (run / "manifest.json").write_bytes(dumps(doc))
        os.chmod(d, 0o755)
        for p in [run, *run.rglob("*")]:
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        return Plan(
            [
                Run(["report", str(run)], as_nobody=True),
                Run(["report", "--json", str(run)], as_nobody=True),
            ],
            survive=[run],
        )

    def long_name(d: Path) -> Plan:
        return Plan([Run(["ingest", str(src), "-o", str(d / ("R" * 300))], must_fail=True)])

    def escape_name(d: Path) -> Plan:
        return Plan([Run(["ingest", str(src), "-o", str(d / "RUN\x1b[31m\x07")])])

    yield case("o-regular-file", regular_file)
    yield case("o-under-regular-file", under_regular_file)
    yield case("o-nonrun-folder", nonrun_folder)
    yield case("readonly-folder", readonly)
    yield case("readonly-export", readonly_export)
    yield case("readonly-run-stale-cache", readonly_run)
    yield case("o-name-too-long", long_name)
    yield case("o-name-escape", escape_name)

    def export_to_file(d: Path) -> Plan:
        run = copy_run(d)
        user = d / "notes.txt"
        user.write_bytes(b"keep me")
        return Plan(
            [Run(["export", str(run), "-o", str(user)], must_fail=True)], keep={user: b"keep me"}
        )

    yield case("export-o-regular-file", export_to_file)
    # not 0: the limit holds for the harness's stdout/stderr files too (a terminal has none)
    for limit in (4096, 65536, 262144):

        def fsize_ingest(d: Path, limit: int = limit) -> Plan:
            return Plan(
                [
                    Run(
                        ["ingest", str(SAMPLES / "pytorch/slowio"), "-o", str(d / "RUN")],
                        fsize=limit,
                        must_fail=limit < 65536,
                    )
                ],
                inputs=2,
            )

        def fsize_export(d: Path, limit: int = limit) -> Plan:
            run = copy_run(d)
            return Plan(
                [
                    Run(
                        ["export", str(run), "-o", str(d / "EXPORT")],
                        fsize=limit,
                        must_fail=limit < 65536,
                    ),
                    Run(
                        ["export", str(run), "--format", "csv", "-o", str(d / "CSV")],
                        fsize=limit,
                        must_fail=limit < 65536,
                    ),
                    Run(
                        ["export", str(run), "--format", "chrome", "-o", str(d / "t.json.gz")],
                        fsize=limit,
                        must_fail=limit < 65536,
                    ),
                ]
            )

        def fsize_reingest(d: Path, limit: int = limit) -> Plan:
            run = copy_run(d)
            return Plan(
                [
                    Run(
                        ["ingest", str(SAMPLES / "pytorch/slowio"), "-o", str(run)],
                        fsize=limit,
                        must_fail=limit < 65536,
                    )
                ],
                inputs=2,
                survive=[run],
            )

        def fsize_stale(d: Path, limit: int = limit) -> Plan:  # the cache rewrite hits the limit
            run = copy_run(d)
            doc = json.loads((run / "manifest.json").read_bytes())
            doc["analysis_version"] = "0"
            (run / "manifest.json").write_bytes(dumps(doc))
            return Plan([Run(["report", str(run)], fsize=limit)], survive=[run])

        yield case(f"fsize-{limit}-ingest", fsize_ingest)
        yield case(f"fsize-{limit}-export", fsize_export)
        yield case(f"fsize-{limit}-reingest", fsize_reingest)
        yield case(f"fsize-{limit}-stale-cache", fsize_stale)


# --- kills -------------------------------------------------------------------------------------

RENAMES = 12  # past the renames one ingest makes (the rest run to the end)


def _kill_cases() -> Iterator[Case]:
    def at_rename(d: Path, n: int, jobs: str) -> Plan:
        run = copy_run(d)
        return Plan(
            [
                Run(
                    ["ingest", str(SAMPLES / "pytorch/slowio"), "-j", jobs, "-o", str(run)],
                    kill_at_rename=n,
                )
            ],
            inputs=2,
            survive=[run],
        )

    def after(d: Path, seconds: float) -> Plan:
        run = copy_run(d)
        return Plan(
            [Run(["ingest", str(SAMPLES / "pytorch/slowio"), "-o", str(run)], kill_after=seconds)],
            inputs=2,
            survive=[run],
        )

    for n in range(1, RENAMES + 1):
        for jobs in ("1", "2"):
            yield Case(
                f"kill-reingest-rename-{n}-j{jobs}", functools.partial(at_rename, n=n, jobs=jobs)
            )
    for ms in (100, 300, 500, 700, 900, 1100, 1300, 1600, 2000):
        yield Case(f"kill-reingest-after-{ms}ms", functools.partial(after, seconds=ms / 1000))


# --- the corpus --------------------------------------------------------------------------------


def all_cases() -> list[Case]:
    cases: list[Case] = []
    for fmt, base in ALL_BASES.items():
        cases += _byte_cases(fmt, base)
    for fmt in ("kineto", "mxnet", "tf1"):  # kineto-json reads as kineto once inflated
        cases += _json_doc_cases(fmt, JSON_BASES[fmt])
    cases += _kineto_header_cases()
    cases += _xplane_cases()
    cases += _bomb_cases()
    cases += _folder_cases()
    cases += _status_cases()
    cases += _rundir_cases()
    cases += _output_cases()
    cases += _kill_cases()
    from tests.hostile_wave4 import wave4_cases

    cases += wave4_cases()
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "case ids are unique"
    return cases


def build(case: Case, folder: Path) -> Plan:
    folder.mkdir(parents=True, exist_ok=True)
    return case.build(folder)


def _main(argv: list[str]) -> int:
    if not argv:
        for c in all_cases():
            print(c.id)
        return 0
    import tempfile

    wanted = {c.id: c for c in all_cases()}
    case = wanted[argv[0]]
    folder = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix=f"{case.id}-"))
    plan = build(case, folder)
    print(f"# built {case.id} in {folder}", file=sys.stderr)
    print(f"# alone, checked: python -m pytest -m fuzz tests/fuzz/test_hostile.py -k '{case.id}'")
    for run in plan.runs:
        line = "python -m traceview " + " ".join(_quote(a) for a in run.argv)
        if run.as_nobody:
            line = "setpriv --reuid=65534 --regid=65534 --clear-groups " + line
        if run.fsize is not None:
            line = f"(ulimit -f {run.fsize // 1024}; {line})"
        if run.vsize is not None:
            line = f"(ulimit -v {run.vsize // 1024}; {line})"
        if run.kill_at_rename is not None:
            line += f"   # SIGKILLed before its os.replace/os.rename number {run.kill_at_rename}"
        if run.kill_after is not None:
            line += f"   # SIGKILLed after {run.kill_after} s"
        print(line)
    for program in plan.background:
        print(f"# while they run, in {folder}: python -c {_quote(program)} &")
    return 0


def _quote(arg: str) -> str:
    import shlex

    return (
        shlex.quote(arg)
        if arg.isprintable()
        else "$'" + arg.encode("unicode_escape").decode().replace("'", "\\'") + "'"
    )


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
