"""Exports of a run directory: flat tables (Parquet, CSV) and a merged Chrome trace.

Each table has one grain: ``events`` (one row per trace event), ``steps`` (rank, step), ``ops``
(rank, device, kind, phase, op, name), ``collectives`` (one row per view of a collective call:
``view`` is ``host`` for the call on a host thread, ``device`` for the kernel that carried it
out; sum durations over one view; the match columns are filled on the view that matching
across ranks used; ``dim`` and ``group_ranks`` name the call's group), ``comm_by_group`` (group,
phase, op) and ``pipeline_stages`` (stage) where the run has them (the report's figures, ms per
step), and on GPU runs ``gpu`` (rank, step), ``launches`` (rank, step, phase, op),
``launches_by_phase`` (rank, step, phase) and ``launches_by_rank`` (rank, step): percentiles do
not add up, so each level of the launch statistics is a table of its own, and each counts every
kernel once.

The Chrome trace puts each rank in its own process (named ``rank N (host)``), its host threads
and device streams as threads (named as the trace names them, or by what they hold), and the
step windows with their breakdown on a track of their own; all ranks share the run's aligned
clock, so collectives line up across ranks in Perfetto. A flow arrow ("s" to "f") joins each
runtime call to the kernel, copy or memset it launched; device activities carry their
correlation id, device, stream and, for kernels, grid and block.
"""

from __future__ import annotations

import functools
import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from traceview.model import schema as S
from traceview.model.errors import BadInput, Notes, cannot_write
from traceview.model.results import RunReport
from traceview.store import rundir as R
from traceview.store.outputs import open_in_place
from traceview.views.chrome_tracks import (
    PHASES_TID,
    STEPS_TID,
    collective_flows,
    lane_of,
    path_track,
    phase_slices,
)

if TYPE_CHECKING:
    from traceview.model.columns import TableOnDemand


def tables(
    run: Path,
    analysis: dict[str, pa.Table],
    out: Path,
    fmt: str,
    notes: Notes,
    run_id: str | None = None,
) -> list[Path]:
    """The events of ``run`` and its ``analysis`` tables (steps, ops, collectives; gpu and
    launches on GPU runs) as single files under ``out``. A rank whose events cannot be read, or
    belong to another run than ``run_id`` (the analysis's run; default the manifest's), is left
    out, as ``report`` leaves it out, and said so in ``notes``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_write(out, exc) from None
    damaged: dict[int, BadInput] = {}
    manifest = R.read_manifest(run)
    run_id = run_id if run_id is not None else manifest.run_id
    # (the ranks its manifest lists: report leaves a rank it does not list out, and says so)
    listed = [r.rank for r in manifest.ranks] or None
    events = R.read_events(run, listed, damaged=damaged, run_id=run_id)
    _left_out(damaged, len(damaged) < len(R.event_ranks(run)), notes)
    unlisted = [r for r in R.event_ranks(run) if listed is not None and r not in listed]
    if unlisted:
        notes.warnings.append(
            f"rank(s) {', '.join(map(str, unlisted[:10]))} left out: events for rank(s) the "
            "run's manifest does not list"
        )
    written = []
    for name, table in (("events", events), *analysis.items()):
        table = _plain_strings(table)
        path = out / f"{name}.{fmt}"
        if fmt == "parquet":
            R.write_parquet(path, table)
        else:
            with R.atomic_path(path) as tmp:
                pcsv.write_csv(_plain(table), tmp)
        written.append(path)
    return written


def report_tables(report: RunReport) -> dict[str, pa.Table]:
    """The report's communication by group and its pipeline's stages as tables
    (schema.COMM_BY_GROUP_SCHEMA, schema.PIPELINE_STAGES_SCHEMA), each where the run has rows."""
    out = {}
    if report.comm_by_group:
        rows = [row.to_builtins() for row in report.comm_by_group]
        out["comm_by_group"] = pa.Table.from_pylist(rows, S.COMM_BY_GROUP_SCHEMA)
    pipeline = report.pipeline
    if pipeline is not None and pipeline.stages:
        rows = [
            {
                **stage.to_builtins(),
                S.SCHEDULE: pipeline.schedule,
                S.MICROBATCHES: pipeline.microbatches,
            }
            for stage in pipeline.stages
        ]
        out["pipeline_stages"] = pa.Table.from_pylist(rows, S.PIPELINE_STAGES_SCHEMA)
    return out


def _left_out(damaged: dict[int, BadInput], others: bool, notes: Notes | None) -> None:
    """Ranks whose events cannot be read: each a warning, or the error where none is left."""
    if damaged and not others:  # one line: the first rank's reason, and how many more
        rank, exc = min(damaged.items())
        more = f" (and {len(damaged) - 1} more rank(s))" if len(damaged) > 1 else ""
        raise BadInput(f"no rank left: rank {rank}'s events left out: {exc}{more}")
    for rank, exc in sorted(damaged.items()):
        if notes is not None:
            notes.warn(f"rank {rank}'s events left out: {exc}")


def _plain_strings(table: pa.Table) -> pa.Table:
    """Large strings (what polars hands back) as strings, so that every exported table types
    its text columns alike."""
    if not any(pa.types.is_large_string(f.type) for f in table.schema):
        return table
    schema = pa.schema(
        [f.with_type(pa.string()) if pa.types.is_large_string(f.type) else f for f in table.schema],
        metadata=table.schema.metadata,
    )
    return table.cast(schema)


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded and lists written as JSON arrays (``[0, 2]``): CSV writers
    want plain values."""
    columns = [
        c.cast(c.type.value_type)
        if pa.types.is_dictionary(c.type)
        else _json_list(c)
        if pa.types.is_list(c.type)
        else c
        for c in table.columns
    ]
    return pa.Table.from_arrays(columns, names=table.column_names)


def _json_list(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A list column of numbers as JSON array text (null stays null)."""
    inner = pc.binary_join(column.cast(pa.list_(pa.string())), ", ")
    return pc.binary_join_element_wise("[", inner, "]", "")


@contextmanager
def _target(out: Path, in_place: bool) -> Iterator[Path]:
    """Where the bytes go: a temporary sibling renamed onto ``out``, or ``out`` itself where it
    is a special file (replacing ``/dev/null`` or a FIFO would be wrong)."""
    if not in_place:
        with R.atomic_path(out) as tmp:
            yield tmp
        return
    try:
        yield out
    except OSError as exc:
        raise cannot_write(out, exc) from None


def write_bytes(out: Path, data: bytes, in_place: bool = False) -> None:
    """``data`` into ``out``: atomically, or written in place into a special file."""
    with _target(out, in_place) as tmp:
        try:
            with open_in_place(tmp) if in_place else tmp.open("wb") as f:
                f.write(data)
        except OSError as exc:
            raise cannot_write(out, exc) from None


@contextmanager
def _open(path: Path, tmp: Path, in_place: bool = False) -> Iterator[IO[bytes]]:
    with open_in_place(tmp) if in_place else tmp.open("wb") as raw:
        if path.suffix != ".gz":
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as packed:
            yield cast(IO[bytes], packed)


def chrome(
    run: Path,
    steps_table: pa.Table,
    out: Path,
    clock_offsets: dict[int, int] | None = None,
    in_place: bool = False,
    notes: Notes | None = None,
    run_id: str | None = None,
    *,
    matched: pa.Table | None = None,
    segments: TableOnDemand | None = None,
    path: pa.Table | None = None,
) -> int:
    """Write the merged multi-rank trace; returns the number of trace events written.
    What the analysis found goes with it where given: ``matched`` (the collectives with what
    matching found: an arrow to each call's last arrival), ``segments`` (each rank's phases as a
    track) and ``path`` (the critical path, a process of its own).
    ``clock_offsets``: ns to subtract from each rank's times to put it on the run's clock (the
    offsets estimated from collectives, for traces from several hosts); ``in_place``: ``out``
    is a special file (a device, a FIFO), written to rather than replaced. A rank whose events
    cannot be read, or belongs to another run than ``run_id`` (the steps' run; default the
    manifest's), is left out, as ``report`` leaves it out, and said so in ``notes``."""
    manifest = R.read_manifest(run)
    run_id = run_id if run_id is not None else manifest.run_id
    steps = pl.from_arrow(steps_table)
    assert isinstance(steps, pl.DataFrame)
    ranks = [r.rank for r in manifest.ranks]
    info = {r.rank: r for r in manifest.ranks}
    offsets = clock_offsets or {}
    origin: int | None = None
    damaged: dict[int, BadInput] = {}
    for rank in ranks:
        ts = R.read_events(run, [rank], damaged, run_id).column(S.TS_NS)
        if len(ts):
            low = pc.min(ts).as_py() - offsets.get(rank, 0)
            origin = low if origin is None else min(origin, low)
    _left_out(damaged, len(damaged) < len(ranks), notes)
    ranks = [r for r in ranks if r not in damaged]
    origin = origin or 0
    count = 0
    flow_ids = iter(range(1, 1 << 62))  # flow ids are global to the trace: numbered here
    with _target(out, in_place) as tmp, _open(out, tmp, in_place) as f:
        f.write(b'{"displayTimeUnit":"ms","otherData":{"generator":"traceview"},"traceEvents":[\n')
        first = True

        def emit(records: list[dict[str, Any]]) -> None:
            nonlocal first, count
            for record in records:
                f.write((b"" if first else b",\n") + msgspec.json.encode(record))
                first = False
            count += len(records)

        for rank in ranks:
            rank_info = info[rank]
            host = rank_info.host or ""
            shift = origin + offsets.get(rank, 0)
            emit(
                [
                    {
                        "ph": "M",
                        "name": "process_name",
                        "pid": rank,
                        "tid": 0,
                        "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")},
                    },
                    {
                        "ph": "M",
                        "name": "process_sort_index",
                        "pid": rank,
                        "tid": 0,
                        "args": {"sort_index": rank},
                    },
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": rank,
                        "tid": STEPS_TID,
                        "args": {"name": "traceview steps"},
                    },
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": rank,
                        "tid": PHASES_TID,
                        "args": {"name": "traceview phases"},
                    },
                ]
            )
            df = pl.from_arrow(R.read_events(run, [rank], run_id=run_id))
            assert isinstance(df, pl.DataFrame)
            df = df.filter(~pl.col(S.KIND).cast(pl.String).is_in([S.KIND_TRACE]))
            gpu = pl.col(S.DEVICE).cast(pl.String) == S.DEVICE_GPU
            df = df.with_columns(
                lane_of(pl.col(S.DEVICE), pl.col(S.PID), pl.col(S.TID)).alias("lane"),
                ((pl.col(S.TS_NS) - shift) / 1000).alias("ts_us"),
                (pl.col(S.DUR_NS) / 1000).alias("dur_us"),
            )
            lanes = df.group_by("lane").agg(
                pl.col(S.PID).first(),
                pl.col(S.TID).first(),
                gpu.first().alias("gpu"),
                (pl.col(S.KIND).cast(pl.String) == S.KIND_INSTANT).all().alias("marks"),
                pl.col(S.NAME).cast(pl.String).first().alias("first"),
            )
            threads = rank_info.threads
            for lane in lanes.iter_rows(named=True):
                label = _lane_name(lane, threads)
                emit(
                    [
                        {
                            "ph": "M",
                            "name": "thread_name",
                            "pid": rank,
                            "tid": lane["lane"],
                            "args": {"name": label},
                        }
                    ]
                )
            for batch in df.iter_slices(50_000):
                records = []
                for row in batch.select(
                    S.NAME,
                    S.KIND,
                    S.PHASE,
                    S.OP,
                    S.STEP,
                    S.BYTES,
                    S.COLLECTIVE,
                    S.CORRELATION,
                    S.PID,
                    S.TID,
                    S.GRID,
                    S.BLOCK,
                    "lane",
                    "ts_us",
                    "dur_us",
                ).iter_rows():
                    name, kind, phase, op, step, nbytes, collective, corr, pid, tid = row[:10]
                    grid, block, lane, ts, dur = row[10:]
                    args: dict[str, Any] = {"phase": phase, "op": op}
                    if step is not None:
                        args["step"] = step
                    if collective is not None:
                        args["collective"] = collective
                    if nbytes is not None:
                        args["bytes"] = nbytes
                    if corr is not None:
                        args["correlation"] = corr
                    if kind in S.DEVICE_ACTIVITY_KINDS:  # where it ran, as the trace says
                        args.update(device=pid, stream=tid)
                    if grid is not None:  # a kernel's launch configuration
                        args["grid"] = _dims(grid)
                    if block is not None:
                        args["block"] = _dims(block)
                    record: dict[str, Any] = {
                        "name": name,
                        "cat": kind,
                        "pid": rank,
                        "tid": lane,
                        "ts": round(ts, 3),
                        "args": args,
                    }
                    if kind == S.KIND_INSTANT:
                        record.update(ph="i", s="t")
                    else:
                        record.update(ph="X", dur=round(dur, 3))
                    records.append(record)
                emit(records)
            emit(_flows(df, rank, flow_ids))
            for window in steps.filter(pl.col(S.RANK) == rank).iter_rows(named=True):
                args = {p: round(window[S.phase_ns(p)] / 1e6, 3) for p in S.BREAKDOWN_PHASES}
                args["comm_hidden_fraction"] = round(window[S.COMM_HIDDEN_FRACTION], 3)
                emit(
                    [
                        {
                            "ph": "X",
                            "name": f"step {window[S.STEP]}"
                            if window[S.STEP] is not None
                            else "trace",
                            "cat": "traceview",
                            "pid": rank,
                            "tid": STEPS_TID,
                            "ts": round((window[S.START_NS] - shift) / 1000, 3),
                            "dur": round(window[S.WALL_NS] / 1000, 3),
                            "args": {"breakdown_ms": args},
                        }
                    ]
                )
        shifts = {rank: origin + offsets.get(rank, 0) for rank in ranks}
        kept = set(ranks)
        if matched is not None:
            emit(collective_flows(matched, shifts, kept, flow_ids))
        if segments is not None:
            for piece in phase_slices(segments.in_pieces(), shifts, kept):
                emit(piece)
        if path is not None and path.num_rows:
            emit(path_track(path, origin))
        f.write(b"\n]}\n")
    return count


def _lane_name(lane: dict[str, Any], threads: dict[str, str]) -> str:
    """A track's name: the device stream, the thread's own name from the trace, or (a track
    the trace names nowhere) what it holds and where."""
    pid, tid = lane[S.PID], lane[S.TID]
    if lane["gpu"]:
        return f"GPU {pid} stream {tid}"
    named = threads.get(f"{pid}/{tid}")
    if named:
        return named
    if lane["marks"]:  # Kineto's "Iteration Start" and "Record Window End" marks, apart
        return f"marks: {lane['first'][:60]}"
    return f"thread {tid} of process {pid} (unnamed in the trace)"


def _flows(df: pl.DataFrame, rank: int, ids: Iterator[int]) -> list[dict[str, Any]]:
    """A flow arrow (Trace Event Format "s" then "f", one id) from each runtime call to the
    kernel, copy or memset it launched: the start inside the call's slice, the end bound to
    the slice that begins at the device activity's start ("bp": "e")."""
    device = df.filter(
        pl.col(S.KIND).cast(pl.String).is_in(list(S.DEVICE_ACTIVITY_KINDS))
        & pl.col(S.PARENT).is_not_null()
    ).select(S.PARENT, pl.col("lane").alias("to_lane"), pl.col("ts_us").alias("to_ts"))
    calls = df.filter(pl.col(S.KIND).cast(pl.String) == S.KIND_RUNTIME).select(
        pl.col(S.EVENT_ID).alias(S.PARENT), "lane", "ts_us", "dur_us"
    )
    pairs = device.join(calls, on=S.PARENT, how="inner").sort("ts_us")
    out: list[dict[str, Any]] = []
    for lane, ts, dur, to_lane, to_ts in pairs.select(
        "lane", "ts_us", "dur_us", "to_lane", "to_ts"
    ).iter_rows():
        flow = next(ids)
        # the start a little inside the call, so that it binds to the call, not a neighbour
        start = round(ts + min(dur / 2, 0.001), 3)
        base = {"name": "launch", "cat": "launch", "id": flow, "pid": rank}
        out.append({**base, "ph": "s", "tid": lane, "ts": start})
        out.append({**base, "ph": "f", "bp": "e", "tid": to_lane, "ts": round(to_ts, 3)})
    return out


@functools.lru_cache(maxsize=4096)
def _dims(text: str) -> Any:
    """A launch configuration as the trace wrote it ("[80, 1, 1]"): its list of numbers where it
    is one, else the text (untrusted: never more than the parser kept)."""
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    return text
