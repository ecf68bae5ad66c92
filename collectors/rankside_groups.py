"""Names each collective call's process group in the trace (PyTorch; standard library only).

gloo's events name neither the process group of a call nor a point-to-point call's peer, and a
job beyond data parallelism makes calls in several groups (a DeviceMesh's dimensions, pipeline
stages). While the profiler runs, each call of ``torch.distributed``'s collective and
point-to-point functions (and of the functional collectives DTensor and FSDP use) is wrapped in a
``record_function`` region named ``traceview.pg:<group name>`` (``...:<peer>`` for a
point-to-point call: the peer's rank inside the group), around the c10d call it makes. The
parser reads the region's name; nothing else changes. The group is resolved only while the
profiler runs.

The same wrappers feed the rank's step record (``rankside_record``), profiled or not: each
outermost call's op, group, bytes, start and end (point-to-point calls carry no sequence number:
only collectives must match across a group's ranks).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from .rankside_record import ASYNC, FAILED, StepRecord, op_index

#: The region's name prefix (parsers/kineto/comm.py reads it).
PREFIX = "traceview.pg:"

#: torch.distributed's functions that make one call in one group (``group``), and the argument
#: naming a point-to-point call's peer as a global rank.
_C10D = {
    "all_reduce": None,
    "all_gather": None,
    "all_gather_into_tensor": None,
    "all_gather_single": None,  # (FSDP2's)
    "all_gather_coalesced": None,
    "all_reduce_coalesced": None,
    "reduce_scatter": None,
    "reduce_scatter_tensor": None,
    "reduce_scatter_single": None,  # (FSDP2's)
    "all_to_all": None,
    "all_to_all_single": None,
    "broadcast": None,
    "reduce": None,
    "gather": None,
    "scatter": None,
    "barrier": None,
    "send": "dst",
    "recv": "src",
    "isend": "dst",
    "irecv": "src",
}
#: The functional collectives (DTensor, FSDP2's tensor-parallel paths): ``group`` is a group,
#: a name, a DeviceMesh or a (mesh, dimension) pair.
_FUNCTIONAL = (
    "all_reduce",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "broadcast",
    "all_reduce_coalesced",
)


def install(torch: Any, record: Callable[[], StepRecord | None] = lambda: None) -> None:
    """Wrap the functions (once per process); a torch without them is left alone. ``record``:
    the rank's step record, made on first use (None: not recorded)."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        c10d = dist.distributed_c10d
    except Exception:
        return
    enabled = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    record_region = torch.profiler.record_function
    if getattr(c10d, "_traceview_groups", False):
        return
    setattr(c10d, "_traceview_groups", True)  # noqa: B010  (once per process)

    def active() -> bool:
        if enabled is None:
            return False
        try:
            return bool(enabled())
        except Exception:
            return False

    def c10d_name(group: Any, peer: int | None, local: int | None) -> str | None:
        if group is None:
            group = c10d._get_default_group() if c10d.is_initialized() else None
        name = getattr(group, "group_name", None)
        if not isinstance(name, str):
            return None
        if local is None and peer is not None:
            try:
                local = c10d.get_group_rank(group, peer)
            except Exception:
                local = None
        return PREFIX + name if local is None else f"{PREFIX}{name}:{local}"

    depth = threading.local()  # (a call inside a wrapped call is not another call)
    named: dict[int, tuple[Any, str | None]] = {}  # id(group) -> (group, its name)

    def wrap(owner: Any, attr: str, label: Any, group_name: Any, p2p: bool = False) -> None:
        original = getattr(owner, attr, None)
        if original is None or not callable(original):
            return
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            return
        params = list(signature.parameters)
        group_at = params.index("group") if "group" in params else -1
        op = op_index(attr)

        def argument(args: tuple[Any, ...], kwargs: dict[str, Any], at: int) -> Any:
            if at < 0:
                return None
            return (
                kwargs[params[at]]
                if params[at] in kwargs
                else (args[at] if at < len(args) else None)
            )

        def begin(args: tuple[Any, ...], kwargs: dict[str, Any], rec: StepRecord) -> int:
            group = argument(args, kwargs, group_at)
            # (a group object lives as long as the job; a (mesh, dim) pair is made per call)
            key = None if isinstance(group, (tuple, list)) else id(group)
            if key is None or key not in named:
                try:
                    found = (group, group_name(group))
                except Exception:
                    found = (group, None)
                if key is None:
                    name = found[1]
                else:
                    named[key] = found
            if key is not None:
                name = named[key][1]
            return rec.call_begin(
                op, rec.group(name or "?"), _nbytes(argument(args, kwargs, 0)), p2p
            )

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if getattr(depth, "level", 0):
                return original(*args, **kwargs)
            rec = record()
            slot = -1
            if rec is not None:
                try:
                    slot = begin(args, kwargs, rec)
                except Exception:
                    slot = -1
            depth.level = 1
            flags = FAILED
            try:
                if not active():
                    result = original(*args, **kwargs)
                else:
                    try:
                        name = label(signature.bind(*args, **kwargs).arguments)
                    except Exception:
                        name = None
                    if name is None:
                        result = original(*args, **kwargs)
                    else:
                        with record_region(name):
                            result = original(*args, **kwargs)
                flags = ASYNC if hasattr(result, "wait") else 0
                return result
            finally:
                depth.level = 0
                if slot >= 0 and rec is not None:
                    rec.call_end(slot, flags)

        setattr(owner, attr, wrapped)
        if owner is c10d and getattr(dist, attr, None) is original:
            setattr(dist, attr, wrapped)

    def c10d_group(group: Any) -> str | None:
        if group is None:
            group = c10d._get_default_group() if c10d.is_initialized() else None
        name = getattr(group, "group_name", None)
        return name if isinstance(name, str) else None

    for attr, peer_arg in _C10D.items():

        def label(arguments: dict[str, Any], peer_arg: str | None = peer_arg) -> str | None:
            peer = arguments.get(peer_arg) if peer_arg else None
            local = arguments.get(f"group_{peer_arg}") if peer_arg else None
            return c10d_name(
                arguments.get("group"),
                peer if isinstance(peer, int) else None,
                local if isinstance(local, int) else None,
            )

        wrap(c10d, attr, label, c10d_group, p2p=peer_arg is not None)

    try:
        import torch.distributed._functional_collectives as funcol
    except Exception:
        return

    def functional_label(arguments: dict[str, Any]) -> str | None:
        group = arguments.get("group")
        if group is None:
            return None
        name = funcol._resolve_group_name(group, arguments.get("tag", ""))
        return PREFIX + name if isinstance(name, str) else None

    def functional_group(group: Any) -> str | None:
        name = funcol._resolve_group_name(group, "")
        return name if isinstance(name, str) else None

    for attr in _FUNCTIONAL:
        wrap(funcol, attr, functional_label, functional_group)


def _nbytes(tensor: Any) -> int:
    """A call's size: its first argument's bytes (a tensor, or a list of tensors)."""
    try:
        if isinstance(tensor, (list, tuple)):
            return sum(t.numel() * t.element_size() for t in tensor)
        return int(tensor.numel() * tensor.element_size()) if tensor is not None else 0
    except Exception:
        return 0
