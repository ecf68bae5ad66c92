"""A ChainerMN job written the usual way, with a Trainer (no traceview import, no timers):
``chainermn.create_multi_node_optimizer`` (its update all-reduces the gradients), the dataset
scattered over the ranks, ``StandardUpdater`` and ``training.Trainer`` for a fixed number of
iterations.

    mpirun -np 2 python trainer.py [ITERATIONS]
"""

from __future__ import annotations

import os
import sys

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import chainer  # noqa: E402
import chainer.links as L  # noqa: E402
import chainermn  # noqa: E402
import numpy as np  # noqa: E402
from chainer import training  # noqa: E402


class MLP(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(64, 128)
            self.l2 = L.Linear(128, 10)

    def forward(self, x: chainer.Variable) -> chainer.Variable:
        return self.l2(chainer.functions.relu(self.l1(x)))


def main(iterations: int) -> int:
    comm = chainermn.create_communicator("naive")
    model = L.Classifier(MLP())
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    optimizer.setup(model)
    rng = np.random.default_rng(comm.rank)
    data = None
    if comm.rank == 0:
        n = 32 * iterations * comm.size
        data = chainer.datasets.TupleDataset(
            rng.standard_normal((n, 64), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)
        )
    data = chainermn.scatter_dataset(data, comm, shuffle=False)
    it = chainer.iterators.SerialIterator(data, 32, shuffle=False)
    updater = training.updaters.StandardUpdater(it, optimizer)
    trainer = training.Trainer(updater, (iterations, "iteration"))
    trainer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 12))
