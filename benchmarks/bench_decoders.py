#!/usr/bin/env python3
"""Which JSON decoder should read Kineto traces (issue 31, "Evaluate the decoder")?

For each trace kind (made by make_big_trace.py), the ``traceEvents`` array is cut into slices of
``--slice-mb`` at event boundaries, as ``parsers/chrome_stream.py`` cuts it (a ``}, {`` whose
slice decodes; the cuts are planned once per trace and shared by every candidate), and each
slice is decoded into one Arrow table of seven columns: name, ph, cat (string), pid, tid (int64:
numbers as they are, labels such as "Spans" as traceview's ``_thread_id`` folds them) and ts, dur
(float64 µs). ``args`` are skipped (parsed past, not kept) except by ``msgspec_args``, which keeps
them as raw JSON bytes. Every event of the array becomes a row, whatever its ``ph``.

Each candidate runs in its own process: once to check it against ``msgspec`` (a typed decode of
the seven fields; traceview's parsers decode the same way, with more fields) slice by slice, then
``--repeat`` times to time it, the candidates' order rotated between repetitions. Times are whole
processes (interpreter start and imports included): CPU is user + sys from ``wait4``, peak RSS the
process's own ``VmHWM``. The machine is shared, so CPU time is the comparison.

    .venv/bin/python benchmarks/bench_decoders.py --mb 200 --out benchmarks/results/decoders_200mb
    .venv/bin/python benchmarks/bench_decoders.py --kinds cpu_shapes --mb 1000 \
        --out benchmarks/results/decoders_1gb

Traces go to ``--data`` (deleted after each kind unless ``--keep``); results to ``--out`` .json
(every run) and .md (a table per trace). The conclusion is in benchmarks/results/decoders.md.
"""

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

# pid/tid folded as the reference decode folds them (as traceview's parser does)
from _typed_decode import _ids, _label_id

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "traces" / "pytorch"
MB = 1_000_000
FIELDS = ("name", "ph", "cat", "pid", "tid", "ts", "dur")

# kind -> (source trace under shared/traces/pytorch, make_big_trace.py flags)
KINDS: dict[str, tuple[str, list[str]]] = {
    # the CPU side (cpu_op, user_annotation, metadata) of a TorchRec job recorded with shapes
    "cpu_shapes": ("hta_trace_diff_control/control.json.gz", []),
    "gpu": ("hta_nccl_parser_config/nccl_data.json.gz", []),
    "no_markers": ("hta_nccl_parser_config/nccl_data.json.gz", ["--no-markers"]),
    "one_step": ("hta_nccl_parser_config/nccl_data.json.gz", ["--single-step"]),
    "rocm": ("tracelens_mi300_resnet_act_checkpoint/resnet_act_checkpoint.json.gz", []),
    "kineto2021": ("kineto_resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz", []),
    # one rank of the repository's 2-rank CPU DDP job (gloo, recorded shapes, Kineto's indented
    # layout, ~1,000 events a step): an absolute path, SHARED / it is itself
    "cpu_ddp": (str(HERE.parent / "sample_traces/pytorch/ddp/rank-0.pt.trace.json.gz"), []),
}
CANDIDATES = (
    "read",  # the floor: read the slices, decode nothing
    "msgspec",
    "msgspec_args",
    "orjson",
    "yyjson",
    "simdjson",
    "simdjson_lazy",
    "pyarrow_ndjson",
    "pyarrow_nopid",
    "polars_ndjson",
)

# ---------------------------------------------------------------------------------------------
# worker side: decoders (imported lazily, so each process pays only for its own)

_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_NUMERIC_ID = re.compile(rb'"(pid|tid)":\s*(-?\d+)')
_prep_s = 0.0  # CPU seconds spent rewriting slices as NDJSON
_parse_s = 0.0  # CPU seconds in the parser's own call (the rest builds the columns)


def _parsed(parse: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    global _parse_s
    start = time.process_time()
    try:
        return parse(*args, **kwargs)
    finally:
        _parse_s += time.process_time() - start


def _table(columns: dict[str, list[Any]]) -> Any:
    """The seven columns from Python values (ints and strings mixed in pid/tid)."""
    import pyarrow as pa

    return pa.table(
        {
            "name": pa.array(columns["name"], pa.string()),
            "ph": pa.array(columns["ph"], pa.string()),
            "cat": pa.array(columns["cat"], pa.string()),
            "pid": _ids(columns["pid"]),
            "tid": _ids(columns["tid"]),
            "ts": pa.array(columns["ts"], pa.float64()),
            "dur": pa.array(columns["dur"], pa.float64()),
        }
    )


def _from_dicts(events: list[dict[str, Any]]) -> Any:
    return _table({k: list(map(dict.get, events, repeat(k))) for k in FIELDS})


def _arrow_ids(column: Any) -> Any:
    """pid/tid read as strings by an Arrow-native reader, folded like ``_ids``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column).combine_chunks()
    mapped = pa.array([_label_id(v) for v in encoded.dictionary.to_pylist()], pa.int64())
    return pc.take(mapped, encoded.indices)


def _ndjson(buf: bytearray, quote_ids: bool = False) -> bytes:
    """The slice as one event per line. Raw newlines in JSON are only ever whitespace, so they
    go; then every ``}, {`` becomes ``}\\n{``: right between events, wrong inside a string or a
    nested array of objects (the exactness check catches that). ``quote_ids``: numeric pid and
    tid written as strings too (Arrow's reader refuses a column of numbers and strings)."""
    global _prep_s
    start = time.process_time()
    text = _SEPARATOR.sub(b"}\n{", bytes(buf[1:-1]).replace(b"\n", b" ")) + b"\n"
    if quote_ids:
        text = _NUMERIC_ID.sub(rb'"\1": "\2"', text)
    _prep_s += time.process_time() - start
    return text


def make_decoder(name: str) -> Callable[[bytearray], Any]:
    """``name``'s decoder: a slice (``[`` + events + ``]``) to a seven-column table."""
    if name == "read":
        return len
    if name in ("msgspec", "msgspec_args"):
        import msgspec

        class Event(msgspec.Struct, gc=False):
            name: str | None = None
            ph: str | None = None
            cat: str | None = None
            pid: int | str | None = None
            tid: int | str | None = None
            ts: float | None = None
            dur: float | None = None

        class EventArgs(Event, gc=False):
            # (a plain Raw: ``Raw | None`` reads null only; an absent args is the empty Raw)
            args: msgspec.Raw = msgspec.Raw(b"")

        kept = EventArgs if name == "msgspec_args" else Event
        typed = msgspec.json.Decoder(list[kept])  # type: ignore[valid-type]

        def msgspec_decode(buf: bytearray) -> Any:
            import pyarrow as pa

            events = _parsed(typed.decode, buf)
            table = _table({k: list(map(attrgetter(k), events)) for k in FIELDS})
            if name == "msgspec_args":
                raw = [bytes(e.args) or None for e in events]
                table = table.append_column("args", pa.array(raw, pa.binary()))
            return table

        return msgspec_decode
    if name == "orjson":
        import orjson

        return lambda buf: _from_dicts(_parsed(orjson.loads, buf))
    if name == "yyjson":
        import yyjson

        return lambda buf: _from_dicts(_parsed(yyjson.loads, bytes(buf)))  # (str or bytes only)
    if name == "simdjson":
        import simdjson

        parser = simdjson.Parser()
        return lambda buf: _from_dicts(_parsed(parser.parse, bytes(buf), True))
    if name == "simdjson_lazy":
        import simdjson

        lazy = simdjson.Parser()

        def simdjson_lazy(buf: bytearray) -> Any:
            # proxies into simdjson's document: only the fields asked for become Python objects
            events = list(_parsed(lazy.parse, bytes(buf)))
            columns = {k: [e.get(k) for e in events] for k in FIELDS}
            del events  # (the next parse refuses while proxies live)
            return _table(columns)

        return simdjson_lazy
    if name in ("pyarrow_ndjson", "pyarrow_nopid"):
        import pyarrow as pa
        import pyarrow.json as pj

        fields = [(k, pa.float64() if k in ("ts", "dur") else pa.string()) for k in FIELDS]
        if name == "pyarrow_nopid":
            fields = [f for f in fields if f[0] not in ("pid", "tid")]
        options = pj.ParseOptions(
            explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"
        )

        def pyarrow_decode(buf: bytearray) -> Any:
            text = _ndjson(buf, quote_ids=name == "pyarrow_ndjson")
            table = _parsed(pj.read_json, pa.BufferReader(text), None, options)
            table = table.combine_chunks()
            if name == "pyarrow_ndjson":
                for i, k in ((3, "pid"), (4, "tid")):
                    table = table.set_column(i, k, _arrow_ids(table.column(k)))
            return table

        return pyarrow_decode
    if name == "polars_ndjson":
        import polars as pl
        import pyarrow as pa

        schema = {k: pl.Float64 if k in ("ts", "dur") else pl.String for k in FIELDS}

        def polars_decode(buf: bytearray) -> Any:
            frame = _parsed(pl.read_ndjson, io.BytesIO(_ndjson(buf)), schema=schema)
            table = frame.to_arrow()
            columns = {k: table.column(k) for k in FIELDS}
            for k in ("name", "ph", "cat"):  # polars hands over string views
                columns[k] = columns[k].cast(pa.string())
            for k in ("pid", "tid"):
                columns[k] = _arrow_ids(columns[k])
            return pa.table(columns).combine_chunks()

        return polars_decode
    raise SystemExit(f"unknown candidate {name}")


def read_slices(trace: Path, cuts: list[list[int]]) -> Iterator[bytearray]:
    """Each planned slice as ``[`` + its events + ``]``, read into a fresh buffer."""
    with trace.open("rb") as f:
        for start, end in cuts:
            buf = bytearray(end - start + 2)
            buf[0], buf[-1] = 0x5B, 0x5D
            f.seek(start)
            with memoryview(buf) as view:
                f.readinto(view[1:-1])
            yield buf


def _vmhwm_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _differences(ref: Any, got: Any) -> str:
    """Where two tables differ, said briefly: column, rows, the first row's values."""
    import pyarrow.compute as pc

    if got.schema != ref.schema:
        return f"schema {got.schema.types} != {ref.schema.types}"
    if got.num_rows != ref.num_rows:
        return f"{got.num_rows} rows != {ref.num_rows}"
    out = []
    for k in ref.column_names:
        a, b = ref.column(k), got.column(k)
        same = pc.fill_null(pc.equal(a, b), False)
        same = pc.or_(same, pc.and_(pc.is_null(a), pc.is_null(b)))
        if k in ("ts", "dur"):  # NaN is not equal to itself
            same = pc.or_(same, pc.and_(pc.is_nan(a), pc.is_nan(b)).fill_null(False))
        bad = pc.indices_nonzero(pc.invert(same))
        if len(bad):
            i = bad[0].as_py()
            out.append(f"{k}: {len(bad)} rows, e.g. {a[i].as_py()!r} != {b[i].as_py()!r}")
    return "; ".join(out)


def worker(candidate: str, trace: Path, cuts_file: Path, check: bool) -> int:
    cuts = json.loads(cuts_file.read_text())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    decode = make_decoder(candidate)
    reference = make_decoder("msgspec") if check else None
    import_cpu = time.process_time() - cpu0
    rows = failed = differing = 0
    why: list[str] = []
    for buf in read_slices(trace, cuts):
        try:
            table = decode(buf)
        except Exception as exc:  # a decoder that cannot read the slice: not exact
            failed += 1
            if len(why) < 3:
                why.append(f"{type(exc).__name__}: {str(exc)[:160]}")
            continue
        rows += getattr(table, "num_rows", 0)
        if reference is not None and candidate != "read":
            if missing := [k for k in FIELDS if k not in table.column_names]:
                differing += 1
                why[:] = [f"no {', '.join(missing)} column"]
                continue
            ref = reference(buf).select(FIELDS)
            got = table.select(FIELDS)
            if not got.equals(ref):
                differing += 1
                if len(why) < 3:
                    why.append(_differences(ref, got))
        del buf, table
    result = {
        "candidate": candidate,
        "rows": rows,
        "slices": len(cuts),
        "failed_slices": failed,
        "differing_slices": differing,
        "why": why,
        "import_cpu_s": import_cpu,
        "decode_cpu_s": time.process_time() - cpu0 - import_cpu,
        "decode_wall_s": time.perf_counter() - wall0,
        "ndjson_rewrite_cpu_s": _prep_s,
        "parse_cpu_s": _parse_s,
        "vmhwm_kb": _vmhwm_kb(),
    }
    print(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------
# planning the cuts (in a process of its own, so that the harness stays small)

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BYTE = re.compile(r"byte (\d+)")


def plan(trace: Path, slice_bytes: int, out: Path) -> int:
    """Byte ranges [start, end) of slices of whole events: from an event's ``{`` to the ``}``
    before a separator, ``slice_bytes`` or a little more each; a cut is kept only where the
    slice decodes (as chrome_stream moves a cut that fell inside an event)."""
    import msgspec

    raw = msgspec.json.Decoder(list[msgspec.Raw])
    cuts: list[list[int]] = []
    with trace.open("rb") as f:
        head = f.read(1 << 22)
        match = _EVENTS_KEY.search(head)
        if match is None:
            raise SystemExit(f"{trace}: no traceEvents array in its first 4 MB")
        base = head.index(b"{", match.end())  # file offset of buf[0]
        f.seek(base)
        buf = bytearray(f.read(slice_bytes + (4 << 20)))
        while True:
            found = None
            for m in _SEPARATOR.finditer(buf, slice_bytes):
                try:
                    raw.decode(b"[" + buf[: m.start() + 1] + b"]")
                except msgspec.DecodeError:
                    continue  # the separator is inside an event
                found = m
                break
            if found is None:
                more = f.read(4 << 20)
                if more:
                    buf += more
                    continue
                break  # the rest holds the last events and the keys after them
            cuts.append([base, base + found.start() + 1])
            base += found.end() - 1
            del buf[: found.end() - 1]
            buf += f.read(found.end() - 1)
    try:
        raw.decode(b"[" + buf)  # a bare array ends the file
        end = buf.rstrip().rfind(b"]")
    except msgspec.DecodeError as exc:  # "trailing characters (byte N)": the keys after it
        position = int(_BYTE.search(str(exc)).group(1))  # type: ignore[union-attr]
        end = (b"[" + buf).rfind(b"]", 0, position) - 1  # the "]" that closes the array
    end = buf.rfind(b"}", 0, end) + 1
    raw.decode(b"[" + buf[:end] + b"]")  # must read
    cuts.append([base, base + end])
    out.write_text(json.dumps(cuts))
    return 0


# ---------------------------------------------------------------------------------------------
# harness side


def _busy_jiffies() -> int:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return user + nice + system + irq + softirq + steal


def run_worker(args: list[str]) -> dict[str, Any]:
    """One worker process: its JSON answer, whole-process wall and CPU, others' CPU meanwhile."""
    tick = os.sysconf("SC_CLK_TCK")
    busy0, t0 = _busy_jiffies(), time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=errors
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # (its own rusage, not all children's)
        wall = time.perf_counter() - t0
        proc.returncode = status
        proc.stdout.close()
        errors.seek(0)
        err = errors.read()
    cpu = usage.ru_utime + usage.ru_stime
    others = max((_busy_jiffies() - busy0) / tick - cpu, 0.0) / wall
    if status != 0 or not out.strip():
        raise SystemExit(f"worker {args} failed ({status}):\n{err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    result.update(proc_wall_s=wall, proc_cpu_s=cpu, others_cores=others)
    return result


def make_trace(kind: str, mb: float, data: Path) -> Path:
    out = data / f"{kind}-{mb:g}mb"
    found = sorted(out.glob("rank0.pt.trace.json"))
    if found:
        return found[0]
    source, flags = KINDS[kind]
    src = SHARED / source
    if kind == "cpu_shapes":  # the source's host and metadata events, text as written
        sys.path.insert(0, str(HERE))
        import make_big_trace as mbt

        parsed = mbt.parse_source(src)
        kept = [e for e in parsed.events if mbt._section(e.d) in ("host", "meta")]
        src = data / "cpu_shapes_source.json"
        src.write_text(parsed.head + "".join(e.sep + e.raw for e in kept) + parsed.tail)
    subprocess.run(
        [
            sys.executable,
            str(HERE / "make_big_trace.py"),
            *("--source", str(src), "--target-mb", str(mb), "-o", str(out), *flags),
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    return sorted(out.glob("rank0.pt.trace.json"))[0]


def bench_trace(
    kind: str, trace: Path, candidates: list[str], repeat_n: int, slice_mb: float, work: Path
) -> dict[str, Any]:
    cuts = work / f"{trace.parent.name}.cuts.json"
    subprocess.run(
        [sys.executable, __file__, "--plan", str(trace), str(int(slice_mb * MB)), str(cuts)],
        check=True,
    )
    with trace.open("rb") as f:  # into the page cache, for every candidate alike
        while f.read(16 << 20):
            pass
    size = trace.stat().st_size
    checks = {c: run_worker(["--worker", c, str(trace), str(cuts), "--check"]) for c in candidates}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in candidates}
    for r in range(repeat_n):
        shift = r % len(candidates)
        for c in candidates[shift:] + candidates[:shift]:
            runs[c].append(run_worker(["--worker", c, str(trace), str(cuts)]))
            print(
                f"{kind} rep {r + 1} {c}: cpu {runs[c][-1]['proc_cpu_s']:.2f} s, wall "
                f"{runs[c][-1]['proc_wall_s']:.2f} s, others {runs[c][-1]['others_cores']:.2f}",
                flush=True,
            )
    cuts.unlink()
    rows = []
    for c in candidates:
        done = runs[c]
        check = checks[c]
        exact = c == "msgspec" or (
            c != "read" and not check["failed_slices"] and not check["differing_slices"]
        )
        rows.append(
            {
                "candidate": c,
                "exact": exact,
                "failed_slices": check["failed_slices"],
                "differing_slices": check["differing_slices"],
                "why": check["why"],
                "rows": check["rows"],
                "cpu_s": min(d["proc_cpu_s"] for d in done),
                "wall_s": min(d["proc_wall_s"] for d in done),
                "decode_cpu_s": min(d["decode_cpu_s"] for d in done),
                "import_cpu_s": min(d["import_cpu_s"] for d in done),
                "ndjson_rewrite_cpu_s": min(d["ndjson_rewrite_cpu_s"] for d in done),
                "parse_cpu_s": min(d["parse_cpu_s"] for d in done),
                "peak_rss_mb": max(d["vmhwm_kb"] for d in done) / 1024,
                "others_cores_max": max(d["others_cores"] for d in done),
                "runs": done,
            }
        )
    slices = checks[candidates[0]]["slices"]
    return {"kind": kind, "file_bytes": size, "slices": slices, "rows": rows}


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = []
    for res in results:
        mb = res["file_bytes"] / MB
        events = next(r["rows"] for r in res["rows"] if r["candidate"] == "msgspec")
        lines += [
            f"### {res['kind']} ({mb:,.0f} MB, {events:,} events)",
            "",
            "| candidate | exact | CPU s | × msgspec | MB/s of CPU | wall s | peak RSS MB "
            "| decode CPU s (parse + rewrite) | others' cores |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        ref = next(r for r in res["rows"] if r["candidate"] == "msgspec")
        for r in res["rows"]:
            if r["candidate"] == "read":
                exact = "n/a (floor)"
            elif r["exact"]:
                exact = "yes"
            else:
                why = "; ".join(r["why"])[:300].replace("|", "\\|")
                part = f"{r['failed_slices']} failed" if r["failed_slices"] else ""
                part += f"{', ' if part else ''}{r['differing_slices']} differ" * bool(
                    r["differing_slices"]
                )
                exact = f"no ({part} of {res['slices']} slices: {why})"
            split = f"{r['parse_cpu_s']:.2f}"
            split += f" + {r['ndjson_rewrite_cpu_s']:.2f}" if r["ndjson_rewrite_cpu_s"] else ""
            lines.append(
                f"| {r['candidate']} | {exact} | {r['cpu_s']:.2f} | "
                f"{r['cpu_s'] / ref['cpu_s']:.2f} | {mb / r['cpu_s']:,.0f} | {r['wall_s']:.2f} | "
                f"{r['peak_rss_mb']:,.0f} | {r['decode_cpu_s']:.2f} ({split}) | "
                f"{r['others_cores_max']:.2f} |"
            )
        lines.append("")
    lines.append(f"{meta['command']} ({meta['when']}, {meta['cpus']} CPUs, {meta['versions']})")
    return "\n".join(lines) + "\n"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for p in ("msgspec", "orjson", "yyjson", "pysimdjson", "pyarrow", "polars"):
        try:
            out.append(f"{p} {version(p)}")
        except PackageNotFoundError:
            out.append(f"{p} missing")
    return ", ".join(out) + f", Python {sys.version.split()[0]}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1], Path(argv[2]), Path(argv[3]), "--check" in argv[4:])
    if argv[:1] == ["--plan"]:
        return plan(Path(argv[1]), int(argv[2]), Path(argv[3]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--mb", type=float, default=200, help="size of each kind's trace (MB)")
    p.add_argument("--big-mb", type=float, default=0, help="one more trace of --big-kind")
    p.add_argument("--big-kind", default="cpu_shapes", choices=list(KINDS))
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--slice-mb", type=float, default=32)
    p.add_argument("--data", type=Path, default=Path("/tmp/bench-decoders"))
    p.add_argument("--keep", action="store_true", help="keep the traces made")
    p.add_argument("--out", type=Path, default=HERE / "results" / "decoders")
    a = p.parse_args(argv)
    a.data.mkdir(parents=True, exist_ok=True)
    jobs = [(k, a.mb) for k in a.kinds] + ([(a.big_kind, a.big_mb)] if a.big_mb else [])
    results = []
    for kind, mb in jobs:
        trace = make_trace(kind, mb, a.data)
        print(f"{kind}: {trace} ({trace.stat().st_size / MB:,.0f} MB)", flush=True)
        results.append(bench_trace(kind, trace, a.candidates, a.repeat, a.slice_mb, a.data))
        if not a.keep:
            shutil.rmtree(trace.parent)
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "versions": _versions(),
        "command": "python benchmarks/bench_decoders.py " + " ".join(argv),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    text = markdown(results, meta)
    a.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
