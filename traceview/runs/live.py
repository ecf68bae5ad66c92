"""Reading a run that `collect` is writing, or wrote: each rank's step record as it grows, read
incrementally (the bytes appended since the last look), and what collect says of the job
(RUN/live.json, then the manifest). Nothing here writes into the run.

Every byte is untrusted (parsers/record.py's rules): rows cut short wait for the rest, a file
that shrinks or vanishes (a rank restarted, a folder replaced) is read again from its start,
a header that does not read leaves the rank's place unknown. ``LiveRun.look`` never raises on
what it reads.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from traceview.analysis.live import JobSaid, LiveInputs, RankNow, snapshot
from traceview.collectors import rankside_record as R
from traceview.collectors.record_rows import CALL_DTYPE, STEP_DTYPE, op_name, written_rows
from traceview.model.errors import BadInput
from traceview.model.escape import safe
from traceview.model.results.live import LiveSnapshot
from traceview.store import names as D

LIVE = D.LIVE  #: the most step rows kept over all ranks (each rank keeps its share, its newest)
ROW_BUDGET = 2_000_000
#: the job's steps a watch keeps (their step time: the median and p99 over them)
HISTORY_MAX = 1_000_000
#: a rank keeps at least this many of its newest rows
MIN_ROWS = 256
#: the most of a small JSON file read
JSON_LIMIT = 1 << 20
_RANK_DIR = re.compile(r"rank-(\d{1,7})$")


def is_collect_run(run: Path) -> bool:
    """Whether ``run`` is a folder `collect` made (its raw/ with a rank's record, or its
    live.json)."""
    try:
        if (run / LIVE).is_file():
            return True
        return any(p.is_file() for p in (run / D.RAW).glob("rank-*/steps.bin"))
    except OSError:
        return False


def check_run(run: Path) -> None:
    """BadInput, in one line, where ``run`` is not a run `collect` writes or wrote."""
    try:
        is_dir = run.is_dir()
    except OSError as exc:
        raise BadInput(f"{run}: cannot read ({exc.strerror or exc})") from None
    if not is_dir:
        raise BadInput(f"{run}: no such run directory")
    if not is_collect_run(run):
        raise BadInput(
            f"{run}: not a run traceview collect is writing or wrote (no step record, no "
            "live.json): run the job under `traceview collect -o RUN -- ...`"
        )


@dataclass
class _Rank:
    rank: int
    offset: int = 0  # bytes of steps.bin read
    size_seen: int = 0
    inode: int | None = None
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, STEP_DTYPE))
    end: dict[str, Any] | None = None
    warned: bool = False


class LiveRun:
    """The step records of ``run``'s ranks, read as they grow. ``look()`` reads what was
    added since the last look and returns the inputs of ``analysis.live.snapshot``."""

    def __init__(self, run: Path, row_budget: int = ROW_BUDGET):
        self.run = run
        self.row_budget = row_budget
        self.ranks: dict[int, _Rank] = {}
        self.warnings: list[str] = []
        # the job's step history: per step number every rank finished, its slowest rank's
        # duration (ms) and the rank with the most own work in it
        # (arrays grown at each look; the newest HISTORY_MAX steps kept)
        self.steps = np.empty(0, np.int64)
        self.step_ms = np.empty(0)
        self.step_rank = np.empty(0, np.int64)
        self.done_through = -1

    def snapshot(self, windows: bool = True) -> LiveSnapshot:
        """One look at the job (``analysis.live.snapshot``); ``windows``: its profile windows
        listed too (a status file per rank and window read)."""
        from traceview.runs.windows import list_windows

        inputs = self.look()
        if windows:
            inputs.windows = list_windows(
                self.run, job_ended=inputs.job.ended, ranks=len(inputs.ranks) or None
            )
        return snapshot(inputs)

    # --- reading ---------------------------------------------------------------------------

    def look(self, now_ns: int | None = None) -> LiveInputs:
        raw = self.run / D.RAW
        try:
            names = [e.name for e in os.scandir(raw) if e.is_dir(follow_symlinks=False)]
        except OSError:
            names = []
        found = {}
        for name in names:
            match = _RANK_DIR.match(name)
            if match:
                found[int(match[1])] = os.path.join(raw, name)  # (str: 1,024 ranks a look)
        keep = max(MIN_ROWS, self.row_budget // max(len(found), 1))
        now: list[RankNow] = []
        for rank in sorted(found):
            folder = found[rank]
            state = self.ranks.setdefault(rank, _Rank(rank))
            head = _calls_head(os.path.join(folder, "calls.bin"))
            has_steps = self._read_steps(folder, state, keep, head["step"] if head else None)
            if not has_steps and head is None:
                continue  # (a rank folder of no record: an older run's, or one just made)
            now.append(self._rank_now(folder, state, head))
        self._extend_history([r.rank for r in now])
        return LiveInputs(
            job=self._job(),
            ranks=now,
            steps=self.steps,
            step_ms=self.step_ms,
            step_rank=self.step_rank,
            rows={r.rank: self.ranks[r.rank].rows for r in now},
            now_ns=now_ns or time.time_ns(),
            warnings=list(self.warnings),
        )

    def _read_steps(self, folder: str, state: _Rank, keep: int, hint: int | None) -> bool:
        """The rows the rank wrote since the last look (``keep`` of its newest at most;
        ``hint``: the steps its calls.bin says it ended, where the first look starts reading);
        whether it has a steps.bin."""
        try:
            with R.open_regular(os.path.join(folder, "steps.bin"), buffering=0) as f:
                info = os.fstat(f.fileno())
                if state.inode is not None and (
                    info.st_ino != state.inode or info.st_size < state.size_seen
                ):  # replaced or cut back (a rank started again): read from its start
                    state.offset, state.rows = 0, np.empty(0, STEP_DTYPE)
                state.inode, state.size_seen = info.st_ino, info.st_size
                head = len(R.MAGIC_STEPS)
                if state.offset == 0:
                    if f.read(head) != R.MAGIC_STEPS:
                        if info.st_size >= head and not state.warned:
                            state.warned = True
                            self.warnings.append(
                                f"rank {state.rank}: its steps.bin does not read; set aside"
                            )
                        return True
                    whole = _rows_in(f, info.st_size, hint)
                    first = max(whole - keep, 0)  # (a long record: only its newest rows)
                    state.offset = head + first * STEP_DTYPE.itemsize
                pieces = []
                while True:  # (in pieces: the file's unwritten tail is not read)
                    f.seek(state.offset)
                    # as far as the rank's count says (and a few rows more), else a piece
                    done = (state.offset - head) // STEP_DTYPE.itemsize
                    ahead = (hint - done + 16) * STEP_DTYPE.itemsize if hint is not None else 0
                    size = READ_PIECE if ahead <= 0 else min(ahead, READ_PIECE)
                    piece = f.read(min(max(info.st_size - state.offset, 0), size))
                    rows = _whole_rows(piece)
                    if len(rows):
                        pieces.append(rows)
                        state.offset += len(rows) * STEP_DTYPE.itemsize
                    if len(rows) * STEP_DTYPE.itemsize < size:
                        break
        except OSError:
            return False  # (vanished, or not yet there: the next look reads it)
        if not pieces:
            return True
        rows = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        if len(state.rows):  # (in order after what was read)
            rows = rows[rows["step"] > state.rows["step"][-1]]
        state.rows = np.concatenate([state.rows, rows])[-keep:]
        return True

    def _rank_now(self, folder: str, state: _Rank, head: dict[str, Any] | None) -> RankNow:
        if state.end is None:
            state.end = _small_json(os.path.join(folder, "end.json"))
        rows = state.rows
        last = rows[-1] if len(rows) else None
        steps_done = int(last["step"]) + 1 if last is not None else 0
        if head is not None:
            steps_done = max(steps_done, head["step"])
        recent = rows[-RECENT_ROWS:]
        own = (
            recent["end_ns"]
            - recent["start_ns"]
            - np.minimum(recent["comm_ns"], recent["end_ns"] - recent["start_ns"])
        )
        end = state.end if isinstance(state.end, dict) else None
        return RankNow(
            rank=state.rank,
            steps_done=steps_done,
            last_step_ms=float(last["end_ns"] - last["start_ns"]) / 1e6
            if last is not None
            else None,
            own_ms=float(np.mean(own)) / 1e6 if len(own) else None,
            last_end_ns=int(last["end_ns"]) if last is not None else None,
            phase=head["phase"] if head else None,
            phase_since_ns=head["since"] if head else None,
            progress_ns=head["progress"] if head else None,
            call=head["call"] if head else None,
            pid=head["pid"] if head else None,
            end_state=end.get("state") if end and isinstance(end.get("state"), str) else None,
            end_detail=end.get("detail") if end and isinstance(end.get("detail"), str) else None,
            end_ns=end["t_ns"] if end and _is_ns(end.get("t_ns")) else None,
        )

    def _extend_history(self, ranks: list[int]) -> None:
        """The job's steps every rank (of ``ranks`` that runs steps: a process that keeps a
        record but runs none, as a parameter server, is not waited for) has finished since the
        last look."""
        ranks = [r for r in ranks if len(self.ranks[r].rows)]
        if not ranks:
            return
        held = [self.ranks[r].rows for r in ranks]
        through = min(int(rows["step"][-1]) for rows in held)
        if through <= self.done_through:
            return
        lo = max(self.done_through + 1, max(int(rows["step"][0]) for rows in held))
        inside = [rows[(rows["step"] >= lo) & (rows["step"] <= through)] for rows in held]
        # (the step numbers the rows hold, not every number between: a record's numbers may
        # jump by billions)
        numbers = np.unique(np.concatenate([rows["step"] for rows in inside]).astype(np.int64))
        if not len(numbers):
            self.done_through = max(self.done_through, through)
            return
        longest = np.full(len(numbers), -1.0)
        most_own = np.full(len(numbers), -np.inf)
        who = np.full(len(numbers), -1, np.int64)
        seen = np.zeros(len(numbers), np.int64)
        for rank, rows in zip(ranks, inside, strict=True):
            at = np.searchsorted(numbers, rows["step"].astype(np.int64))
            dur = (rows["end_ns"] - rows["start_ns"]).astype(float) / 1e6
            own = dur - np.minimum(rows["comm_ns"], rows["end_ns"] - rows["start_ns"]) / 1e6
            np.maximum.at(longest, at, dur)
            better = own > most_own[at]
            most_own[at[better]] = own[better]
            who[at[better]] = rank
            np.add.at(seen, np.unique(at), 1)  # (a rank's row repeated counts once)
        done = np.flatnonzero(seen == len(ranks))
        self.steps = np.concatenate([self.steps, numbers[done]])[-HISTORY_MAX:]
        self.step_ms = np.concatenate([self.step_ms, longest[done]])[-HISTORY_MAX:]
        self.step_rank = np.concatenate([self.step_rank, who[done]])[-HISTORY_MAX:]
        self.done_through = through

    def _job(self) -> JobSaid:
        said = _small_json(self.run / LIVE)
        said = said if isinstance(said, dict) else {}
        manifest = D.MANIFEST
        ended_code: int | None = None
        try:
            has_manifest = (self.run / manifest).is_file()
        except OSError:
            has_manifest = False
        if has_manifest:  # (its collect section's exit code: read as plain JSON)
            said_there = _small_json(self.run / manifest)
            collect = said_there.get("collect") if isinstance(said_there, dict) else None
            code = collect.get("exit_code") if isinstance(collect, dict) else None
            if isinstance(code, int) and not isinstance(code, bool):
                ended_code = code
        code = said.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool):
            ended_code = code
        host = said.get("host") if isinstance(said.get("host"), str) else None
        pid = said.get("collect_pid")
        alive = None
        if host == socket.gethostname() and isinstance(pid, int) and 0 < pid < 1 << 31:
            alive = _alive(pid)
        stall = said.get("stall_s")
        return JobSaid(
            # (shown and printed as --json: control and bidi characters escaped)
            started=safe(said["started"], 100) if isinstance(said.get("started"), str) else None,
            host=safe(host, 200) if host is not None else None,
            exit_code=ended_code,
            ended=ended_code is not None or has_manifest,
            collect_alive=alive,
            stall_s=float(stall)
            if isinstance(stall, (int, float)) and 0 < stall < 1e7
            else R.DEFAULT_STALL_S,
        )


#: a rank's own work per step is its mean over these last steps
RECENT_ROWS = 20


#: the most of a record read at once (its new rows are read in pieces of this many bytes: a
#: whole number of rows, about 64 KiB)
READ_PIECE = STEP_DTYPE.itemsize * 1638


def _whole_rows(data: bytes) -> np.ndarray:
    """The rows of ``data`` written whole: up to the first unwritten one or one cut short (a
    row being written: read again at the next look)."""
    rows = written_rows(data)
    whole = rows["end_ns"] >= rows["start_ns"]
    return rows if whole.all() else rows[: int(np.argmin(whole))]


def _rows_in(f: Any, size: int, hint: int | None = None) -> int:
    """The step rows written in steps.bin (open as ``f``), found without reading it whole: the
    rank's own count (``hint``) where the rows say so, else a binary search for the first
    unwritten row (its start 0; the file grows in zeroed chunks)."""
    head = len(R.MAGIC_STEPS)
    lo, hi = 0, (size - head) // STEP_DTYPE.itemsize  # (rows < lo written; rows >= hi not)

    def written(row: int) -> bool:
        f.seek(head + row * STEP_DTYPE.itemsize + 16)  # (its start_ns)
        start = f.read(8)
        return len(start) == 8 and int.from_bytes(start, "little", signed=True) > 0

    if (
        hint is not None
        and 0 <= hint <= hi
        and (hint == 0 or written(hint - 1))
        and (hint == hi or not written(hint))
    ):
        return hint
    while lo < hi:
        mid = (lo + hi) // 2
        if written(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _is_ns(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # (another user's: it exists)
    return True


def _small_json(path: str | Path) -> Any:
    try:
        with R.open_regular(path) as f:
            data = f.read(JSON_LIMIT)
        return json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def _calls_head(path: str) -> dict[str, Any] | None:
    """calls.bin's header (where the rank is now) and its last call, where they read."""
    try:
        with R.open_regular(path) as f:
            head = f.read(R.HEAD_SIZE)
            magic, capacity, pid, written, step, phase, since, progress = R.CALLS_HEAD.unpack_from(
                head, 0
            )
            if magic != R.MAGIC_CALLS or not 0 < capacity <= 1 << 24 or written < 0:
                return None
            call: dict[str, Any] | None = None
            if written > 0:
                f.seek(R.HEAD_SIZE + ((written - 1) % capacity) * CALL_DTYPE.itemsize)
                data = f.read(CALL_DTYPE.itemsize)
                if len(data) == CALL_DTYPE.itemsize:
                    row = np.frombuffer(data, CALL_DTYPE)[0]
                    if row["start_ns"] > 0:
                        call = {
                            "op": op_name(int(row["op"])),
                            "seq": int(row["seq"]),
                            "start_ns": int(row["start_ns"]),
                            "end_ns": int(row["end_ns"]),
                            "flags": int(row["flags"]),
                        }
    except (OSError, ValueError, Exception):
        return None
    return {
        "pid": int(pid),
        "step": int(step),
        "phase": R.PHASES[phase] if phase < len(R.PHASES) else None,
        "since": int(since) or None,
        # (a call that raised did not progress: its end is the failure's moment)
        "progress": max(
            int(progress),
            call["start_ns"] if call else 0,
            call["end_ns"] if call and not call["flags"] & R.FAILED else 0,
        )
        or None,
        "call": call,
    }


def ask_profile(run: Path, steps: int, warmup: int | None) -> tuple[int, int, int]:
    """``windows.ask_window`` for the job running into ``run``, refused in one line
    (BadInput) where ``run`` is no run collect writes or wrote: (window, first step, ranks)."""
    from traceview.runs.windows import ask_window

    check_run(run)
    return ask_window(run, LiveRun(run).look(), steps, warmup)
