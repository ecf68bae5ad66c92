"""Reads the step record `traceview collect` keeps on every rank (the format:
collectors/rankside_record.py): each step of the run, the rank's last collective calls, where it
was when it stopped, its stacks and Flight Recorder dump.

Every byte is untrusted: a file cut short keeps its whole rows, a header that does not read sets
the rank's file aside with a warning, rows that do not fit (a step number going backwards, a
call ending before it starts) are left out and counted, names are kept as text and escaped
where shown. Nothing here raises on bad content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.collectors import rankside_record as R
from traceview.collectors.record_rows import CALL_DTYPE, STEP_DTYPE, op_name, written_rows
from traceview.model import schema as S
from traceview.parsers.flight import MAX_ENTRIES, flight_rows, in_order

#: the most of a JSON file of the record read (stacks, groups, end, Flight Recorder)
JSON_LIMIT = 64 << 20
_RANK_DIR = re.compile(r"rank-(\d{1,7})$")


@dataclass
class RankRecord:
    """One rank's record as read: its steps and calls (numpy rows, in order), where it was at
    the end (``head``: rankside_record's header fields), how it ended (``end``), its stacks and
    Flight Recorder entries."""

    rank: int
    steps: np.ndarray = field(default_factory=lambda: np.empty(0, STEP_DTYPE))
    calls: np.ndarray = field(default_factory=lambda: np.empty(0, CALL_DTYPE))
    calls_lost: int = 0  # calls the ring no longer holds
    pid: int | None = None
    step_now: int | None = None
    phase_now: str | None = None
    phase_since_ns: int | None = None
    progress_ns: int | None = None
    groups: dict[int, str] = field(default_factory=dict)
    end: dict[str, Any] | None = None
    stacks: dict[str, Any] | None = None
    flight: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunRecord:
    """Every rank's record as tables (schema.RECORD_STEPS_SCHEMA, RECORD_CALLS_SCHEMA,
    RECORD_RANKS_SCHEMA) and what was set aside reading them."""

    steps: pa.Table
    calls: pa.Table
    ranks: pa.Table
    warnings: list[str]


def read_run_record(raw: Path) -> RunRecord | None:
    """Every rank's record under ``raw`` (RUN/raw: its rank-NNNNN folders); None where no rank
    kept one (a run collected before the record, or of another framework)."""
    warnings: list[str] = []
    try:
        folders = sorted(p for p in raw.iterdir() if _RANK_DIR.match(p.name) and p.is_dir())
    except OSError:
        return None
    read = []
    for folder in folders:
        if not (folder / "steps.bin").is_file() and not (folder / "calls.bin").is_file():
            continue
        rank = int(_RANK_DIR.match(folder.name).group(1))  # type: ignore[union-attr]
        read.append(_read_rank(folder, rank, warnings))
    if not read:
        return None
    return RunRecord(_steps_table(read), _calls_table(read), _ranks_table(read), warnings)


def _steps_table(read: list[RankRecord]) -> pa.Table:
    rows = [r.steps for r in read]
    ranks = np.concatenate([np.full(len(r.steps), r.rank, np.int32) for r in read])
    steps = np.concatenate(rows) if rows else np.empty(0, STEP_DTYPE)
    return pa.table(
        {
            S.RANK: ranks, S.STEP: steps["step"].astype(np.int64),
            S.CALLS: steps["calls"].astype(np.int64), S.START_NS: steps["start_ns"],
            S.END_NS: steps["end_ns"], S.IO_NS: steps["io_ns"],
            S.COMM_NS: np.clip(steps["comm_ns"], 0, steps["end_ns"] - steps["start_ns"]),
        },
        schema=S.RECORD_STEPS_SCHEMA,
    )  # fmt: skip


def _calls_table(read: list[RankRecord]) -> pa.Table:
    parts = []
    for r in read:
        c = r.calls
        if len(c):
            ends = c["end_ns"]
            parts.append(
                pa.table(
                    {
                        S.RANK: np.full(len(c), r.rank, np.int32),
                        S.SOURCE: ["record"] * len(c),
                        S.GROUP: [r.groups.get(int(g)) for g in c["group"]],
                        S.SEQ: c["seq"].astype(np.int64),
                        S.OP: [op_name(int(o)) for o in c["op"]],
                        S.BYTES: c["bytes"],
                        S.STEP: c["step"].astype(np.int64),
                        S.START_NS: c["start_ns"],
                        S.END_NS: pa.array(ends, mask=ends == 0),
                        S.FLAGS: c["flags"].astype(np.int32),
                        S.SITE: pa.nulls(len(c), pa.string()),
                    },
                    schema=S.RECORD_CALLS_SCHEMA,
                )
            )
        if r.flight:
            parts.append(flight_rows(r.rank, r.flight))
    return pa.concat_tables(parts) if parts else S.RECORD_CALLS_SCHEMA.empty_table()


def _ranks_table(read: list[RankRecord]) -> pa.Table:
    def frames(r: RankRecord) -> str | None:
        if r.stacks is None:
            return None
        main = [t for t in r.stacks["threads"] if isinstance(t, dict) and t.get("main")]
        got = main[0].get("frames") if main else None
        return json.dumps(got) if isinstance(got, list) else None

    return pa.table(
        {
            S.RANK: [r.rank for r in read],
            S.PID: [r.pid for r in read],
            S.STEP_NOW: [r.step_now for r in read],
            S.PHASE_NOW: [r.phase_now for r in read],
            S.PHASE_SINCE_NS: [r.phase_since_ns for r in read],
            S.PROGRESS_NS: [r.progress_ns for r in read],
            S.CALLS_LOST: [r.calls_lost for r in read],
            S.END_STATE: [r.end["state"] if r.end else None for r in read],
            S.END_DETAIL: [r.end["detail"] if r.end else None for r in read],
            S.END_NS: [r.end["t_ns"] if r.end else None for r in read],
            S.STACK_REASON: [
                str(r.stacks.get("reason")) if r.stacks is not None else None for r in read
            ],
            S.STACK_NS: [
                t if r.stacks is not None and _is_ns(t := r.stacks.get("t_ns")) else None
                for r in read
            ],
            S.STACK: [frames(r) for r in read],
            S.GROUP_NAMES: [json.dumps(r.groups) for r in read],
        },
        schema=S.RECORD_RANKS_SCHEMA,
    )


def _is_ns(value: object) -> bool:
    """A time in ns as the record's int64 columns hold one (a wider number is no time)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _read_rank(folder: Path, rank: int, warnings: list[str]) -> RankRecord:
    record = RankRecord(rank)
    steps = _bytes(folder / "steps.bin")
    if steps is not None:
        if steps[: len(R.MAGIC_STEPS)] != R.MAGIC_STEPS:
            warnings.append(f"rank {rank}: its step record's steps.bin does not read; set aside")
        else:
            rows = written_rows(steps[len(R.MAGIC_STEPS) :])
            ok = (rows["end_ns"] >= rows["start_ns"]) & (rows["start_ns"] > 0)
            if len(rows) > 1:  # (steps in order, each after the one before)
                ok[1:] &= np.diff(rows["step"].astype(np.int64)) > 0
            if not ok.all():
                warnings.append(
                    f"rank {rank}: {int((~ok).sum())} step record rows out of order or "
                    "inconsistent; left out"
                )
            record.steps = rows[ok].copy()
            if (
                len(steps) == JSON_LIMIT
                and len(rows) == (len(steps) - len(R.MAGIC_STEPS)) // STEP_DTYPE.itemsize
            ):
                warnings.append(
                    f"rank {rank}: its step record is longer than {JSON_LIMIT >> 20} MB: its "
                    f"first {len(rows):,} steps read, the rest left out"
                )
    _read_calls(folder, record, warnings)
    groups = _json(folder / "groups.json")
    if isinstance(groups, dict):
        record.groups = {v: str(k) for k, v in groups.items() if isinstance(v, int)}
    end = _json(folder / "end.json")
    if isinstance(end, dict) and isinstance(end.get("state"), str):
        record.end = {
            "state": end["state"],
            "detail": end.get("detail") if isinstance(end.get("detail"), str) else None,
            "t_ns": end["t_ns"] if _is_ns(end.get("t_ns")) else None,
        }
        if end.get("phase") in R.PHASES:  # (the phase it raised in: where it stood as it died)
            record.phase_now = end["phase"]
    stacks = _json(folder / "stacks.json")
    if isinstance(stacks, dict) and isinstance(stacks.get("threads"), list):
        record.stacks = stacks
    flight = _json(folder / "fr.json")
    if isinstance(flight, dict) and isinstance(flight.get("entries"), list):
        entries = flight["entries"]
        if len(entries) > MAX_ENTRIES:
            warnings.append(
                f"rank {rank}: {len(entries) - MAX_ENTRIES:,} older Flight Recorder entries set "
                f"aside (its newest {MAX_ENTRIES:,} read)"
            )
        record.flight, backwards = in_order(
            [e for e in entries[-MAX_ENTRIES:] if isinstance(e, dict)]
        )
        if backwards:
            warnings.append(
                f"rank {rank}: {backwards} Flight Recorder entries whose sequence number goes "
                "back (calls of another run?); set aside"
            )
    return record


def _read_calls(folder: Path, record: RankRecord, warnings: list[str]) -> None:
    """The ring's rows, oldest first (only the rows written are read: 1,024 ranks' rings are
    not read whole)."""
    try:
        with R.open_regular(folder / "calls.bin") as f:
            head = f.read(R.HEAD_SIZE)
            magic, capacity, pid, written, step, phase, since, progress = R.CALLS_HEAD.unpack_from(
                head, 0
            )
            ok_head = magic == R.MAGIC_CALLS and 0 < capacity <= 1 << 24 and written >= 0
            held = min(int(written), capacity) if ok_head else 0
            data = f.read(held * CALL_DTYPE.itemsize)
    except FileNotFoundError:
        return
    except Exception:
        ok_head = False
    if not ok_head:
        warnings.append(f"rank {record.rank}: its step record's calls.bin does not read; set aside")
        return
    record.pid, record.step_now = int(pid), int(step)
    record.phase_now = R.PHASES[phase] if phase < len(R.PHASES) else None
    record.phase_since_ns, record.progress_ns = int(since) or None, int(progress) or None
    ring = np.frombuffer(data[: len(data) // CALL_DTYPE.itemsize * CALL_DTYPE.itemsize], CALL_DTYPE)
    first = int(written) % capacity if written > capacity and len(ring) == capacity else 0
    rows = np.concatenate([ring[first:], ring[:first]]) if first else ring.copy()
    record.calls_lost = max(int(written) - len(rows), 0)
    ok = (rows["start_ns"] > 0) & ((rows["end_ns"] == 0) | (rows["end_ns"] >= rows["start_ns"]))
    if not ok.all():
        warnings.append(
            f"rank {record.rank}: {int((~ok).sum())} call rows of its step record inconsistent; "
            "left out"
        )
    record.calls = rows[ok]
    if len(record.calls):  # (the header's progress is kept at steps; calls only in their rows)
        last = int(max(record.calls["start_ns"].max(), record.calls["end_ns"].max()))
        record.progress_ns = max(record.progress_ns or 0, last) or None


def _bytes(path: Path) -> bytes | None:
    try:
        with R.open_regular(path) as f:
            return f.read(JSON_LIMIT)
    except OSError:
        return None


def _json(path: Path) -> Any:
    data = _bytes(path)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None
