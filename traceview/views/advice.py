"""What to try, in the words of the run's framework: the advice under a cause (``cause_advice``,
``late_start_advice``) and the GPU verdict's (``gpu_advice``). The verdict is the analysis's;
only its remedy is said in the framework's own terms (a TensorFlow job is not told to raise
DataLoader's num_workers), and a run of no known framework gets the remedy without an API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from traceview.model import vocabulary as S
from traceview.model.escape import safe
from traceview.model.results import Cause


@dataclass(frozen=True)
class Idioms:
    """A framework's way to do each remedy."""

    overlap: str  # communication overlapped with compute
    loader: str  # data loaded in parallel ...
    prefetch: str  # ... and ahead of the step
    fuse: str  # fewer, larger kernels (compilation, graph capture)
    fused_update: str  # the optimizer's kernels fused
    h2d: str  # the batch copied to the device ahead of the step
    allocator: str = ""  # more on a caching allocator that calls the driver inside the step

    @property
    def loading(self) -> str:
        """Data loaded in parallel and ahead of the step."""
        return f"{self.loader}, or {self.prefetch}"


GENERIC = Idioms(
    overlap="overlap communication with backward",
    loader="load data in more worker processes or threads",
    prefetch="prefetch the next batch while the step computes",
    fuse="compile the step or capture it as a graph",
    fused_update="use an optimizer that updates many tensors per kernel",
    h2d="copy the next batch to the device while the step computes",
)

IDIOMS = {
    "pytorch": Idioms(
        overlap="overlap communication with backward (DDP's gradient buckets, bucket_cap_mb)",
        loader="use more DataLoader workers (num_workers)",
        prefetch="prefetch the next batch while the step computes",
        fuse="torch.compile or CUDA graphs",
        fused_update="use a fused/foreach optimizer or CUDA graphs",
        h2d="pin the batch in host memory and copy it with non_blocking=True",
        allocator=(
            ", drop torch.cuda.empty_cache() from the loop, or set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        ),
    ),
    "tensorflow": Idioms(
        overlap=(
            "break the gradients' all-reduce into packs that overlap the updates "
            "(tf.distribute.experimental.CommunicationOptions(bytes_per_pack=...))"
        ),
        loader="read and map the input in parallel (num_parallel_calls=tf.data.AUTOTUNE)",
        prefetch="end the input pipeline with .prefetch(tf.data.AUTOTUNE)",
        fuse="XLA (jit_compile=True)",
        fused_update="compile the update with XLA (jit_compile=True)",
        h2d="prefetch the batches to the device (tf.data.experimental.prefetch_to_device)",
    ),
    "jax": Idioms(
        overlap="jit the whole step, so that XLA schedules the collectives beside the compute",
        loader="load data in more worker processes or threads",
        prefetch="prefetch the next batches onto the devices (jax.device_put ahead of the step)",
        fuse="jit larger functions (the whole step, not its pieces)",
        fused_update="jit the update with the step (optax's update inside the jitted step)",
        h2d="prefetch the next batches onto the devices (jax.device_put ahead of the step)",
    ),
    "mxnet": Idioms(
        overlap=(
            "more parameter servers (DMLC_NUM_SERVER) or gradient compression "
            "(kvstore.set_gradient_compression)"
        ),
        loader="decode in more threads (ImageRecordIter's preprocess_threads; Gluon: num_workers)",
        prefetch="prefetch the next batch while the step computes (PrefetchingIter)",
        fuse="hybridize the model (hybridize(static_alloc=True, static_shape=True))",
        fused_update="aggregate the update's kernels (MXNET_OPTIMIZER_AGGREGATION_SIZE)",
        h2d="copy the next batch to the device while the step computes",
    ),
    "chainer": Idioms(
        overlap=(
            "overlap communication with the next step (ChainerMN's "
            "create_multi_node_optimizer(..., double_buffering=True), pure_nccl communicator)"
        ),
        loader="load with a MultiprocessIterator (n_processes) instead of a SerialIterator",
        prefetch="prefetch the next batch while the step computes (MultiprocessIterator)",
        fuse="chainer.static_graph on the model's forward",
        fused_update="fewer, larger parameters: Chainer's update launches kernels per parameter",
        h2d="copy the next batch to the device while the step computes",
    ),
}


def idioms(framework: str | None) -> Idioms:
    """The remedies in the words of ``framework`` (a run's: "pytorch", "tensorflow+pytorch"
    for traces of several; one of several or none known: the words without an API)."""
    return IDIOMS.get(framework or "", GENERIC)


#: A runtime call of the device's allocator, and a runtime call at all (the names segments of
#: host work that is not a launch carry: analysis/attribution/segments.py).
ALLOCATOR = re.compile(r"(?i)^(cuda|hip|cu)\w*(Malloc|Free|Alloc)")
RUNTIME_CALL = re.compile(r"^(cuda|hip|cu)[A-Z]")


def gpu_advice(phase: str, framework: str | None) -> str | None:
    """What to try when the device waits for the host in ``phase`` ("data": for the data
    loader), None for a phase without a remedy of its own."""
    said = idioms(framework)
    return {
        S.UPDATE: said.fused_update,
        S.FORWARD: f"launch fewer, larger kernels: a larger batch, {said.fuse}",
        S.BACKWARD: f"launch fewer, larger kernels: a larger batch, {said.fuse}",
        S.H2D: said.h2d,
        "data": said.loading,
    }.get(phase)


def cause_advice(cause: Cause, framework: str | None) -> str | None:
    """What to look at or try for the cause, by its kind (and phase), in ``framework``'s
    words."""
    said = idioms(framework)
    rank = f"rank {cause.rank}" if cause.rank is not None else "the ranks"
    does, its = ("does", "its") if cause.rank is not None else ("do", "their")
    if cause.kind == "late_start":
        return late_start_advice(cause, framework, rank, does, its)
    if cause.kind == "idle":
        return (
            f"look at what keeps {rank} waiting inside its steps outside every operator (a "
            "sleep, a barrier or synchronize, another process on its cores)"
        )
    if cause.kind == "dispatch":
        return (
            "give each scheduled function more work than its dispatch costs (several steps in a "
            "loop inside it), and the coordinator cores of its own"
        )
    if cause.kind == "transfer":
        return (
            f"{said.overlap}, fewer and larger calls, or a faster link "
            "(`traceview scaling --link-gbps`)"
        )
    if cause.kind == "host_bound" and cause.op and ALLOCATOR.search(cause.op):
        return (
            f"the caching allocator calls the driver ({safe(cause.op, 40)}) inside the step: "
            f"keep tensor shapes steady from step to step{said.allocator}"
        )
    if cause.kind == "host_bound" and cause.op and RUNTIME_CALL.match(cause.op):
        return (
            f"the host is inside {safe(cause.op, 40)}, not launching work: find what calls it "
            "every step (the Timeline of `traceview tui` shows where)"
        )
    if cause.kind in ("host_bound", "launch"):
        return gpu_advice(cause.phase or "", framework) or gpu_advice(S.FORWARD, framework)
    if cause.kind == "io" or cause.phase == S.IO:
        return (
            said.loading
            + (f"; find why {rank} loads slower than the others" if cause.rank is not None
               and cause.change.startswith("balance:") else "")
        )  # fmt: skip
    if cause.phase == S.H2D:
        return said.h2d
    op = f" ({safe(cause.op, 40)} the most)" if cause.op else ""
    if cause.stage is not None and cause.change.startswith("balance:"):
        return (
            f"stage {cause.stage}'s {cause.phase}{op} takes longer than the other stages': "
            f"move layers from stage {cause.stage} to its neighbours so that the stages take "
            "alike (more micro-batches shrink the bubble they wait in, not the stage)"
        )
    if cause.change.startswith("balance:"):
        return (
            f"find why {rank}'s {cause.phase}{op} takes longer than the others': more data or "
            "longer sequences on it, uneven expert routing, a slower device or a busier host"
        )
    return None


def late_start_advice(cause: Cause, framework: str | None, rank: str, does: str, its: str) -> str:
    """What to look at for a late start, by where the late rank was meanwhile (its largest
    piece, ``Cause.before``): idling, data loading, its update or communication ending its
    previous step, or time outside every step marker."""
    timeline = "the Timeline of `traceview tui` shows it"
    first = cause.before[0] if cause.before else None
    if first is None or first.kind == "between_steps":
        return (
            f"look at what {rank} {does} between {its} steps, outside every step marker (data "
            "loading outside the loop body, checkpoints, logging, garbage collection, a host "
            f"synchronize): {timeline}"
        )
    if first.kind == "idle":
        return (
            f"{rank} idles outside every operator before {its} next step (a sleep, a barrier or "
            f"synchronize, logging, garbage collection, another process on its cores): {timeline}"
        )
    if first.phase == S.IO:
        return f"{rank} is still loading data when the others start: {idioms(framework).loading}"
    op = f" ({safe(first.op, 40)} the most)" if first.op else ""
    return (
        f"{rank} is still in {its} previous step's {first.phase}{op} when the others start: "
        f"find why it takes longer there than on the others; {timeline}"
    )
