"""Inhibition rules: an open alert of one kind mutes the notifications of another.

    inhibit:
      - name: intervention-covers-drop
        source: {type: intervention.fired}        # any match expression, as in rules
        target: {type: score.drop}
        equal: [sessionId]                         # present AND equal on both

While an alert opened by an event matching `source` is open, the notifications of events
matching `target` whose `equal` fields have the same values are inhibited. A field missing
on either side means no inhibition (Alertmanager's prometheus/alertmanager#507: there two
missing labels count as equal). receiver.dispatch.inhibition keeps the open sources in the
store and applies the rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from receiver.matchers import MISSING, Condition, compile_match, lookup, show
from receiver.rules.notifiers import NAME_RE
from receiver.rules.options import OPENS

INHIBIT_KEYS = ("name", "source", "target", "equal")


@dataclass(frozen=True)
class Inhibition:
    """A validated inhibition rule; build them with check_inhibit (rules.load_text)."""

    name: str
    source: tuple[Condition, ...]
    target: tuple[Condition, ...]
    equal: tuple[str, ...]
    shown: tuple[str, str] = ("", "")  # source and target as written, for humans

    def is_source(self, payload: Mapping[str, Any]) -> bool:
        return all(c.holds(payload) for c in self.source)

    def is_target(self, payload: Mapping[str, Any]) -> bool:
        return all(c.holds(payload) for c in self.target)

    def key(self, payload: Mapping[str, Any]) -> str | None:
        """The values of the equal fields, as one text; None when any is missing (or
        null): then nothing is inhibited, on either side."""
        values = []
        for field in self.equal:
            value = lookup(payload, field)
            if value is MISSING or value is None:
                return None
            values.append(_canonical(value))
        return json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)


def _canonical(value: Any) -> Any:
    """value with each whole float as an int, as matching compares them (1.0 equals 1),
    inside lists and objects too; a bool stays a bool.

    >>> _canonical({"a": [1.0, 2.5, True]})
    {'a': [1, 2.5, True]}
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def check_inhibit(raw: Any, problems: list[str]) -> list[Inhibition]:
    """The rules under rules.yaml's `inhibit:`, each problem appended to problems with the
    rule named: 'inhibit "covers": equal: ...'."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append(f"inhibit: expected a list of inhibition rules, got {show(raw)}")
        return []
    found: list[Inhibition] = []
    seen: set[str] = set()
    for index, spec in enumerate(raw):
        name = spec.get("name") if isinstance(spec, dict) else None
        label = f'inhibit "{name}"' if isinstance(name, str) and name else f"inhibit #{index + 1}"
        before = len(problems)
        rule = _check_one(spec, seen, problems)
        problems[before:] = [f"{label}: {p}" for p in problems[before:]]
        if rule is not None and len(problems) == before:
            found.append(rule)
    return found


def _check_one(spec: Any, seen: set[str], problems: list[str]) -> Inhibition | None:
    if not isinstance(spec, dict):
        problems.append(f"expected a mapping with keys {', '.join(INHIBIT_KEYS)}, got {show(spec)}")
        return None
    for key in spec:
        if key not in INHIBIT_KEYS:
            problems.append(f'unknown key "{key}"; allowed: {", ".join(INHIBIT_KEYS)}')
    for key in ("name", "source", "target", "equal"):
        if key not in spec:
            problems.append(f'missing required key "{key}"')
    name = spec.get("name")
    if "name" in spec:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(
                "name: invalid name; allowed: letters, digits, '_', '.', '-', starting with a "
                "letter or digit"
            )
        elif name in seen:
            problems.append(f'duplicate inhibition name "{name}"; names must be unique')
        else:
            seen.add(name)
    source = _side("source", spec.get("source"), problems) if "source" in spec else ()
    target = _side("target", spec.get("target"), problems) if "target" in spec else ()
    equal = _equal(spec.get("equal"), problems) if "equal" in spec else ()
    # Compared as sets: a match expression's keys may be written in any order. Two sides
    # refused (both empty) are not the same events: each has its own message.
    if source and target and set(source) == set(target):
        problems.append(
            "source and target match the same events: each alert would mute the next one "
            "like it; make target narrower (or source)"
        )
    if source and not any(_may_open(source, kind) for kind in OPENS):
        problems.append(
            f"source: matches no event that opens an alert ({', '.join(OPENS)}); an "
            "inhibition lasts while its source alert is open"
        )
    shown = (_flow(spec.get("source")), _flow(spec.get("target")))
    return Inhibition(str(name), source, target, equal, shown)


def _flow(raw: Any) -> str:
    return json.dumps(raw, separators=(", ", ": "), default=str)


def _side(where: str, raw: Any, problems: list[str]) -> tuple[Condition, ...]:
    if not isinstance(raw, dict) or not raw:
        problems.append(f"{where}: expected a non-empty match expression (as a rule's match)")
        return ()
    conditions, found = compile_match(raw)
    problems.extend(f"{where}.{p.removeprefix('match.')}" for p in found)
    return conditions


def _equal(raw: Any, problems: list[str]) -> tuple[str, ...]:
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names:
        problems.append(
            "equal: expected a non-empty list of payload fields (such as [sessionId]) that "
            "must be present and equal on both sides"
        )
        return ()
    result: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name or "" in name.split("."):
            problems.append(f"equal: expected payload field names, got {show(name)}")
        elif name in result:
            problems.append(f'equal: "{name}" is listed twice')
        else:
            result.append(name)
    return tuple(result)


def _may_open(conditions: Sequence[Condition], kind: str) -> bool:
    return all(c.matcher.ok(kind) for c in conditions if c.field == "type")
