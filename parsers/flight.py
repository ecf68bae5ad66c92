"""PyTorch Flight Recorder dumps: each rank's last collectives, as the process group wrote them
(``torch._C._distributed_c10d._dump_fr_trace`` / ``_dump_fr_trace_json``; NCCL's on a watchdog
timeout, to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank; gloo's when asked).

A dump is a pickle or JSON of one object: ``version``, ``pg_config``, ``pg_status`` and
``entries``, one per collective (``collective_seq_id``, ``process_group`` [name, desc],
``profiling_name`` "backend:op", ``input_sizes``/``input_dtypes``, ``time_created_ns``,
``state`` scheduled | started | completed, ``retired``, ``frames``...). Dumps are recognised by
content, whatever their names; the rank is the dump's own ``rank`` where it has one, else the
number that ends its file name (PyTorch's own naming), else a ``rank`` in the name.

Every byte is untrusted. Pickles are read by an unpickler that builds only plain containers
and scalars: a pickle that names any class or function (what a pickle runs code with) is
refused, never executed.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from traceview.model import schema as S
from traceview.parsers import number_ranges, rank_from_filename

#: the most of a dump read (NCCL's default ring is 2,000 entries: a few MB; a pickle's objects
#: take about ten times its bytes in memory)
DUMP_LIMIT = 32 << 20
#: the most entries of a dump read, its newest (25 times NCCL's default ring: a pickle of a few
#: MB can hold millions of references to one entry)
MAX_ENTRIES = 50_000
#: bytes of an element, by the Flight Recorder's dtype names
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
                "Short": 2, "Char": 1, "Byte": 1, "Bool": 1,
                "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8,
                "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}  # fmt: skip
_KEYS = (b"pg_config", b"pg_status", b"entries", b"nccl_comm_state", b"comm_lib_version")
_TRAILING_NUMBER = re.compile(r"(?<!\d)(\d{1,7})$")


class NotADump(ValueError):
    """A file that looked like a dump and is not one that can be read (the reason)."""


@dataclass
class FlightDump:
    path: Path
    form: str  # pickle | json
    rank: int | None
    version: str | None
    entries: list[dict[str, Any]] = field(default_factory=list)
    pg_status: dict[str, Any] = field(default_factory=dict)
    group_ranks: set[int] = field(default_factory=set)  # every rank its process groups name
    # a process group's name -> how its calls name it: the name, and its ranks where they are
    # not all the dump's (two ranks' subgroups of one name are different groups)
    group_labels: dict[str, str] = field(default_factory=dict)
    # what the dump's ``rank`` says where that is no rank (a number out of range, a string...)
    claimed_rank: str | None = None
    older: int = 0  # entries set aside past MAX_ENTRIES (the oldest)

    @property
    def record_ids(self) -> tuple[Any, ...]:
        return tuple(e.get("record_id") for e in self.entries)


def dump_form(head: bytes) -> str | None:
    """``pickle`` or ``json`` where a file's first bytes look like a Flight Recorder dump."""
    if head[:1] == b"\x80" and sum(key in head for key in _KEYS) >= 2:
        return "pickle"
    if head.lstrip()[:1] == b"{" and sum(b'"' + key + b'"' in head for key in _KEYS) >= 2:
        return "json"
    return None


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, numbers, booleans and None; any class, function
    or persistent id (the ways a pickle runs code) ends the read."""

    def find_class(self, module: str, name: str) -> Any:
        raise NotADump(f"a pickle that names {module[:40]}.{name[:40]}: refused, not executed")

    def persistent_load(self, pid: Any) -> Any:
        raise NotADump("a pickle with persistent ids: refused, not executed")


def read_dump(path: Path, form: str) -> FlightDump:
    """One dump; ``NotADump`` says why a file cannot be read as one."""
    try:
        with open(path, "rb") as f:
            data = f.read(DUMP_LIMIT + 1)
    except OSError as exc:
        raise NotADump(f"cannot read ({exc.strerror or exc})") from None
    if len(data) > DUMP_LIMIT:
        raise NotADump(
            f"over {DUMP_LIMIT >> 20} MB: not read as a Flight Recorder dump (NCCL's ring of "
            "2,000 entries is a few MB)"
        )
    try:
        read = (
            _PlainUnpickler(io.BytesIO(data)).load if form == "pickle" else lambda: json.loads(data)
        )
        content = read()
    except NotADump:
        raise
    except RecursionError:
        raise NotADump("nested too deep") from None
    except Exception as exc:  # a truncated or damaged pickle raises many kinds
        raise NotADump(f"does not read as a {form} dump ({type(exc).__name__})") from None
    if not isinstance(content, dict) or not isinstance(content.get("entries"), list):
        raise NotADump(f"a {form} file without a Flight Recorder's entries")
    rank = content.get("rank")
    claimed = None if rank is None or _is_rank(rank) else repr(rank)[:40]
    status = content.get("pg_status")
    version = content.get("version")
    return FlightDump(
        path=path,
        form=form,
        rank=rank if _is_rank(rank) else None,
        version=str(version)[:40] if isinstance(version, str | int | float) else None,
        entries=[e for e in content["entries"][-MAX_ENTRIES:] if isinstance(e, dict)],
        pg_status=status if isinstance(status, dict) else {},
        group_ranks=_group_ranks(content.get("pg_config")),
        group_labels=_group_labels(content.get("pg_config")),
        claimed_rank=claimed,
        older=max(len(content["entries"]) - MAX_ENTRIES, 0),
    )


#: the most ranks a dump's process groups are believed to name (a larger claim is ignored)
MAX_RANKS = 1 << 18


def _members(config: Any) -> dict[str, set[int]]:
    """Each process group's ranks, as a dump's ``pg_config`` names them ({group: {"ranks":
    "[0, 1]" or [0, 1]}}; a group whose ranks do not read is left out)."""
    members: dict[str, set[int]] = {}
    if not isinstance(config, dict):
        return members
    for name, group in list(config.items())[:10_000]:
        listed = group.get("ranks") if isinstance(group, dict) else None
        if isinstance(listed, str) and len(listed) < 8 << 20:
            try:
                listed = json.loads(listed)
            except ValueError:
                continue
        if isinstance(listed, list):
            members[str(name)[:200]] = {r for r in listed if _is_int(r) and r < MAX_RANKS}
    return members


def _group_ranks(config: Any) -> set[int]:
    """Every rank a dump's ``pg_config`` names."""
    return set().union(*_members(config).values())


def _group_labels(config: Any) -> dict[str, str]:
    members = _members(config)
    everyone = set().union(*members.values())
    return {
        name: f"{name} (ranks {number_ranges(sorted(ranks))})"
        for name, ranks in members.items()
        if ranks and ranks != everyone
    }


def rank_of_dump(dump: FlightDump) -> int | None:
    """The dump's own rank, else the number ending its file name (``nccl_trace_rank_3``,
    ``fr_7.json``), else a rank its name states."""
    if dump.rank is not None:
        return dump.rank
    stem = dump.path.name
    for suffix in (".json", ".pkl", ".pickle"):
        stem = stem.removesuffix(suffix)
    match = _TRAILING_NUMBER.search(stem)
    rank = int(match.group(1)) if match else rank_from_filename(dump.path)
    return rank if _is_rank(rank) else None


def flight_rows(
    rank: int, entries: list[dict[str, Any]], group_labels: dict[str, str] | None = None
) -> pa.Table:
    """A rank's Flight Recorder entries as calls (schema.RECORD_CALLS_SCHEMA, source
    "flight"): ended where the recorder says so (NCCL's ``completed``, or ``retired``: when
    is not said, end = its discovery or its start), else still running (end null). The entries
    of one coalesced call (each op, then the ``coalesced`` one, all of one sequence number) are
    one call: its bytes summed, its op the coalesced entry's. Sequence numbers and times may be
    digit strings (as PyTorch's own analyser's test data writes them)."""
    labels = group_labels or {}
    rows: dict[str, list[Any]] = {name: [] for name in S.RECORD_CALLS_SCHEMA.names}
    last: dict[str | None, tuple[int, int]] = {}  # group -> its last call's (seq, row)
    for e in entries:
        seq, created = _as_int(e.get("collective_seq_id")), _as_int(e.get("time_created_ns"))
        name = e.get("profiling_name")
        if seq is None or created is None or not isinstance(name, str):
            continue
        pg = e.get("process_group")
        group = str(pg[0])[:200] if isinstance(pg, list | tuple) and pg else None
        group = labels.get(group, group) if group is not None else None
        completed = _as_int(e.get("time_discovered_completed_ns"))
        ended = e.get("state") == "completed" or e.get("retired") is True
        end: int | None = None
        if ended:
            end = completed if completed is not None and completed >= created else created
        op, nbytes = name.rpartition(":")[2][:80] or "other", _bytes(e)
        if e.get("is_p2p"):
            seq = 0
        elif seq and last.get(group, (0, 0))[0] == seq:  # (entries of one call follow each other)
            _coalesce(rows, last[group][1], op, nbytes, created, end)
            continue
        if seq:
            last[group] = (seq, len(rows[S.RANK]))
        rows[S.RANK].append(rank)
        rows[S.SOURCE].append("flight")
        rows[S.GROUP].append(group)
        rows[S.SEQ].append(seq)
        rows[S.OP].append(op)
        rows[S.BYTES].append(nbytes)
        rows[S.STEP].append(None)
        rows[S.START_NS].append(created)
        rows[S.END_NS].append(end)
        rows[S.FLAGS].append(0)
        rows[S.SITE].append(_site(e.get("frames")))
    return pa.table(rows, schema=S.RECORD_CALLS_SCHEMA)


def in_order(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """A rank's entries without those whose sequence number goes back within their process
    group (a ring holding two runs' calls?), and how many were set aside."""
    kept, dropped = [], 0
    highest: dict[str, int] = {}
    for e in entries:
        seq, pg = _as_int(e.get("collective_seq_id")), e.get("process_group")
        group = str(pg[0])[:200] if isinstance(pg, list | tuple) and pg else ""
        if seq and not e.get("is_p2p"):
            if seq < highest.get(group, 0):
                dropped += 1
                continue
            highest[group] = seq
        kept.append(e)
    return kept, dropped


def _coalesce(
    rows: dict[str, list[Any]], i: int, op: str, nbytes: int | None, start: int, end: int | None
) -> None:
    """Another entry of the call in row ``i`` (one sequence number: a coalesced call)."""
    if "coalesced" in op.lower():
        rows[S.OP][i] = op
    else:
        held = rows[S.BYTES][i]
        rows[S.BYTES][i] = None if held is None or nbytes is None else held + nbytes
    rows[S.START_NS][i] = min(rows[S.START_NS][i], start)
    held_end = rows[S.END_NS][i]
    rows[S.END_NS][i] = None if held_end is None or end is None else max(held_end, end)


def _as_int(value: Any) -> int | None:
    """An entry's number, or its digits as a string; None where it is neither."""
    if isinstance(value, str) and value.isdigit() and len(value) < 19:
        value = int(value)
    return value if _is_int(value) else None


#: frames of PyTorch's own code, passed over to find where the job made a call
_LIBRARY = re.compile(r"[/\\](torch|site-packages|dist-packages)[/\\]")


def _site(frames: Any) -> str | None:
    """Where the job made a call: the innermost frame outside PyTorch's own code, as
    "file:line in function" (None where the entry has no frames)."""
    if not isinstance(frames, list):
        return None
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename, line, name = frame.get("filename"), frame.get("line"), frame.get("name")
        if not isinstance(filename, str) or _LIBRARY.search(filename):
            continue
        where = f"{Path(filename[-300:]).name}:{line if _is_int(line) else '?'}"
        return f"{where} in {str(name)[:80]}" if isinstance(name, str) else where
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _is_rank(value: Any) -> bool:
    return _is_int(value) and value < MAX_RANKS


def _bytes(entry: dict[str, Any]) -> int | None:
    try:
        total = 0
        dtypes = entry["input_dtypes"]
        if isinstance(dtypes, str):  # (one for every input)
            dtypes = [dtypes] * len(entry["input_sizes"])
        for shape, dtype in zip(entry["input_sizes"], dtypes, strict=False):
            n = 1
            for d in shape:
                n *= int(d)
            total += n * _DTYPE_BYTES.get(str(dtype), 4)
        return total if 0 <= total < 1 << 62 else None
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


@dataclass
class DumpRecord:
    """The dumps of a folder as step-record tables (schema.RECORD_*: no steps; each rank's
    calls; each rank "dumped" where it stood), the dumps read, and what was set aside."""

    steps: pa.Table
    calls: pa.Table
    ranks: pa.Table
    warnings: list[str]
    dumps: dict[int, FlightDump]


#: the first bytes of a file looked at to tell a dump
HEAD_BYTES = 4096


def find_dumps(files: list[Path]) -> DumpRecord | None:
    """The Flight Recorder dumps among ``files`` (None: none is one). A rank's pickle and JSON
    of one dump are one; two different dumps of a rank: the later kept, with a warning."""
    warnings: list[str] = []
    by_rank: dict[int, FlightDump] = {}
    for path in files:
        try:
            with open(path, "rb") as f:
                head = f.read(HEAD_BYTES)
        except OSError:
            continue
        form = dump_form(head)
        if form is None:
            continue
        try:
            dump = read_dump(path, form)
        except NotADump as exc:
            warnings.append(f"{path}: {exc}; set aside")
            continue
        rank = rank_of_dump(dump)
        if dump.claimed_rank is not None:
            warnings.append(
                f"{path}: its rank {dump.claimed_rank} is no rank number; "
                + (f"read as rank {rank}, by its file name" if rank is not None else "set aside")
            )
        if rank is None:
            if dump.claimed_rank is None:
                warnings.append(f"{path}: a Flight Recorder dump that names no rank; set aside")
            continue
        if dump.older:
            warnings.append(
                f"{path}: {dump.older:,} older entries set aside (its newest {MAX_ENTRIES:,} read)"
            )
        dump.entries, backwards = in_order(dump.entries)
        if backwards:
            warnings.append(
                f"{path}: {backwards} entr{'y' if backwards == 1 else 'ies'} whose sequence "
                "number goes back in its process group (calls of another run?); set aside"
            )
        held = by_rank.get(rank)
        if held is not None and held.record_ids != dump.record_ids:
            later = max((held, dump), key=_last_time)
            warnings.append(
                f"rank {rank}: two different Flight Recorder dumps ({held.path.name} and "
                f"{dump.path.name}); the later, {later.path.name}, is read"
            )
            dump = later
        by_rank[rank] = dump if held is None or dump is not held else held
    if not by_rank:
        return None if not warnings else _tables({}, warnings)
    return _tables(by_rank, warnings)


def _last_time(dump: FlightDump) -> int:
    times = [e.get("time_created_ns") for e in dump.entries]
    return max((t for t in times if isinstance(t, int) and _is_int(t)), default=0)


def _tables(dumps: dict[int, FlightDump], warnings: list[str]) -> DumpRecord:
    named = set().union(*(d.group_ranks for d in dumps.values()))
    missing = sorted(named - set(dumps))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        warnings.append(
            f"no Flight Recorder dump of rank(s) {shown}, which the dumps' process groups name "
            "(a rank that died, or hung where it could not dump?)"
        )
    ranks = sorted(dumps)
    parts = [flight_rows(rank, dumps[rank].entries, dumps[rank].group_labels) for rank in ranks]
    calls = pa.concat_tables(parts) if parts else S.RECORD_CALLS_SCHEMA.empty_table()
    progress = []
    for part in parts:
        times = [t for t in (*part.column(S.START_NS).to_pylist(),
                             *part.column(S.END_NS).to_pylist()) if t]  # fmt: skip
        progress.append(max(times) if times else None)
    ranks, progress = ranks + missing, progress + [None] * len(missing)
    states = ["dumped"] * len(dumps) + ["undumped"] * len(missing)
    n = len(ranks)
    table = pa.table(
        {
            S.RANK: ranks, S.PID: [None] * n, S.STEP_NOW: [None] * n, S.PHASE_NOW: [None] * n,
            S.PHASE_SINCE_NS: [None] * n, S.PROGRESS_NS: progress, S.CALLS_LOST: [0] * n,
            S.END_STATE: states, S.END_DETAIL: [None] * n, S.END_NS: [None] * n,
            S.STACK_REASON: [None] * n, S.STACK_NS: [None] * n, S.STACK: [None] * n,
            S.GROUP_NAMES: ["{}"] * n,
        },
        schema=S.RECORD_RANKS_SCHEMA,
    )  # fmt: skip
    return DumpRecord(S.RECORD_STEPS_SCHEMA.empty_table(), calls, table, warnings, dumps)
