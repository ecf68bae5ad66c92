"""The ``kinds``, ``stray_times`` and ``classify`` passes: what each event is (its kind, own
phase, canonical operator and collective) by the rules, run once per distinct name; events whose
times are corrupt dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import (
    dictionary_codes,
    ints,
    taken,
    unique_inverse,
)
from traceview.model.errors import Notes
from traceview.normalize.rules import NO_NUMBER, NOT_A_MARKER, RuleSet

PHASE_CODES: dict[str, int] = {p: i for i, p in enumerate(S.EVENT_PHASES)}


NO_PHASE = -1


KIND_CODES: dict[str, int] = {k: i for i, k in enumerate(S.EVENT_KINDS)}


@dataclass
class Classes:
    """What the rules say, per event, in the smallest integer types that hold it."""

    kind: np.ndarray  # int8 kind code
    phase: np.ndarray  # int8 own phase code (NO_PHASE: context decides)
    rule_op: np.ndarray  # int32 index into ops (-1: no canonical op from a rule)
    default_op: np.ndarray  # int32 index into ops: the name-derived op
    collective: np.ndarray  # int16 index into collectives (-1: none)
    from_args: np.ndarray  # bool: collective comes from the trace's argument
    ops: list[str]
    collectives: list[str]
    _step: np.ndarray  # per distinct name: step number of step markers (-1: none)
    _inverse: np.ndarray
    _stated_step: np.ndarray | None = None  # per event: a layout pass's step number (-1: none)

    def step_number(self, rows: np.ndarray) -> np.ndarray:
        numbers = self._step[self._inverse[rows]]
        if self._stated_step is not None:
            stated = self._stated_step[rows]
            numbers = np.where(stated >= 0, stated, numbers)
        return numbers


@dataclass
class _Stated:
    """The events a layout pass made, and what it says they are (``schema.LAID_OUT_SCHEMA``)."""

    rows: np.ndarray  # event indices
    kind: np.ndarray  # per row: kind code
    phase: np.ndarray  # per row: phase code (NO_PHASE: none of its own)
    op: list[str | None]  # per row: canonical op (None: named after the event)
    step: np.ndarray  # per event (all of them): step number (-1: none)


def _stated(raw: pa.Table) -> _Stated | None:
    """What a layout pass stated of the events it made; None where it made none."""
    if S.STATED_KIND not in raw.column_names or raw.column(S.STATED_KIND).null_count == len(raw):
        return None
    kind, kinds = dictionary_codes(raw.column(S.STATED_KIND))
    rows = np.flatnonzero(kind >= 0)
    phase, phases = dictionary_codes(raw.column(S.STATED_PHASE))
    ops = raw.column(S.STATED_OP).take(pa.array(rows)).to_pylist()
    return _Stated(
        rows=rows,
        kind=np.array([KIND_CODES[str(k)] for k in kinds], np.int8)[kind[rows]],
        phase=np.array([*(PHASE_CODES[str(p)] for p in phases), NO_PHASE], np.int8)[phase[rows]],
        op=[None if op is None else str(op) for op in ops],
        step=ints(raw.column(S.STATED_STEP), -1),
    )


def _warn_step_number(notes: Notes, label: str, name: str, rules: RuleSet) -> None:
    shown = _short(name)
    text = rules.number_text(name)
    why = (
        "step number too large to be a step (corrupt)"
        if text.isdigit()
        else f"the step pattern's first group reads {_short(text)}, not a number"
    )
    notes.warn(f"{label}: step marker {shown}: {why}, numbered by its position")


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


#: The most digits a step number read at once may have (10**15 - 1 < MAX_STEP)
_DIGITS = 15


def marker_numbers(rules: RuleSet, names: list[str]) -> np.ndarray:
    """``rules.marker_number`` of each name (int64). Where the step pattern is a literal and its
    number (``RuleSet.marker_literal``), the names that are the literal and 1-15 ASCII digits are
    read at once and the names without the literal are no markers; where it is a name's trailing
    digits (``RuleSet.trailing_number``), so are the names of ASCII characters and no line
    break. The rest (other digits, a trailing newline ``$`` allows, longer numbers) and every
    name of another pattern are asked of the pattern one at a time (a run of 100,000 steps has
    as many distinct marker names)."""
    literal = rules.marker_literal()
    ask = rules.marker_number
    if (literal is None and not rules.trailing_number()) or not names:
        return np.array([ask(name) for name in names], np.int64).reshape(-1)
    try:
        values = pa.array(names, pa.string())
    except (UnicodeEncodeError, pa.ArrowException):  # (a name with a lone surrogate)
        return np.array([ask(name) for name in names], np.int64).reshape(-1)
    if literal is not None:
        unsure = pc.starts_with(values, literal)  # (without it: no marker)
        number = pc.utf8_slice_codeunits(values, len(literal))  # (code points, as len counts)
        readable = pc.ascii_is_decimal(number)
    else:  # (an ASCII name without a line break: its digits at the end, or no marker)
        plain = pc.and_(pc.string_is_ascii(values), pc.invert(pc.match_substring(values, "\n")))
        number = pc.struct_field(pc.extract_regex(values, "(?P<n>[0-9]+)$"), [0])
        unsure = pc.or_(pc.invert(plain), number.is_valid())
        readable = plain
    quick = pc.and_(pc.and_(unsure, readable), pc.less_equal(pc.binary_length(number), _DIGITS))
    quick = pc.fill_null(quick, False).to_numpy(zero_copy_only=False)
    found = np.full(len(names), NOT_A_MARKER, np.int64)
    found[quick] = pc.filter(number, quick).cast(pa.int64()).to_numpy()
    asked = np.flatnonzero(unsure.to_numpy(zero_copy_only=False) & ~quick)
    found[asked] = [ask(name) for name in taken(names, asked)]
    return found


def classify(raw: pa.Table, rules: RuleSet, notes: Notes | None = None, label: str = "") -> Classes:
    """The rules applied to each distinct (kind, category, name); a step marker whose number
    is too large to be a step is numbered by its position, with a warning in ``notes``. The
    events a layout pass made are what it states (``schema.STATED_KIND``...), not what a rule
    would make of their names."""
    stated = _stated(raw)
    kind_codes, kind_values = dictionary_codes(raw.column(S.KIND))
    cat_codes, cats = dictionary_codes(raw.column(S.CAT))
    key = kind_codes * (len(cats) + 1) + (cat_codes + 1)
    del kind_codes, cat_codes
    name_codes, name_values = dictionary_codes(raw.column(S.NAME))
    kinds = [str(k) for k in kind_values]
    names = [str(n) for n in name_values]
    key = key * max(len(names), 1) + name_codes
    del name_codes
    unique, inverse = unique_inverse(key)
    del key
    inverse = inverse.astype(np.int32)

    count = len(unique)
    u_kind = np.empty(count, np.int8)
    u_phase = np.full(count, NO_PHASE, np.int8)
    u_collective = np.full(count, -1, np.int16)
    u_from_args = np.zeros(count, bool)
    u_step = np.full(count, -1, np.int64)
    by_rules = np.ones(count, bool)  # (kind, category, name)s of the trace's own events
    if stated is not None:
        trace_rows = np.ones(len(inverse), bool)
        trace_rows[stated.rows] = False
        by_rules[:] = False
        by_rules[inverse[trace_rows]] = True
    n_names, n_cats = max(len(names), 1), len(cats) + 1
    named: list[str] = taken(names, unique % n_names)  # (each key's name)
    u_cat = (unique // n_names % n_cats).tolist()
    u_kind_of = unique // n_names // n_cats
    # step markers first, all at once (a run of 100,000 steps has as many distinct names):
    # the events of a step kind whose name the step pattern finds
    step_kind = np.array([k in rules.step_kinds for k in kinds], bool)
    maybe = np.flatnonzero(by_rules & step_kind[u_kind_of]) if kinds else u_kind_of[:0]
    found = marker_numbers(rules, taken(named, maybe))
    marker = maybe[found != NOT_A_MARKER]
    u_kind[marker] = KIND_CODES[S.KIND_STEP]
    u_step[marker] = found[found != NOT_A_MARKER]  # (NO_NUMBER: -1, none)
    if notes is not None:
        for i in maybe[found == NO_NUMBER].tolist():
            if rules.has_step_number(named[i]):
                _warn_step_number(notes, label, named[i], rules)
    # only events a layout pass made: see below
    made = np.flatnonzero(~by_rules)
    u_kind[made] = [KIND_CODES.get(kinds[k], KIND_CODES[S.KIND_OP]) for k in u_kind_of[made]]
    # the rest, by the rules
    rule_ops: list[str | None] = [None] * count
    collectives: dict[str, int] = {}
    by_rules[marker] = False
    for i in np.flatnonzero(by_rules).tolist():
        name = named[i]
        cat = cats[u_cat[i] - 1] if u_cat[i] else None
        result = rules.classify(kinds[u_kind_of[i]], cat, name)
        u_kind[i] = KIND_CODES.get(result.kind, KIND_CODES[S.KIND_OP])
        if result.phase:
            u_phase[i] = PHASE_CODES[result.phase]
        rule_ops[i] = result.op or None
        if result.collective:
            u_collective[i] = collectives.setdefault(result.collective, len(collectives))
        u_from_args[i] = result.collective_from_args
        if result.kind == S.KIND_STEP:
            number = rules.step_number(name)
            u_step[i] = -1 if number is None else number
            if number is None and notes is not None and rules.has_step_number(name):
                _warn_step_number(notes, label, name, rules)
    # each (kind, category, name)'s operators, numbered in the order they come
    default_of, prefixes = rules.default_op, rules.strip_prefixes
    defaults = (
        [default_of(name) if name.startswith(prefixes) else name for name in named]
        if prefixes
        else named
    )
    ops: dict[str, int] = {}
    add = ops.setdefault
    u_rule_op = np.full(count, -1, np.int32)
    if any(op is not None for op in rule_ops):  # (a rule's op before the name's, key by key)
        default_codes = []
        for i, (op, default) in enumerate(zip(rule_ops, defaults, strict=True)):
            if op is not None:
                u_rule_op[i] = add(op, len(ops))
            default_codes.append(add(default, len(ops)))
    else:
        default_codes = [add(default, len(ops)) for default in defaults]
    u_default_op = np.array(default_codes, np.int32).reshape(count)
    classes = Classes(
        kind=u_kind[inverse],
        phase=u_phase[inverse],
        rule_op=u_rule_op[inverse],
        default_op=u_default_op[inverse],
        collective=u_collective[inverse],
        from_args=u_from_args[inverse],
        ops=list(ops),
        collectives=list(collectives),
        _step=u_step,
        _inverse=inverse,
    )
    if stated is not None:
        rows = stated.rows
        classes.kind[rows] = stated.kind
        classes.phase[rows] = stated.phase
        index = {op: i for i, op in enumerate(classes.ops)}
        for op in stated.op:
            if op is not None and op not in index:
                index[op] = len(classes.ops)
                classes.ops.append(op)
        classes.rule_op[rows] = [-1 if op is None else index[op] for op in stated.op]
        classes.collective[rows] = -1
        classes.from_args[rows] = False
        classes._stated_step = stated.step
    return classes


def has_scope(raw: pa.Table) -> bool:
    return S.SCOPE in raw.column_names and raw.column(S.SCOPE).null_count < raw.num_rows


def scope_classes(
    raw: pa.Table, rows: np.ndarray, rules: RuleSet, ops: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Phase and op codes (-1: none) of ``rows`` as the operator named in their scope would get.

    ``ops`` gains the canonical names it did not have yet.
    """
    phase = np.full(len(rows), NO_PHASE, np.int8)
    op = np.full(len(rows), -1, np.int32)
    if not has_scope(raw) or len(rows) == 0:
        return phase, op
    scope, scopes = dictionary_codes(raw.column(S.SCOPE))
    codes = scope[rows]
    index = {name: i for i, name in enumerate(ops)}
    u_phase, u_op = [], []
    for name in scopes:
        result = rules.classify(S.KIND_OP, None, str(name))
        u_phase.append(PHASE_CODES[result.phase] if result.phase else NO_PHASE)
        canonical = result.op or rules.default_op(str(name))
        if canonical not in index:
            index[canonical] = len(ops)
            ops.append(canonical)
        u_op.append(index[canonical])
    known = codes >= 0
    phase[known] = np.array(u_phase, np.int8)[codes[known]]
    op[known] = np.array(u_op, np.int32)[codes[known]]
    return phase, op


def _constant(value: str | None, n: int) -> pa.DictionaryArray:
    if value is None:
        return S.all_null(n, pa.dictionary(pa.int32(), pa.string()))
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


#: No profiled window lasts this long: events this far from the rest carry a corrupt time.
STRAY_NS = 30 * 86_400 * 10**9


def may_stray(ts_min: int, ts_max: int, dur_max: int) -> bool:
    """Whether some event may carry a corrupt time (else, the usual case, no median is taken)."""
    return ts_max - ts_min > STRAY_NS or dur_max > STRAY_NS


def stray(ts: np.ndarray, dur: np.ndarray, median: float) -> np.ndarray:
    """Which events are more than 30 days from the trace's median time, or last longer."""
    return (np.abs(ts.astype(np.float64) - median) > STRAY_NS) | (dur > STRAY_NS)


def strays_dropped(rank: int, count: int) -> str:
    return (
        f"rank {rank}: {count} event(s) more than 30 days away from the rest of its trace "
        "(or lasting longer) were not read: their times are corrupt"
    )


def without_stray_times(raw: pa.Table, notes: Notes, rank: int) -> pa.Table:
    """The events, less those more than 30 days from the trace's median time (or lasting
    longer): one corrupt record must not make the whole trace unreadable. (A rank read in
    chunks: ``ingest.large.spill.without_strays``, the same rule.)"""
    if raw.num_rows == 0:
        return raw
    ts = ints(raw.column(S.TS_NS), 0)
    dur = ints(raw.column(S.DUR_NS), 0)
    if not may_stray(int(ts.min()), int(ts.max()), int(dur.max())):
        return raw  # the usual case: no copies, no median
    dropped = stray(ts, dur, float(np.median(ts.astype(np.float64))))
    if not dropped.any():
        return raw
    notes.warn(strays_dropped(rank, int(dropped.sum())))
    return raw.filter(pa.array(~dropped))


def kinds_from_categories(raw: pa.Table, rules: RuleSet) -> pa.Table:
    """An event whose parser left its kind open takes the kind the rules give its category."""
    if raw.column(S.KIND).null_count == 0:
        return raw
    kind_codes, kinds = dictionary_codes(raw.column(S.KIND))
    cat_codes, cats = dictionary_codes(raw.column(S.CAT))
    stated = [str(k) for k in kinds]
    by_category = [rules.kind_of(c) for c in cats] + [rules.kind_of(None)]
    names = sorted({*stated, *by_category})
    code = {name: i for i, name in enumerate(names)}
    # on dictionary codes: the parser's kind where it stated one, else its category's
    from_category = np.array([code[k] for k in by_category], np.int32)[cat_codes]
    from_parser = np.array([code[k] for k in stated] + [0], np.int32)[kind_codes]
    filled = np.where(kind_codes >= 0, from_parser, from_category).astype(np.int32)
    column = pa.DictionaryArray.from_arrays(pa.array(filled), pa.array(names, pa.string()))
    return raw.set_column(raw.schema.get_field_index(S.KIND), S.KIND, column)
