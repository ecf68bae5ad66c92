"""A gloo job that leaves PyTorch Flight Recorder dumps behind, as a user's job does, with one
fault injected on a known rank at a known call (the ground truth, in ``truth.json``):

- ``--fault hang``: rank R never makes call K (it is stuck outside any collective, in a loop);
  the others, which issue their calls asynchronously from K on, wait in call K;
- ``--fault none``: every call made and complete.

(A call of another size is no case here: gloo aborts the process that receives it, before any
dump; NCCL's dumps of one are built in tests/integration/test_flight_dumps.py.)

Each rank makes ``--calls`` all-reduces (the group's calls 1..N), then, after a pause, dumps its
Flight Recorder as a pickle (``nccl_trace_rank_R``, PyTorch's own naming) and as JSON
(``fr-rankR.json``), writes a log line beside them and exits without waiting. Run under torchrun
with ``TORCH_FR_BUFFER_SIZE`` set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fault", choices=("hang", "none"), default="none")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--call", type=int, default=4)
    parser.add_argument("--calls", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    args.out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        truth = {"fault": args.fault, "rank": args.rank, "call": args.call, "world": world}
        (args.out / "truth.json").write_text(json.dumps(truth))
    pending = []
    for call in range(1, args.calls + 1):
        if args.fault == "hang" and rank == args.rank and call == args.call:
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # stuck: no collective from here on
                pass
            break
        work = dist.all_reduce(torch.ones(1000), async_op=True)
        if args.fault == "none" or call < args.call:
            work.wait()
        else:
            pending.append(work)  # (after the fault: never waited for)
    time.sleep(1.0)
    c10d = torch._C._distributed_c10d
    (args.out / f"nccl_trace_rank_{rank}").write_bytes(c10d._dump_fr_trace(True, True))
    text = c10d._dump_fr_trace_json(True, True)
    (args.out / f"fr-rank{rank}.json").write_text(text if isinstance(text, str) else text.decode())
    (args.out / f"rank{rank}.log").write_text(f"rank {rank} dumped its Flight Recorder\n")
    print(f"rank {rank} dumped", flush=True)
    os._exit(0)  # (the calls left pending would wait for the gloo timeout)


if __name__ == "__main__":
    main()
