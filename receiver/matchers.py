"""Conditions of a rule's `match:` block: compiling each value once, testing payloads, saying why.

A value is an exact string, a glob (``score.*``), a regex (``~^user_``), a
number or boolean (equality), a mapping of numeric operators (``{lt: 30}``) or a
list of any of these (any one must hold). Every test returns the verdict and a
reason (``test``, for explain); routing uses ``ok`` / ``Condition.holds``, which
decide the same verdict without formatting anything (tests check they agree).

Regexes run on RE2 (google-re2), which never backtracks: a match takes time linear
in the value, so no pattern and value can stall routing (``(a+)+$`` against
``"a" * 28 + "!"`` took 20 s on Python's ``re``). Patterns RE2 cannot run
(backreferences, lookaround, ...) are refused when compiled, naming what to change.
"""

from __future__ import annotations

import json
import math
import operator
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from fnmatch import translate
from typing import Any, Protocol

import re2
from re2 import _re2

OPERATORS = ("lt", "lte", "gt", "gte", "eq", "between")
_GLOB_CHARS = frozenset("*?[")
_MISSING: Any = object()
MISSING = _MISSING  # what lookup() answers for a field the payload does not have
_NUMBER = (int, float)


class Matcher(Protocol):
    def ok(self, value: Any) -> bool:
        """Whether value satisfies the matcher; the routing hot path, so it formats nothing."""

    def test(self, value: Any) -> tuple[bool, str]:
        """Whether value satisfies the matcher, and a phrase saying so ("45 is not lt 30")."""


@dataclass(frozen=True)
class Exact:
    value: str

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value == self.value

    def test(self, value: Any) -> tuple[bool, str]:
        if not isinstance(value, str):
            return False, f"{show(value)} is not a string"
        ok = self.ok(value)
        return ok, f"{show(value)} {'is' if ok else 'is not'} {show(self.value)}"


@dataclass(frozen=True)
class Glob:
    pattern: str
    # fnmatchcase(value, pattern), compiled once instead of looked up per call.
    _match: Callable[[str], re.Match[str] | None] = dataclass_field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_match", re.compile(translate(self.pattern)).match)

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and self._match(value) is not None

    def test(self, value: Any) -> tuple[bool, str]:
        if not isinstance(value, str):
            return False, f"{show(value)} is not a string"
        ok = self.ok(value)
        verb = "matches" if ok else "does not match"
        return ok, f"{show(value)} {verb} glob {show(self.pattern)}"


@dataclass(frozen=True)
class Regex:
    """``~pattern``: the pattern found anywhere in the value (``re.search`` semantics),
    on RE2. Raises ValueError for a pattern that is invalid or that RE2 cannot run."""

    pattern: str
    _search: Callable[[str], bool] = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_search", compile_regex(self.pattern))

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and self._search(value)

    def test(self, value: Any) -> tuple[bool, str]:
        if not isinstance(value, str):
            return False, f"{show(value)} is not a string"
        ok = self.ok(value)
        verb = "matches" if ok else "does not match"
        return ok, f"{show(value)} {verb} regex {show(self.pattern)}"


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refusal is reported to whoever wrote it, not to stderr
    options.never_capture = True  # only the verdict is wanted: RE2's fastest matcher
    return options


_RE2_OPTIONS = _re2_options()
# The binding itself: re2.compile()'s wrapper builds a match object and maps offsets back
# to characters, which a verdict needs neither of (docs/performance.md: the figures behind
# code choices).
_RE2 = _re2.RE2
_UNANCHORED = _re2.RE2.Anchor.UNANCHORED
# Python's re accepts these and RE2 refuses them; by the start of RE2's message.
_NOT_ON_RE2 = (
    ("invalid escape sequence: \\Z", "not supported: write \\z for the end of the value"),
    ("invalid perl operator: (?=", "lookahead is not supported"),
    ("invalid perl operator: (?!", "lookahead is not supported"),
    ("invalid perl operator: (?<=", "lookbehind is not supported"),
    ("invalid perl operator: (?<!", "lookbehind is not supported"),
    ("invalid perl operator: (?>", "atomic groups are not supported (nor needed)"),
    ("bad repetition operator", "possessive quantifiers are not supported (nor needed)"),
    ("invalid perl operator: (?(", "conditional groups are not supported"),
    ("invalid perl operator: (?#", "comments (?#...) are not supported"),
    ("invalid perl operator: (?", "only the flags i, m, s and U are supported"),
    (
        "invalid repetition size",
        "repetition counts above 1000 are not supported (nested counts multiply)",
    ),
    ("pattern too large", "the pattern is too large"),
)


def compile_regex(pattern: str) -> Callable[[str], bool]:
    """A test of whether pattern occurs in a string (``re.search``), linear in its length.

    RE2's syntax is Python's less the features that need backtracking, plus a few of
    its own (``\\pL``, ``[[:alpha:]]``). Raises ValueError saying what is wrong:
    Python's message for invalid syntax ("missing ), unterminated subpattern at
    position 0"), or why RE2 cannot run a pattern Python accepts ("\\1: backreferences
    are not supported (...)").
    """
    program = _RE2(pattern.encode("utf-8", "surrogatepass"), _RE2_OPTIONS)
    if not program.ok():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # FutureWarning: "possible nested set"
                re.compile(pattern)
        except re.error as exc:  # invalid anywhere: Python's words, which users know
            raise ValueError(str(exc)) from None
        raise ValueError(_refusal(program.error(), pattern))
    match, unanchored = program.Match, _UNANCHORED

    def search(value: str) -> bool:
        text = value.encode("utf-8", "surrogatepass")
        return bool(match(unanchored, text, 0, len(text))[0][0] >= 0)

    return search


def _refusal(error: bytes | str, pattern: str) -> str:
    """RE2's refusal of a pattern and what to change: ``(?=: lookahead is not supported``."""
    text = error.decode(errors="replace") if isinstance(error, bytes) else error
    what, _, where = text.partition(": ")
    backreference = (where == "(?P" and "(?P=" in pattern) or (
        what == "invalid escape sequence" and where[1:2].isdigit()
    )
    if backreference:
        why = "backreferences are not supported"
    else:
        why = next((w for start, w in _NOT_ON_RE2 if text.startswith(start)), what)
    return f"{where or text}: {why} (regexes run on RE2, which never backtracks)"


@dataclass(frozen=True)
class Equal:
    value: int | float | bool

    def ok(self, value: Any) -> bool:
        # bool is an int in Python; keep true and 1 apart as JSON does.
        same_kind = isinstance(value, bool) == isinstance(self.value, bool)
        return same_kind and isinstance(value, _NUMBER) and value == self.value

    def test(self, value: Any) -> tuple[bool, str]:
        ok = self.ok(value)
        return ok, f"{show(value)} {'is' if ok else 'is not'} {show(self.value)}"


@dataclass(frozen=True)
class Compare:
    """All operators must hold; ``between`` is inclusive at both ends."""

    ops: tuple[tuple[str, float | tuple[float, float]], ...]

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, _NUMBER):
            return False
        for op, operand in self.ops:
            if isinstance(operand, tuple):
                if not operand[0] <= value <= operand[1]:
                    return False
            elif not _COMPARE[op](value, operand):
                return False
        return True

    def test(self, value: Any) -> tuple[bool, str]:
        if isinstance(value, bool) or not _is_number(value):
            return False, f"{show(value)} is not a number"
        held = []
        for op, operand in self.ops:
            if isinstance(operand, tuple):
                lo, hi = operand
                ok = lo <= value <= hi
                phrase = f"between {show(lo)} and {show(hi)}"
            else:
                ok = _COMPARE[op](value, operand)
                phrase = f"{op} {show(operand)}"
            if not ok:
                return False, f"{show(value)} is not {phrase}"
            held.append(phrase)
        return True, f"{show(value)} is {' and '.join(held)}"


@dataclass(frozen=True)
class AnyOf:
    items: tuple[Matcher, ...]

    def ok(self, value: Any) -> bool:
        for item in self.items:
            if item.ok(value):
                return True
        return False

    def test(self, value: Any) -> tuple[bool, str]:
        reasons = []
        for item in self.items:
            ok, reason = item.test(value)
            if ok:
                return True, reason
            reasons.append(reason)
        return False, "none of the alternatives holds: " + "; ".join(reasons)


@dataclass(frozen=True)
class Condition:
    """One `match:` entry: a payload field (dotted path for nested data) and its matcher."""

    field: str
    matcher: Matcher
    # A dotted path's parts; None for a plain name (missing from the payload: missing).
    _nested: tuple[str, ...] | None = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = tuple(self.field.split("."))
        object.__setattr__(self, "_nested", parts if len(parts) > 1 else None)
        if len(parts) == 1:  # the routing hot path: this instance's own holds()
            object.__setattr__(self, "holds", _plain_holds(self.field, self.matcher))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Condition, (self.field, self.matcher))  # holds() is made again

    def holds(self, payload: Mapping[str, Any]) -> bool:
        """test()'s verdict alone, formatting nothing: the routing hot path."""
        value = payload.get(self.field, _MISSING)
        if value is _MISSING:
            if self._nested is None:
                return False
            value = _walk(payload, self._nested)
            if value is _MISSING:
                return False
        ok = self.matcher.ok
        return _any_item(ok, value) if isinstance(value, list) else ok(value)

    def test(self, payload: Mapping[str, Any]) -> tuple[bool, str]:
        """The verdict and a reason naming the field: ``score: 45 is not lt 30``."""
        value = lookup(payload, self.field)
        if value is _MISSING:
            return False, f"{self.field}: field missing"
        if isinstance(value, list):
            # A list field holds when any of its items does (tags: urgent).
            for item in value:
                ok, reason = self.matcher.test(item)
                if ok:
                    return True, f"{self.field}: item {reason}"
            return False, f"{self.field}: no item of {show(value)} matches"
        ok, reason = self.matcher.test(value)
        return ok, f"{self.field}: {reason}"


def _plain_holds(field: str, matcher: Matcher) -> Callable[[Mapping[str, Any]], bool]:
    """Condition.holds() for a field without dots, made once for its matcher: an exact
    string, or a list of them (most rules' conditions), is a set lookup in place; any other
    matcher's ok() is called without the method's lookups. The same verdicts as the method
    (tests/test_matchers.py holds every form to test()'s); what it saves is in
    docs/performance.md's levers table."""
    items = matcher.items if isinstance(matcher, AnyOf) else (matcher,)
    if all(type(item) is Exact for item in items):
        wanted = frozenset(item.value for item in items if isinstance(item, Exact))

        def holds_string(payload: Mapping[str, Any]) -> bool:
            value = payload.get(field)
            if isinstance(value, str):
                return value in wanted
            if isinstance(value, list):
                for item in value:  # a list field holds when any of its items does
                    if isinstance(item, str) and item in wanted:
                        return True
            return False

        return holds_string
    ok = matcher.ok

    def holds(payload: Mapping[str, Any]) -> bool:
        value = payload.get(field, _MISSING)
        if value is _MISSING:
            return False
        return _any_item(ok, value) if isinstance(value, list) else ok(value)

    return holds


def _any_item(ok: Callable[[Any], bool], items: list[Any]) -> bool:
    """A list field holds when any of its items does (tags: urgent)."""
    for item in items:
        if ok(item):
            return True
    return False


def lookup(payload: Mapping[str, Any], path: str) -> Any:
    """The value at a field name or dotted path (``meta.page``, ``items.0``), else a sentinel.

    A key that itself contains dots wins over the nested reading.
    """
    if path in payload:
        return payload[path]
    return _walk(payload, path.split("."))


def _walk(payload: Mapping[str, Any], parts: tuple[str, ...] | list[str]) -> Any:
    value: Any = payload
    for part in parts:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def parse_matchers(lines: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """FIELD=VALUE lines (a silence's matchers, from `receiver silence add --match` or the
    admin page's form) as a `match:` mapping, and every problem found. A value is read as
    a rules.yaml scalar would be: true/false and JSON numbers typed (a score, a flag), a
    JSON string in double quotes as that text (`userId="42"` for the text 42), anything
    else as the text written (exact, glob or ~regex).

    >>> parse_matchers(["userId=42", 'cohort="42"', "page=/checkout*", "signals=true"])
    ({'userId': 42, 'cohort': '42', 'page': '/checkout*', 'signals': True}, [])
    """
    matchers: dict[str, Any] = {}
    problems: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        field, sep, raw = line.partition("=")
        field, raw = field.strip(), raw.strip()
        if not sep or not field:
            problems.append(f"{show(line.strip()[:60])} is not FIELD=VALUE")
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if (
            not isinstance(value, str | bool | int | float)
            or (isinstance(value, str) and not raw.startswith('"'))
            or (isinstance(value, float) and not math.isfinite(value))
        ):
            value = raw  # null, lists, objects, NaN, 1e999: the text as written
        matchers[field] = value
    if not matchers and not problems:
        problems.append("at least one matcher (FIELD=VALUE) is needed")
    _, invalid = compile_match(matchers)
    return matchers, problems + invalid


def compile_match(raw: Mapping[Any, Any] | None) -> tuple[tuple[Condition, ...], list[str]]:
    """Conditions for a `match:` mapping, and every problem found (prefixed ``match.<field>:``)."""
    conditions: list[Condition] = []
    problems: list[str] = []
    for field, value in (raw or {}).items():
        if not isinstance(field, str) or not field or "" in field.split("."):
            problems.append(
                f"match: field name {show(field)} is not allowed; "
                "allowed: a payload field name or dotted path such as meta.page"
            )
            continue
        found: list[str] = []
        matcher = _compile(value, found, top=True)
        problems.extend(f"match.{field}: {p}" for p in found)
        if matcher is not None and not found:
            conditions.append(Condition(field, matcher))
    return tuple(conditions), problems


def _compile(value: Any, problems: list[str], *, top: bool) -> Matcher | None:
    if isinstance(value, str):
        if value.startswith("~"):
            if value == "~":
                problems.append('empty regex "~"; write a pattern after the ~')
                return None
            try:
                return Regex(value[1:])
            except ValueError as exc:
                problems.append(f"invalid regex {show(value[1:])}: {exc}")
                return None
        if _GLOB_CHARS & set(value):
            return Glob(value)
        return Exact(value)
    if isinstance(value, bool) or (_is_number(value) and math.isfinite(value)):
        return Equal(value)
    if isinstance(value, Mapping):
        return _compile_operators(value, problems)
    if isinstance(value, list) and top:
        if not value:
            problems.append("empty list matches nothing; allowed: a list of one or more values")
            return None
        items = [_compile(item, problems, top=False) for item in value]
        return AnyOf(tuple(i for i in items if i is not None))
    what = "a nested list" if isinstance(value, list) else show(value)
    problems.append(
        f"{what} is not a condition; allowed: a string (exact, glob or ~regex), "
        "a number, true/false, an operator mapping such as {lt: 30}, or a list of these"
    )
    return None


def _compile_operators(raw: Mapping[Any, Any], problems: list[str]) -> Matcher | None:
    allowed = ", ".join(OPERATORS)
    if not raw:
        problems.append(f"empty operator mapping; allowed: {allowed}")
        return None
    ops: list[tuple[str, float | tuple[float, float]]] = []
    before = len(problems)
    for op, operand in raw.items():
        if op not in OPERATORS:
            problems.append(f"unknown operator {show(op)}; allowed: {allowed}")
        elif op == "between":
            ok = isinstance(operand, list) and len(operand) == 2 and all(map(_finite, operand))
            if not ok:
                problems.append(f"between: expected two numbers [low, high], got {show(operand)}")
            elif operand[0] > operand[1]:
                problems.append(f"between: low {show(operand[0])} is above high {show(operand[1])}")
            else:
                ops.append((op, (operand[0], operand[1])))
        elif not _finite(operand):
            problems.append(f"{op}: expected a number, got {show(operand)}")
        else:
            ops.append((op, operand))
    return Compare(tuple(ops)) if len(problems) == before else None


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "lt": operator.lt,
    "lte": operator.le,
    "gt": operator.gt,
    "gte": operator.ge,
    "eq": operator.eq,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)


def _finite(value: Any) -> bool:
    return _is_number(value) and not isinstance(value, bool) and math.isfinite(value)


def show(value: Any) -> str:
    """A value as JSON would write it, cut to 60 characters: "user_42", 20, true, null."""
    if value is _MISSING:
        return "(missing)"
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
