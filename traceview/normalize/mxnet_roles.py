"""Which process of an MXNet parameter-server job (ps-lite KVStore) a trace is, from its
operators alone (``mxnet_engine.lay_out`` asks): a worker pushes to and pulls from the servers
(``KVStoreDist…`` operators); a server marks no step, has no forward, backward, data loading or
communication of its own, and runs only sums of the workers' pushes, optimizer updates and
engine bookkeeping."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from traceview.model import schema as S

#: A ps-lite worker's push and pull operators (KVStoreDistDefaultStoragePushPull...).
DIST_KVSTORE = "KVStoreDist"
# A server's own operators beside the optimizer's updates and the engine's bookkeeping: the sums
# of the workers' pushes of a key (synchronous mode merges them before one update).
_SUM = re.compile(r"^(BinaryOpKernel|ElementwiseSum|elemwise_add|_plus|_Plus|add_n|_grad_add)$")
_PHASE_CODES = {p: i for i, p in enumerate(S.EVENT_PHASES)}
_OWN_WORK = [_PHASE_CODES[p] for p in (S.FORWARD, S.BACKWARD, S.COMM, S.IO, S.H2D)]


def pushes_to_servers(names: Sequence[Any]) -> bool:
    """Whether a trace with these distinct operator names is a ps-lite worker's."""
    return any(str(name).startswith(DIST_KVSTORE) for name in names)


def server_of(
    names: Sequence[Any],
    name: np.ndarray,
    own: np.ndarray,
    is_step: np.ndarray,
    is_op: np.ndarray,
    bookkeeping: np.ndarray,
) -> dict[str, int] | None:
    """What a server's trace shows (None: the trace is not a server's), per event: ``name``
    codes into ``names`` (-1: none), ``own`` its phase code (-1: none), whether it ``is_step``
    marker, ``is_op`` and engine ``bookkeeping``. ``sums``: the merges of synchronous mode (an
    asynchronous server applies each push at once); ``updates``: the optimizer's operators."""
    if is_step.any() or not is_op.any() or np.isin(own, _OWN_WORK).any():
        return None
    summed = is_op & np.array([bool(_SUM.match(str(n))) for n in names] + [False])[name]
    update = is_op & (own == _PHASE_CODES[S.UPDATE])
    if not (summed | update).any() or (is_op & ~(summed | update | bookkeeping)).any():
        return None
    return {"sums": int(summed.sum()), "updates": int(update.sum())}
