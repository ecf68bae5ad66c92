"""Bus bandwidth: what each link of a collective carries against the message (``BUS_FACTOR``,
as nccl-tests defines it), and the rate a call moved at during its transfer."""

from __future__ import annotations

#: Bus bandwidth: what each link carries against the message, as nccl-tests defines it, for a
#: group of n ranks.
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_bandwidth_gbps(op: str, ranks: int, size: int | None, transfer_ns: float) -> float | None:
    """Gb/s each link moved during the transfer (not the wait), where the size is known."""
    factor = BUS_FACTOR.get(op)
    if factor is None or not size or transfer_ns <= 0 or ranks < 2:
        return None
    return size * 8 / transfer_ns * factor(ranks)  # bits per ns = Gb/s
