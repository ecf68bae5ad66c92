"""One process, many devices: an XSpace's events cut into one rank per device.

TensorFlow's mirrored strategies and JAX drive all of a host's devices from one process, and
their profile is one XSpace per host: one plane per device (a GPU's streams, a TPU's ops) beside
the host's threads. Each device is a rank of the run. Which events are a device's:

- the events of its plane (``/device:GPU:4``: kernels and copies, and xprof's ``Steps`` line);
- on CPU devices (JAX's host-platform devices), the XLA ops the host's threads ran for it
  (their ``device_ordinal``), and what runs inside them on the same thread;
- TensorFlow's private threads of a GPU (``tf_gpu_private_4``), and any host thread whose
  launches (``correlation_id``) all reach that one device;
- TensorFlow on CPU devices names each replica's ops ``replica_N/...`` (replica 0 unscoped).

The rest of the host's work (the Python thread, tf.data, the runtime) is shared by the devices:
it is read once, with the host's first device. Each device's steps are its own ``Steps`` line
where xprof derived one, else the host's step markers; both sit on a thread of the device's own
(``STEPS_TID``), so every device's rank is read the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.parsers import ParsedTrace

#: The thread of a device's step markers, and the process of a CPU device's XLA ops
STEPS_TID = -(1 << 40)
CPU_DEVICE_PID = 1 << 30
_DEVICE_PLANE = re.compile(r"^/device:([A-Za-z_]+):(\d+)$")
_GPU_PRIVATE = re.compile(r"^tf_gpu_private_(\d+)(?:/|$)")
_REPLICA = re.compile(r"(?:^|/)replica_(\d+)/")
COPY_CATS = ("tf_memcpy", "tf_memset")


def device_of_plane(name: str) -> str | None:
    """``/device:GPU:4`` -> ``GPU:4``; None for a host plane or a plane of no device."""
    match = _DEVICE_PLANE.match(name)
    return f"{match.group(1)}:{int(match.group(2))}" if match else None


def gpu_private(line: str) -> int | None:
    """``tf_gpu_private_4/123`` -> 4: the thread TensorFlow keeps for that GPU's launches."""
    match = _GPU_PRIVATE.match(line)
    return int(match.group(1)) if match else None


def replica_of(name: str) -> int | None:
    """``gradient_tape/replica_2/MatMul:MatMul`` -> 2 (a mirrored strategy's replica scope)."""
    match = _REPLICA.search(name)
    return int(match.group(1)) if match else None


def _order(device: str) -> tuple[str, int]:
    kind, _, number = device.rpartition(":")
    return (kind, int(number) if number.isdigit() else 0)


@dataclass
class Devices:
    """The devices of one XSpace that are ranks, and which events are whose."""

    names: list[str]  # in order (kind, number)
    of_row: np.ndarray  # per event: index into names (-1: the host's shared work)
    host_marker: np.ndarray  # per event: a host step marker (every device gets a copy)
    step_line: np.ndarray  # per event: a device's own step (xprof's Steps line)
    left_out: dict[str, int]  # devices that are no rank (copies only): their events, by device
    # per event: the XLA program execution it belongs to (-1: none): a host's call of the
    # program and each device's ops of it share it
    run: np.ndarray | None = None

    @property
    def several(self) -> bool:
        return len(self.names) > 1


def find_devices(
    labels: pa.Array,
    kinds: pa.Array,
    line_device: dict[tuple[int, int], str],
    pid: np.ndarray,
    tid: np.ndarray,
    correlation: np.ndarray,
) -> Devices:
    """Which device each event is (``labels``: what the parser read of each event itself, null
    where it names none; ``kinds``: its category), threads attached by their launches (``line_device``: threads named
    for a device; ``correlation``: -1 where none), and which devices are ranks: those with work
    other than copies."""
    encoded = pc.dictionary_encode(labels)  # (the distinct labels: a few)
    named = set(encoded.dictionary.to_pylist())
    known = sorted(named | set(line_device.values()), key=_order)
    index = {d: i for i, d in enumerate(known)}
    numbers = np.asarray([index[d] for d in encoded.dictionary.to_pylist()] + [-1], np.int64)
    code = numbers[encoded.indices.fill_null(len(named)).to_numpy(zero_copy_only=False)]
    is_step = pc.equal(kinds, "tf_step").to_numpy(zero_copy_only=False)
    step_line = is_step & (code >= 0)
    host_marker = is_step & (code < 0)
    # threads: named for a device, else every launch reaching one device
    thread = pid * (1 << 32) + tid  # (xprof's pids and tids are small)
    lines = {(int(p) << 32) + int(t): index[d] for (p, t), d in line_device.items()}
    launched = correlation >= 0
    device_side = launched & (code >= 0)
    host_side = launched & (code < 0)
    if device_side.any() and host_side.any():
        target = dict(
            zip(correlation[device_side].tolist(), code[device_side].tolist(), strict=True)
        )
        reach: dict[int, set[int]] = {}
        for key, corr in zip(
            thread[host_side].tolist(), correlation[host_side].tolist(), strict=True
        ):
            if corr in target:
                reach.setdefault(key, set()).add(target[corr])
        for key, devices in reach.items():
            if len(devices) == 1 and key not in lines:
                lines[key] = devices.pop()
    if lines:
        free = (code < 0) & ~host_marker
        keys = thread[free]
        attached = np.fromiter((lines.get(k, -1) for k in keys.tolist()), np.int64, len(keys))
        code[np.flatnonzero(free)] = attached
    # devices with work other than copies and step lines are ranks
    copies = pc.is_in(kinds, pa.array(sorted(COPY_CATS))).to_numpy(zero_copy_only=False)
    working = np.unique(code[(code >= 0) & ~copies & ~step_line])
    ranks = [known[i] for i in working.tolist()]
    renumber = np.full(len(known) + 1, -1, np.int64)
    renumber[working] = np.arange(len(working))
    left_out = {}
    for i, device in enumerate(known):
        if device not in ranks:
            count = int(((code == i) & ~step_line).sum())
            if count:
                left_out[device] = count
    return Devices(ranks, renumber[code], host_marker, step_line, left_out)


def one_device(
    parsed: ParsedTrace, devices: Devices, device: str, host_pid: int | None
) -> ParsedTrace:
    """``parsed`` (the whole XSpace, every event) cut to ``device``'s rank (module doc)."""
    events = parsed.events
    at = devices.names.index(device)
    mine = devices.of_row == at
    first = at == 0
    own_steps = mine & devices.step_line
    markers = own_steps if own_steps.any() else devices.host_marker
    work = mine & ~devices.step_line
    if first:  # the host's shared work, once
        work |= (devices.of_row < 0) & ~devices.host_marker & ~devices.step_line
    steps = events.filter(pa.array(markers))
    if not own_steps.any():
        steps = _stretched(steps, events, devices, mine)
    pid_value = host_pid if host_pid is not None else 0
    steps = steps.set_column(
        steps.schema.get_field_index(S.PID),
        S.PID,
        pa.array([pid_value] * steps.num_rows, pa.int64()),
    )
    steps = steps.set_column(
        steps.schema.get_field_index(S.TID),
        S.TID,
        pa.array([STEPS_TID] * steps.num_rows, pa.int64()),
    )
    kept = pa.concat_tables([events.filter(pa.array(work)), steps])
    order = pc.sort_indices(kept, sort_keys=[(S.TS_NS, "ascending")])
    # the labels of this rank's own threads only (each of 1,024 device ranks holding every
    # thread's label and every device's name made the manifest grow with their square)
    pairs = np.stack([kept.column(c).fill_null(0).to_numpy() for c in (S.PID, S.TID)], axis=1)
    present = {f"{p}/{t}" for p, t in np.unique(pairs, axis=0).tolist()}
    threads = {key: label for key, label in parsed.threads.items() if key in present}
    threads[f"{pid_value}/{STEPS_TID}"] = f"steps of {device}"
    meta = dict(parsed.meta)
    meta["device"] = device
    meta["devices_in_process"] = len(devices.names)
    side = {}
    for name, table in parsed.side.items():
        if name == "memory" and S.DEVICE in table.column_names:
            on = pc.equal(pc.utf8_lower(table.column(S.DEVICE)), device.lower())
            if first:  # the host's own allocators (cpu) with the first device
                on = pc.or_(
                    on, pc.invert(pc.match_substring_regex(table.column(S.DEVICE), r":\d+$"))
                )
            table = table.filter(on)
        side[name] = table
    return ParsedTrace(
        path=parsed.path,
        framework=parsed.framework,
        events=kept.take(order),
        rank=None,
        world_size=None,
        host=parsed.host,
        meta=meta,
        threads=threads,
        notes=parsed.notes,
        bytes_read=parsed.bytes_read if first else 0,
        lost_bytes=parsed.lost_bytes,
        skipped=dict(parsed.skipped),
        layout=parsed.layout,
        infer_steps=parsed.infer_steps,
        process_names=dict(parsed.process_names),
        side=side,
    )


def _stretched(steps: pa.Table, events: pa.Table, devices: Devices, mine: np.ndarray) -> pa.Table:
    """The host's step markers, each stretched to the end of the device's work of that step:
    its ops of the program executions the host called inside the marker (an XLA program runs
    behind the host's call of it: JAX dispatches asynchronously), as a GPU's step ends with the
    last kernel its step launched."""
    run = devices.run
    if run is None or steps.num_rows == 0:
        return steps
    ts = events.column(S.TS_NS).to_numpy()
    end = ts + events.column(S.DUR_NS).to_numpy()
    called = (devices.of_row < 0) & (run >= 0)  # the host's calls of a program
    ran = mine & (run >= 0)
    if not called.any() or not ran.any():
        return steps
    # each execution's last op on this device, and where the host called it
    last: dict[int, int] = {}
    for r, e in zip(run[ran].tolist(), end[ran].tolist(), strict=True):
        last[r] = max(last.get(r, e), e)
    calls = sorted(zip(ts[called].tolist(), run[called].tolist(), strict=True))
    starts = steps.column(S.TS_NS).to_numpy()
    durations = steps.column(S.DUR_NS).to_numpy().copy()
    call_ts = np.asarray([c[0] for c in calls], np.int64)
    for i, (start, dur) in enumerate(zip(starts.tolist(), durations.tolist(), strict=True)):
        lo, hi = np.searchsorted(call_ts, [start, start + dur])
        ends = [last[calls[k][1]] for k in range(int(lo), int(hi)) if calls[k][1] in last]
        if ends and max(ends) > start + dur:
            durations[i] = max(ends) - start
    at = steps.schema.get_field_index(S.DUR_NS)
    return steps.set_column(at, steps.schema.field(at), pa.array(durations, pa.int64()))
