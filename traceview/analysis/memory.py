"""Memory: per rank and device, the peak, where it happens, and how memory moves step to step.

Per rank (``memory_steps``, cached as memory_steps.parquet): one row per device and step window,
and one for the whole trace, from the rank's memory records (memory.parquet) and events: what
was allocated when the window starts and ends, its peak and when, the phase and operator running
at the peak, the reserve's peak. Run-wide (``memory_results``): per rank its peak (on the device
that matters most: an accelerator where there is one), its growth across steps with a verdict
(leak, creep, steady), and across ranks the highest peak and how far it is above the others'.

The operator at the peak is the innermost host operator running on the thread that made the
allocation (the training thread where none runs), leaving out allocation primitives
(``aten::empty``...), which run at every allocation and say nothing; the phase is that of the
innermost event there with a phase (``other`` where none has).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.attribution import merge_intervals
from traceview.model import schema as S
from traceview.model.columns import HOST_TREE, KIND_CODE, coded, dictionary_codes, ints, parent_rows
from traceview.model.results import DeviceMemory, RankMemory, RunMemory, StepMemory

MIB = 1 << 20
#: Operators that only allocate (every allocation runs one): not "the operator at the peak".
ALLOCATION_OPS = frozenset(
    (
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "[memory]",
    )
)
#: Growth across steps is named (leak, creep) when allocated memory at the boundaries between
#: consecutive steps grew over at least GROWTH_MIN_STEPS of them, in at least GROWTH_MIN_RISING
#: of the changes, by at least GROWTH_MIN_MB in all (and 1% of the peak): a leak when it grew
#: at every step, else a creep.
GROWTH_MIN_STEPS = 3
GROWTH_MIN_RISING = 0.75
GROWTH_MIN_MB = 1.0
#: A rank "peaks far above the others" (a warning) when its peak exceeds the median of the other
#: ranks' by IMBALANCE_MIN (a fraction of that median) and IMBALANCE_MIN_MB.
IMBALANCE_MIN = 0.2
IMBALANCE_MIN_MB = 32.0


@dataclass
class _HostEvents:
    """The rank's host call-tree events, as arrays, to find what runs at an instant."""

    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    depth: np.ndarray
    is_op: np.ndarray  # an operator that is not an allocation primitive
    phase: np.ndarray  # the event's phase, as a code into phases (-1: null)
    phases: list[str | None]
    name: np.ndarray  # the event's name, as a code into names
    names: list[str | None]
    training: tuple[int, int] | None  # (pid, tid) of the thread with the step markers
    parent: np.ndarray  # row of each event's parent (-1: none)
    # rows of each thread by start (deepest last), and their starts
    threads: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]
    busy_start: np.ndarray  # the union of every host event's time, as disjoint intervals
    busy_end: np.ndarray

    @classmethod
    def of(cls, events: pa.Table) -> _HostEvents:
        kind = coded(events.column(S.KIND), KIND_CODE)
        host = HOST_TREE[kind]
        table = events.filter(pa.array(host))
        kind = kind[host]
        name, names = dictionary_codes(table.column(S.NAME))
        phase, phases = dictionary_codes(table.column(S.PHASE))
        allocation = [i for i, n in enumerate(names) if n in ALLOCATION_OPS]
        step = kind == KIND_CODE[S.KIND_STEP]
        pid, tid = ints(table.column(S.PID), 0), ints(table.column(S.TID), 0)
        training = None
        if step.any():
            threads, counts = np.unique(
                np.stack([pid[step], tid[step]]), axis=1, return_counts=True
            )
            best = int(np.argmax(counts))
            training = int(threads[0, best]), int(threads[1, best])
        ts = ints(table.column(S.TS_NS), 0)
        end = ts + ints(table.column(S.DUR_NS), 0)
        depth = ints(table.column(S.DEPTH), 0)
        parent = parent_rows(table)
        order = np.lexsort((depth, ts, tid, pid))
        key = np.stack([pid[order], tid[order]])
        cuts = np.flatnonzero((np.diff(key, axis=1) != 0).any(axis=0)) + 1
        by_thread = {
            (int(pid[rows[0]]), int(tid[rows[0]])): (rows, ts[rows])
            for rows in np.split(order, cuts)
            if len(rows)
        }
        busy_start, busy_end = merge_intervals(ts, end)
        return cls(
            pid=pid,
            tid=tid,
            ts=ts,
            end=end,
            depth=depth,
            is_op=(kind == KIND_CODE[S.KIND_OP]) & ~np.isin(name, allocation),
            phase=phase,
            phases=phases,
            name=name,
            names=names,
            training=training,
            parent=parent,
            threads=by_thread,
            busy_start=busy_start,
            busy_end=busy_end,
        )

    def _covering(self, ts: int, thread: tuple[int, int]) -> list[int]:
        """The thread's events covering ``ts``, innermost first: from the last event to start
        at or before it, up its parents (events nest, so every covering one is on that path)."""
        if thread not in self.threads:
            return []
        rows, starts = self.threads[thread]
        at = int(np.searchsorted(starts, ts, side="right")) - 1
        row = int(rows[at]) if at >= 0 else -1
        chain = []
        while row >= 0:
            if self.end[row] >= ts:
                chain.append(row)
            row = int(self.parent[row])
        return chain

    def at(self, ts: int, pid: int, tid: int) -> tuple[str | None, str | None]:
        """(phase, operator) running at ``ts`` on the thread, else on the training thread."""
        threads = [(pid, tid)]
        if self.training is not None and self.training != (pid, tid):
            threads.append(self.training)
        phase = op = None
        other = self.phases.index(S.OTHER) if S.OTHER in self.phases else -2
        for thread in threads:
            chain = self._covering(ts, thread)
            if phase is None:
                phase = next(
                    (
                        str(self.phases[self.phase[r]])
                        for r in chain
                        if self.phase[r] >= 0 and self.phase[r] != other
                    ),
                    None,
                )
            if op is None:
                op = next((str(self.names[self.name[r]]) for r in chain if self.is_op[r]), None)
            if phase is not None and op is not None:
                break
        if phase is None:  # some host event runs then, on any thread: other
            k = int(np.searchsorted(self.busy_start, ts, side="right")) - 1
            if k >= 0 and self.busy_end[k] >= ts:
                phase = S.OTHER
        return phase, op


def _device_records(memory: pa.Table, device: str) -> pa.Table:
    return memory.filter(pc.equal(memory.column(S.DEVICE), device)).sort_by(S.TS_NS)


class _Records:
    """One device's memory records by time (``_device_records``), as arrays: what a window's
    row is made of (not the table: the lookups of a helper process hold them to the end)."""

    def __init__(self, table: pa.Table):
        self.ts = ints(table.column(S.TS_NS), 0)
        self.alloc = ints(table.column(S.ALLOCATED_BYTES), 0)
        self.pid = ints(table.column(S.PID), 0)
        self.tid = ints(table.column(S.TID), 0)
        reserved = table.column(S.RESERVED_BYTES)
        # the reserve where the trace gives it (-1: a record without)
        self.reserved = ints(reserved, -1) if reserved.null_count < len(reserved) else None
        size = table.column(S.BYTES)
        first = size[0].as_py() if len(size) else None
        # allocated before the first record: its total less its own size, where the trace
        # gives the size
        self.before = int(self.alloc[0] - first) if first is not None else None

    def peak(self, start: int, end: int) -> tuple[int, int, int]:
        """(first record, past the last, the first at the peak) of the window [start, end]."""
        i0 = int(np.searchsorted(self.ts, start, "left"))
        i1 = int(np.searchsorted(self.ts, end, "right"))
        return i0, i1, (i0 + int(np.argmax(self.alloc[i0:i1])) if i1 > i0 else -1)


def _devices(memory: pa.Table) -> list[str]:
    return sorted(set(memory.column(S.DEVICE).to_pylist()))


class MemoryLookups:
    """What ``memory_steps`` looks up in a rank's events (the phase and operator at an
    instant), gathered as the rank is analysed a slice at a time (``parts``): a window's memory
    rows are made once it is over, when the events of its first slices are gone. Each slice
    (``add``) resolves the instants that lie in it: per device, the peak of each piece of a
    window in it and the start of a window that starts there (memory held from before peaks
    there), and the whole trace's peak and first record. The peak of a window is the first
    peak among its pieces' (pieces meet at a record's instant, which both count), so it is one
    of theirs."""

    def __init__(self, memory: pa.Table, training: tuple[int, int] | None):
        self.training = training  # (as ``_HostEvents``: the thread with the step markers)
        self.rank = int(memory.column(S.RANK)[0].as_py())
        self.devices = {d: _Records(_device_records(memory, d)) for d in _devices(memory)}
        self.records = list(self.devices.values())
        self.found: dict[tuple[int, int, int], tuple[str | None, str | None]] = {}
        at_start = training or (-1, -1)
        self.pending: set[tuple[int, int, int]] = set()
        for r in self.records:
            _, _, at = r.peak(int(r.ts[0]), int(r.ts[-1]))
            self.pending |= {
                (int(r.ts[at]), int(r.pid[at]), int(r.tid[at])),
                (int(r.ts[0]), *at_start),
            }

    def add(
        self,
        events: pa.Table,
        since: int,
        upto: int,
        starts: np.ndarray,
        ends: np.ndarray,
        first: np.ndarray,
    ) -> None:
        """A slice [since, upto) of the rank (``events``: every row an instant in it needs)
        with the pieces [starts, ends] of the windows in it (``first``: where one starts)."""
        at_start = self.training or (-1, -1)
        for start, end, is_first in zip(
            starts.tolist(), ends.tolist(), first.tolist(), strict=True
        ):
            for r in self.records:
                _, _, at = r.peak(start, end)
                if at >= 0:
                    self.pending.add((int(r.ts[at]), int(r.pid[at]), int(r.tid[at])))
            if is_first:
                self.pending.add((start, *at_start))
        now = {key for key in self.pending if since <= key[0] < upto}
        if now:
            host = dataclasses.replace(_HostEvents.of(events), training=self.training)
            self.found.update({key: host.at(*key) for key in now})
            self.pending -= now

    def at(self, ts: int, pid: int, tid: int) -> tuple[str | None, str | None]:
        """The phase and operator at an instant; none where no slice held it (a rank whose
        events are all unreadable has memory records but no slices)."""
        return self.found.get((ts, pid, tid), (None, None))


def memory_steps(
    events: pa.Table | MemoryLookups, memory: pa.Table | None, steps: pa.Table
) -> pa.Table:
    """One rank's memory figures (schema.MEMORY_STEPS_SCHEMA): per device, one row for the
    whole trace and one per step window of ``steps`` (the rank's steps table). ``events``: the
    rank's events and ``memory`` its records, or what the rows look up in them (the records
    and the phase and operator at an instant), found as the rank was analysed in slices."""
    host: MemoryLookups | _HostEvents
    if isinstance(events, MemoryLookups):
        host, rank, devices = events, events.rank, events.devices
    elif memory is None or memory.num_rows == 0:
        return S.empty(S.MEMORY_STEPS_SCHEMA)
    else:
        host, rank = _HostEvents.of(events), int(memory.column(S.RANK)[0].as_py())
        devices = {d: _Records(_device_records(memory, d)) for d in _devices(memory)}
    windows = [
        (step, int(start), int(end))
        for step, start, end in zip(
            steps.column(S.STEP).to_pylist(),
            steps.column(S.START_NS).to_pylist(),
            steps.column(S.END_NS).to_pylist(),
            strict=True,
        )
    ]
    rows: dict[str, list[object]] = {f.name: [] for f in S.MEMORY_STEPS_SCHEMA}
    for device, records in devices.items():
        ts, alloc, pid, tid = records.ts, records.alloc, records.pid, records.tid
        res, before = records.reserved, records.before
        trace = [(None, int(ts[0]), int(ts[-1]), True)]
        for step, start, end, is_whole in [
            *trace,
            *((s, a, b, False) for s, a, b in windows),
        ]:
            i0, i1, at = records.peak(start, end)
            start_bytes = int(alloc[i0 - 1]) if i0 > 0 else before
            end_bytes = int(alloc[i1 - 1]) if i1 > 0 else before
            peak = peak_ts = phase = op = reserved_peak = None
            if at >= 0:
                peak, peak_ts = int(alloc[at]), int(ts[at])
                phase, op = host.at(peak_ts, int(pid[at]), int(tid[at]))
                if res is not None:
                    window_res = res[max(i0 - 1, 0) : i1]
                    reserved_peak = int(window_res.max()) if (window_res >= 0).any() else None
            if start_bytes is not None and (peak is None or start_bytes > peak):
                peak, peak_ts = start_bytes, start  # held from before: the peak is its start
                phase, op = host.at(start, *(host.training or (-1, -1)))
            for name, value in (
                (S.RANK, rank),
                (S.DEVICE, device),
                (S.STEP, step),
                (S.WHOLE, is_whole),
                (S.START_NS, start),
                (S.END_NS, end),
                (S.SAMPLES, i1 - i0),
                (S.START_BYTES, start_bytes),
                (S.END_BYTES, end_bytes),
                (S.PEAK_BYTES, peak),
                (S.PEAK_TS_NS, peak_ts),
                (S.PEAK_PHASE, phase),
                (S.PEAK_OP, op),
                (S.RESERVED_PEAK_BYTES, reserved_peak),
            ):
                rows[name].append(value)
    return pa.Table.from_pydict(rows, schema=S.MEMORY_STEPS_SCHEMA)


# --- run-wide ----------------------------------------------------------------------------------


#: Why a run has no memory records, by framework (one remark).
_NO_RECORDS = {
    "pytorch": "memory: the traces hold no memory records (PyTorch writes them with "
    "profile_memory=True; traceview collect records them unless --no-memory)",
    "tensorflow": "memory: the traces hold no memory records (TensorFlow records its BFC "
    "allocators' allocations: on GPU, and on CPU in full only with "
    "TF_CPU_ALLOCATOR_USE_BFC=true, which traceview does not set for the job)",
    "mxnet": "memory: the traces hold no memory records (MXNet writes its storage counters with "
    "profile_memory=True)",
    "jax": "memory: the traces hold no memory records (a JAX profile's XSpace records no "
    "allocations; jax.profiler.save_device_memory_profile writes them apart)",
}


@dataclass
class MemoryResults:
    """What ``memory_results`` finds: per rank, the run, and its notes."""

    ranks: dict[int, RankMemory] = field(default_factory=dict)
    run: RunMemory | None = None
    warnings: list[str] = field(default_factory=list)
    remarks: list[str] = field(default_factory=list)


def _mb(value: int | float | None) -> float | None:
    return None if value is None else round(float(value) / MIB, 3)


def growth(end_bytes: list[int | None]) -> tuple[float | None, str | None]:
    """(MiB per step, verdict) of allocated memory at the end of consecutive steps: the least-
    squares slope, and ``leak`` (grew at every step), ``creep`` (grew at most steps) or
    ``steady``; (None, None) with fewer than GROWTH_MIN_STEPS steps."""
    values = np.array([v for v in end_bytes if v is not None], np.float64)
    if len(values) < GROWTH_MIN_STEPS:
        return None, None
    x = np.arange(len(values), dtype=np.float64)
    slope = float(np.polyfit(x, values, 1)[0]) / MIB + 0.0  # (no -0.0)
    diffs = np.diff(values)
    rising = float((diffs > 0).mean())
    total = (values[-1] - values[0]) / MIB
    grows = (
        slope > 0
        and rising >= GROWTH_MIN_RISING
        and total >= max(GROWTH_MIN_MB, 0.01 * float(values.max()) / MIB)
    )
    verdict = ("leak" if rising == 1.0 else "creep") if grows else "steady"
    return round(slope, 3) + 0.0, verdict


def _device(
    rows: list[dict[str, object]], steps: set[int | None] | None, since_start: bool
) -> DeviceMemory:
    whole = next(r for r in rows if r[S.WHOLE])
    by_step = sorted(
        (r for r in rows if not r[S.WHOLE] and (steps is None or r[S.STEP] in steps)),
        key=lambda r: _opt_int(r[S.START_NS]) or 0,
    )
    step_rows = [
        StepMemory(
            step=_opt_int(r[S.STEP]),
            start_mb=_mb(_opt_int(r[S.START_BYTES])),
            end_mb=_mb(_opt_int(r[S.END_BYTES])),
            peak_mb=_mb(_opt_int(r[S.PEAK_BYTES])),
            peak_phase=_opt_str(r[S.PEAK_PHASE]),  # type: ignore[arg-type]
        )
        for r in by_step
    ]
    # Measured where one step ends and the next begins: the same point of every iteration. The
    # last step ends where the profiler stopped, which need not be that point (under collect it
    # stops in the optimizer's step, before the script's zero_grad frees the gradients).
    rate, verdict = growth([_opt_int(r[S.END_BYTES]) for r in by_step[:-1]])
    peak_step = None
    peak_ts = whole[S.PEAK_TS_NS]
    for r in by_step:
        if peak_ts is not None and r[S.START_NS] <= peak_ts <= r[S.END_NS]:  # type: ignore[operator]
            peak_step = _opt_int(r[S.STEP])
    return DeviceMemory(
        peak_mb=_mb(_opt_int(whole[S.PEAK_BYTES])),
        peak_phase=_opt_str(whole[S.PEAK_PHASE]),  # type: ignore[arg-type]
        peak_op=_opt_str(whole[S.PEAK_OP]),
        peak_step=peak_step,
        reserved_peak_mb=_mb(_opt_int(whole[S.RESERVED_PEAK_BYTES])),
        start_mb=step_rows[0].start_mb if step_rows else None,
        end_mb=step_rows[-1].end_mb if step_rows else None,
        growth_mb_per_step=rate,
        growth=verdict,  # type: ignore[arg-type]
        since_profiling_started=since_start,
        steps=step_rows,
    )


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def headline_device(by_device: dict[str, DeviceMemory]) -> str:
    """The device a rank's memory figures are about: its accelerator with the highest peak,
    else the CPU."""
    allocators = [d for d in by_device if d != S.DEVICE_RSS]
    accelerators = [d for d in allocators if not d.startswith(S.DEVICE_CPU)]
    pool = accelerators or allocators or list(by_device)
    return max(pool, key=lambda d: (by_device[d].peak_mb or 0.0, d))


def memory_results(
    table: pa.Table | None,
    ranks: list[int],
    steps: set[int | None] | None = None,
    since_start: dict[int, list[str]] | None = None,
    framework: str | None = None,
) -> MemoryResults:
    """Per rank and across ranks, from the memory_steps tables of ``ranks`` (None: the run has
    no memory table); ``steps``: the step numbers that count (complete on every rank);
    ``since_start``: per rank, the devices whose figures count only from the profiler's start,
    as the parser found (PyTorch's CPU allocator; totals summed from the records' sizes)."""
    out = MemoryResults()
    if table is None and not ranks:  # (no rank traced: nothing to say of memory)
        return out
    if table is None:
        out.remarks.append(
            "memory: unknown (the run was ingested before traceview read memory records: "
            "ingest it again)"
        )
        return out
    rows = table.to_pylist()
    if not rows:
        out.remarks.append(_NO_RECORDS.get(framework or "", _NO_RECORDS["pytorch"]))
        return out
    by_rank: dict[int, dict[str, list[dict[str, object]]]] = {}
    for row in rows:
        rank = _opt_int(row[S.RANK]) or 0
        by_rank.setdefault(rank, {}).setdefault(str(row[S.DEVICE]), []).append(row)
    for rank in sorted(by_rank):
        if rank not in ranks:
            continue
        partial = (since_start or {}).get(rank, [])
        devices = {d: _device(r, steps, d in partial) for d, r in sorted(by_rank[rank].items())}
        main = headline_device(devices)
        figure = devices[main]
        out.ranks[rank] = RankMemory(
            device=main,
            peak_mb=figure.peak_mb,
            peak_phase=figure.peak_phase,
            peak_op=figure.peak_op,
            peak_step=figure.peak_step,
            reserved_peak_mb=figure.reserved_peak_mb,
            growth_mb_per_step=figure.growth_mb_per_step,
            growth=figure.growth,
            since_profiling_started=figure.since_profiling_started,
            by_device=devices,
        )
        for device, fig in devices.items():
            if fig.growth in ("leak", "creep"):
                out.warnings.append(
                    f"memory: rank {rank} {device}: allocated memory grows "
                    f"{fig.growth_mb_per_step:.1f} MiB per step over {len(fig.steps)} steps "
                    f"({'at every step: a leak?' if fig.growth == 'leak' else 'a creep'})"
                )
    without = [r for r in ranks if r not in out.ranks]
    if without:
        out.remarks.append(
            f"memory: rank(s) {', '.join(map(str, without))} have no memory records (null)"
        )
    out.run = _run(out.ranks)
    run = out.run
    if run is not None and run.imbalanced:
        out.warnings.append(
            f"memory: rank {run.peak_rank} peaks at {run.peak_mb:.1f} MiB ({run.device}), "
            f"{run.excess_mb:.1f} MiB above the other ranks' median of {run.median_mb:.1f} MiB: "
            "it would run out of memory first"
        )
    if any(m.since_profiling_started for m in out.ranks.values()):
        out.remarks.append(
            "memory: CPU figures (and those of traces that state no totals) count only what was "
            "allocated while the profiler ran"
        )
    return out


def _run(ranks: dict[int, RankMemory]) -> RunMemory | None:
    peaks = {r: m.peak_mb for r, m in ranks.items() if m.peak_mb is not None}
    if not peaks:
        return None
    top = max(peaks, key=lambda r: (peaks[r], -r))
    device = ranks[top].device
    others = [v for r, v in peaks.items() if r != top and ranks[r].device == device]
    excess = imbalance = median_mb = None
    imbalanced = None
    if others:
        median = float(np.median(others))
        median_mb = round(median, 3)
        excess = round(peaks[top] - median, 3)
        imbalance = round(excess / median, 4) if median > 0 else None
        imbalanced = excess >= IMBALANCE_MIN_MB and (
            imbalance is None or imbalance >= IMBALANCE_MIN
        )
    return RunMemory(
        peak_mb=peaks[top],
        peak_rank=top,
        device=device,
        excess_mb=excess,
        imbalance=imbalance,
        median_mb=median_mb,
        imbalanced=imbalanced,
        leaking_ranks=sorted(r for r, m in ranks.items() if m.growth in ("leak", "creep")),
    )
