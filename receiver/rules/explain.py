"""Why a payload was routed as it was: each rule's verdict, its reasons, and the rendered texts.

Only notifier names appear here, never their URLs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from receiver.rules.duration import format_duration
from receiver.rules.match import lookup
from receiver.rules.notifiers import Notifier
from receiver.rules.rule import Decision, Rule

Status = Literal["matched", "not matched", "not evaluated"]


@dataclass(frozen=True)
class ConditionOutcome:
    field: str
    ok: bool
    reason: str  # "score: 45 is not lt 30", "userId: field missing"


@dataclass(frozen=True)
class RuleOutcome:
    """One rule's part in the explanation; texts are set only when it matched."""

    rule: str
    status: Status
    conditions: tuple[ConditionOutcome, ...] = ()
    notifiers: tuple[str, ...] = ()
    title: str | None = None
    body: str | None = None
    fallback: bool = False
    error: str | None = None
    throttle_key: str | None = None
    throttle_seconds: float | None = None
    continues: bool = False
    skipped_by: str | None = None  # the earlier matching rule that stopped evaluation

    @property
    def failed(self) -> tuple[ConditionOutcome, ...]:
        return tuple(c for c in self.conditions if not c.ok)


@dataclass(frozen=True)
class Explanation:
    """The routing of one payload; ``decisions`` equals what Ruleset.route returns."""

    event_id: str | None
    event_type: str | None
    rules: tuple[RuleOutcome, ...]
    decisions: tuple[Decision, ...]

    @property
    def matched(self) -> list[str]:
        return [r.rule for r in self.rules if r.status == "matched"]

    def format(self) -> str:
        """Readable text for `receiver explain`."""
        head = f"event {self.event_id or '(no id)'} ({self.event_type or 'no type'})"
        lines = [head]
        for number, outcome in enumerate(self.rules, start=1):
            lines.extend(_format_rule(number, outcome))
        if not self.decisions:
            lines.append("result: no rule matched; nothing is sent")
        else:
            count = len(self.decisions)
            targets = ", ".join(f"{d.rule} -> {d.notifier}" for d in self.decisions)
            lines.append(f"result: {count} notification{'s' if count != 1 else ''}: {targets}")
        return "\n".join(lines)


def explain(
    rules: Sequence[Rule], notifiers: Mapping[str, Notifier], payload: Mapping[str, Any]
) -> Explanation:
    """Evaluate every rule in order exactly as routing does, keeping the reasons."""
    outcomes: list[RuleOutcome] = []
    decisions: list[Decision] = []
    stopped_by: str | None = None
    for rule in rules:
        if stopped_by is not None:
            outcomes.append(RuleOutcome(rule.name, "not evaluated", skipped_by=stopped_by))
            continue
        conditions = tuple(
            ConditionOutcome(c.field, ok, reason)
            for c, (ok, reason) in zip(rule.conditions, rule.test(payload), strict=True)
        )
        if not all(c.ok for c in conditions):
            outcomes.append(RuleOutcome(rule.name, "not matched", conditions))
            continue
        rendered = rule.render(payload)
        decisions.extend(rule.decisions(rendered, notifiers))
        outcomes.append(
            RuleOutcome(
                rule.name,
                "matched",
                conditions,
                notifiers=rule.notify,
                title=rendered.title,
                body=rendered.body,
                fallback=rendered.fallback,
                error=rendered.error,
                throttle_key=rendered.throttle_key,
                throttle_seconds=rendered.throttle_seconds,
                continues=rule.continue_,
            )
        )
        if not rule.continue_:
            stopped_by = rule.name
    event_id, event_type = lookup(payload, "id"), lookup(payload, "type")
    return Explanation(
        event_id=event_id if isinstance(event_id, str) else None,
        event_type=event_type if isinstance(event_type, str) else None,
        rules=tuple(outcomes),
        decisions=tuple(decisions),
    )


def _format_rule(number: int, outcome: RuleOutcome) -> list[str]:
    head = f"{number}. {outcome.rule}:"
    if outcome.status == "not evaluated":
        return [f'{head} not evaluated (rule "{outcome.skipped_by}" matched and does not continue)']
    if outcome.status == "not matched":
        lines = [f"{head} not matched"]
        lines.extend(f"     - {c.reason}" for c in outcome.failed)
        return lines
    lines = [f"{head} matched -> {', '.join(outcome.notifiers)}"]
    if not outcome.conditions:
        lines.append("     + (no conditions: matches every event)")
    lines.extend(f"     + {c.reason}" for c in outcome.conditions)
    if outcome.fallback:
        lines.append(f"     ! template failed ({outcome.error}); the fallback text is sent")
    lines.append(f"     title: {outcome.title}")
    lines.extend(_indented("body:  ", outcome.body or ""))
    if outcome.throttle_seconds is not None:
        every = format_duration(outcome.throttle_seconds)
        lines.append(f'     throttle: at most one per {every} for key "{outcome.throttle_key}"')
    if outcome.continues:
        lines.append("     continue: later rules are evaluated too")
    return lines


def _indented(label: str, text: str) -> list[str]:
    first, *rest = text.splitlines() or [""]
    pad = " " * (5 + len(label))
    return [f"     {label}{first}", *(pad + line for line in rest)]
