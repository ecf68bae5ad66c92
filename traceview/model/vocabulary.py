"""The names the schema's columns hold that a view needs (phases, segment kinds), apart from
the Arrow types: ``schema`` re-exports every one, and a view that renders a finished report
imports them from here without loading pyarrow."""

from __future__ import annotations

from typing import Final

# --- phases ---------------------------------------------------------------------------------

IO: Final = "io"
H2D: Final = "h2d"
FORWARD: Final = "forward"
BACKWARD: Final = "backward"
UPDATE: Final = "update"
COMM: Final = "comm"
OTHER: Final = "other"
IDLE: Final = "idle"

#: Phases an event can carry (idle is a property of time, not of an event).
EVENT_PHASES: Final = (IO, H2D, FORWARD, BACKWARD, UPDATE, COMM, OTHER)
#: The exclusive breakdown of a step, in report order.
BREAKDOWN_PHASES: Final = (IO, H2D, FORWARD, BACKWARD, UPDATE, COMM, OTHER, IDLE)
#: Phases that can be "the bottleneck" of a step.
BOTTLENECK_PHASES: Final = (IO, H2D, FORWARD, BACKWARD, UPDATE, COMM)
COMPUTE_PHASES: Final = (FORWARD, BACKWARD, UPDATE)
#: The one attribution rule: an instant of a step goes to the first of these active then
#: (compute > h2d > io > comm > other > idle; docs/design.md).
ATTRIBUTION_PRIORITY: Final = (FORWARD, BACKWARD, UPDATE, H2D, IO, COMM, OTHER, IDLE)

#: What a segment of a rank's timeline is: time the rank computed (host operators: CPU
#: timelines, and the host's data loading on GPU ones), a kernel or copy ran on the device, the
#: device waited for the host to launch work (host-bound: the host inside an operator; launch:
#: inside the runtime call that launches a kernel or copy), communication ran with nothing above
#: it, or nothing ran (idle). The critical path across ranks adds its own kinds (transfer, late
#: start) where communication and step entry are explained by other ranks.
SEGMENT_COMPUTE: Final = "compute"
SEGMENT_KERNEL: Final = "kernel"
SEGMENT_HOST_BOUND: Final = "host_bound"
SEGMENT_LAUNCH: Final = "launch"
SEGMENT_COMM: Final = "comm"
SEGMENT_IDLE: Final = "idle"
SEGMENT_KINDS: Final = (
    SEGMENT_COMPUTE,
    SEGMENT_KERNEL,
    SEGMENT_HOST_BOUND,
    SEGMENT_COMM,
    SEGMENT_IDLE,
    SEGMENT_LAUNCH,
)

#: Phases whose host time can leave the device waiting (host-bound time, docs/design.md
#: section 2): on GPU timelines part of the phase's exclusive time, also recorded alone.
GPU_HOST_BOUND_PHASES: Final = (H2D, FORWARD, BACKWARD, UPDATE)
