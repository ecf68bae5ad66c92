"""Streaming reader for Chrome-trace JSON (``{"traceEvents": [...]}`` or a bare ``[...]``).

Traces reach gigabytes, so the file is never decoded in one piece: the events array is cut into
chunks of a few megabytes at ``}, {`` boundaries and each chunk is decoded on its own by the
caller's typed decoder. A cut is valid exactly when the chunk decodes: a boundary inside a string
or a nested object leaves an unterminated string or unbalanced brackets, which no JSON decoder
accepts, so such a cut is simply moved to the next candidate.

Plain and gzip files are read the same way. A file that ends early (a rank killed mid-write) keeps
every complete event before the cut; the reader says how many bytes were lost.

Memory is bounded by the events really there, not by what the bytes claim: gzip is inflated a
block at a time (a small file of compressed padding inflates to gigabytes), and a stretch of
``EVENT_LIMIT`` bytes without an event boundary (one absurd event, padding, an endless string)
ends the read there, keeping every event before it. JSON nested deeper than the decoder's
recursion allows is damage like any other malformed JSON: the event holding it is lost.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import zlib
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

import msgspec
import numpy as np

from traceview.model.errors import BadInput
from traceview.parsers.json_fault import Fault, locate

T = TypeVar("T")

CHUNK_BYTES = 4 << 20
_BLOCK_BYTES = 2 << 20
#: The most bytes read without finding an event boundary (or the end of the header or trailer):
#: no real event comes near it, and it bounds the reader's buffer.
EVENT_LIMIT = 64 << 20
#: Nesting past this depth is damage (msgspec's decoder recurses; real events nest < 10 deep).
_DEPTH_LIMIT = 256
_GZIP_MAGIC = b"\x1f\x8b"
_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_RECOVERY_TRIES = 64
# What may follow the events array: more top-level keys, or the end of the document.
_TRAILER = re.compile(rb"\s*(,\s*\"|\}\s*\Z)")
_NOT_SPACE = re.compile(rb"\S")


@dataclass
class StreamState:
    """What the byte stream under the JSON looked like."""

    bytes_read: int = 0
    compressed: bool = False
    ended_early: str | None = None  # why the byte stream stopped before its end


@dataclass
class ChromeTraceInfo:
    """Everything around the events: top-level keys and how the read went."""

    header: dict[str, Any] = field(default_factory=dict)
    trailer: dict[str, Any] = field(default_factory=dict)
    stream: StreamState = field(default_factory=StreamState)
    lost_bytes: int = 0  # bytes that held no complete event (truncation or corruption)
    damage: str | None = None  # what was wrong with the JSON, if anything
    truncated: bool = False  # the file ends inside the events array (its writer died)
    stopped: str | None = None  # why the read stopped before the end of the file
    header_damage: str | None = None  # why the keys before the events did not read

    @property
    def top_level(self) -> dict[str, Any]:
        return {**self.header, **self.trailer}

    def then(self, later: ChromeTraceInfo) -> ChromeTraceInfo:
        """This part's info followed by that of the part after it (``ChromeTraceReader``'s
        ``part``): as one read of both."""
        return ChromeTraceInfo(
            header=self.header,
            trailer=later.trailer,
            stream=StreamState(
                self.stream.bytes_read + later.stream.bytes_read,
                self.stream.compressed,
                later.stream.ended_early,
            ),
            lost_bytes=self.lost_bytes + later.lost_bytes,
            damage=self.damage or later.damage,
            truncated=later.truncated,
            stopped=self.stopped or later.stopped,
            header_damage=self.header_damage,
        )

    def require_events(self, path: Path, rows: int, counts: Mapping[str, int]) -> None:
        """One clear error when the trace held no timed event (``counts``: records by type)."""
        if rows:
            return
        if counts:
            raise BadInput(
                f"{path}: the trace holds no timed events (only {', '.join(sorted(counts))} records)"
            )
        if self.damage:
            raise BadInput(f"{path}: no complete event before the damage ({self.damage})")
        raise BadInput(f"{path}: the trace holds no events")

    def damage_warning(self, path: Path, kept: int) -> str | None:
        """What a damaged (cut or corrupt) trace lost, for the notes; None when it was whole."""
        if self.stopped:
            return f"{path.name}: {self.stopped}: kept {kept} events; the rest of the file was not read"
        if not self.damage:
            return None
        if self.truncated:
            return (
                f"{path.name}: trace damaged ({self.damage}): kept {kept} events from the first "
                f"{self.stream.bytes_read - self.lost_bytes:,} bytes; lost {self.lost_bytes:,} "
                "bytes after the last complete event (the process probably died while writing)"
            )
        return (
            f"{path.name}: trace damaged ({self.damage}): kept {kept} events; lost "
            f"{self.lost_bytes:,} bytes around the damage"
        )


def is_gzip(head: bytes) -> bool:
    return head[:2] == _GZIP_MAGIC


def read_head(path: Path, size: int = 1 << 16) -> bytes:
    """The first ``size`` decompressed bytes of ``path`` (for sniffing)."""
    with path.open("rb") as f:
        raw = f.read(size)
    if not is_gzip(raw):
        return raw
    try:
        return zlib.decompressobj(wbits=31).decompress(raw, size)
    except zlib.error as exc:
        raise BadInput(f"{path}: corrupt gzip data ({exc})") from None


def _byte_blocks(
    path: Path, state: StreamState, start: int = 0, stop: int | None = None
) -> Iterator[bytes]:
    """Decompressed blocks of ``path``; a damaged or cut gzip stream ends the iteration early.
    ``start``/``stop``: only the bytes [start, stop) of a plain (not gzip) file.

    Gzip is inflated by a helper thread (zlib releases the GIL), one block ahead of the caller.
    """
    with path.open("rb") as f:
        if start or stop is not None:
            f.seek(start)
            left = (stop - start) if stop is not None else None
            while left is None or left > 0:
                block = f.read(_BLOCK_BYTES if left is None else min(_BLOCK_BYTES, left))
                if not block:
                    return
                left = None if left is None else left - len(block)
                state.bytes_read += len(block)
                yield block
            return
        first = f.read(_BLOCK_BYTES)
        if not is_gzip(first):
            block = first
            while block:
                state.bytes_read += len(block)
                yield block
                block = f.read(_BLOCK_BYTES)
            return
        state.compressed = True
        if len(first) < _BLOCK_BYTES:  # the whole file is in hand: no reading to overlap
            yield from _inflated(f, first, _BLOCK_BYTES, state)
            return
        ahead: queue.Queue[bytes | None] = queue.Queue(maxsize=2)
        done = threading.Event()
        worker = threading.Thread(target=_inflate, args=(f, first, ahead, state, done), daemon=True)
        worker.start()
        try:
            while (inflated := ahead.get()) is not None:
                yield inflated
        finally:
            done.set()
            while worker.is_alive():  # unblock a producer waiting on a full queue
                with contextlib.suppress(queue.Empty):
                    ahead.get_nowait()
                worker.join(timeout=0.01)


def _inflate(
    f: BinaryIO,
    first: bytes,
    out: queue.Queue[bytes | None],
    state: StreamState,
    stop: threading.Event,
) -> None:
    try:
        for block in _inflated(f, first, _BLOCK_BYTES, state, stop):
            out.put(block)
    finally:
        out.put(None)


def _inflated(
    f: BinaryIO,
    compressed: bytes,
    size: int,
    state: StreamState,
    stop: threading.Event | None = None,
) -> Iterator[bytes]:
    """The decompressed blocks, ``size`` bytes at most each, of the gzip stream in ``f`` that
    begins with ``compressed``, member after member; a damaged or cut stream ends them and says
    why in ``state`` (``stop``: set when the reader needs no more)."""
    decompressor = zlib.decompressobj(wbits=31)
    while stop is None or not stop.is_set():
        try:
            # bounded output: 2 MB of compressed padding would inflate to 2 GB at once
            block = decompressor.decompress(compressed, size)
        except zlib.error as exc:
            state.ended_early = f"corrupt gzip data ({exc})"
            return
        if block:
            state.bytes_read += len(block)
            yield block
        if decompressor.eof:
            rest = decompressor.unused_data
            if rest.strip(b"\0"):  # another gzip member follows
                decompressor = zlib.decompressobj(wbits=31)
                compressed = rest
                continue
        elif decompressor.unconsumed_tail or len(block) == size:
            compressed = decompressor.unconsumed_tail  # more output from the same input
            continue
        compressed = f.read(size)
        if not compressed:
            break
    if not decompressor.eof and (stop is None or not stop.is_set()):
        tail = decompressor.flush()
        if tail:
            state.bytes_read += len(tail)
            yield tail
        state.ended_early = "the gzip stream ends before its end marker"


def _deep_position(data: Any) -> int:
    """Where brackets first nest past ``_DEPTH_LIMIT`` in ``data`` (strings not told apart:
    only used to place damage already found)."""
    raw = np.frombuffer(data, np.uint8)
    depth = 0
    for start in range(0, len(raw), 1 << 20):  # a block at a time: the piece may be 64 MB
        part = raw[start : start + (1 << 20)]
        step = (part == 0x5B).astype(np.int8) + (part == 0x7B)
        step -= (part == 0x5D).astype(np.int8) + (part == 0x7D)
        running = np.cumsum(step, dtype=np.int64) + depth
        deep = np.flatnonzero(running > _DEPTH_LIMIT)
        if len(deep):
            return start + int(deep[0])
        depth = int(running[-1])
    return 0


class _TooDeep(msgspec.DecodeError):
    """JSON nested past the decoder's recursion, at ``position`` (the first bracket past
    ``_DEPTH_LIMIT``)."""

    def __init__(self, position: int):
        super().__init__(f"JSON nested more than {_DEPTH_LIMIT} deep")
        self.position = position


def _checked(decode: Callable[[Any], T]) -> Callable[[Any], T]:
    """``decode``, with invalid UTF-8 and nesting too deep for the decoder raised as
    ``msgspec.DecodeError`` (decoders raise UnicodeDecodeError or RecursionError for them, or
    DecodeError, by release); where the fault lies is found by ``_fault``, never read from an
    error's message."""

    def checked(data: Any) -> T:
        try:
            return decode(data)
        except RecursionError:
            raise _TooDeep(_deep_position(data)) from None
        except UnicodeDecodeError as exc:
            raise msgspec.DecodeError("invalid UTF-8") from exc

    return checked


def _fault(exc: msgspec.DecodeError, data: Any) -> Fault:
    """Where and how ``data``, which the decoder refused with ``exc``, is malformed."""
    if isinstance(exc, _TooDeep):
        return Fault("malformed", exc.position, f"JSON nested more than {_DEPTH_LIMIT} deep")
    try:
        fault = locate(data)
    except RecursionError:  # deeper than Python's own reader goes
        return Fault(
            "malformed", _deep_position(data), f"JSON nested more than {_DEPTH_LIMIT} deep"
        )
    return fault or Fault("malformed", None, "not readable by the decoder")


def _after_array(buf: bytearray, position: int | None) -> int:
    """Index in ``buf`` just past the ``]`` that closed the array msgspec complained after."""
    return buf.rfind(b"]", 0, (position or 0) + 1) + 1


def _decode_object(text: bytes) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(text)
    except RecursionError:
        raise msgspec.DecodeError(f"JSON nested more than {_DEPTH_LIMIT} deep") from None
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError("invalid UTF-8") from exc
    return value if isinstance(value, dict) else {}


def decode_records(data: Any) -> tuple[list[Any], int]:
    """A chunk decoded without a schema (a parser's slow path). A number beyond a float's range
    (``1e999``) fails the whole array, so then the records are decoded one by one: returns the
    records that read and how many did not. Malformed JSON still raises ``DecodeError``."""
    try:
        value = msgspec.json.decode(data)
        return (value if isinstance(value, list) else []), 0
    except msgspec.ValidationError:  # "Number out of range": that record only
        pass
    records, bad = [], 0
    # (from a copy: the Raw pieces must not pin the caller's buffer, see kineto.chunk._decode_chunk)
    for piece in msgspec.json.decode(bytes(data), type=list[msgspec.Raw]):
        try:
            records.append(msgspec.json.decode(piece))
        except msgspec.ValidationError:
            bad += 1
    return records, bad


def out_of_range(name: str, count: int) -> str:
    """The warning for records ``decode_records`` left out."""
    return f"{name}: {count} record(s) holding a number out of range (such as 1e999) not read"


class ChromeTraceReader(Generic[T]):
    """Iterate over decoded chunks of a Chrome trace's events.

    ``decode`` receives a buffer holding a JSON array of complete events and returns whatever
    the parser wants (typically columns). The buffer is a view into the reader's own memory,
    valid only during the call: ``decode`` must not keep references into it (msgspec.Raw
    values included). It must raise ``msgspec.DecodeError`` for malformed JSON and handle type
    surprises itself. After iteration, ``info`` holds the top-level keys and any damage.
    """

    def __init__(
        self,
        path: Path,
        decode: Callable[[Any], T],
        chunk_bytes: int = CHUNK_BYTES,
        part: tuple[int, int | None] | None = None,
    ):
        self.path = path
        self.decode = _checked(decode)
        self.chunk_bytes = chunk_bytes
        self.info = ChromeTraceInfo()
        # (start, stop): only the events in these bytes of a plain file (``split_point``); the
        # first part has the header, the last the trailer
        self.part = part
        # bytes moved into the buffer so far (the inflater runs ahead), counted from the file's
        # start: damage is placed by it
        self._filled = part[0] if part else 0

    # The buffer always starts with "[" followed by the next undecoded event, so a chunk is
    # decoded in place: the byte after its last "}" (a comma or a space) becomes "]" for the
    # duration of the call. No copies of the text are made here (a decoder whose results point
    # into the text copies it first: kineto.chunk._decode_chunk).

    def _decode_in_place(self, buf: bytearray, end: int) -> T:
        """Decode buf[0:end] as an array; buf[end] is borrowed for the closing bracket."""
        saved = buf[end]
        buf[end] = 0x5D  # "]"
        try:
            with memoryview(buf) as view, view[: end + 1] as piece:
                return self.decode(piece)
        finally:
            buf[end] = saved

    def _fault_in_place(self, buf: bytearray, end: int, exc: msgspec.DecodeError) -> Fault:
        """``_fault`` of buf[0:end] as an array, as ``_decode_in_place`` decoded it."""
        saved = buf[end]
        buf[end] = 0x5D  # "]"
        try:
            with memoryview(buf) as view, view[: end + 1] as piece:
                return _fault(exc, piece)
        finally:
            buf[end] = saved

    @staticmethod
    def _consume(buf: bytearray, start: int) -> None:
        """Drop the decoded events: the next event begins at ``start``."""
        buf[start - 1] = 0x5B  # "["
        del buf[: start - 1]

    def __iter__(self) -> Iterator[T]:
        start, stop = self.part if self.part else (0, None)
        blocks = _byte_blocks(self.path, self.info.stream, start, stop)
        buf = bytearray()
        exhausted = False

        def fill() -> bool:
            nonlocal exhausted
            for block in blocks:
                buf.extend(block)
                self._filled += len(block)
                return True
            exhausted = True
            return False

        if start:  # a later part starts at an event (``split_point``)
            buf.extend(b"[")
        else:
            try:
                body_start = self._read_header(buf, fill)
            except BadInput:
                if stop is not None:  # the cut is in the keys before the events
                    raise SplitMismatch(f"{self.path}: the part ends before the events") from None
                raise
            if body_start is None:
                return
            del buf[: body_start - 1]  # keep the "[" that opens the events array
        search_from = self.chunk_bytes
        misses = 0  # cuts in a row that fell inside an event
        while True:
            if not exhausted and len(buf) < self.chunk_bytes + _BLOCK_BYTES:
                fill()
                continue
            if exhausted and stop is not None:
                yield from self._part_end(buf)
                return
            if exhausted:
                # Cut before the last event, so that the final piece (decoded twice, to find
                # where the array ends) is small.
                last = None
                for found in _SEPARATOR.finditer(buf):
                    last = (found.start(), found.end())
                if last is None:
                    if (yield from self._tail(buf)):
                        return
                    continue
                cut_start, cut_end = last
            else:
                match = _SEPARATOR.search(buf, search_from)
                if match is None:
                    if len(buf) > self.chunk_bytes + EVENT_LIMIT:
                        yield from self._stop(buf, "no event boundary")
                        return
                    search_from = max(self.chunk_bytes, len(buf) - 64)
                    fill()
                    continue
                cut_start, cut_end = match.start(), match.end()
                del match
            end = cut_start + 1
            try:
                chunk = self._decode_in_place(buf, end)
            except msgspec.DecodeError as exc:
                fault = self._fault_in_place(buf, end, exc)
                position = fault.position
                if fault.kind == "trailing" and _TRAILER.match(buf, _after_array(buf, position)):
                    if stop is not None:  # the cut is past the events, in the keys after them
                        raise SplitMismatch(f"{self.path}: the events end before the cut") from None
                    # the events end in this piece: finish with the whole rest (the keys after
                    # the events), unless it is absurdly long
                    while len(buf) <= self.chunk_bytes + EVENT_LIMIT and fill():
                        pass
                    if not exhausted:
                        end = _after_array(buf, position)
                        with memoryview(buf) as view, view[:end] as piece:
                            chunk = self.decode(piece)
                        yield chunk
                        # every event was read: the trace is not cut short, no event lost
                        why = "the keys after the events array are too long"
                        self._stopped(buf, end, why, events_lost=False)
                        return
                    if (yield from self._tail(buf)):
                        return
                elif position is not None and position < end - 1:
                    # Malformed JSON before the cut: real damage, not a cut in the wrong place.
                    yield from self._skip_damage(buf, position, fault.detail)
                    search_from, misses = self.chunk_bytes, 0
                elif exhausted:
                    if (yield from self._tail(buf)):
                        return
                else:
                    # The cut fell inside an event. Any later boundary will do, so after a few
                    # misses the next try jumps ever further: a string full of "}, {" costs a
                    # few dozen decodes, not one per separator (a hang).
                    misses += 1
                    search_from = cut_start + 1 + (1 << min(misses, 40) >> 4)
                continue
            yield chunk
            self._consume(buf, cut_end - 1)
            search_from, misses = (self.chunk_bytes if not exhausted else 0), 0

    def _part_end(self, buf: bytearray) -> Iterator[T]:
        """The last events of a part that ends where the next event starts: what is left must be
        complete events and the comma after them, or the split was not at an event."""
        end = len(buf.rstrip())
        if end < 2 or buf[end - 1] != 0x2C:  # ","
            raise SplitMismatch(f"{self.path}: the part does not end after an event")
        end = len(buf[: end - 1].rstrip())
        if buf[end - 1] != 0x7D:  # "}"
            raise SplitMismatch(f"{self.path}: the part does not end after an event")
        try:
            chunk = self._decode_in_place(buf, end)
        except msgspec.DecodeError as exc:
            raise SplitMismatch(
                f"{self.path}: the part's last events do not read ({exc})"
            ) from None
        yield chunk
        buf.clear()

    def _stop(self, buf: bytearray, what: str) -> Iterator[T]:
        """Stop reading: ``EVENT_LIMIT`` bytes went by without ``what``. Keep the complete events
        before them."""
        if self.part and self.part[1] is not None:  # read whole, the rest would be skipped
            raise SplitMismatch(f"{self.path}: {what} in {EVENT_LIMIT >> 20} MB")
        kept = yield from self._decode_prefix(buf, len(buf))
        self._stopped(buf, max(kept, 1), f"{what} in {EVENT_LIMIT >> 20} MB")

    def _stopped(self, buf: bytearray, kept: int, why: str, events_lost: bool = True) -> None:
        where = self._filled - len(buf) + kept
        self.info.lost_bytes += len(buf) - kept if events_lost else 0
        self.info.stopped = f"{why} after byte {where:,}"
        self.info.damage = self.info.damage or self.info.stopped
        buf.clear()

    def _read_header(self, buf: bytearray, fill: Callable[[], bool]) -> int | None:
        """Parse the keys before the events array; return where the events begin (after "[")."""
        searched = blank = 0
        while True:
            start = _NOT_SPACE.search(buf, blank)
            blank = len(buf) if start is None else blank
            if start is not None:
                first = buf[start.start() : start.start() + 1]
                if first == b"[":
                    return start.start() + 1
                if first != b"{":
                    raise BadInput(f"{self.path}: not a JSON trace (starts with {bytes(first)!r})")
                # (from where a key cut by the last fill may begin: its name, or any run of
                # blanks after it, ends the bytes searched before)
                key = buf.rfind(b'"traceEvents"', 0, searched)
                match = _EVENTS_KEY.search(buf, key if key >= 0 else max(searched - 64, 0))
                if match is not None:
                    head = bytes(buf[: match.start()]).rstrip().rstrip(b",")
                    try:
                        self.info.header = _decode_object(head + b"}") if head != b"{" else {}
                    except msgspec.DecodeError as exc:
                        self.info.header = {}
                        self.info.header_damage = _fault(exc, head + b"}").detail
                    return match.end()
                searched = len(buf)
            if len(buf) > EVENT_LIMIT or not fill():
                break
        if not buf.strip():
            if self.info.stream.ended_early:
                raise BadInput(f"{self.path}: {self.info.stream.ended_early}, nothing readable")
            raise BadInput(f"{self.path}: empty file")
        if len(buf) > EVENT_LIMIT:
            raise BadInput(
                f"{self.path}: not a Chrome trace (no traceEvents array in the first "
                f"{EVENT_LIMIT >> 20} MB)"
            )
        try:
            document = msgspec.json.decode(bytes(buf))
        except (msgspec.DecodeError, RecursionError):
            raise BadInput(f"{self.path}: not a Chrome trace (no traceEvents array)") from None
        keys = ", ".join(sorted(document)[:6]) if isinstance(document, dict) else ""
        raise BadInput(f"{self.path}: JSON without a traceEvents array (keys: {keys})")

    def _tail(self, buf: bytearray) -> Generator[T, None, bool]:
        """Decode the last piece: the end of the events array and the keys after it.

        Returns False when the piece turns out not to hold the end (damage earlier in the file
        put the cut inside an event), after skipping past the damage.
        """
        try:
            with memoryview(buf) as view:
                chunk = self.decode(view)
            yield chunk
            buf.clear()
            return True
        except msgspec.DecodeError as exc:
            with memoryview(buf) as view:
                fault = _fault(exc, view)
            position = fault.position
        if fault.kind == "trailing" and position is not None:
            end = _after_array(buf, position)
            trailer = bytes(buf[end:]).strip().lstrip(b",").strip()
            keys: dict[str, Any] | None = {}
            if trailer and trailer != b"}":
                try:
                    keys = _decode_object(b"{" + trailer)
                except msgspec.DecodeError:
                    keys = None
            if keys is not None:
                del buf[end:]
                with memoryview(buf) as view:
                    chunk = self.decode(view)
                yield chunk
                self.info.trailer = keys
                buf.clear()
                return True
            yield from self._skip_damage(buf, position, fault.detail)
            return False
        if (
            position is not None
            and fault.kind == "malformed"
            and _SEPARATOR.search(buf, position) is not None
        ):
            yield from self._skip_damage(buf, position, fault.detail)  # damage with events after it
            return False
        # The file ends inside the events array: keep every complete event.
        kept = yield from self._decode_prefix(buf, len(buf))
        self.info.lost_bytes += len(buf) - max(kept, 1)
        self.info.truncated = True
        self.info.damage = (
            self.info.damage
            or self.info.stream.ended_early
            or "the JSON ends inside the events array"
        )
        buf.clear()
        return True

    def _decodes(self, buf: bytearray, start: int, end: int) -> bool:
        try:
            self.decode(b"[" + bytes(buf[start:end]) + b"]")
        except msgspec.DecodeError:
            return False
        return True

    def _decode_prefix(self, buf: bytearray, limit: int) -> Generator[T, None, int]:
        """Yield the longest decodable run of complete events that ends before ``limit``.

        Returns how many bytes of ``buf`` (from its start) it consumed.
        """
        end = limit
        for _ in range(_RECOVERY_TRIES):
            end = buf.rfind(b"}", 0, end)
            if end < 0:
                break
            # then a comma, the end, or nothing (NUL too: a file zeroed past what was written)
            following = bytes(buf[end + 1 : end + 64]).lstrip(b" \t\r\n\0")[:1]
            if following not in (b",", b"]", b""):
                continue
            try:
                chunk = self.decode(bytes(buf[: end + 1]) + b"]")
            except msgspec.DecodeError:
                continue
            yield chunk
            return end + 1
        return 0

    def _skip_damage(self, buf: bytearray, position: int, reason: str = "") -> Iterator[T]:
        """Keep the events before malformed bytes at ``position``; resume at the next event."""
        kept = yield from self._decode_prefix(buf, position)
        kept = max(kept, 1)
        cut = len(buf)
        # (positions only: a live match iterator would pin the buffer's size)
        starts = [
            m.end() - 1
            for m in islice(_SEPARATOR.finditer(buf, max(position, kept)), _RECOVERY_TRIES)
        ]
        for start in starts:
            # A real event start decodes up to one of the next separators (the event's end;
            # earlier ones may lie inside it); a "}, {" inside an event's arguments does not.
            ends = [m.start() + 1 for m in islice(_SEPARATOR.finditer(buf, start + 1), 16)]
            if not ends or any(self._decodes(buf, start, e) for e in ends):
                cut = start
                break
        self.info.lost_bytes += cut - kept
        where = self._filled - len(buf) + position
        self.info.damage = f"malformed JSON near byte {where:,}" + (f": {reason}" if reason else "")
        if cut >= len(buf):
            buf[:] = b"["
        else:
            self._consume(buf, cut)


class SplitMismatch(Exception):
    """A part of a trace (``ChromeTraceReader``'s ``part``) did not end at an event: the trace
    has to be read in one piece."""


def split_point(path: Path, near: int, decode: Callable[[Any], Any]) -> int | None:
    """Where an event starts at or after byte ``near`` of a plain (not gzip) trace: the start
    of a part that ``ChromeTraceReader`` reads on its own (``part``), so that two processes
    can decode one trace. The first ``}, {`` after ``near`` whose ``{`` opens an event that
    ``decode`` reads (one inside a string or nested object does not); None where there is none
    in the next ``EVENT_LIMIT`` bytes. The part before it checks the cut again: it must end
    with a whole event (else ``SplitMismatch``)."""
    with path.open("rb") as f:
        if is_gzip(f.read(2)):
            return None
        f.seek(near)
        buf = bytearray()
        while len(buf) < EVENT_LIMIT:
            block = f.read(_BLOCK_BYTES)
            if not block:
                return None
            buf.extend(block)
            starts = [m.end() - 1 for m in islice(_SEPARATOR.finditer(buf), _RECOVERY_TRIES)]
            for begin in starts:
                ends = [m.start() + 1 for m in islice(_SEPARATOR.finditer(buf, begin + 1), 4)]
                for end in ends:
                    try:
                        decode(b"[" + bytes(buf[begin:end]) + b"]")
                    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
                        continue
                    return near + begin
    return None


#: How much a header read takes at a time (compressed and decompressed).
_HEAD_BLOCK_BYTES = 64 << 10


def _head_blocks(path: Path, state: StreamState) -> Iterator[bytes]:
    """Small decompressed blocks from the start of ``path``, inflated only as far as asked:
    reading a header costs what the header holds, not the blocks `_byte_blocks` inflates ahead
    (discovering 1,024 ranks reads 1,024 headers, one after another)."""
    with path.open("rb") as f:
        raw = f.read(_HEAD_BLOCK_BYTES)
        if is_gzip(raw):
            state.compressed = True
            yield from _inflated(f, raw, _HEAD_BLOCK_BYTES, state)
            return
        while raw:
            state.bytes_read += len(raw)
            yield raw
            raw = f.read(_HEAD_BLOCK_BYTES)


def read_header(path: Path) -> dict[str, Any]:
    """The top-level keys written before the events array (cheap: stops at ``traceEvents``)."""
    reader: ChromeTraceReader[None] = ChromeTraceReader(path, lambda _: None)
    blocks = _head_blocks(path, reader.info.stream)
    buf = bytearray()

    def fill() -> bool:
        for block in blocks:
            buf.extend(block)
            return True
        return False

    reader._read_header(buf, fill)
    return reader.info.header


#: Times and durations (µs) at or beyond this are corrupt: 2**52 µs is 142 years, and below it
#: every conversion to int64 nanoseconds (and a sum of two) stays exact and in range.
MAX_US = float(2**52)
ABSURD = "beyond ±2**52 µs (142 years)"


def corrupt_times(name: str, count: int) -> str:
    """The warning for events left out by ``absurd_times``."""
    return f"{name}: {count} event(s) with ts or dur {ABSURD} not read (corrupt times)"


def absurd_times(ts_us: np.ndarray, dur_us: np.ndarray) -> np.ndarray:
    """Which events have a corrupt time or duration (NaN times count; a NaN duration is none)."""
    with np.errstate(invalid="ignore"):
        return ~(np.abs(ts_us) < MAX_US) | (np.abs(dur_us) >= MAX_US)
