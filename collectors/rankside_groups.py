"""Names each collective call's process group in the trace (PyTorch; standard library only).

gloo's events name neither the process group of a call nor a point-to-point call's peer, and a
job beyond data parallelism makes calls in several groups (a DeviceMesh's dimensions, pipeline
stages). While the profiler runs, each call of ``torch.distributed``'s collective and
point-to-point functions (and of the functional collectives DTensor and FSDP use) is wrapped in a
``record_function`` region named ``traceview.pg:<group name>`` (``...:<peer>`` for a
point-to-point call: the peer's rank inside the group), around the c10d call it makes. The
parser reads the region's name; nothing else changes. The group is resolved only while the
profiler runs; otherwise the wrapper calls straight through.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

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


def install(torch: Any) -> None:
    """Wrap the functions (once per process); a torch without them is left alone."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        c10d = dist.distributed_c10d
    except Exception:
        return
    enabled = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    record = torch.profiler.record_function
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

    def wrap(owner: Any, attr: str, label: Any) -> None:
        original = getattr(owner, attr, None)
        if original is None or not callable(original):
            return
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            return

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not active():
                return original(*args, **kwargs)
            try:
                name = label(signature.bind(*args, **kwargs).arguments)
            except Exception:
                name = None
            if name is None:
                return original(*args, **kwargs)
            with record(name):
                return original(*args, **kwargs)

        setattr(owner, attr, wrapped)
        if owner is c10d and getattr(dist, attr, None) is original:
            setattr(dist, attr, wrapped)

    for attr, peer_arg in _C10D.items():

        def label(arguments: dict[str, Any], peer_arg: str | None = peer_arg) -> str | None:
            peer = arguments.get(peer_arg) if peer_arg else None
            local = arguments.get(f"group_{peer_arg}") if peer_arg else None
            return c10d_name(
                arguments.get("group"),
                peer if isinstance(peer, int) else None,
                local if isinstance(local, int) else None,
            )

        wrap(c10d, attr, label)

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

    for attr in _FUNCTIONAL:
        wrap(funcol, attr, functional_label)
