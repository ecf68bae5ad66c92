"""The data model: column names, phases and the Arrow schemas of every table traceview writes.

Every other module refers to columns through these constants, never through string literals,
so a rename happens here and nowhere else. Units are part of the names (``ts_ns``).
"""

from __future__ import annotations

import sys
from typing import Final, NamedTuple

import numpy as np
import pyarrow as pa

from traceview.model.vocabulary import (  # noqa: F401 (re-exported: the schema's names)
    ATTRIBUTION_PRIORITY,
    BACKWARD,
    BOTTLENECK_PHASES,
    BREAKDOWN_PHASES,
    COMM,
    COMPUTE_PHASES,
    EVENT_PHASES,
    FORWARD,
    GPU_HOST_BOUND_PHASES,
    H2D,
    IDLE,
    IO,
    OTHER,
    SEGMENT_COMM,
    SEGMENT_COMPUTE,
    SEGMENT_HOST_BOUND,
    SEGMENT_IDLE,
    SEGMENT_KERNEL,
    SEGMENT_KINDS,
    SEGMENT_LAUNCH,
    UPDATE,
)


def _skip_pandas_probe() -> None:
    """pyarrow imports pandas, where it is installed, the first time it converts Python values
    or asks whether an input is a pandas object (half a second and more of every command);
    traceview never hands it one. Those first probes are made with pandas out of reach, so
    pyarrow takes it as absent; it still imports pandas when asked for it (``to_pandas``)."""
    if "pandas" in sys.modules:
        return  # (already paid for)

    class _Unreachable:
        def find_spec(self, name: str, *_: object) -> None:
            if name == "pandas" or name.startswith("pandas."):
                raise ImportError(name)

    blocker = _Unreachable()
    sys.meta_path.insert(0, blocker)
    try:
        pa.lib._pandas_api.have_pandas  # noqa: B018 (the probe of array-like inputs)
        pa.array([0])  # (and of Python values: pandas' NA)
    except Exception:  # (a pyarrow without these: nothing to skip)
        pass
    finally:
        sys.meta_path.remove(blocker)


_skip_pandas_probe()

SCHEMA_VERSION: Final = "1"
SCHEMA_VERSION_KEY: Final = b"traceview.schema_version"

# --- phases and segment kinds: traceview.model.vocabulary's, imported above ----------------

# --- event kinds ----------------------------------------------------------------------------

KIND_OP: Final = "op"  # a framework operator on a host thread
KIND_RUNTIME: Final = "runtime"  # a CUDA/HIP runtime or driver call (kernel launch, memcpy call)
KIND_ANNOTATION: Final = "annotation"  # a user or framework region marker (record_function)
KIND_STEP: Final = "step"  # a training-step marker (ProfilerStep#N)
KIND_PYTHON: Final = "python"  # a Python stack frame (with_stack)
KIND_KERNEL: Final = "kernel"  # device kernel
KIND_MEMCPY: Final = "memcpy"  # device copy
KIND_MEMSET: Final = "memset"  # device memset
KIND_GPU_ANNOTATION: Final = "gpu_annotation"  # a region marker projected onto a device stream
KIND_INSTANT: Final = "instant"  # zero-duration marker
KIND_TRACE: Final = "trace"  # the profiler's own window / bookkeeping
KIND_OVERHEAD: Final = "overhead"  # profiler overhead records

EVENT_KINDS: Final = (
    KIND_OP,
    KIND_RUNTIME,
    KIND_ANNOTATION,
    KIND_STEP,
    KIND_PYTHON,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_GPU_ANNOTATION,
    KIND_INSTANT,
    KIND_TRACE,
    KIND_OVERHEAD,
)
#: Kinds that execute on a device (their time is device time).
DEVICE_ACTIVITY_KINDS: Final = (KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET)
#: Host kinds that nest into a call tree per thread.
HOST_TREE_KINDS: Final = (KIND_OP, KIND_RUNTIME, KIND_ANNOTATION, KIND_STEP, KIND_PYTHON)
#: Host kinds that only structure time (their own time is not an operator's).
STRUCTURAL_KINDS: Final = (KIND_ANNOTATION, KIND_STEP, KIND_PYTHON)

DEVICE_CPU: Final = "cpu"
DEVICE_GPU: Final = "gpu"
#: The memory table's device for a process's resident memory, sampled by collect at step
#: boundaries (framework-independent; not an allocator's figure)
DEVICE_RSS: Final = "rss"

COLLECTIVES: Final = (
    "allreduce",
    "allgather",
    "reduce_scatter",
    "broadcast",
    "alltoall",
    "send",
    "recv",
    "push",
    "pull",
    "barrier",
    "reduce",
    "gather",
    "scatter",
)

# --- events: one row per trace event ---------------------------------------------------------

RUN_ID: Final = "run_id"
RANK: Final = "rank"
HOST: Final = "host"
FRAMEWORK: Final = "framework"
DEVICE: Final = "device"
KIND: Final = "kind"
CAT: Final = "cat"
PID: Final = "pid"
TID: Final = "tid"
NAME: Final = "name"
OP: Final = "op"
PHASE: Final = "phase"
STEP: Final = "step"
TS_NS: Final = "ts_ns"
DUR_NS: Final = "dur_ns"
SELF_NS: Final = "self_ns"
BYTES: Final = "bytes"
COLLECTIVE: Final = "collective"
CORRELATION: Final = "correlation"
EVENT_ID: Final = "id"
PARENT: Final = "parent"
DEPTH: Final = "depth"
GROUP: Final = "group"  # a collective's process group, where the trace names it
#: a point-to-point call's peer as the trace states it: the rank inside the call's process group
#: (``c10d::send``'s destination, ``c10d::recv_``'s source), where the trace records it
PEER: Final = "peer"
#: an all-to-all's imbalance: the largest of its split sizes over their mean, the larger of the
#: input's and the output's (1.0: even), where the trace records the splits (Kineto's
#: ``In split size``/``Out split size``, c10d::alltoall_base_'s recorded split arguments)
SPLIT_IMBALANCE: Final = "split_imbalance"
#: A kernel's launch configuration as the trace writes it ("[80, 1, 1]"; null: not a kernel,
#: or the trace does not say).
GRID: Final = "grid"
BLOCK: Final = "block"

_DICT = pa.dictionary(pa.int32(), pa.string())

EVENTS_SCHEMA: Final = pa.schema(
    [
        pa.field(RUN_ID, _DICT, nullable=False),
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(HOST, _DICT),
        pa.field(FRAMEWORK, _DICT, nullable=False),
        pa.field(DEVICE, _DICT, nullable=False),
        pa.field(KIND, _DICT, nullable=False),
        pa.field(CAT, _DICT),
        pa.field(PID, pa.int64()),
        pa.field(TID, pa.int64()),
        pa.field(NAME, _DICT, nullable=False),
        pa.field(OP, _DICT),
        pa.field(PHASE, _DICT, nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(TS_NS, pa.int64(), nullable=False),
        pa.field(DUR_NS, pa.int64(), nullable=False),
        pa.field(SELF_NS, pa.int64()),
        pa.field(BYTES, pa.int64()),
        pa.field(COLLECTIVE, _DICT),
        pa.field(CORRELATION, pa.int64()),
        pa.field(EVENT_ID, pa.int64(), nullable=False),
        pa.field(PARENT, pa.int64()),
        pa.field(DEPTH, pa.int32()),
        pa.field(GROUP, _DICT),
        pa.field(PEER, pa.int32()),
        pa.field(GRID, _DICT),
        pa.field(BLOCK, _DICT),
        pa.field(SPLIT_IMBALANCE, pa.float64()),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)

#: What a parser hands to the core: trace events before classification. ``kind`` is set where
#: the format itself says it (an instant record) and otherwise left null: the core reads it off
#: the category with the rules.
#: ``correlation`` links a device activity to the host runtime call that launched it;
#: ``external_id`` links it to the host operator when no runtime call is in the trace;
#: ``scope`` names that operator where the trace says it instead (TensorFlow: the op's full name
#: on each kernel), so an unlinked device activity is classified as its operator would be.
#: ``step_group`` is the step an event belongs to where the profiler groups events into steps
#: itself without marking them (TensorFlow's ``group_id``): the raw material of the core's
#: ``step_groups`` pass (``traceview/normalize/step_inference.py``), which the events table does not keep.
EXTERNAL_ID: Final = "external_id"
SCOPE: Final = "scope"
STEP_GROUP: Final = "step_group"
RAW_SCHEMA: Final = pa.schema(
    [
        pa.field(KIND, _DICT),
        pa.field(CAT, _DICT),
        pa.field(NAME, _DICT, nullable=False),
        pa.field(PID, pa.int64()),
        pa.field(TID, pa.int64()),
        pa.field(TS_NS, pa.int64(), nullable=False),
        pa.field(DUR_NS, pa.int64(), nullable=False),
        pa.field(CORRELATION, pa.int64()),
        pa.field(EXTERNAL_ID, pa.int64()),
        pa.field(BYTES, pa.int64()),
        pa.field(COLLECTIVE, _DICT),
        pa.field(SCOPE, _DICT),
        pa.field(GROUP, _DICT),
        pa.field(STEP_GROUP, pa.int64()),
        pa.field(PEER, pa.int32()),
        pa.field(GRID, _DICT),
        pa.field(BLOCK, _DICT),
        pa.field(SPLIT_IMBALANCE, pa.float64()),
    ]
)

#: What a core layout pass (``normalize.LAYOUTS``) hands on: the raw events and, for the events
#: the pass made itself (step markers, phase spans), what each one is, stated: its kind, its
#: phase (null: none of its own), its canonical operator (null: named after the event) and, for
#: a step marker, its step number (null: numbered by its position). ``stated_kind`` is null on
#: the trace's own events, which the rules classify; the pass's events are never matched
#: against a rule (no pattern decodes a name the core invented). Parsers never write these
#: columns: a parser states no phase.
STATED_KIND: Final = "stated_kind"
STATED_PHASE: Final = "stated_phase"
STATED_OP: Final = "stated_op"
STATED_STEP: Final = "stated_step"
LAID_OUT_SCHEMA: Final = pa.schema(
    [
        *RAW_SCHEMA,
        pa.field(STATED_KIND, _DICT),
        pa.field(STATED_PHASE, _DICT),
        pa.field(STATED_OP, _DICT),
        pa.field(STATED_STEP, pa.int64()),
    ]
)

# --- steps: one row per (rank, step) -----------------------------------------------------------

START_NS: Final = "start_ns"
END_NS: Final = "end_ns"
WALL_NS: Final = "wall_ns"
COMM_TOTAL_NS: Final = "comm_total_ns"
COMM_EXPOSED_NS: Final = "comm_exposed_ns"
COMM_HIDDEN_FRACTION: Final = "comm_hidden_fraction"
TIMELINE: Final = "timeline"  # which clock the breakdown was measured on: cpu or gpu


def phase_ns(phase: str) -> str:
    """The steps-table column holding the exclusive time of ``phase``."""
    return f"{phase}_ns"


def host_bound_ns(phase: str) -> str:
    """The steps- and gpu-table column holding the device's wait for the host inside ``phase``
    (in the steps table: the part of ``phase_ns(phase)`` that is host-bound; null on CPU
    timelines)."""
    return f"host_bound_{phase}_ns"


STEPS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(TIMELINE, pa.string(), nullable=False),
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(END_NS, pa.int64(), nullable=False),
        pa.field(WALL_NS, pa.int64(), nullable=False),
        *(pa.field(phase_ns(p), pa.int64(), nullable=False) for p in BREAKDOWN_PHASES),
        pa.field(COMM_TOTAL_NS, pa.int64(), nullable=False),
        pa.field(COMM_EXPOSED_NS, pa.int64(), nullable=False),
        pa.field(COMM_HIDDEN_FRACTION, pa.float64(), nullable=False),
        *(pa.field(host_bound_ns(p), pa.int64()) for p in GPU_HOST_BOUND_PHASES),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)

# --- ops: per canonical operator and rank ----------------------------------------------------------

COUNT: Final = "count"
TOTAL_NS: Final = "total_ns"
MEAN_NS: Final = "mean_ns"
P50_NS: Final = "p50_ns"
P95_NS: Final = "p95_ns"

OPS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),  # null: outside every step (set-up, teardown)
        pa.field(DEVICE, pa.string(), nullable=False),
        pa.field(KIND, pa.string(), nullable=False),  # op, annotation (a region), kernel, memcpy...
        pa.field(PHASE, pa.string(), nullable=False),
        pa.field(OP, pa.string(), nullable=False),
        pa.field(NAME, pa.string(), nullable=False),  # the most frequent framework name
        pa.field(COUNT, pa.int64(), nullable=False),
        pa.field(TOTAL_NS, pa.int64(), nullable=False),
        pa.field(SELF_NS, pa.int64(), nullable=False),
        pa.field(MEAN_NS, pa.float64(), nullable=False),
        pa.field(P50_NS, pa.float64(), nullable=False),
        pa.field(P95_NS, pa.float64(), nullable=False),
        pa.field(BYTES, pa.int64()),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


# --- collectives: per rank, its collective calls (what cross-rank passes match) -------------------

SEQ: Final = "seq"
#: when the program issued the call: the start of the training thread's call that queued the
#: work a worker thread runs (gloo's ``gloo:all_reduce`` queued by ``c10d::allreduce_``); null
#: where the call is not run for another (then it is ``start_ns``)
ISSUED_NS: Final = "issued_ns"
#: the phase the program was in when it issued the call: that of the nearest region or operator
#: around the call with a phase other than comm (forward, backward, update, io, h2d; other: none)
ISSUED_IN: Final = "issued_in"
#: FSDP's unit (the ``(i)`` of ``FSDP::all_gather (i)`` / ``FSDP::post_backward_reduce (i)``
#: around the call): whose parameters an all-gather gathers or whose gradients a reduce-scatter
#: reduces; null outside FSDP
UNIT: Final = "unit"
#: an FSDP all-gather issued ahead of its unit (inside ``FSDP::forward_prefetch`` /
#: ``backward_prefetch``, or another unit's pre-forward/pre-backward); null outside FSDP
PREFETCHED: Final = "prefetched"
#: when the rank first used what an FSDP all-gather gathered: the start of its unit's next
#: ``FSDP::all_gather_copy_out (i)`` on the issuing thread (for a kernel: of the first kernel that
#: copy-out launched); null where the trace shows none
NEEDED_NS: Final = "needed_ns"

COLLECTIVES_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(DEVICE, pa.string(), nullable=False),
        pa.field(PID, pa.int64()),
        pa.field(TID, pa.int64()),  # the thread or stream the call ran on
        pa.field(NAME, pa.string(), nullable=False),  # the view: c10d::allreduce_, gloo:all_reduce
        pa.field(COLLECTIVE, pa.string(), nullable=False),
        pa.field(GROUP, pa.string()),  # process group, where the trace names it
        pa.field(
            SEQ, pa.int64(), nullable=False
        ),  # order of the call among the rank's (name, collective)
        pa.field(BYTES, pa.int64()),
        pa.field(START_NS, pa.int64(), nullable=False),  # when the call began to run
        pa.field(END_NS, pa.int64(), nullable=False),
        pa.field(ISSUED_NS, pa.int64()),
        pa.field(PEER, pa.int32()),
        pa.field(ISSUED_IN, pa.string()),
        pa.field(SPLIT_IMBALANCE, pa.float64()),
        pa.field(UNIT, pa.string()),
        pa.field(PREFETCHED, pa.bool_()),
        pa.field(NEEDED_NS, pa.int64()),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


# --- export: the tables and columns only ``export`` writes (views/export.py) ---------------------

VIEW: Final = "view"  # host: the call on a host thread; device: the kernel that carried it out
MATCHED: Final = "matched"
POSITION: Final = "position"
LAST_RANK: Final = "last_rank"
ARRIVAL_NS: Final = "arrival_ns"
LAST_ARRIVAL_NS: Final = "last_arrival_ns"
WAIT_NS: Final = "wait_ns"
TRANSFER_NS: Final = "transfer_ns"
QUEUED_NS: Final = "queued_ns"
SKEW_NS: Final = "skew_ns"
DIM: Final = "dim"
GROUP_RANKS: Final = "group_ranks"
RANKS: Final = "ranks"
CALLS_PER_STEP: Final = "calls_per_step"
BYTES_PER_STEP: Final = "bytes_per_step"
TOTAL_MS: Final = "total_ms"
EXPOSED_MS: Final = "exposed_ms"
HIDDEN_MS: Final = "hidden_ms"
WAIT_MS: Final = "wait_ms"
QUEUED_MS: Final = "queued_ms"
TRANSFER_MS: Final = "transfer_ms"
STAGE: Final = "stage"
COMPUTE_MS: Final = "compute_ms"
BUBBLE_MS: Final = "bubble_ms"
SCHEDULE: Final = "schedule"
MICROBATCHES: Final = "microbatches"

#: ``collectives.parquet`` as ``export`` writes it has every column of the run directory's
#: collectives table, ``view`` after ``device``, then these: what matching across ranks found
#: (on the view matching used; null where the call was left unmatched) and the call's group.
EXPORT_COLLECTIVES_SCHEMA: Final = pa.schema(
    [
        pa.field(VIEW, pa.string(), nullable=False),
        pa.field(MATCHED, pa.bool_(), nullable=False),  # matched with its group's other calls
        pa.field(POSITION, pa.int64()),  # its place among the step's calls of this view (0: first)
        pa.field(LAST_RANK, pa.int32()),  # the member that issued the call last
        pa.field(ARRIVAL_NS, pa.int64()),  # when this rank issued the call (the run's clock)
        pa.field(LAST_ARRIVAL_NS, pa.int64()),  # when the last member issued it
        pa.field(WAIT_NS, pa.int64()),  # inside the call before the last member issued it
        pa.field(TRANSFER_NS, pa.int64()),  # moving data: the rest of the call, less queued
        pa.field(QUEUED_NS, pa.int64()),  # behind its own worker (gloo): not wait, not transfer
        pa.field(SKEW_NS, pa.int64()),  # the last member's issue less the first's
        pa.field(DIM, pa.string()),  # the group's mesh dimension (mesh_tp: tp), null outside a mesh
        pa.field(GROUP_RANKS, pa.list_(pa.int32())),  # the group's ranks, where the run declares it
    ]
)

#: ``comm_by_group.parquet`` (``export``): one row per process group, phase the calls were
#: issued in and collective; ms per step, means over the group's ranks and the counted steps
#: (``report --json``'s ``comm_by_group``; wait + queued + transfer = total = exposed + hidden).
COMM_BY_GROUP_SCHEMA: Final = pa.schema(
    [
        pa.field(GROUP, pa.string()),  # the process group (null: not known)
        pa.field(DIM, pa.string()),  # its mesh dimension, null outside a mesh
        pa.field(RANKS, pa.list_(pa.int32())),  # its ranks, where the run declares it
        pa.field(PHASE, pa.string(), nullable=False),  # where the calls were issued
        pa.field(OP, pa.string(), nullable=False),  # the collective: allgather, send...
        pa.field(CALLS_PER_STEP, pa.float64(), nullable=False),
        pa.field(BYTES_PER_STEP, pa.int64()),  # null where the trace records no sizes
        pa.field(TOTAL_MS, pa.float64(), nullable=False),  # from issue to end, overlaps once
        pa.field(EXPOSED_MS, pa.float64(), nullable=False),  # nothing else of the rank ran
        pa.field(HIDDEN_MS, pa.float64(), nullable=False),  # behind compute
        pa.field(WAIT_MS, pa.float64(), nullable=False),  # waiting for the last member (or peer)
        pa.field(QUEUED_MS, pa.float64(), nullable=False),  # behind its own worker thread
        pa.field(TRANSFER_MS, pa.float64(), nullable=False),  # moving data
    ]
)

#: ``pipeline_stages.parquet`` (``export``, runs whose point-to-point calls form a pipeline): one
#: row per stage, stage 0 sending first; ms per step, means over the stage's ranks and the
#: counted steps (``report --json``'s ``pipeline.stages``).
PIPELINE_STAGES_SCHEMA: Final = pa.schema(
    [
        pa.field(STAGE, pa.int32(), nullable=False),
        pa.field(RANKS, pa.list_(pa.int32()), nullable=False),  # one per data-parallel replica
        pa.field(COMPUTE_MS, pa.float64(), nullable=False),  # forward + backward + update
        pa.field(BUBBLE_MS, pa.float64(), nullable=False),  # blocked on its neighbours
        pa.field(TRANSFER_MS, pa.float64(), nullable=False),  # of the bubble, its messages moving
        pa.field(SCHEDULE, pa.string(), nullable=False),  # the pipeline's: GPipe or 1F1B
        pa.field(MICROBATCHES, pa.float64(), nullable=False),  # the pipeline's, per step
    ]
)


# --- actions: per rank, the pipeline actions it ran ----------------------------------------------

ACTION: Final = "action"  # F (forward), B (backward), I and W (its input and weight halves)
MICROBATCH: Final = "microbatch"

#: torch.distributed.pipelining's actions (its ``PP:<stage><F|B|I|W><micro-batch>`` regions) on a
#: rank: which of the stages it holds ran when (what names a virtual stage's own work).
ACTIONS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(STAGE, pa.int32(), nullable=False),
        pa.field(ACTION, pa.string(), nullable=False),
        pa.field(MICROBATCH, pa.int32(), nullable=False),
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(END_NS, pa.int64(), nullable=False),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


# --- comm: per rank, its communication time as intervals, exposed or hidden -----------------------

EXPOSED: Final = "exposed"

#: The union of a rank's communication within its step windows, cut where it turns from exposed
#: (no compute at that instant: the breakdown's comm) to hidden; what cross-rank passes split
#: into waiting and transfer without reading events.
COMM_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(END_NS, pa.int64(), nullable=False),
        pa.field(EXPOSED, pa.bool_(), nullable=False),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


# --- segments: per rank, its critical timeline cut into exclusive segments ------------------------

#: Each step window of a rank as the sequence of its exclusive segments (the attribution rule
#: kept in time order, not summed): a segment per stretch of one phase, kind and operator (the
#: canonical op of the event that holds the time; null for a region's uncovered time and idle).
#: Per window the segments tile the window; their phases add up to the steps table's row. What
#: the critical path across ranks is built from (analysis/critical_path/).
SEGMENTS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(END_NS, pa.int64(), nullable=False),
        pa.field(PHASE, pa.string(), nullable=False),
        pa.field(KIND, pa.string(), nullable=False),
        pa.field(OP, pa.string()),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


#: One row per stretch of a step's critical path across ranks (analysis/critical_path/), in
#: time order per step: ``export`` writes it as critical_path.parquet. Per step the rows tile
#: the job's step (first rank's start to last rank's end); kind adds transfer and late_start to
#: the segment kinds (a late start has no phase).
CRITICAL_PATH_SCHEMA: Final = pa.schema(
    [
        pa.field(STEP, pa.int64()),
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(DUR_NS, pa.int64(), nullable=False),
        pa.field(PHASE, pa.string()),
        pa.field(KIND, pa.string(), nullable=False),
        pa.field(OP, pa.string()),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


# --- gpu: per rank and step window of a GPU timeline, device busy and idle time -----------------

BUSY_NS: Final = "busy_ns"
IDLE_DATA_NS: Final = "idle_data_ns"
IDLE_OTHER_NS: Final = "idle_other_ns"
SYNC_NS: Final = "sync_ns"
QUEUE_MAX: Final = "queue_max"
QUEUE_MEAN: Final = "queue_mean"


def device_ns(phase: str) -> str:
    """The gpu-table column holding the device time of ``phase``."""
    return f"device_{phase}_ns"


#: One row per (rank, step window) of a rank with device activity (analysis/gpu.py): the device's
#: busy time by phase and its gaps by what the training thread did meanwhile; busy + host-bound +
#: data + other = wall.
GPU_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(WALL_NS, pa.int64(), nullable=False),
        pa.field(BUSY_NS, pa.int64(), nullable=False),
        *(
            pa.field(device_ns(p), pa.int64(), nullable=False)
            for p in ATTRIBUTION_PRIORITY
            if p != IDLE
        ),
        *(pa.field(host_bound_ns(p), pa.int64(), nullable=False) for p in GPU_HOST_BOUND_PHASES),
        pa.field(IDLE_DATA_NS, pa.int64(), nullable=False),
        pa.field(IDLE_OTHER_NS, pa.int64(), nullable=False),
        pa.field(SYNC_NS, pa.int64(), nullable=False),
        pa.field(QUEUE_MAX, pa.int64(), nullable=False),
        pa.field(QUEUE_MEAN, pa.float64(), nullable=False),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)

# --- launches: per rank, kernel-launch statistics by phase and canonical operator --------------

KERNELS: Final = "kernels"
#: A kernel's launch delay (launch call start to kernel start) is queueing (its stream busy
#: with earlier work) plus launch latency (its stream idle, the kernel not yet started).
LATENCY_P50_NS: Final = "latency_p50_ns"  # launch latency: the stream idle part of the delay
LATENCY_P95_NS: Final = "latency_p95_ns"
QUEUE_P50_NS: Final = "queue_p50_ns"  # queueing: the stream busy part of the delay
QUEUE_P95_NS: Final = "queue_p95_ns"
DELAY_TOTAL_NS: Final = "delay_total_ns"  # the kernels' launch delays summed
QUEUE_TOTAL_NS: Final = "queue_total_ns"  # their queueing summed
DURATION_P50_NS: Final = "duration_p50_ns"
DURATION_P95_NS: Final = "duration_p95_ns"
OVERHEAD_P50_NS: Final = "overhead_p50_ns"  # the launch call's own duration
SHORT_KERNELS: Final = "short_kernels"  # kernels shorter than their launch call

#: Kernels launched by a runtime call inside the rank's steps, per step (null: the one window of
#: a trace without step markers): one row per (step, phase, op) (op "": unknown), one per (step,
#: phase) (op null) and one for all of the step's (phase and op null). A report reads the counted
#: steps' rows (``analysis.gpu.over_steps``).
LAUNCHES_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(PHASE, pa.string()),
        pa.field(OP, pa.string()),
        pa.field(KERNELS, pa.int64(), nullable=False),
        pa.field(LATENCY_P50_NS, pa.float64(), nullable=False),
        pa.field(LATENCY_P95_NS, pa.float64(), nullable=False),
        pa.field(QUEUE_P50_NS, pa.float64(), nullable=False),
        pa.field(QUEUE_P95_NS, pa.float64(), nullable=False),
        pa.field(DELAY_TOTAL_NS, pa.int64(), nullable=False),
        pa.field(QUEUE_TOTAL_NS, pa.int64(), nullable=False),
        pa.field(DURATION_P50_NS, pa.float64(), nullable=False),
        pa.field(DURATION_P95_NS, pa.float64(), nullable=False),
        pa.field(OVERHEAD_P50_NS, pa.float64(), nullable=False),
        pa.field(TOTAL_NS, pa.int64(), nullable=False),
        pa.field(SHORT_KERNELS, pa.int64(), nullable=False),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


# --- memory: per rank and device, the allocator's totals over time -------------------------------

ALLOCATED_BYTES: Final = "allocated_bytes"
RESERVED_BYTES: Final = "reserved_bytes"

#: What a parser hands over beside the events: one row per memory record (Kineto's ``[memory]``
#: instants), ``device`` named as the framework does (``cpu``, ``cuda:0``), ``allocated_bytes``
#: the allocator's total after the record, ``reserved_bytes`` its reserve (null where the
#: framework does not keep one: PyTorch's CPU allocator writes 0), ``bytes`` the change.
MEMORY_RAW_SCHEMA: Final = pa.schema(
    [
        pa.field(DEVICE, pa.string(), nullable=False),
        pa.field(PID, pa.int64()),
        pa.field(TID, pa.int64()),  # the thread that allocated or freed
        pa.field(TS_NS, pa.int64(), nullable=False),
        pa.field(ALLOCATED_BYTES, pa.int64()),
        pa.field(RESERVED_BYTES, pa.int64()),
        pa.field(BYTES, pa.int64()),
    ]
)

#: memory.parquet in a run directory: every rank's memory records, on the run's clock. Written
#: by ingest from the traces (not a cache: there is nothing to recompute it from).
MEMORY_SCHEMA: Final = pa.schema(
    [pa.field(RANK, pa.int32(), nullable=False), *MEMORY_RAW_SCHEMA],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)

# --- side inputs: what a rank's trace holds beside its events --------------------------------------


class SideInput(NamedTuple):
    """A per-rank input beside the events (memory records today): a parser hands its rows over
    as ``raw`` (``ParsedTrace.side[name]``); ingest puts them on the run's clock (``times``),
    adds the rank and writes every rank's rows to ``<name>.parquet`` (``stored``), which the
    per-rank analysis and the report's sections read by ``name``. A run ingested before the
    input existed has no such file: its rows are unknown, not empty. ``what``: how a warning
    names the rows."""

    name: str
    raw: pa.Schema
    stored: pa.Schema
    times: tuple[str, ...]
    what: str


#: Every side input, by name: adding one is a schema and an entry here, nothing in ingest, the
#: run directory or the run layer.
SIDE_INPUTS: Final = {
    side.name: side
    for side in (SideInput("memory", MEMORY_RAW_SCHEMA, MEMORY_SCHEMA, (TS_NS,), "memory records"),)
}

# --- memory_steps: per rank, device and step window, the memory figures ---------------------------

WHOLE: Final = "whole"  # the row covers the whole trace, not one step window
SAMPLES: Final = "samples"
START_BYTES: Final = "start_bytes"  # allocated when the window starts (the last record before)
END_BYTES: Final = "end_bytes"  # allocated when it ends
PEAK_BYTES: Final = "peak_bytes"  # the most allocated at any record in the window
PEAK_TS_NS: Final = "peak_ts_ns"
PEAK_PHASE: Final = "peak_phase"  # the phase of the host operator running at the peak
PEAK_OP: Final = "peak_op"  # that operator's name (untrusted)
RESERVED_PEAK_BYTES: Final = "reserved_peak_bytes"

MEMORY_STEPS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(DEVICE, pa.string(), nullable=False),
        pa.field(STEP, pa.int64()),
        pa.field(WHOLE, pa.bool_(), nullable=False),
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(END_NS, pa.int64(), nullable=False),
        pa.field(SAMPLES, pa.int64(), nullable=False),
        pa.field(START_BYTES, pa.int64()),
        pa.field(END_BYTES, pa.int64()),
        pa.field(PEAK_BYTES, pa.int64()),
        pa.field(PEAK_TS_NS, pa.int64()),
        pa.field(PEAK_PHASE, pa.string()),
        pa.field(PEAK_OP, pa.string()),
        pa.field(RESERVED_PEAK_BYTES, pa.int64()),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)


def all_null(n: int, type_: pa.DataType) -> pa.Array:
    """``pa.nulls(n, type_)`` on zeros the system has not handed out yet: a number column's
    data and validity (and a dictionary column's indices) are ``calloc``'d and never written,
    so they take no memory (``pa.nulls`` writes its zeros: 8 bytes a row for int64, 64 for the
    raw schema's usual missing columns). Other types: ``pa.nulls``."""
    if pa.types.is_dictionary(type_):
        indices = all_null(n, type_.index_type)
        return pa.DictionaryArray.from_arrays(indices, pa.array([], type_.value_type))
    if pa.types.is_integer(type_) or pa.types.is_floating(type_):
        data = pa.py_buffer(np.zeros(max(n * type_.bit_width // 8, 1), np.uint8))
        validity = pa.py_buffer(np.zeros(max((n + 7) // 8, 1), np.uint8))
        return pa.Array.from_buffers(type_, n, [validity, data], null_count=n)
    return pa.nulls(n, type_)


_EMPTY: dict[int, tuple[pa.Schema, pa.Table]] = {}


def empty(schema: pa.Schema) -> pa.Table:
    """``schema.empty_table()``, made once per schema (an Arrow table is immutable: one serves
    every caller; making it costs ~60 µs, paid several times a rank by the analyses)."""
    held = _EMPTY.get(id(schema))
    if held is None or held[0] is not schema:
        held = _EMPTY[id(schema)] = (schema, schema.empty_table())
    return held[1]


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select, order and cast ``table``'s columns to ``schema`` (missing nullable columns: null,
    ``all_null``)."""
    if table.schema.equals(schema, check_metadata=True):
        return table
    have = dict(zip(table.column_names, table.columns, strict=True))  # (by name: 5x faster)
    columns = []
    for field in schema:
        column = have.get(field.name)
        if column is not None:
            if column.type != field.type:
                column = column.cast(field.type)
        elif field.nullable:
            column = all_null(table.num_rows, field.type)
        else:
            raise ValueError(f"table lacks the required column {field.name!r}")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


# --- the step record: every step of the run and each rank's last calls (issue 49) ---------------
# (the format the ranks write: collectors/rankside_record.py; read by parsers/record.py)

CALLS: Final = "calls"  # calls the rank made in the step (collective and point-to-point)
IO_NS: Final = "io_ns"  # of the step, in data loading
COMM_NS: Final = "comm_ns"  # of the step, blocked in the collective calls it made (0: none seen)
SOURCE: Final = "source"  # a call's: "record" (traceview's wrapper) or "flight" (Flight Recorder)
FLAGS: Final = "flags"  # a call's: 1 it returned a handle (async), 2 it raised
STEP_NOW: Final = "step_now"
PHASE_NOW: Final = "phase_now"  # where the rank was: step, io, comm, checkpoint
PHASE_SINCE_NS: Final = "phase_since_ns"
PROGRESS_NS: Final = "progress_ns"  # its last step ended or call made or returned
CALLS_LOST: Final = "calls_lost"  # calls its ring no longer holds
END_STATE: Final = "end_state"  # ok, exception, signal; null: it never reached its exit handlers
END_DETAIL: Final = "end_detail"
#: (a rank's end: END_NS, as a step's and a call's)
#: JSON: its main thread's frames when it stopped [{file, line, function, code}]
STACK: Final = "stack"
STACK_REASON: Final = "stack_reason"  # stall, signal, exception
STACK_NS: Final = "stack_ns"  # when the stacks were taken: the rank was alive then
GROUP_NAMES: Final = "group_names"  # JSON: {number: name} of the groups its calls carry

SITE: Final = "site"  # a call's place in the job's own code (a Flight Recorder entry's frames)

RECORD_STEPS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(STEP, pa.int64(), nullable=False),
        pa.field(CALLS, pa.int64(), nullable=False),
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(END_NS, pa.int64(), nullable=False),
        pa.field(IO_NS, pa.int64(), nullable=False),
        pa.field(COMM_NS, pa.int64(), nullable=False),
    ]
)
RECORD_CALLS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(SOURCE, pa.string(), nullable=False),
        pa.field(GROUP, pa.string()),
        pa.field(SEQ, pa.int64(), nullable=False),  # the group's (0: point-to-point)
        pa.field(OP, pa.string(), nullable=False),
        pa.field(BYTES, pa.int64()),
        pa.field(STEP, pa.int64()),  # the rank's step when it began (null: not known)
        pa.field(START_NS, pa.int64(), nullable=False),
        pa.field(END_NS, pa.int64()),  # null: it had not returned
        pa.field(FLAGS, pa.int32(), nullable=False),
        pa.field(
            SITE, pa.string()
        ),  # where the job made it, "file:line in function" (null: not said)
    ]
)
RECORD_RANKS_SCHEMA: Final = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),
        pa.field(PID, pa.int64()),
        pa.field(STEP_NOW, pa.int64()),
        pa.field(PHASE_NOW, pa.string()),
        pa.field(PHASE_SINCE_NS, pa.int64()),
        pa.field(PROGRESS_NS, pa.int64()),
        pa.field(CALLS_LOST, pa.int64(), nullable=False),
        pa.field(END_STATE, pa.string()),
        pa.field(END_DETAIL, pa.string()),
        pa.field(END_NS, pa.int64()),
        pa.field(STACK_REASON, pa.string()),
        pa.field(STACK_NS, pa.int64()),
        pa.field(STACK, pa.string()),
        pa.field(GROUP_NAMES, pa.string()),
    ]
)
