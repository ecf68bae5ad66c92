"""Trace contents are untrusted: make names safe to show in a terminal.

Event names come from other people's programs; they can hold terminal escape sequences (which
could retitle a window, hide text or worse) or Rich markup. ``safe`` removes the first by showing
control characters as visible escapes; the reporters never interpret markup in names.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
#: Lone surrogates: a file name's bytes that are not UTF-8, as Python decodes them
#: (surrogateescape: byte 0xNN is U+DCNN); no UTF-8 encoder or JSON reader takes them.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte of a file name: shown as that byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def undecodable_escaped(text: str) -> str:
    """``text`` where a file name's undecodable bytes are written as ``\\xNN`` (and any other
    lone surrogate as ``\\uXXXX``): a string every UTF-8 writer and JSON reader takes."""
    return text if text.isascii() else _SURROGATE.sub(_escape, text)


def encodable(value: Any) -> Any:
    """``value`` (JSON-like builtins) with every string, keys included, ``undecodable_escaped``."""
    if isinstance(value, str):
        return undecodable_escaped(value)
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(v) for v in value]
    return value


#: What JSON leaves raw but a terminal acts on: DEL, the C1 controls, bidi and line overrides
#: (JSON itself escapes only U+0000-U+001F).
_JSON_RAW = re.compile(r"[\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def json_safe(text: str) -> str:
    """Encoded JSON with the characters above written as \\uXXXX escapes: the same JSON
    value, harmless when printed to a terminal. They can only occur inside strings (and none
    in ASCII but DEL: a report of 100,000 steps, 70 MB, is looked through at once)."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def safe(text: object, limit: int | None = None, *, middle: bool = False) -> str:
    """``text`` with control and bidi characters escaped, cut to ``limit`` characters (at the
    end, or in the ``middle``: names that differ only at their end, as runs' folders often do,
    stay apart)."""
    value = _CONTROL.sub(_escape, str(text))
    if limit is not None and len(value) > limit:
        if middle and limit >= 5:
            tail = (limit - 1) // 2
            value = value[: limit - 1 - tail] + "…" + value[len(value) - tail :]
        else:
            value = value[: max(limit - 1, 1)] + "…"
    return value
