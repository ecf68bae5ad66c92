"""An FSDP2 job (torch.distributed.fsdp.fully_shard) on CPU and gloo, one 1-D mesh named "dp".

  torchrun --standalone --nproc-per-node N fsdp.py --steps 10 --truth DIR

Four Linear layers (256 -> 512 -> 512 -> 512 -> 10), each its own FSDP unit, then the root.
Timers per rank (see _common): "step", "forward", "backward", "update", and "call" rows for each
collective issued (C.record_collectives: op, group, bytes, phase); per FSDP unit (``unit``: the
module's name, as FSDP's regions name it) "unshard" around each all-gather FSDP issues for it
(on CPU the all-gather is done when it returns) and "needed" when FSDP waits for the gathered
parameters (``wait_for_unshard``, before the unit's copy-out), with the phase of each.
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import _common as C
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup


def record_units(timers: C.Timers) -> None:
    """The "unshard" and "needed" rows (module docstring), by wrapping FSDP's own methods."""
    unshard, wait = FSDPParamGroup.unshard, FSDPParamGroup.wait_for_unshard

    def unit(group: Any) -> str:
        return group._module_fqn or "(root)"

    def timed_unshard(self: Any, *a: Any, **k: Any) -> Any:
        pending = self._all_gather_result is not None  # (already gathered: returns at once)
        t0 = time.perf_counter_ns()
        try:
            return unshard(self, *a, **k)
        finally:
            if not pending and self._all_gather_result is not None:
                t1 = time.perf_counter_ns()
                timers.add("unshard", t0, t1, unit=unit(self), phase=timers.phase)

    def timed_wait(self: Any, *a: Any, **k: Any) -> Any:
        if self._all_gather_result is not None:  # (else nothing was gathered to wait for)
            now = time.perf_counter_ns()
            timers.add("needed", now, now, unit=unit(self), phase=timers.phase)
        return wait(self, *a, **k)

    FSDPParamGroup.unshard = timed_unshard  # type: ignore[method-assign]
    FSDPParamGroup.wait_for_unshard = timed_wait  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--truth", required=True)
    parser.add_argument(
        "--prefetch", action="store_true",
        help="each unit's forward prefetches the next unit's all-gather (explicit prefetch)",
    )  # fmt: skip
    args = parser.parse_args()
    rank, world = C.start()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10),
    )  # fmt: skip
    units = [layer for layer in model if isinstance(layer, nn.Linear)]
    for layer in units:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if args.prefetch:
        for unit, after in itertools.pairwise(units):
            unit.set_modules_to_forward_prefetch([after])  # type: ignore[operator]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(rank)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    timers = C.Timers()
    C.record_collectives(timers)
    record_units(timers)
    for step in range(args.steps):
        timers.step = step
        with timers.timed("step"):
            optimizer.zero_grad()
            with timers.timed("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with timers.timed("backward"):
                loss.backward()
            with timers.timed("update"):
                optimizer.step()
    groups = [C.group_entry(dist.group.WORLD, None), C.group_entry(mesh.get_group("dp"), "dp")]
    C.write_truth(args.truth, "fsdp", rank, world, args, groups, timers)
    C.finish()


if __name__ == "__main__":
    main()
