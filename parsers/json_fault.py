"""Where and how a JSON text fails to decode, found by reading the bytes.

A fast decoder (msgspec) says *that* a chunk is malformed; the streaming reader also needs
*where* and *how*: the end of a value followed by more text (the events array and the keys after
it), input that ends inside a value (a trace cut short), or damage at a byte (skipped, keeping
the events around it). Decoders word their errors as they please and change the wording between
releases, so the answer never comes from an error's message: the text is read again here by
Python's own JSON scanner, whose error carries its position as an attribute, and by the UTF-8
codec, whose error does too. This runs only after a decode has failed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

FaultKind = Literal["trailing", "truncated", "malformed"]


@dataclass(frozen=True)
class Fault:
    """Why a JSON text did not decode as one value.

    ``trailing``: the value ends and more text follows, at ``position``. ``truncated``: the input
    ends inside the value (``position`` None). ``malformed``: invalid JSON at ``position`` (None
    when the fast decoder refused a text that this reading accepts: the fault is somewhere).
    Positions are byte offsets into the text."""

    kind: FaultKind
    position: int | None
    detail: str


class _Constant(ValueError):
    """NaN or Infinity: Python's JSON accepts them, strict decoders do not."""


def _no_constant(name: str) -> Any:
    raise _Constant(name)


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_NOT_SPACE = re.compile(r"\S")
# a string from its opening quote to its closing one
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
# NaN or Infinity where a value stands (after "[", ":" or ",")
_CONSTANT = re.compile(r"[\[:,]\s*(-?Infinity|NaN)\b")
_INVALID = "\ufffd"
# a \u escape of a UTF-16 surrogate, and of the low half that must follow a high one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LOW_ESCAPE = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8", "surrogateescape"))


def _first_invalid_utf8(data: bytes) -> tuple[int, str] | None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start, exc.reason
    return None


def locate(data: Any) -> Fault | None:
    """The first fault of ``data`` (bytes-like) read as one JSON value with nothing after it but
    blanks; None where it reads. Invalid UTF-8 is a fault at its first byte; nesting too deep for
    Python's reader is reported as truncated only where the text ends inside it, else at the
    first place past ``depth_limit`` (see ``chrome_stream``)."""
    raw = bytes(data)
    bad_utf8 = _first_invalid_utf8(raw)
    # invalid bytes kept as lone surrogates, so that the structure around them is still read
    text = raw.decode("utf-8", "surrogateescape")
    faults = [_structural(text)]
    if bad_utf8 is not None:
        faults.append(Fault("malformed", bad_utf8[0], f"invalid UTF-8: {bad_utf8[1]}"))
    lone = _lone_surrogate(text)
    if lone is not None:
        faults.append(
            Fault(
                "malformed", _byte_offset(text, lone), "a UTF-16 surrogate escape without its pair"
            )
        )
    found = [f for f in faults if f is not None]
    if not found:
        return None
    # the first in the text (a fault without a position, the text cut short, comes last)
    return min(found, key=lambda f: len(raw) if f.position is None else f.position)


def _lone_surrogate(text: str) -> int | None:
    """Where the first ``\\uD800``-style escape of a surrogate without its other half stands
    (strict decoders refuse it; Python's reader takes it); None where there is none."""
    taken = 0  # past the low half of the last pair
    for match in _SURROGATE_ESCAPE.finditer(text):
        at = match.start()
        if at < taken:
            continue
        before = at
        while before > 0 and text[before - 1] == "\\":
            before -= 1
        if (at - before) % 2:  # the backslash is itself escaped: "\\\\ud800" is text
            continue
        if text[at + 3] in "89abAB" and _LOW_ESCAPE.match(text, at + 6):
            taken = at + 12
            continue
        return at
    return None


def _structural(text: str) -> Fault | None:
    start = _NOT_SPACE.search(text)
    if start is None:
        return Fault("truncated", None, "no value")
    try:
        _, end = _DECODER.raw_decode(text, start.start())
    except _Constant as exc:
        constant = _CONSTANT.search(text)
        where = _byte_offset(text, constant.start(1)) if constant else None
        return Fault("malformed", where, f"{exc} is not JSON")
    except json.JSONDecodeError as exc:
        if not text[exc.pos :].strip():
            return Fault("truncated", None, "the text ends inside a value")
        if text[exc.pos] == '"' and _STRING.match(text, exc.pos) is None:
            return Fault("truncated", None, "the text ends inside a string")
        return Fault("malformed", _byte_offset(text, exc.pos), _what(text, exc.pos))
    after = _NOT_SPACE.search(text, end)
    if after is None:
        return None
    return Fault("trailing", _byte_offset(text, after.start()), "text after the value")


def _what(text: str, index: int) -> str:
    """The fault in traceview's own words: the character found where it is not allowed."""
    found = text[index]
    if found < " ":
        return f"control character {found!r} where it is not allowed"
    shown = found if found.isprintable() and not ("\udc80" <= found <= "\udcff") else _INVALID
    return f"unexpected {shown!r}"
