"""The attribution rule's priority levels (``LEVELS``, ``LEVEL``), highest first, and the tables
that map an event's phase, a gap and the training thread's time on GPU runs onto them.

The per-step breakdown: every instant of a step counted once, by the highest-priority phase.

Per rank, time is cut into step windows and every instant of a window goes to the highest-priority
phase active at that instant on the rank's critical timeline:

    forward | backward | update  >  h2d  >  io  >  comm  >  (region fill)  >  other
        >  (host-bound h2d > forward > backward > update)  >  idle

The critical timeline is, on CPU runs, the training thread: at each instant the innermost event
on it decides; on GPU runs, the device: kernels and copies (which carry the phase of the host
call that launched them), plus the training thread's data loading, and below every device
level and communication, the host's compute and copy time (the training thread inside an
operator or region of forward, backward, update or h2d, or another thread running such an
operator): the device waits for the host to launch that phase's work, which is that phase's
time, "host-bound", recorded in the steps table on its own (``host_bound_<phase>_ns``) as well
as inside the phase's column. Communication on any thread or stream of the rank also counts. Time on the training thread that no operator covers (Python
between operators, a wait without an event of its own) counts as the enclosing region's phase
("region fill": inside a forward/backward/optimizer region, or between two operators of the same
phase), but only when no communication is in flight then: a training thread that stops while a
collective runs is waiting for it, which is communication, not compute.
"""

from __future__ import annotations

import numpy as np

from traceview.model import schema as S

# Priority levels, highest first: (name, the phase its time reports as). The explicit levels
# follow schema.ATTRIBUTION_PRIORITY; "fill" levels are a compute region's uncovered time
# (Python between the region's operators), which ranks below communication.
LEVELS = (
    (S.FORWARD, S.FORWARD),
    (S.BACKWARD, S.BACKWARD),
    (S.UPDATE, S.UPDATE),
    (S.H2D, S.H2D),
    (S.IO, S.IO),
    (S.COMM, S.COMM),
    ("forward fill", S.FORWARD),
    ("backward fill", S.BACKWARD),
    ("update fill", S.UPDATE),
    (S.OTHER, S.OTHER),
    # GPU timelines only: the device idles while the host is inside a compute or copy operator
    # or region (launching that phase's work). Below every device level (an unlinked kernel is
    # "other" and still device time) and communication on any host thread.
    *((f"host-bound {p}", p) for p in S.GPU_HOST_BOUND_PHASES),
)
LEVEL_PHASES = tuple(phase for _, phase in LEVELS)
LEVEL = {name: i for i, (name, _) in enumerate(LEVELS)}
_COMM_LEVEL = LEVEL[S.COMM]
_GAP = -1
_FILL = {p: LEVEL[f"{p} fill"] for p in S.COMPUTE_PHASES}
#: The host-bound level of each phase that has one (GPU timelines).
HOST_BOUND_LEVEL = {p: LEVEL[f"host-bound {p}"] for p in S.GPU_HOST_BOUND_PHASES}
# Level of an event's time by its phase code (schema.EVENT_PHASES order): as an operator's own
# time (explicit), and as a region marker's uncovered time (compute regions fill; other: none).
_EXPLICIT = np.array([LEVEL[p] for p in S.EVENT_PHASES])
_REGION = np.array([_FILL.get(p, LEVEL[p]) if p != S.OTHER else _GAP for p in S.EVENT_PHASES])
# A gap between two segments takes their level when they agree: compute as region fill, data
# loading, copies and communication as themselves; "other" never spreads.
_FILL_OF = {
    **{LEVEL[p]: _FILL[p] for p in S.COMPUTE_PHASES},
    **{_FILL[p]: _FILL[p] for p in S.COMPUTE_PHASES},
    **{LEVEL[p]: LEVEL[p] for p in (S.H2D, S.IO, S.COMM)},
}
# On GPU runs the training thread's data loading and communication keep their levels; its
# compute and copy time (operators and region fill) is host-bound; the rest does not count.
_GPU_HOST_LEVEL = np.full(len(LEVELS), _GAP, np.int64)
for _name, _phase in LEVELS:
    if _name in (S.IO, S.COMM):
        _GPU_HOST_LEVEL[LEVEL[_name]] = LEVEL[_name]
    elif _phase in HOST_BOUND_LEVEL and not _name.startswith("host-bound"):
        _GPU_HOST_LEVEL[LEVEL[_name]] = HOST_BOUND_LEVEL[_phase]
# The levels must keep the attribution rule's order, fill ranking just below communication.
assert [n for n, _ in LEVELS if "fill" not in n and "host-bound" not in n] == [
    p for p in S.ATTRIBUTION_PRIORITY if p != S.IDLE
], "LEVELS out of step with schema.ATTRIBUTION_PRIORITY"
assert min(HOST_BOUND_LEVEL.values()) > LEVEL[S.OTHER], "host-bound must rank below all else"
