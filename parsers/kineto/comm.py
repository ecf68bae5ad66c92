"""What communication calls' records say beyond their times: message sizes, process groups and
point-to-point peers, all-to-all split sizes; and the process groups a trace declares
(``distributedInfo.pg_config``)."""

from __future__ import annotations

from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import encode_ranks
from traceview.parsers.kineto.columns import _strings
from traceview.parsers.kineto.records import _Args, _as_int

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "Float": 4, "double": 8, "float64": 8, "Double": 8,
    "c10::Half": 2, "Half": 2, "half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2,
    "bfloat16": 2, "long int": 8, "int64": 8, "Long": 8, "int": 4, "int32": 4, "Int": 4,
    "short int": 2, "int16": 2, "Short": 2, "signed char": 1, "int8": 1, "Char": 1,
    "unsigned char": 1, "uint8": 1, "Byte": 1, "bool": 1, "Bool": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
}  # fmt: skip


def _comm_bytes(args: _Args) -> int | None:
    """Message size of a collective from ``In msg nelems``/``dtype`` or the input shapes."""
    if args.in_nelems is not None:
        size = _DTYPE_BYTES.get(args.dtype or "")
        count = _as_int(args.in_nelems)
        return count * size if size and count is not None else None
    if not args.input_dims or not args.input_type:
        return None
    try:
        dims = msgspec.json.decode(args.input_dims)
        types = msgspec.json.decode(args.input_type)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not dims or not types or not isinstance(dims, list) or not isinstance(types, list):
        return None
    size = _DTYPE_BYTES.get(types[0]) if isinstance(types[0], str) else None
    first = dims[0]
    if size is None or not isinstance(first, list) or not all(isinstance(d, int) for d in first):
        return None  # a tensor list or an unknown dtype: the size cannot be told
    count = 1
    for d in first:
        count *= d
    return count * size


#: Point-to-point calls whose recorded scalar arguments (``Concrete Inputs``, written with
#: ``record_shapes``) hold the peer, at this position: ``c10d::send(tensors, group, dst, tag)``,
#: ``c10d::recv_(tensors, group, src, tag)`` (the rank inside the call's group).
_PEER_ARGUMENT = {"c10d::send": 2, "c10d::recv_": 2}
_PEER_DECODER = msgspec.json.Decoder(list[str | int | float | None])


#: ``traceview collect``'s region around each collective call, naming its process group and a
#: point-to-point call's peer (``traceview.pg:<group>[:<peer>]``: collectors/rankside_groups.py).
GROUP_REGION = "traceview.pg:"


def _groups_and_peers(
    names: list[str | None], args: list[_Args], distinct: set[str | None]
) -> dict[str, pa.Array]:
    """Each event's process group and point-to-point peer: from its arguments (NCCL's
    ``Process Group Name``, c10d's recorded scalars) or, for traceview's own region, its name
    (``distinct``: the names there are)."""
    groups: list[str | None] = list(map(attrgetter("group"), args))
    peers = _peers(names, args, distinct)
    regions = {n for n in distinct if n and n.startswith(GROUP_REGION)}
    if regions:
        peers = peers or [None] * len(names)
        parsed = {}
        for name in regions:
            group, _, peer = name[len(GROUP_REGION) :].partition(":")
            parsed[name] = (group or None, int(peer) if peer.isdigit() and len(peer) < 10 else None)
        for i in compress(range(len(names)), map(regions.__contains__, names)):
            groups[i], peers[i] = parsed[names[i]]  # type: ignore[index]
    peer = pa.nulls(len(names), pa.int32()) if peers is None else pa.array(peers, pa.int32())
    return {S.GROUP: _strings(groups), S.PEER: peer}


#: All-to-alls whose recorded scalar arguments hold the split sizes, at these positions:
#: ``c10d::alltoall_base_(output, input, group, output_split_sizes, input_split_sizes, ...)``.
_SPLIT_ARGUMENTS = {"c10d::alltoall_base_": (3, 4)}
_SPLIT_DECODER = msgspec.json.Decoder(list[int] | str)
#: Most split sizes read from one call (one per rank of its group).
MAX_SPLITS = 1 << 16


def _imbalance(raw: msgspec.Raw | str | None) -> float | None:
    """max / mean of a list of split sizes (as JSON, or a string holding it: "[3, 4]"); None
    where there is no list, an empty one (an even split), or it is not sizes."""
    try:
        value: Any = _SPLIT_DECODER.decode(raw) if isinstance(raw, msgspec.Raw) else raw
        if isinstance(value, str):
            if not value.startswith("[") or len(value) > 16 * MAX_SPLITS:
                return None
            value = _SPLIT_DECODER.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_SPLITS:
        return None
    if any(v < 0 for v in value):
        return None
    total = sum(value)
    return max(value) * len(value) / total if total > 0 else None


def _split_imbalances(names: list[str | None], args: list[_Args], comm_names: set[str]) -> pa.Array:
    """Each all-to-all's split imbalance (schema.SPLIT_IMBALANCE) where its arguments record
    the splits: NCCL's ``In split size``/``Out split size``, or c10d's recorded split
    arguments (gloo, with ``record_shapes``); null elsewhere."""
    out: list[float | None] = [None] * len(names)
    if not comm_names:
        return pa.array(out, pa.float64())
    for i in compress(range(len(names)), map(comm_names.__contains__, names)):
        a = args[i]
        found = [_imbalance(a.in_split) if a.in_split else None,
                 _imbalance(a.out_split) if a.out_split else None]  # fmt: skip
        positions = _SPLIT_ARGUMENTS.get(names[i] or "")
        if positions and a.concrete_inputs:
            try:
                values = _PEER_DECODER.decode(a.concrete_inputs)
                found += [_imbalance(str(values[p])) for p in positions]
            except (msgspec.DecodeError, IndexError):
                pass
        known = [f for f in found if f is not None]
        out[i] = max(known) if known else None
    return pa.array(out, pa.float64())


def _peers(
    names: list[str | None], args: list[_Args], distinct: set[str | None]
) -> list[int | None] | None:
    """Each event's point-to-point peer, where its recorded arguments state it (else null;
    None: no event is a call that could state one)."""
    if not _PEER_ARGUMENT.keys() & distinct:
        return None
    peers: list[int | None] = [None] * len(names)
    for i in compress(range(len(names)), map(_PEER_ARGUMENT.__contains__, names)):
        raw = args[i].concrete_inputs
        if not raw:
            continue
        try:
            values = _PEER_DECODER.decode(raw)
            peer = _as_int(values[_PEER_ARGUMENT[names[i]]])  # type: ignore[index]
        except (msgspec.DecodeError, IndexError):
            continue
        if peer is not None and 0 <= peer < 1 << 31:
            peers[i] = peer
    return peers


#: Most process groups one trace's ``pg_config`` is read for (more: the rest is not read).
MAX_GROUPS = 4096


def read_pg_config(value: object) -> tuple[list[dict[str, str]], int]:
    """A trace's ``distributedInfo.pg_config`` as manifest entries ``{name, desc, ranks}``
    (ranks encoded), and how many entries were not usable."""
    if not isinstance(value, list):
        return [], 0
    groups: list[dict[str, str]] = []
    bad = 0
    for entry in value[:MAX_GROUPS]:
        if not isinstance(entry, dict):
            bad += 1
            continue
        name, ranks = entry.get("pg_name"), entry.get("ranks")
        if not isinstance(name, str | int) or not isinstance(ranks, list):
            bad += 1
            continue
        members = sorted({r for r in ranks if isinstance(r, int) and 0 <= r < 1 << 31})
        if len(members) != len(ranks):
            bad += 1
        desc = entry.get("pg_desc")
        groups.append(
            {
                "name": str(name),
                "desc": str(desc) if isinstance(desc, str | int) else "",
                "ranks": encode_ranks(members),
            }
        )
    return groups, bad + max(0, len(value) - MAX_GROUPS)
