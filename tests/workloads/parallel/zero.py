"""A DeepSpeed ZeRO job on CPU (gloo): a 4-layer MLP trained with ZeRO stage 1, 2 or 3, profiled
with Python frames (with_stack), as a user profiling DeepSpeed would, one trace per rank.

With stage 3 and no persistent parameters every layer's parameters are all-gathered in forward
(the module hooks' fetch_sub_module) and the gradients reduce-scattered at the end of backward;
the optimizer step all-reduces the gradient norm.

    DS_ACCELERATOR=cpu python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        zero.py OUT --stage 3 --steps 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    config = {
        "train_batch_size": 8 * dist.get_world_size(),
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": args.stage, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    x = torch.randn(8, 256)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = str(args.out / f"rank-{dist.get_rank()}.pt.trace.json")
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=True,
        schedule=schedule(wait=0, warmup=1, active=args.steps),
        on_trace_ready=lambda p: p.export_chrome_trace(trace),
    ) as prof:
        for _ in range(args.steps + 1):
            loss = engine(x).sum()
            engine.backward(loss)
            engine.step()
            prof.step()


if __name__ == "__main__":
    main()
