#!/usr/bin/env python3
"""Make large Kineto (PyTorch profiler) traces by replicating the steps of a real one.

The source trace (default: the GPU + NCCL DDP trace from HTA's test data, 3 ProfilerSteps) is
read once into memory (it is small). Its step content is then appended again and again,
shifted in time after the previous copy, until the output reaches --target-mb:

* the step content is every host event inside [first ProfilerStep start, last ProfilerStep
  end], the GPU activities (kernels, memcpy, memset) whose correlation id belongs to a
  runtime call in that window, the GPU user annotations of those steps, and every flow
  (ac2g, fwdbwd, ...) whose first event lies in the window;
* ``ProfilerStep#N`` is renumbered (copy k of step N becomes N + k * number_of_steps);
* ids that must stay unique get a per-copy offset, the same offset for every event that
  carries that id, so links survive: "External id", "correlation" (cuda_runtime / kernel /
  gpu_memcpy / gpu_memset args) together with the flow event "id" (ac2g flow ids equal the
  correlation id in Kineto), "Ev Idx", "Record function id", "Sequence number" (fwd/bwd
  pairing) and "Python id" / "Python parent id" when present;
* the "Trace" span and the "Record Window End" marker are stretched to cover the copies.

The output keeps the source's layout byte for byte where nothing changes: the header keys
(schemaVersion, deviceProperties, distributedInfo, ...) before "traceEvents", one event per
block exactly as Kineto formatted it, the trailer keys (traceName, displayTimeUnit,
baseTimeNanoseconds, ...) after it. Only the numbers listed above are rewritten in the
original text (timestamps with exact decimal arithmetic, keeping the number of decimals),
so parsers that depend on Kineto's formatting (HTA finds the rank with a regular expression
over the header lines) see what they would see from Kineto. Copies are placed after the
original events of the same section (host ops, then runtime + GPU activity, then GPU user
annotations, then metadata), as Kineto groups them.

The output is streamed (a copy at a time), never built as one string. With --ranks N it
writes rank0 .. rank{N-1} files whose distributedInfo carries rank / world_size (and the
default process group's size and ranks), each with a small per-rank clock offset and a
per-step jitter.

Examples:
    python benchmarks/make_big_trace.py --target-mb 100
    python benchmarks/make_big_trace.py --target-mb 25 --ranks 8 --gzip -o bench-data/r8
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import random
import re
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "traces"
    / "pytorch"
    / "hta_nccl_parser_config"
    / "nccl_data.json.gz"
)
DEFAULT_OUT_ROOT = REPO_ROOT / "bench-data"
MB = 1_000_000  # sizes and MB/s use decimal megabytes
INFO_NAME = "make_big_trace.info"  # JSON summary written next to the traces

# Categories Kineto writes in the "activity" part of the event list (after the host ops).
ACTIVITY_CATS = {
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "ac2g",
    "async_cpu_to_gpu",
    "Runtime",
    "Kernel",
    "Memcpy",
    "Memset",
    "async",
    "cuda_sync",
    "gpu_user_annotation_flow",
}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
FLOW_PHASES = {"s", "f", "t"}

# Integer args that must be unique per event (or per linked group) -> offset per copy.
# "correlation" shares its offset with flow "id"s (ac2g flow id == correlation id).
ID_ARGS = (
    "External id",
    "Ev Idx",
    "Record function id",
    "Sequence number",
    "Python id",
    "Python parent id",
)

_NUM = r"-?\d+(?:\.\d+)?"
_FIELD_RE = re.compile(
    r'"(ts|id|correlation|External id|Ev Idx|Record function id|Sequence number'
    r'|Python id|Python parent id)": (' + _NUM + r")"
    r'|"name": "ProfilerStep#(\d+)"'
)
_DUR_RE = re.compile(r'"dur": (' + _NUM + r")")
_STEP_NAME_RE = re.compile(r"^ProfilerStep#(\d+)$")


def _shift_decimal(token: str, shift_us: int) -> str:
    """Add an integer number of microseconds to a decimal token, keeping its decimals."""
    if "." in token:
        ip, fp = token.split(".")
        d = len(fp)
        scale = 10**d
        neg = ip.startswith("-")
        v = abs(int(ip)) * scale + int(fp)
        if neg:
            v = -v
        v += shift_us * scale
        sign = "-" if v < 0 else ""
        v = abs(v)
        return f"{sign}{v // scale}.{v % scale:0{d}d}"
    return str(int(token) + shift_us)


def _to_ns(x: float) -> int:
    return round(x * 1000)


@dataclass
class Event:
    sep: str  # text before the event in the source (e.g. ",\n  ")
    raw: str  # the event's text exactly as in the source
    d: dict[str, Any]
    section: str = ""
    selected: bool = False


@dataclass
class SourceTrace:
    path: Path
    head: str  # everything up to and including the "[" of traceEvents
    di_span: tuple[int, int] | None  # span of the distributedInfo object inside head
    events: list[Event]
    tail: str  # everything after the last event
    # derived
    strides: dict[str, int] = field(default_factory=dict)
    step_range: tuple[int, int] = (0, 0)
    period_us: int = 0
    steps_span_us: int = 0  # from the first step marker's end to the last one's
    n_selected: int = 0
    copy_bytes: int = 0


def read_text(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8")


def parse_source(path: Path) -> SourceTrace:
    text = read_text(path)
    dec = json.JSONDecoder()
    m = re.search(r'"traceEvents"\s*:\s*\[', text)
    if not m:
        raise SystemExit(f"{path}: no traceEvents array")
    head = text[: m.end()]
    di_span = None
    dm = re.search(r'"distributedInfo"\s*:\s*', head)
    if dm:
        _, end = dec.raw_decode(head, dm.end())
        di_span = (dm.end(), end)
    pos = m.end()
    events: list[Event] = []
    n = len(text)
    while True:
        start = pos
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            raise SystemExit(f"{path}: truncated traceEvents")
        if text[pos] == "]":
            pos = start
            break
        obj, end = dec.raw_decode(text, pos)
        events.append(Event(sep=text[start:pos], raw=text[pos:end], d=obj))
        pos = end
    tail = text[pos:]
    return SourceTrace(path=path, head=head, di_span=di_span, events=events, tail=tail)


def _section(d: dict[str, Any]) -> str:
    ph, cat = d.get("ph"), d.get("cat")
    if ph == "M" or cat == "Trace" or (ph == "i" and not cat and d.get("s") == "g"):
        return "meta"
    if cat == "gpu_user_annotation":
        return "gpu_user_annotation"
    if cat in ACTIVITY_CATS:
        return "activity"
    return "host"


def analyze(src: SourceTrace, gap_us: int | None, jitter_us: int) -> None:
    """Select the step content and compute id strides and the copy period."""
    evs = src.events
    steps = [
        e.d
        for e in evs
        if e.d.get("ph") == "X"
        and _STEP_NAME_RE.match(str(e.d.get("name", "")))
        and e.d.get("cat") != "gpu_user_annotation"
    ]
    if not steps:
        raise SystemExit(f"{src.path}: no ProfilerStep#N events; pick a --source that has them")
    steps.sort(key=lambda d: d["ts"])
    w0 = _to_ns(steps[0]["ts"])
    w1 = max(_to_ns(d["ts"]) + _to_ns(d.get("dur", 0)) for d in steps)
    nums = [int(m.group(1)) for d in steps if (m := _STEP_NAME_RE.match(d["name"]))]
    src.step_range = (min(nums), max(nums))
    src.steps_span_us = math.ceil((w1 - _to_ns(steps[0]["ts"]) - _to_ns(steps[0]["dur"])) / 1000)

    def in_window(d: dict[str, Any]) -> bool:
        return "ts" in d and w0 <= _to_ns(d["ts"]) <= w1

    for e in evs:
        e.section = _section(e.d)

    # 1) host events and runtime calls in the window
    corr: set[int] = set()
    ext_ids: set[int] = set()
    for e in evs:
        d = e.d
        if e.section == "meta" or d.get("ph") in FLOW_PHASES:
            continue
        if d.get("cat") in GPU_CATS or d.get("cat") == "gpu_user_annotation":
            continue
        if in_window(d):
            e.selected = True
            a = d.get("args") or {}
            if "correlation" in a:
                corr.add(a["correlation"])
            if "External id" in a:
                ext_ids.add(a["External id"])
    # 2) GPU activities launched by those runtime calls; GPU user annotations of the steps
    for e in evs:
        d = e.d
        a = d.get("args") or {}
        if d.get("ph") in FLOW_PHASES:
            continue
        if d.get("cat") in GPU_CATS:
            e.selected = a.get("correlation") in corr if "correlation" in a else in_window(d)
        elif d.get("cat") == "gpu_user_annotation":
            e.selected = a.get("External id") in ext_ids if "External id" in a else in_window(d)
    # 3) flows: a whole (cat, id) group is copied when its earliest event is in the window
    groups: dict[tuple[Any, Any], list[Event]] = {}
    for e in evs:
        if e.d.get("ph") in FLOW_PHASES and "id" in e.d:
            groups.setdefault((e.d.get("cat"), e.d["id"]), []).append(e)
    for members in groups.values():
        first = min(members, key=lambda e: e.d.get("ts", 0))
        take = in_window(first.d) or (
            first.d.get("cat") in ("ac2g", "async", "async_cpu_to_gpu") and first.d["id"] in corr
        )
        for e in members:
            e.selected = take

    # id strides (max - min + 1 over the whole source, so copies never collide)
    vals: dict[str, list[int]] = {k: [] for k in (*ID_ARGS, "correlation")}
    for e in evs:
        a = e.d.get("args") or {}
        for k in vals:
            v = a.get(k)
            if isinstance(v, int):
                vals[k].append(v)
        if e.d.get("ph") in FLOW_PHASES and isinstance(e.d.get("id"), int):
            vals["correlation"].append(e.d["id"])  # flows share correlation's offset
    # a value that is the same on every event (e.g. "Record function id": 0 when record
    # functions are off) is no id in this trace: leave it alone
    src.strides = {
        k: (max(v) - min(v) + 1 if v and (max(v) > min(v) or len(v) == 1) else 0)
        for k, v in vals.items()
    }

    # copy period: from the first step start to the end of everything the body holds
    t_end = w0
    for e in evs:
        if e.section == "meta" or "ts" not in e.d:
            continue
        t_end = max(t_end, _to_ns(e.d["ts"]) + _to_ns(e.d.get("dur", 0) or 0))
    if gap_us is None:
        gaps = [
            (_to_ns(b["ts"]) - _to_ns(a["ts"]) - _to_ns(a["dur"])) / 1000
            for a, b in itertools.pairwise(steps)
        ]
        gap_us = max(1, int(statistics.median(gaps))) if gaps else 100
    src.period_us = math.ceil((t_end - w0) / 1000) + gap_us + 2 * jitter_us
    sel = [e for e in evs if e.selected]
    src.n_selected = len(sel)
    src.copy_bytes = sum(len(e.raw) + 4 for e in sel)


@dataclass
class CopyParams:
    k: int  # 0 = the original events
    shift_us: int
    step_offset: int
    id_offsets: dict[str, int]
    single_step: int | None = None  # only ProfilerStep#<this> stays a step marker (-1: none)


def transform(
    raw: str, d: dict[str, Any], cp: CopyParams, extra_dur_us: int = 0, extra_ts_us: int = 0
) -> str:
    is_flow = d.get("ph") in FLOW_PHASES
    io = cp.id_offsets

    def repl(m: re.Match[str]) -> str:
        key = m.group(1)
        if key is None:  # ProfilerStep#N
            number = int(m.group(3)) + cp.step_offset
            if cp.single_step is not None and number != cp.single_step:
                return f'"name": "step_copy#{number}"'  # a plain annotation now
            return f'"name": "ProfilerStep#{number}"'
        tok = m.group(2)
        if key == "ts":
            return f'"ts": {_shift_decimal(tok, cp.shift_us + extra_ts_us)}'
        if key == "id":
            if not is_flow or "." in tok or cp.k == 0:
                return m.group(0)
            return f'"id": {int(tok) + io["correlation"]}'
        if cp.k == 0 or "." in tok:
            return m.group(0)
        return f'"{key}": {int(tok) + io[key]}'

    out = _FIELD_RE.sub(repl, raw)
    if extra_dur_us:
        out = _DUR_RE.sub(
            lambda m: f'"dur": {_shift_decimal(m.group(1), extra_dur_us)}', out, count=1
        )
    return out


def rank_head(src: SourceTrace, rank: int, world: int, ranks_mode: bool) -> str:
    """The source header with distributedInfo set for this rank (unchanged unless --ranks>1)."""
    if not ranks_mode:
        return src.head
    if src.di_span is None:
        m = re.search(r'"traceEvents"\s*:\s*\[$', src.head)
        assert m
        di = json.dumps({"backend": "nccl", "rank": rank, "world_size": world})
        return src.head[: m.start()] + f'"distributedInfo": {di},\n  ' + src.head[m.start() :]
    a, b = src.di_span
    old_text = src.head[a:b]
    info = json.loads(old_text)
    old_world = info.get("world_size")
    info["rank"] = rank
    info["world_size"] = world
    pgs = info.get("pg_config")
    if isinstance(pgs, list):
        for pg in pgs:
            if isinstance(pg, dict) and (
                pg.get("pg_desc") == "default_pg" or pg.get("pg_size") == old_world
            ):
                pg["pg_size"] = world
                if "ranks" in pg:
                    pg["ranks"] = list(range(world))
    if json.dumps(json.loads(old_text)) == old_text:
        new_text = json.dumps(info)  # Kineto writes it exactly like json.dumps
    else:  # unknown formatting: only rewrite the two numbers in place
        new_text = re.sub(r'("rank":\s*)\d+', rf"\g<1>{rank}", old_text, count=1)
        new_text = re.sub(r'("world_size":\s*)\d+', rf"\g<1>{world}", new_text, count=1)
    return src.head[:a] + new_text + src.head[b:]


def plan_copies(src: SourceTrace, target_bytes: int) -> int:
    base = len(src.head) + len(src.tail) + sum(len(e.sep) + len(e.raw) for e in src.events)
    if target_bytes <= base or src.copy_bytes == 0:
        return 0
    return math.ceil((target_bytes - base) / src.copy_bytes)


def generate(
    src: SourceTrace,
    n_copies: int,
    rank: int,
    world: int,
    ranks_mode: bool,
    jitter_us: int,
    seed: int,
    single_step: bool = False,
    no_markers: bool = False,
) -> Iterator[str]:
    rng = random.Random(seed * 1_000_003 + rank)
    rank_shift = rng.randint(0, jitter_us) if jitter_us else 0
    n_steps = src.step_range[1] - src.step_range[0] + 1
    total_extra = n_copies * src.period_us

    def params(k: int) -> CopyParams:
        jit = rng.randint(0, jitter_us) if (jitter_us and k) else 0
        return CopyParams(
            k=k,
            shift_us=rank_shift + k * src.period_us + jit,
            step_offset=k * n_steps,
            id_offsets={key: k * s for key, s in src.strides.items()},
            single_step=-1 if no_markers else src.step_range[0] if single_step else None,
        )

    copies = [params(k) for k in range(n_copies + 1)]
    orig = copies[0]
    common_sep = ",\n  "
    seps = [e.sep for e in src.events[1:]]
    if seps:
        common_sep = max(set(seps), key=seps.count)

    yield rank_head(src, rank, world, ranks_mode)
    # sections in source order: runs of events with the same section key
    runs: list[list[Event]] = []
    for e in src.events:
        if runs and runs[-1][0].section == e.section:
            runs[-1].append(e)
        else:
            runs.append([e])
    buf: list[str] = []
    size = 0
    for run in runs:
        # the original events of this section (only the rank's clock offset applied) ...
        for e in run:
            extra_dur = extra_ts = 0
            if e.d.get("cat") == "Trace" and "dur" in e.d:
                extra_dur = total_extra
            if e.d.get("name") == "Record Window End":
                extra_ts = total_extra
            if (
                single_step
                and e.d.get("name") == f"ProfilerStep#{src.step_range[0]}"
                and e.d.get("cat") != "gpu_user_annotation"
            ):  # the one step marker spans every copy
                extra_dur = src.steps_span_us + total_extra
            t = transform(e.raw, e.d, orig, extra_dur, extra_ts)
            buf.append(e.sep)
            buf.append(t)
            size += len(t)
        # ... followed by this section's share of every copy
        sel = [e for e in run if e.selected]
        for cp in copies[1:] if sel else []:
            for e in sel:
                t = transform(e.raw, e.d, cp)
                buf.append(common_sep)
                buf.append(t)
                size += len(t)
                if size > 4 * MB:  # bounded buffer: stream it out
                    yield "".join(buf)
                    buf.clear()
                    size = 0
    yield "".join(buf)
    yield src.tail


def write_rank_file(
    src: SourceTrace,
    path: Path,
    n_copies: int,
    rank: int,
    world: int,
    ranks_mode: bool,
    jitter_us: int,
    seed: int,
    use_gzip: bool,
    gzip_level: int,
    single_step: bool = False,
    no_markers: bool = False,
) -> int:
    """Stream one rank's trace to path (atomically); returns uncompressed bytes."""
    tmp = path.with_name(path.name + ".tmp")
    nbytes = 0
    with gzip.open(tmp, "wb", compresslevel=gzip_level) if use_gzip else open(tmp, "wb") as fh:
        for chunk in generate(
            src, n_copies, rank, world, ranks_mode, jitter_us, seed, single_step, no_markers
        ):
            b = chunk.encode("utf-8")
            nbytes += len(b)
            fh.write(b)
    os.replace(tmp, path)
    return nbytes


def trace_filename(rank: int, use_gzip: bool) -> str:
    # "<worker>.pt.trace.json[.gz]" like torch.profiler.tensorboard_trace_handler
    # (torch-tb-profiler only picks up files with this suffix; HTA wants .json or .gz).
    return f"rank{rank}.pt.trace.json" + (".gz" if use_gzip else "")


def check_trace(path: Path) -> dict[str, Any]:
    """Load a trace and look for broken ids and links (uses memory ~10x the file).

    "problems" maps a kind of problem to a detail. A generated file should show no kind of
    problem its source does not already have (see --check)."""
    d = json.loads(read_text(path))
    ev = d["traceEvents"]
    problems: dict[str, str] = {}
    ext: dict[int, int] = {}
    for e in ev:
        a = e.get("args") or {}
        if e.get("cat") in ("cpu_op", "user_annotation", "Operator") and "External id" in a:
            ext[a["External id"]] = ext.get(a["External id"], 0) + 1
    dup_ext = sum(1 for v in ext.values() if v > 1)
    if dup_ext:
        problems["duplicate host External id"] = str(dup_ext)
    rt_corr = [
        e["args"]["correlation"]
        for e in ev
        if e.get("cat") in RUNTIME_CATS and "correlation" in (e.get("args") or {})
    ]
    rt_set = set(rt_corr)
    gpu_corr = {
        e["args"]["correlation"]
        for e in ev
        if e.get("cat") in GPU_CATS and "correlation" in (e.get("args") or {})
    }
    if len(rt_set) != len(rt_corr):
        problems["duplicate runtime correlation"] = str(len(rt_corr) - len(rt_set))
    if not gpu_corr <= rt_set:
        problems["GPU correlation without runtime call"] = str(len(gpu_corr - rt_set))
    for key in ("Ev Idx", "Record function id", "Python id"):
        vals = [e["args"][key] for e in ev if key in (e.get("args") or {})]
        if len(set(vals)) != len(vals):
            problems[f"duplicate {key}"] = str(len(vals) - len(set(vals)))
    flows: dict[tuple[Any, Any], list[str]] = {}
    for e in ev:
        if e.get("ph") in FLOW_PHASES:
            flows.setdefault((e.get("cat"), e.get("id")), []).append(e["ph"])
    bad_flows = sum(1 for v in flows.values() if v.count("s") > 1)
    if bad_flows:
        problems["flow id with several starts"] = str(bad_flows)
    ac2g_ids = {i for (c, i) in flows if c == "ac2g"}
    if not ac2g_ids <= rt_set:
        problems["ac2g flow id that is no runtime correlation"] = str(len(ac2g_ids - rt_set))
    steps = sorted(
        (
            e
            for e in ev
            if e.get("ph") == "X"
            and _STEP_NAME_RE.match(str(e.get("name", "")))
            and e.get("cat") != "gpu_user_annotation"
        ),
        key=lambda e: e["ts"],
    )
    names = [e["name"] for e in steps]
    if len(set(names)) != len(names):
        problems["duplicate ProfilerStep"] = str(len(names) - len(set(names)))
    for a, b in itertools.pairwise(steps):
        if b["ts"] < a["ts"] + a["dur"]:
            problems["overlapping ProfilerSteps"] = f"{a['name']} {b['name']}"
            break
    return {
        "file": str(path),
        "events": len(ev),
        "steps": len(steps),
        "first_step": names[0] if names else None,
        "last_step": names[-1] if names else None,
        "distributedInfo": {
            k: (d.get("distributedInfo") or {}).get(k) for k in ("rank", "world_size")
        },
        "keys": list(d.keys()),
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--source",
        type=Path,
        default=DEFAULT_SOURCE,
        help="real Kineto trace with ProfilerStep#N annotations (.json or .json.gz)",
    )
    p.add_argument(
        "--target-mb",
        type=float,
        default=100.0,
        help="uncompressed size of EACH output file in MB (10^6 bytes); default 100",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="write rank0..rank{N-1} files with distributedInfo rank/world_size set",
    )
    p.add_argument("--gzip", action="store_true", help="write .json.gz files")
    p.add_argument("--gzip-level", type=int, default=6)
    p.add_argument(
        "--jitter-us",
        type=int,
        default=None,
        help="max per-rank clock offset and per-copy jitter in µs "
        "(default 0 for one rank, 100 for several)",
    )
    p.add_argument(
        "--gap-us",
        type=int,
        default=None,
        help="idle gap between copies (default: the source's median step gap)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--single-step",
        action="store_true",
        help="one ProfilerStep marker spanning every copy (the others become plain "
        "annotations): a trace that is one long step",
    )
    p.add_argument(
        "--no-markers",
        action="store_true",
        help="no ProfilerStep marker at all (each becomes a plain annotation): a whole-run "
        "profile that never called prof.step()",
    )
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        default=None,
        help="output directory (default bench-data/kineto-<MB>mb-<N>rank[-gz])",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="after writing, load each file and verify ids, links and steps",
    )
    a = p.parse_args(argv)
    if a.ranks < 1:
        p.error("--ranks must be >= 1")
    if a.single_step and a.no_markers:
        p.error("--single-step and --no-markers exclude each other")
    jitter = a.jitter_us if a.jitter_us is not None else (0 if a.ranks == 1 else 100)
    out = a.out or DEFAULT_OUT_ROOT / (
        f"kineto-{a.target_mb:g}mb-{a.ranks}rank" + ("-gz" if a.gzip else "")
    )
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    src = parse_source(a.source)
    analyze(src, a.gap_us, jitter)
    n_copies = plan_copies(src, int(a.target_mb * MB))
    n_steps = src.step_range[1] - src.step_range[0] + 1
    steps_per_rank = 0 if a.no_markers else 1 if a.single_step else n_steps * (n_copies + 1)
    print(
        f"source {a.source}: {len(src.events)} events, steps "
        f"#{src.step_range[0]}..#{src.step_range[1]}, {src.n_selected} events "
        f"(~{src.copy_bytes / MB:.1f} MB) per copy, period {src.period_us} µs; "
        f"{n_copies} copies -> {steps_per_rank} steps per rank",
        file=sys.stderr,
    )
    summary: list[dict[str, Any]] = []
    for r in range(a.ranks):
        path = out / trace_filename(r, a.gzip)
        nbytes = write_rank_file(
            src,
            path,
            n_copies,
            r,
            a.ranks,
            a.ranks > 1,
            jitter,
            a.seed,
            a.gzip,
            a.gzip_level,
            a.single_step,
            a.no_markers,
        )
        n_events = len(src.events) + n_copies * src.n_selected
        summary.append(
            {
                "file": str(path),
                "uncompressed_bytes": nbytes,
                "file_bytes": path.stat().st_size,
                "events": n_events,
            }
        )
        print(
            f"wrote {path} ({nbytes / MB:.1f} MB uncompressed, {n_events} events)", file=sys.stderr
        )
    meta = {
        "source": str(a.source),
        "ranks": a.ranks,
        "copies": n_copies,
        "steps_per_rank": steps_per_rank,
        "jitter_us": jitter,
        "command": shlex.join(
            [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)]
        ),
        "files": summary,
    }
    # not "*.json": HTA would take any .json/.gz file in the directory for a trace
    (out / INFO_NAME).write_text(json.dumps(meta, indent=1) + "\n")
    print(f"done in {time.perf_counter() - t0:.1f} s -> {out}", file=sys.stderr)
    if a.check:
        inherited = check_trace(a.source)["problems"]
        bad = 0
        for s in summary:
            res = check_trace(Path(s["file"]))
            res["new_problems"] = {k: v for k, v in res["problems"].items() if k not in inherited}
            res["problems_also_in_source"] = {
                k: v for k, v in res.pop("problems").items() if k in inherited
            }
            print(json.dumps(res), file=sys.stderr)
            bad += bool(res["new_problems"])
        if bad:
            print("check FAILED: the output has problems its source does not have", file=sys.stderr)
            return 1
        print("check ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
