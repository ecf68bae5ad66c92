"""Classification rules: trace names to event kind, phase, canonical operator and collective.

Rules are data (a TOML file per framework, shipped in ``traceview/parsers/rules``), not code.
A user extends them with ``--rules FILE``; that file's rules are tried before the built-in ones.
The first rule whose pattern matches an event's name (and whose ``kind``/``cat`` filters, if any,
accept the event) decides; fields a rule leaves out stay unset. Rules are applied to each distinct
(kind, category, name) once, never per event.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from traceview.model import schema as S
from traceview.model.errors import BadInput, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    kinds: frozenset[str] | None = None
    cats: frozenset[str] | None = None
    phase: str | None = None
    op: str | None = None
    collective: str | None = None
    kind: str | None = None  # overrides the kind the category gave

    def accepts(self, kind: str, cat: str | None, name: str) -> re.Match[str] | None:
        if self.kinds is not None and kind not in self.kinds:
            return None
        if self.cats is not None and (cat or "") not in self.cats:
            return None
        return self.pattern.search(name)


@dataclass(frozen=True)
class Classification:
    kind: str
    phase: str | None  # None: decided by context (ancestors, position, launching operator)
    op: str | None  # the canonical operator a rule names; None: derived from the name
    collective: str | None
    collective_from_args: bool = False  # the name does not say; use the trace's own argument


AUTO = "auto"
#: Step numbers from here on are not steps a run reached but corrupt markers (2**53: also the
#: last integer a JSON reader holds exactly).
MAX_STEP = 1 << 53


#: ``RuleSet.marker_number`` of a name that is no step marker, and of a marker without a number
NOT_A_MARKER, NO_NUMBER = -2, -1

#: A step pattern that is a literal and its number, ``^LITERAL(\d+)$`` (no flag set): the
#: literal's characters, each plain or a punctuation mark escaped.
_LITERAL_AND_NUMBER = re.compile(r"\^((?:[^.^$*+?{}\[\]\\|()]|\\[^\w\s])*)\(\\d\+\)\$")


@dataclass
class RuleSet:
    framework: str
    kinds: dict[str, str] = field(default_factory=dict)  # trace category -> event kind
    default_kind: str = S.KIND_OP
    step_pattern: re.Pattern[str] = re.compile(r"^ProfilerStep#(\d+)$")
    #: the kinds of event the step pattern turns into step markers (a parser that marks steps
    #: itself gives them a category mapped to kind "step", and the pattern only numbers them)
    step_kinds: tuple[str, ...] = (S.KIND_ANNOTATION, S.KIND_OP)
    rules: list[Rule] = field(default_factory=list)
    collectives: list[tuple[re.Pattern[str], str]] = field(default_factory=list)
    strip_prefixes: tuple[str, ...] = ()
    rules_define_step: bool = False

    def kind_of(self, cat: str | None, ph: str | None = None) -> str:
        if ph in ("i", "I", "n"):
            return S.KIND_INSTANT
        return self.kinds.get(cat or "", self.default_kind)

    def classify(self, kind: str, cat: str | None, name: str) -> Classification:
        if kind in self.step_kinds and self.step_pattern.search(name):
            return Classification(S.KIND_STEP, None, None, None)
        for rule in self.rules:
            match = rule.accepts(kind, cat, name)
            if match is None:
                continue
            collective = rule.collective
            from_args = False
            if collective == AUTO:
                collective = self.normalize_collective(name)
                from_args = collective is None
            op = rule.op
            if op == AUTO:
                op = collective
            elif op and "\\" in op:
                op = match.expand(op)
            return Classification(rule.kind or kind, rule.phase, op, collective, from_args)
        return Classification(kind, None, None, None)

    def default_op(self, name: str) -> str:
        for prefix in self.strip_prefixes:
            if name.startswith(prefix):
                return name[len(prefix) :]
        return name

    def marker_number(self, name: str) -> int:
        """What the step pattern makes of a name of a step kind: NOT_A_MARKER, NO_NUMBER (a
        marker without a step number it can read), or the marker's step number."""
        match = self.step_pattern.search(name)
        if match is None:
            return NOT_A_MARKER
        number = self.number_of(match)
        return NO_NUMBER if number is None else number

    def marker_literal(self) -> str | None:
        """The literal a step pattern of the form ``^LITERAL(\\d+)$`` begins with (escapes
        undone), else None. Such a pattern finds exactly the names that are the literal and
        digits, so a name that is the literal and ASCII digits needs no search
        (``classify.marker_numbers``)."""
        if self.step_pattern.flags != re.UNICODE:
            return None
        found = _LITERAL_AND_NUMBER.fullmatch(self.step_pattern.pattern)
        return None if found is None else re.sub(r"\\(.)", r"\1", found.group(1))

    def trailing_number(self) -> bool:
        """Whether the step pattern is ``(\\d+)$`` (TensorFlow's: a name's trailing digits), which
        a name of ASCII characters and no line break answers without a search
        (``classify.marker_numbers``)."""
        return self.step_pattern.flags == re.UNICODE and self.step_pattern.pattern == r"(\d+)$"

    def step_number(self, name: str) -> int | None:
        """The step number in a marker's name; None without one, or where it is too large to be
        a step a run reached (a corrupt marker: see ``has_step_number``)."""
        return self.number_of(self.step_pattern.search(name))

    def number_of(self, match: re.Match[str] | None) -> int | None:
        """``step_number`` of the step pattern's match on a name."""
        if match is None or not match.groups():
            return None
        try:
            number = int(match.group(1))
        except ValueError:  # not digits, or more of them than int() takes
            return None
        return number if 0 <= number < MAX_STEP else None

    def has_step_number(self, name: str) -> bool:
        """Whether the name holds a step number at all (readable or not)."""
        return bool(self.number_text(name))

    def number_text(self, name: str) -> str:
        """What the step pattern's first group finds in the name ("": no group, no match)."""
        match = self.step_pattern.search(name)
        return (match.group(1) or "") if match is not None and match.groups() else ""

    def normalize_collective(self, hint: str | None) -> str | None:
        if not hint:
            return None
        for pattern, collective in self.collectives:
            if pattern.search(hint):
                return collective
        return None

    def extended(self, other: RuleSet) -> RuleSet:
        """``other``'s rules first, then these; ``other``'s kinds override these."""
        return RuleSet(
            framework=self.framework,
            kinds={**self.kinds, **other.kinds},
            default_kind=self.default_kind,
            step_pattern=other.step_pattern if other.rules_define_step else self.step_pattern,
            step_kinds=other.step_kinds if other.rules_define_step else self.step_kinds,
            rules=[*other.rules, *self.rules],
            collectives=[*other.collectives, *self.collectives],
            strip_prefixes=(*other.strip_prefixes, *self.strip_prefixes),
        )


def _strings(value: Any, what: str, source: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset([value])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise BadInput(f"{source}: {what} must be a string or a list of strings")


def _compile(pattern: Any, source: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise BadInput(f"{source}: every rule needs a 'match' pattern (a string)")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise BadInput(f"{source}: bad pattern {pattern!r}: {exc}") from None


class _Lines:
    """Where a table's key is in the rules file's text, for errors that name its line
    (``source:LINE``); without the text (built-in rules), just the source."""

    _HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")

    def __init__(self, source: str, text: str | None):
        self.source = source
        self.lines = text.splitlines() if text is not None else None

    def at(self, table: str | None, key: str, index: int = 0) -> str:
        """``source:LINE`` of ``key`` in the ``index``-th ``[[table]]`` (or ``[table]``; None:
        the top level, before any table)."""
        if self.lines is None:
            return self.source
        seen, inside = -1, table is None
        key_line = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
        for number, line in enumerate(self.lines, start=1):
            header = self._HEADER.match(line)
            if header and not line.lstrip().startswith(("#",)) and "=" not in line.split("]")[0]:
                name = header.group(1).strip().strip("\"'")
                if name == table:
                    seen += 1
                    inside = seen == index
                else:
                    inside = False
                continue
            if inside and key_line.match(line):
                return f"{self.source}:{number}"
        return self.source


def parse_rules(data: dict[str, Any], source: str, text: str | None = None) -> RuleSet:
    """Build a RuleSet from the TOML document ``data`` (``source`` names it in errors; with its
    ``text``, an error names the line too: ``source:LINE: ...``)."""
    lines = _Lines(source, text)
    ruleset = RuleSet(framework=str(data.get("framework", "")))
    kinds = data.get("kinds", {})
    if not isinstance(kinds, dict):
        raise BadInput(f"{lines.at(None, 'kinds')}: [kinds] must map trace categories to kinds")
    for cat, kind in kinds.items():
        if kind not in S.EVENT_KINDS:
            raise BadInput(
                f"{lines.at('kinds', str(cat))}: unknown kind {kind!r} for category {cat!r} "
                f"(use one of {', '.join(S.EVENT_KINDS)})"
            )
        ruleset.kinds[str(cat)] = kind
    if "default_kind" in data:
        if data["default_kind"] not in S.EVENT_KINDS:
            raise BadInput(
                f"{lines.at(None, 'default_kind')}: unknown kind {data['default_kind']!r} "
                f"(use one of {', '.join(S.EVENT_KINDS)})"
            )
        ruleset.default_kind = str(data["default_kind"])
    step = data.get("step", {})
    if not isinstance(step, dict):
        raise BadInput(f"{lines.at(None, 'step')}: [step] must be a table")
    if "pattern" in step:
        ruleset.step_pattern = _compile(step["pattern"], lines.at("step", "pattern"))
        ruleset.rules_define_step = True
    if "kinds" in step:
        where = lines.at("step", "kinds")
        step_kinds = _strings(step["kinds"], "kind", where) or frozenset()
        unknown = sorted(step_kinds - set(S.EVENT_KINDS))
        if unknown:
            raise BadInput(f"{where}: unknown step kind {unknown[0]!r}")
        ruleset.step_kinds = tuple(sorted(step_kinds))
        ruleset.rules_define_step = True
    ruleset.strip_prefixes = tuple(data.get("op", {}).get("strip_prefixes", ()))
    entries = data.get("rule", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BadInput(f"{lines.at(None, 'rule')}: rules must be [[rule]] tables")
    for index, entry in enumerate(entries):
        phase = entry.get("phase")
        if phase is not None and phase not in S.EVENT_PHASES:
            raise BadInput(
                f"{lines.at('rule', 'phase', index)}: unknown phase {phase!r} "
                f"(use one of {', '.join(S.EVENT_PHASES)})"
            )
        kind = entry.get("set_kind")
        if kind is not None and kind not in S.EVENT_KINDS:
            raise BadInput(f"{lines.at('rule', 'set_kind', index)}: unknown kind {kind!r}")
        collective = entry.get("collective")
        if collective is not None and collective != AUTO and collective not in S.COLLECTIVES:
            raise BadInput(
                f"{lines.at('rule', 'collective', index)}: unknown collective {collective!r}"
            )
        where = lines.at("rule", "match", index)
        if "match" not in entry:
            where = lines.at("rule", next(iter(entry), "match"), index)
        ruleset.rules.append(
            Rule(
                pattern=_compile(entry.get("match"), where),
                kinds=_strings(entry.get("kind"), "kind", lines.at("rule", "kind", index)),
                cats=_strings(entry.get("cat"), "cat", lines.at("rule", "cat", index)),
                phase=phase,
                op=entry.get("op"),
                collective=collective,
                kind=kind,
            )
        )
    for index, entry in enumerate(data.get("collective", [])):
        name = entry.get("name")
        if name not in S.COLLECTIVES:
            raise BadInput(f"{lines.at('collective', 'name', index)}: unknown collective {name!r}")
        ruleset.collectives.append(
            (_compile(entry.get("match"), lines.at("collective", "match", index)), name)
        )
    return ruleset


def load_rules_file(path: Path) -> RuleSet:
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such rules file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{path}: cannot read rules: {exc}") from None
    return parse_rules(data, str(path), text)


_BUILTIN: dict[str, RuleSet] = {}


def builtin_rules(framework: str) -> RuleSet:
    """The rules shipped for ``framework`` (pytorch, tensorflow, mxnet, chainer; chrome: the
    defaults of the generic path)."""
    if framework not in _BUILTIN:
        source = (
            resources.files("traceview.parsers").joinpath("rules").joinpath(f"{framework}.toml")
        )
        try:
            text = source.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"no built-in rules for framework {framework!r}") from None
        _BUILTIN[framework] = parse_rules(tomllib.loads(text), f"rules/{framework}.toml")
    return _BUILTIN[framework]


def rules_for(framework: str, extra: Path | None = None, own: Path | None = None) -> RuleSet:
    """The rules a rank is read with: the built-in ones of ``framework``, extended by the
    parser's ``own`` (``Parser.rules_file``), then by the user's ``extra`` (``--rules``). A
    parser with rules of its own may name a framework traceview ships none for: its rules then
    extend the generic path's defaults (``chrome``)."""
    if own is not None and not _ships(framework):
        rules = builtin_rules("chrome").extended(load_rules_file(own))
    else:
        rules = builtin_rules(framework)
        if own is not None:
            rules = rules.extended(load_rules_file(own))
    return rules.extended(load_rules_file(extra)) if extra is not None else rules


def _ships(framework: str) -> bool:
    """Whether traceview ships rules for ``framework``."""
    return (
        resources.files("traceview.parsers")
        .joinpath("rules")
        .joinpath(f"{framework}.toml")
        .is_file()
    )
