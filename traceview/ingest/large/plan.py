"""What pass 1 keeps of a large trace (``Survey``: step and phase markers, launch links, the
busiest threads) and the plan made of it: the step windows, the training thread and the chunks'
bounds (cut at step ends; a long step cut inside at phase markers).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    OPERATOR,
    STRUCTURAL,
    disjoint,
    distinct,
    ints,
    pair_groups,
    training_thread_of,
    unique_pairs,
    window_index,
)
from traceview.model.errors import Notes
from traceview.normalize.classify import KIND_CODES, classify, kinds_from_categories
from traceview.normalize.phases import ANCHOR_PHASES
from traceview.normalize.rules import RuleSet
from traceview.normalize.step_inference import RepeatState, SessionRunState
from traceview.normalize.steps import first_of_each_step

#: Rows a chunk aims at: as many whole steps as hold about this many events (at least one).
#: ``TRACEVIEW_CHUNK_ROWS`` overrides it (tests: 1, a chunk per step). Measured on the 1.02 GB
#: trace (wall, peak RSS of both processes): 25,000 8.9 s / 434 MB; 50,000 7.7-8.2 s / 455-465
#: MB; 100,000 7.8-8.0 s / 530-537 MB; 200,000 8.8-8.9 s / 677-696 MB (a chunk's working set,
#: in the ingest and its helper at once, is most of the peak).
CHUNK_ROWS = 50_000


#: A stretch between two cuts (a long step, or what precedes or follows the steps) holding
#: more than twice this many events is cut inside too, into pieces of about this many, at
#: phase markers (``inside_steps``). ``TRACEVIEW_PIECE_ROWS`` overrides it.
PIECE_ROWS = CHUNK_ROWS


#: Pass 1 keeps the start of every this-many-th event: where a long step's events lie.
SAMPLE_EVERY = 32


class MemoRules(RuleSet):
    """The rules with their answers per name remembered: every chunk (and the survey of
    every decoded batch) asks again about the same few thousand names."""

    def classify(self, kind: str, cat: str | None, name: str) -> Any:
        key = (kind, cat, name)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = super().classify(kind, cat, name)
        return found

    def default_op(self, name: str) -> str:
        found = self._ops.get(name)
        if found is None:
            found = self._ops[name] = super().default_op(name)
        return found

    def marker_number(self, name: str) -> int:
        found = self._markers.get(name)
        if found is None:
            found = self._markers[name] = super().marker_number(name)
        return found

    @classmethod
    def of(cls, rules: RuleSet) -> MemoRules:
        memo = cls(**{f.name: getattr(rules, f.name) for f in dataclasses.fields(rules) if f.init})
        memo._memo = {}
        memo._ops = {}
        memo._markers = {}
        return memo

    _memo: dict[tuple[str, str | None, str], Any]
    _ops: dict[str, str]
    _markers: dict[str, int]  # (a run of 100,000 steps: each marker's name is asked twice)


def chunk_rows() -> int:
    return max(1, int(os.environ.get("TRACEVIEW_CHUNK_ROWS", CHUNK_ROWS)))


def piece_rows() -> int:
    return max(1, int(os.environ.get("TRACEVIEW_PIECE_ROWS", PIECE_ROWS)))


#: A chunk's time span where it has no bound (before the first cut, after the last).
OPEN_END = 1 << 62


class Firsts:
    """Per key, the chunk of the first row (in row order) with that key: a sorted lookup table
    built from the survey's per-batch arrays (which it empties as it goes: the rank's
    correlations are the largest state the survey keeps)."""

    def __init__(self, keys: list[np.ndarray], ts: list[np.ndarray], bounds: np.ndarray):
        k = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        keys.clear()
        t = np.concatenate(ts) if ts else np.zeros(0, np.int64)
        ts.clear()
        v = np.searchsorted(bounds, t, side="right").astype(np.int32)
        del t
        order = np.argsort(k, kind="stable")
        k, v = k[order], v[order]
        del order
        first = np.concatenate(([True], k[1:] != k[:-1])) if len(k) else np.zeros(0, bool)
        self.keys, self.values = k[first], v[first]

    def get(self, query: np.ndarray) -> np.ndarray:
        """The chunk of each query's key; -1 where none (and for negative keys)."""
        if len(self.keys) == 0 or len(query) == 0:
            return np.full(len(query), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
        return np.where((query >= 0) & (self.keys[pos] == query), self.values[pos], -1)

    NONE: Firsts  # an empty table

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)


Firsts.NONE = Firsts([], [], np.zeros(0, np.int64))


class ThreadTime:
    """Per host thread, the time of its host-tree events by (outermost operator, own phase
    backward): what ``arrays.training_thread_of`` weighs to find the training thread of a rank
    without step markers, summed a batch or a chunk at a time."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []  # (keys [4, groups], time)

    def add(
        self, pid: np.ndarray, tid: np.ndarray, top: np.ndarray, back: np.ndarray, dur: np.ndarray
    ) -> None:
        if len(pid):
            keys = np.stack([pid, tid, top.astype(np.int64), back.astype(np.int64)])
            self.parts.append(_summed_by(keys, dur))
        if len(self.parts) > 64:  # (a few rows per thread, however many batches)
            self.parts = [self._total()]

    def then(self, later: ThreadTime) -> None:
        self.parts.extend(later.parts)

    def _total(self) -> tuple[np.ndarray, np.ndarray]:
        keys = np.concatenate([k for k, _ in self.parts], axis=1)
        return _summed_by(keys, np.concatenate([t for _, t in self.parts]))

    def training(self) -> tuple[int, int] | None:
        if not self.parts:
            return None
        (pid, tid, top, back), time = self._total()
        kind = np.full(len(pid), KIND_CODE[S.KIND_OP])
        return training_thread_of(pid, tid, kind, top.astype(bool), time, back.astype(bool))


def _summed_by(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct columns of ``keys``, and the sum of ``values`` over each."""
    order = np.lexsort(keys[::-1])
    keys, values = keys[:, order], values[order]
    heads = np.flatnonzero(np.concatenate(([True], (keys[:, 1:] != keys[:, :-1]).any(axis=0))))
    return keys[:, heads], np.add.reduceat(values, heads) if len(heads) else values[:0]


@dataclass
class Survey:
    """Pass 1's small state: what the whole rank holds that its chunks need."""

    rows: int = 0
    ts_min: int = 1 << 62
    ts_max: int = -(1 << 62)
    dur_max: int = 0
    marker_pid: list[np.ndarray] = field(default_factory=list)
    marker_tid: list[np.ndarray] = field(default_factory=list)
    marker_ts: list[np.ndarray] = field(default_factory=list)
    marker_dur: list[np.ndarray] = field(default_factory=list)
    marker_number: list[np.ndarray] = field(default_factory=list)
    runtime_corr: list[np.ndarray] = field(default_factory=list)
    runtime_ts: list[np.ndarray] = field(default_factory=list)
    op_ext: list[np.ndarray] = field(default_factory=list)
    op_ts: list[np.ndarray] = field(default_factory=list)
    anchor_ts: list[np.ndarray] = field(default_factory=list)
    anchor_phase: list[np.ndarray] = field(default_factory=list)
    sampled_ts: list[np.ndarray] = field(default_factory=list)  # every SAMPLE_EVERY-th row's
    devices: int = 0
    # per thread (pid, tid): host operators whose own phase is backward
    backward_threads: set[tuple[int, int]] = field(default_factory=set)
    # until a step marker is seen (a whole-run profile has none): per thread, the time in its
    # operators (the training thread is then the busiest: a first guess, ``make_plan``) and where
    # the timed events start and end (the one window of such a rank)
    thread_time: ThreadTime = field(default_factory=ThreadTime)
    timed_start: int = 1 << 62
    timed_end: int = -(1 << 62)
    # what step inference needs to infer the steps of a rank without markers (the rows it could
    # cut steps at, the threads' spans: ``RepeatState``)
    repeats: RepeatState = field(default_factory=RepeatState)
    sessions: SessionRunState = field(default_factory=SessionRunState)  # (TF1 Timelines')

    def then(self, later: Survey) -> None:
        """Add the survey of the rows that follow (a later part of the trace)."""
        self.rows += later.rows
        self.ts_min, self.ts_max = min(self.ts_min, later.ts_min), max(self.ts_max, later.ts_max)
        self.dur_max = max(self.dur_max, later.dur_max)
        for f in dataclasses.fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, list):
                mine.extend(getattr(later, f.name))
        self.devices += later.devices
        self.backward_threads |= later.backward_threads
        self.thread_time.then(later.thread_time)
        self.timed_start = min(self.timed_start, later.timed_start)
        self.timed_end = max(self.timed_end, later.timed_end)
        self.repeats.then(later.repeats)
        self.sessions.then(later.sessions)

    def inference_table(self, method: str) -> pa.Table | None:
        """The rows on which step inference ``method`` finds the steps it finds over the whole
        rank (None: nothing to cut steps at, or a method that needs the whole rank)."""
        if method == "repeats":
            return self.repeats.table() if self.repeats.rows else None
        if method == "session_runs":
            return self.sessions.table()
        return None

    def add(self, batch: pa.RecordBatch, rules: RuleSet) -> np.ndarray:
        """Survey one raw batch; its kind codes."""
        table = kinds_from_categories(pa.Table.from_batches([batch]), rules)
        classes = classify(table, rules)
        kind, own = classes.kind, classes.phase
        ts = ints(batch.column(S.TS_NS), 0)
        raw_dur = ints(batch.column(S.DUR_NS), 0)
        dur = np.maximum(raw_dur, 0)
        n = len(ts)
        self.sampled_ts.append(ts[(-self.rows) % SAMPLE_EVERY :: SAMPLE_EVERY].copy())
        self.rows += n
        if n:
            self.ts_min = min(self.ts_min, int(ts.min()))
            self.ts_max = max(self.ts_max, int(ts.max()))
            self.dur_max = max(self.dur_max, int(raw_dur.max()))
        host = HOST_TREE[kind]
        step = np.flatnonzero(kind == KIND_CODES[S.KIND_STEP])
        if len(step):
            self.marker_pid.append(ints(batch.column(S.PID), 0)[step])
            self.marker_tid.append(ints(batch.column(S.TID), 0)[step])
            self.marker_ts.append(ts[step])
            self.marker_dur.append(dur[step])
            self.marker_number.append(classes.step_number(step))
        corr = ints(batch.column(S.CORRELATION), -1)
        runtime = (kind == KIND_CODES[S.KIND_RUNTIME]) & (corr >= 0)
        self.runtime_corr.append(corr[runtime])
        self.runtime_ts.append(ts[runtime])
        ext = ints(batch.column(S.EXTERNAL_ID), -1)
        ops = host & (kind != KIND_CODES[S.KIND_RUNTIME]) & (ext >= 0)
        self.op_ext.append(ext[ops])
        self.op_ts.append(ts[ops])
        self.devices += int(DEVICE[kind].sum())
        backward = np.flatnonzero(host & ~STRUCTURAL[kind] & (own == _PHASE_BACKWARD))
        if len(backward):
            pid, tid = ints(batch.column(S.PID), 0), ints(batch.column(S.TID), 0)
            pairs = unique_pairs(pid[backward], tid[backward])
            self.backward_threads.update(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))
        anchor = host & (own >= 0)
        anchor[anchor] = ANCHOR_PHASES[own[anchor]]
        self.anchor_ts.append(ts[anchor])
        self.anchor_phase.append(own[anchor].astype(np.int8))
        if not self.marker_ts:
            self._unmarked(batch, kind, own, ts, dur)
            self.repeats.add(table)
            self.sessions.add(table)
        return kind.astype(np.int8)

    def _unmarked(
        self, batch: pa.RecordBatch, kind: np.ndarray, own: np.ndarray, ts: np.ndarray,
        dur: np.ndarray,
    ) -> None:  # fmt: skip
        """What a rank without step markers needs, from a batch (``thread_time``, its span)."""
        timed = np.flatnonzero(HOST_TREE[kind] | DEVICE[kind])
        if len(timed):
            self.timed_start = min(self.timed_start, int(ts[timed].min()))
            self.timed_end = max(self.timed_end, int((ts[timed] + dur[timed]).max()))
        host = np.flatnonzero(HOST_TREE[kind])
        self.thread_time.add(
            ints(batch.column(S.PID), 0)[host],
            ints(batch.column(S.TID), 0)[host],
            OPERATOR[kind[host]],  # (outermost or not: a guess, checked later)
            own[host] == _PHASE_BACKWARD,
            dur[host],
        )


@dataclass
class Plan:
    training: tuple[int, int]
    starts: np.ndarray  # per kept step window (base-0 clock)
    ends: np.ndarray
    numbers: np.ndarray
    bounds: np.ndarray  # chunk c holds [bounds[c-1], bounds[c]); first and last open-ended
    backward_steps: np.ndarray
    anchor_ts: np.ndarray
    anchor_phase: np.ndarray
    runtime: Firsts
    ops: Firsts
    gpu: bool
    backward_elsewhere: bool
    backward_threads: set[tuple[int, int]]
    # a rank without step markers: its one window, the span of its timed events (base-0);
    # ``training`` is then a guess (the thread with the most time in operators), checked once
    # every chunk's call trees are known (``_normalize_routed``)
    whole: tuple[int, int] | None = None


def steps_and_chunks(
    pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, end: np.ndarray, rows: int, target: int
) -> tuple[tuple[int, int], np.ndarray, np.ndarray]:
    """From a rank's step markers: the training thread (the one with the most), its kept
    markers by time (``normalize.find_steps``'s: none starting inside an earlier one), and the
    chunk bounds (cut at step ends, as many whole steps a chunk as hold about ``target`` of
    the rank's ``rows`` events; the events after the last step go with the last steps)."""
    threads, inverse = pair_groups(pid, tid)
    best = int(np.argmax(np.bincount(inverse)))
    training = int(threads[0, best]), int(threads[1, best])
    mine = np.flatnonzero((pid == training[0]) & (tid == training[1]))
    mine = mine[np.argsort(ts[mine], kind="stable")]
    mine = mine[disjoint(ts[mine], end[mine])]
    ends = end[mine]
    per_step = max(1, rows // max(len(mine), 1))
    steps_per_chunk = max(1, target // per_step)
    cuts = ends[steps_per_chunk - 1 :: steps_per_chunk]
    if len(cuts) and cuts[-1] == ends[-1]:
        cuts = cuts[:-1]
    return training, mine, np.unique(cuts)


def make_plan(survey: Survey, target_rows: int, notes: Notes) -> Plan | None:
    """The steps as ``normalize.find_steps`` finds them (with markers: the training thread is
    the one with the most), and the chunks. Without markers, the one window of the whole rank,
    cut in pieces, and a guess of the training thread; None where the rank has no host events
    (the whole-rank path)."""
    whole = None
    if survey.marker_ts:
        pid, tid = np.concatenate(survey.marker_pid), np.concatenate(survey.marker_tid)
        ts, dur = np.concatenate(survey.marker_ts), np.concatenate(survey.marker_dur)
        number = np.concatenate(survey.marker_number)
        training, mine, bounds = steps_and_chunks(pid, tid, ts, ts + dur, survey.rows, target_rows)
        numbers = number[mine]
        numbers = np.where(numbers >= 0, numbers, np.arange(len(mine)))
        kept = first_of_each_step(numbers, notes)
        mine, numbers = mine[kept], numbers[kept]
        starts, ends = ts[mine], ts[mine] + dur[mine]
    else:
        guess = survey.thread_time.training()
        if guess is None or survey.timed_end < survey.timed_start:
            return None
        training, whole = guess, (survey.timed_start, survey.timed_end)
        starts = ends = numbers = bounds = np.zeros(0, np.int64)
    anchor_ts = np.concatenate(survey.anchor_ts)
    anchor_phase = np.concatenate(survey.anchor_phase).astype(np.int64)
    sampled = np.sort(np.concatenate(survey.sampled_ts)) if survey.sampled_ts else np.zeros(0)
    bounds = inside_steps(bounds, sampled, survey.rows, anchor_ts, piece_rows())
    del sampled
    backward = anchor_ts[anchor_phase == _PHASE_BACKWARD]
    window = window_index(starts, ends, backward)
    outside = np.full(int((window < 0).any()), -1, np.int64)  # (-1: not in a step)
    backward_steps = np.unique(np.concatenate([numbers[window[window >= 0]], outside]))
    # only the markers at a chunk's cut can be a chunk's next marker from beyond it
    at_cut = np.isin(anchor_ts, bounds)
    return Plan(
        training,
        starts,
        ends,
        numbers,
        bounds,
        backward_steps,
        anchor_ts[at_cut],
        anchor_phase[at_cut],
        Firsts(survey.runtime_corr, survey.runtime_ts, bounds),
        Firsts(survey.op_ext, survey.op_ts, bounds),
        survey.devices > 0,
        bool(survey.backward_threads - {training}),
        survey.backward_threads,
        whole,
    )


_PHASE_BACKWARD = S.EVENT_PHASES.index(S.BACKWARD)


def inside_steps(
    bounds: np.ndarray, sampled: np.ndarray, rows: int, anchor_ts: np.ndarray, piece: int
) -> np.ndarray:
    """``bounds`` with more cuts inside every stretch between two of them that holds more than
    twice ``piece`` rows (by ``sampled``, the sorted starts of a regular sample of the rank's
    ``rows``), about every ``piece`` rows, each at a phase marker's start (``anchor_ts``).

    A cut there keeps each chunk's positional phases exact: an operator's next phase marker is
    then in its own chunk or is the one at the cut (``ChunkContext.more_anchors``), and a
    gradient seed's run of candidates up to its marker never crosses a cut. A stretch with no
    marker inside stays whole."""
    if len(sampled) == 0 or len(anchor_ts) == 0:
        return bounds
    per_sample = rows / len(sampled)
    edges = np.searchsorted(sampled, bounds, side="left")
    starts = np.concatenate(([0], edges))
    stops = np.concatenate((edges, [len(sampled)]))
    long = np.flatnonzero((stops - starts) * per_sample > 2 * piece)
    if len(long) == 0:
        return bounds
    markers = distinct(anchor_ts)
    cuts = [bounds]
    for stretch in long.tolist():
        first, stop = int(starts[stretch]), int(stops[stretch])
        pieces = round((stop - first) * per_sample / piece)
        wanted = sampled[first + (np.arange(1, pieces) * (stop - first)) // pieces]
        at = markers[np.minimum(np.searchsorted(markers, wanted), len(markers) - 1)]
        low = bounds[stretch - 1] if stretch > 0 else -OPEN_END
        high = bounds[stretch] if stretch < len(bounds) else OPEN_END
        cuts.append(at[(at > low) & (at < high)])
    return distinct(np.concatenate(cuts))
