"""Conditions of a rule's `match:` block: compiling each value once, testing payloads, saying why.

A value is an exact string, a glob (``score.*``), a regex (``~^user_``), a
number or boolean (equality), a mapping of numeric operators (``{lt: 30}``) or a
list of any of these (any one must hold). Every test returns the verdict and a
reason, so explain output and routing can never disagree.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Protocol

OPERATORS = ("lt", "lte", "gt", "gte", "eq", "between")
_GLOB_CHARS = frozenset("*?[")
_MISSING: Any = object()


class Matcher(Protocol):
    def test(self, value: Any) -> tuple[bool, str]:
        """Whether value satisfies the matcher, and a phrase saying so ("45 is not lt 30")."""


@dataclass(frozen=True)
class Exact:
    value: str

    def test(self, value: Any) -> tuple[bool, str]:
        if not isinstance(value, str):
            return False, f"{show(value)} is not a string"
        ok = value == self.value
        return ok, f"{show(value)} {'is' if ok else 'is not'} {show(self.value)}"


@dataclass(frozen=True)
class Glob:
    pattern: str

    def test(self, value: Any) -> tuple[bool, str]:
        if not isinstance(value, str):
            return False, f"{show(value)} is not a string"
        ok = fnmatchcase(value, self.pattern)
        verb = "matches" if ok else "does not match"
        return ok, f"{show(value)} {verb} glob {show(self.pattern)}"


@dataclass(frozen=True)
class Regex:
    pattern: re.Pattern[str]

    def test(self, value: Any) -> tuple[bool, str]:
        if not isinstance(value, str):
            return False, f"{show(value)} is not a string"
        ok = self.pattern.search(value) is not None
        verb = "matches" if ok else "does not match"
        return ok, f"{show(value)} {verb} regex {show(self.pattern.pattern)}"


@dataclass(frozen=True)
class Equal:
    value: int | float | bool

    def test(self, value: Any) -> tuple[bool, str]:
        # bool is an int in Python; keep true and 1 apart as JSON does.
        same_kind = isinstance(value, bool) == isinstance(self.value, bool)
        ok = same_kind and _is_number(value) and value == self.value
        return ok, f"{show(value)} {'is' if ok else 'is not'} {show(self.value)}"


@dataclass(frozen=True)
class Compare:
    """All operators must hold; ``between`` is inclusive at both ends."""

    ops: tuple[tuple[str, float | tuple[float, float]], ...]

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


def lookup(payload: Mapping[str, Any], path: str) -> Any:
    """The value at a field name or dotted path (``meta.page``, ``items.0``), else a sentinel.

    A key that itself contains dots wins over the nested reading.
    """
    if path in payload:
        return payload[path]
    value: Any = payload
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


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
                return Regex(re.compile(value[1:]))
            except re.error as exc:
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


_COMPARE = {
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
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
