"""ChainerMN data parallelism that fails on purpose (CPU, MPI, mpirun): issue 49's ground truth
for a framework other than PyTorch. The fault is on rank --rank at job step --step (the loop's
index, from 0); the job writes what it injected to TRUTH/fault.json before it starts.

  mpirun -np N python faulty_chainer.py --fault KIND [--rank R --step K] [--steps N] --truth DIR

Each step: a batch from an iterator (``next``, then ``concat_examples``), forward and backward
of a small MLP, then the multi-node optimizer's update: its first only broadcasts the
parameters (``bcast_data``, call 1 of the communicator); every later one averages the gradients
(``multi_node_mean_grad``, an MPI all-reduce: call K + 1 at step K, from step 1 on).
Faults (KIND):
- hang-io: the rank's iterator takes --hang-s (default 600) to hand over the batch of step K;
  MPI has no timeout: the launcher's (``mpirun --timeout``) ends the job, as a scheduler's
  time limit would;
- raise: the rank raises RuntimeError after its backward of step K.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import chainermn  # noqa: E402
import numpy as np  # noqa: E402

FAULTS = ("none", "hang-io", "raise")


class Batches(chainer.iterators.SerialIterator):
    """A serial iterator whose batch ``hang_at`` takes ``hang_s`` to hand over."""

    def __init__(self, dataset: object, batch: int, hang_at: int, hang_s: float) -> None:
        super().__init__(dataset, batch, repeat=True, shuffle=False)
        self.handed, self.hang_at, self.hang_s = 0, hang_at, hang_s

    def __next__(self) -> list:
        if self.handed == self.hang_at:
            time.sleep(self.hang_s)
        self.handed += 1
        return super().__next__()

    next = __next__


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=FAULTS, required=True)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hang-s", type=float, default=600.0)
    parser.add_argument("--truth", type=Path, required=True)
    args = parser.parse_args()
    comm = chainermn.create_communicator("naive")
    rank, world = comm.rank, comm.size
    if rank == 0:
        args.truth.mkdir(parents=True, exist_ok=True)
        truth = {"fault": args.fault, "rank": args.rank, "step": args.step, "world": world}
        (args.truth / "fault.json").write_text(json.dumps(truth))
    faulty = args.fault != "none" and rank == args.rank
    model = L.Classifier(chainer.Sequential(L.Linear(32, 64), F.relu, L.Linear(64, 10)))
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    optimizer.setup(model)
    rng = np.random.default_rng(rank)
    data = [
        (rng.standard_normal(32).astype(np.float32), np.int32(rng.integers(10))) for _ in range(256)
    ]
    hang_at = args.step if faulty and args.fault == "hang-io" else -1
    batches = Batches(data, 16, hang_at, args.hang_s)
    for step in range(args.steps):
        x, t = chainer.dataset.concat_examples(next(batches))
        loss = model(x, t)
        model.cleargrads()
        loss.backward()
        if faulty and args.fault == "raise" and step == args.step:
            raise RuntimeError(f"injected fault at step {step}")
        optimizer.update()
        time.sleep(0.01)
    print(f"rank {rank} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
