"""Step markers' numbers read at once (``classify.marker_numbers``) against the step pattern
asked one name at a time (``RuleSet.marker_number``), on names built to sit on every edge of
``^LITERAL(\\d+)$`` and of TensorFlow's ``(\\d+)$``: Unicode digits, a trailing newline ``$``
allows, numbers past 15 digits and past ``MAX_STEP``, the literal alone, names that only begin
like it, names of other characters, lone surrogates."""

from __future__ import annotations

import random
import re

import pytest

from traceview.normalize.classify import marker_numbers
from traceview.normalize.rules import NO_NUMBER, NOT_A_MARKER, RuleSet

PIECES = [
    "ProfilerStep#", "step#", "Profiler", "iteration ", "é#", "#", "0", "7", "00", "42",
    "123456789012345", "1234567890123456", "9007199254740993", "99999999999999999999", "\n",
    "\u0661", "\uff13", " ", "x", "é", "", "\U0001f600",
]  # fmt: skip

PATTERNS = [
    r"^ProfilerStep#(\d+)$",
    r"^step#(\d+)$",
    r"^iteration (\d+)$",
    r"^é\#(\d+)$",
    r"^(\d+)$",
    r"(\d+)$",  # (a name's trailing digits: read at once where the name is ASCII)
    r"(\d+)\Z",  # (neither: asked name by name)
    r"(?i)^(?:ProfilerStep#|step#)(\d+)$",
]


def _names(rng: random.Random, surrogates: bool) -> list[str]:
    pieces = [*PIECES, "\udc80"] if surrogates else PIECES
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 4))) for _ in range(5000)]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("surrogates", [False, True])
def test_read_at_once_as_the_pattern_reads_each_name(pattern: str, surrogates: bool) -> None:
    rules = RuleSet("test", step_pattern=re.compile(pattern))
    names = _names(random.Random(f"{pattern}{surrogates}"), surrogates)
    got = marker_numbers(rules, names).tolist()
    assert got == [rules.marker_number(name) for name in names]
    # the draws reach every outcome
    assert NOT_A_MARKER in got and NO_NUMBER in got and any(n >= 0 for n in got)


def test_the_literal_of_a_pattern() -> None:
    def literal(pattern: str, flags: int = 0) -> str | None:
        return RuleSet("test", step_pattern=re.compile(pattern, flags)).marker_literal()

    assert literal(r"^ProfilerStep#(\d+)$") == "ProfilerStep#"
    assert literal(r"^a\.b\#(\d+)$") == "a.b#"
    assert literal(r"^(\d+)$") == ""
    for not_literal in (r"^a.b(\d+)$", r"^a\d(\d+)$", r"^x(\d+)$$", r"(\d+)$", r"^x(\d+)"):
        assert literal(not_literal) is None, not_literal
    assert literal(r"^x(\d+)$", re.IGNORECASE) is None
    assert literal(r"^x(\d+)$", re.MULTILINE) is None


def test_the_trailing_number_pattern() -> None:
    def trailing(pattern: str, flags: int = 0) -> bool:
        return RuleSet("test", step_pattern=re.compile(pattern, flags)).trailing_number()

    assert trailing(r"(\d+)$")
    for other in (r"^(\d+)$", r"(\d+)\Z", r"(\d*)$", r"x(\d+)$", r"(\d+)$$", r"([0-9]+)$"):
        assert not trailing(other), other
    assert not trailing(r"(\d+)$", re.MULTILINE)
    assert not trailing(r"(\d+)$", re.ASCII)


def test_a_marker_of_100000_steps_read_at_once() -> None:
    rules = RuleSet("test")
    names = [f"ProfilerStep#{i}" for i in range(100_000)] + [
        "aten::mm",
        "ProfilerStep#",
        "ProfilerStep#99999999999999999999",
    ]
    got = marker_numbers(rules, names)
    assert got[:100_000].tolist() == list(range(100_000))
    assert got[100_000:].tolist() == [NOT_A_MARKER, NOT_A_MARKER, NO_NUMBER]
    tensorflow = RuleSet("test", step_pattern=re.compile(r"(\d+)$"))
    names = [f"Session.run {i}" for i in range(100_000)] + ["Session.run", "1" * 20, "x\u0663"]
    got = marker_numbers(tensorflow, names)
    assert got[:100_000].tolist() == list(range(100_000))
    assert got[100_000:].tolist() == [NOT_A_MARKER, NO_NUMBER, 3]
