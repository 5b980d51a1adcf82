"""The rules an event of one type can match, narrowed by the fields most of them test for
exact strings (Ruleset.matching's index).

Teams write many rules on one type told apart by a field (`page: checkout`, `userId:
[u_42, u_43]`): the index by type leaves them all to try for every event. So, per type,
the plain field that the most rules test with exact strings (or a list of exact strings)
keys those rules by string; among the rules left, the next such field keys its own; and so
on while a field keys MIN_KEYED rules or more. For an event, each key field is read once
from the payload:

- a string value: the rules keyed on that value (their condition on the field is known to
  hold and is not tried again);
- missing, or not a string nor a list: none of that field's rules (an exact string holds
  for strings alone);
- a list (which holds when any item does): every rule of the type, as without the index;

with the rules no field keys, all in file order. Each rule's other conditions are tried
cheapest first (exact values, then comparisons, lists, globs, regexes): all must hold and
a test changes nothing, so the order changes no verdict. The verdicts are those of trying
every rule of the type (tests/rules/test_index.py holds the two to each other on
random rules and payloads).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any

from receiver.matchers import MISSING, AnyOf, Compare, Condition, Equal, Exact, Glob, Regex
from receiver.rules.rule import Rule

# Fewer rules than this keyed on one field: not worth a lookup, every rule is tried.
MIN_KEYED = 4

Candidates = tuple[tuple[Rule, tuple[Condition, ...]], ...]
_Placed = tuple[int, Rule, tuple[Condition, ...]]  # a rule, its position in file order


def _strings(condition: Condition) -> frozenset[str] | None:
    """The strings an exact condition on a plain field accepts; None for any other."""
    if "." in condition.field:
        return None
    matcher = condition.matcher
    if isinstance(matcher, Exact):
        return frozenset((matcher.value,))
    if isinstance(matcher, AnyOf) and matcher.items:
        if all(isinstance(item, Exact) for item in matcher.items):
            return frozenset(item.value for item in matcher.items)  # type: ignore[attr-defined]
    return None


class TypeIndex:
    """The rules of one event type (each with its conditions besides `type`), narrowed by
    the fields that MIN_KEYED of them or more test for exact strings: the field most rules
    key on, then, among the rules left, the next, and so on."""

    __slots__ = ("all", "levels", "rest")

    def __init__(self, rules: Iterable[tuple[Rule, tuple[Condition, ...]]]) -> None:
        self.all: Candidates = tuple((r, _cheap_first(c)) for r, c in rules)
        # Per field: the rules keyed on it that want each string, with their position in
        # file order and their conditions less that one (it holds wherever they are sent).
        self.levels: list[tuple[str, dict[str, tuple[_Placed, ...]]]] = []
        left = [(position, rule, conds) for position, (rule, conds) in enumerate(self.all)]
        while True:
            counts: Counter[str] = Counter()
            for _, _, conditions in left:
                counts.update({c.field for c in conditions if _strings(c) is not None})
            if not counts or (best := counts.most_common(1)[0])[1] < MIN_KEYED:
                break
            field = best[0]
            by_value: dict[str, list[_Placed]] = {}
            rest = []
            for position, rule, conditions in left:
                key = next(
                    (c for c in conditions if c.field == field and _strings(c) is not None), None
                )
                if key is None:
                    rest.append((position, rule, conditions))
                    continue
                # Another condition on the same field stays: both must hold.
                placed = (position, rule, tuple(c for c in conditions if c is not key))
                for value in _strings(key) or ():
                    by_value.setdefault(value, []).append(placed)
            self.levels.append((field, {v: tuple(p) for v, p in by_value.items()}))
            left = rest
        self.rest: tuple[_Placed, ...] = tuple(left)

    def candidates(self, payload: Mapping[str, Any]) -> Candidates:
        """The rules to try for payload, in file order, each with the conditions to test."""
        if not self.levels:
            return self.all
        found: list[tuple[_Placed, ...]] = [self.rest] if self.rest else []
        for field, by_value in self.levels:
            value = payload.get(field, MISSING)
            if isinstance(value, str):
                if (wanting := by_value.get(value)) is not None:
                    found.append(wanting)
            elif isinstance(value, list):
                return self.all
        if not found:
            return ()
        if len(found) == 1:
            return tuple((rule, conditions) for _, rule, conditions in found[0])
        return tuple((rule, conditions) for _, rule, conditions in sorted(chain(*found)))


# Matchers by what a test of theirs costs: a rule's conditions are tried cheapest first (all
# must hold, and a test changes nothing, so the order changes no verdict).
_COST = {Exact: 0, Equal: 0, Compare: 1, AnyOf: 2, Glob: 3, Regex: 4}


def _cheap_first(conditions: tuple[Condition, ...]) -> tuple[Condition, ...]:
    return tuple(
        sorted(conditions, key=lambda c: (c.field.count("."), _COST.get(type(c.matcher), 5)))
    )
