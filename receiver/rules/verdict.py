"""Why a payload was routed as it was: each rule's verdict, its reasons, and the rendered texts;
for an event that closes an alert, the resolved messages it would also send.

Only notifier names appear here, never their URLs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from receiver.durations import format_duration
from receiver.matchers import lookup
from receiver.rules.escalations import Policy
from receiver.rules.notifiers import Notifier
from receiver.rules.options import CLOSES, OPENS
from receiver.rules.rule import ESCALATE_ONLY, Decision, Rule
from receiver.rules.schedules import PREFIX

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
    # The rule's escalation, a line a step: "+5m step 2 -> schedule:primary (bob then)".
    escalation: tuple[str, ...] = ()
    policy: str | None = None

    @property
    def failed(self) -> tuple[ConditionOutcome, ...]:
        return tuple(c for c in self.conditions if not c.ok)


@dataclass(frozen=True)
class ResolvedOutcome:
    """A resolved message a closing event sends when its alert is open and this rule's
    notification about the event that opened it was sent (one per notifier URL)."""

    rule: str
    decisions: tuple[Decision, ...]
    title: str
    # Conditions of the rule on fields the opening event's copy here does not know (score,
    # userId...): it sent only if the opener met them.
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class Explanation:
    """The routing of one payload; ``decisions`` equals what Ruleset.route returns.

    For an event that closes an alert (score.recover, session.stopped,
    intervention.resolved), ``resolved`` lists the resolved messages it would send
    too if the alert is open: explain has no database, so that is the condition.
    """

    event_id: str | None
    event_type: str | None
    rules: tuple[RuleOutcome, ...]
    decisions: tuple[Decision, ...]
    alert: str | None = None  # "session sess_1", for a closing event
    opener: str | None = None  # the event type that opens that alert
    resolved: tuple[ResolvedOutcome, ...] = ()

    @property
    def matched(self) -> list[str]:
        return [r.rule for r in self.rules if r.status == "matched"]

    @property
    def resolved_decisions(self) -> tuple[Decision, ...]:
        """The resolved messages, one per notifier URL, if the alert is open."""
        return tuple(d for r in self.resolved for d in r.decisions)

    def format(self) -> str:
        """Readable text for `receiver explain`."""
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """format()'s lines, each one line of text but for a value's own line breaks (an
        event id with a newline), which a terminal shows escaped (cli echo_lines)."""
        head = f"event {self.event_id or '(no id)'} ({self.event_type or 'no type'})"
        lines = [head]
        for number, outcome in enumerate(self.rules, start=1):
            lines.extend(_format_rule(number, outcome))
        if self.resolved:
            lines.append(
                f"resolved messages, if an alert for {self.alert} is open: one from each rule"
                f" below whose notification about the {self.opener} that opened it was sent"
            )
            for item in self.resolved:
                lines.append(f"   - {_targets(item.decisions)}: {item.title}")
                if item.unknown:
                    lines.append(
                        f"       only if that {self.opener} matched its conditions on"
                        f" {', '.join(item.unknown)}"
                    )
        sent = [d for d in self.decisions if d.notifier != ESCALATE_ONLY]
        count = len(sent)
        policies = [r.policy for r in self.rules if r.status == "matched" and r.policy]
        if not self.decisions:
            own = "no notification of its own" if self.resolved else "nothing is sent"
            lines.append(f"result: no rule matched; {own}")
        elif not sent:
            lines.append(f"result: no notification at once; escalation {', '.join(policies)}")
        else:
            targets = _targets(sent)
            lines.append(f"result: {count} notification{'s' if count != 1 else ''}: {targets}")
            if policies:
                lines.append(f"        + escalation {', '.join(policies)} (steps above)")
        if self.resolved:
            more = len(self.resolved_decisions)
            lines.append(
                f"        + if an alert for {self.alert} is open: up to {more} resolved"
                f" message{'s' if more != 1 else ''} ({count + more} notifications in all)"
            )
        return lines


def explain(
    rules: Sequence[Rule],
    notifiers: Mapping[str, Notifier],
    payload: Mapping[str, Any],
    enrichment: Mapping[str, Any] | None = None,
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
        rendered = rule.render(payload, enrichment)
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
                policy=None if rule.escalate is None else rule.escalate.name,
                escalation=() if rule.escalate is None else escalation_lines(rule.escalate),
            )
        )
        if not rule.continue_:
            stopped_by = rule.name
    event_id, event_type = lookup(payload, "id"), lookup(payload, "type")
    closes = CLOSES.get(event_type) if isinstance(event_type, str) else None
    alert = opener = None
    resolved: tuple[ResolvedOutcome, ...] = ()
    if closes is not None:
        opener = next(kind for kind, alert_kind in OPENS.items() if alert_kind == closes)
        alert = f"session {payload.get('sessionId')}"
        if closes == "intervention":
            alert = f"intervention {payload.get('interventionId', '(none)')} of {alert}"
        resolved = _resolved(rules, notifiers, payload, opener)
    return Explanation(
        event_id=event_id if isinstance(event_id, str) else None,
        event_type=event_type if isinstance(event_type, str) else None,
        rules=tuple(outcomes),
        decisions=tuple(decisions),
        alert=alert,
        opener=opener,
        resolved=resolved,
    )


# The fields an alert's opening event shares with the event closing it: they name the alert.
_ALERT_FIELDS = ("sessionId", "interventionId")


def _resolved(
    rules: Sequence[Rule],
    notifiers: Mapping[str, Notifier],
    payload: Mapping[str, Any],
    opener: str,
) -> tuple[ResolvedOutcome, ...]:
    """The rules that may have notified about the event opening this one's alert, routed as
    the router would have routed that opener (first match wins), and have resolve: true.

    Only the opener's type and the fields naming the alert are known here; a condition on
    any other field may or may not have held, and is listed as unknown.
    """
    known: dict[str, Any] = {"type": opener}
    known.update({key: payload[key] for key in _ALERT_FIELDS if key in payload})
    found: list[ResolvedOutcome] = []
    for rule in rules:
        unknown = [c.field for c in rule.conditions if c.field.split(".")[0] not in known]
        if not all(c.holds(known) for c in rule.conditions if c.field not in unknown):
            continue
        if rule.resolve:
            # Only the title is shown: the body's opened_at and duration are the alert's.
            extra = {"opener": known, "opened_at": payload.get("timestamp"), "duration": 0}
            rendered = rule.render_resolved(payload, extra)
            found.append(
                ResolvedOutcome(
                    rule.name,
                    tuple(rule.decisions(rendered, notifiers)),
                    rendered.title,
                    tuple(dict.fromkeys(unknown)),
                )
            )
        if not unknown and not rule.continue_:
            break  # this rule surely took the opener: later rules never saw it
    return tuple(found)


def _targets(decisions: Sequence[Decision]) -> str:
    """'rule -> notifier' for each (rule, notifier), with its URL count when more than one."""
    counts: dict[tuple[str, str], int] = {}
    for d in decisions:
        counts[(d.rule, d.notifier)] = counts.get((d.rule, d.notifier), 0) + 1
    return ", ".join(
        f"{rule} -> {notifier}" + (f" ({n} urls)" if n > 1 else "")
        for (rule, notifier), n in counts.items()
    )


def _format_rule(number: int, outcome: RuleOutcome) -> list[str]:
    head = f"{number}. {outcome.rule}:"
    if outcome.status == "not evaluated":
        return [f'{head} not evaluated (rule "{outcome.skipped_by}" matched and does not continue)']
    if outcome.status == "not matched":
        lines = [f"{head} not matched"]
        lines.extend(f"     - {c.reason}" for c in outcome.failed)
        return lines
    lines = [f"{head} matched -> {', '.join(outcome.notifiers) or '(no notifier of its own)'}"]
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
    if outcome.escalation:
        lines.append(
            f"     escalate: {outcome.policy}, while the alert is open and nobody acknowledges:"
        )
        lines.extend(f"       {line}" for line in outcome.escalation)
    return lines


def escalation_lines(
    policy: Policy, on_call: Callable[[str, float], str] | None = None
) -> tuple[str, ...]:
    """A line for each page of the policy's first round ("+5m step 2 -> schedule:primary
    (bob-chat then)"), then one for the rounds after it; on_call(target, offset) names the
    member a schedule target pages then (None: the target alone)."""
    lines = []
    for offset, round_, index, step in policy.timeline():
        if round_ > 0:
            break
        names = [
            f"{t} ({on_call(t, offset)} then)" if on_call and t.startswith(PREFIX) else t
            for t in step.notify
        ]
        lines.append(f"+{format_duration(offset)} step {index + 1} -> {', '.join(names)}")
    if policy.repeat:
        again = format_duration(policy.round_gap)
        lines.append(
            f"then the chain again, {policy.repeat} more time{'s' if policy.repeat > 1 else ''},"
            f" {again} after its last step"
        )
    if policy.reack is not None:
        lines.append(
            f"an ack still open after {format_duration(policy.reack)} pages the current step again"
        )
    return tuple(lines)


def _indented(label: str, text: str) -> list[str]:
    first, *rest = text.splitlines() or [""]
    pad = " " * (5 + len(label))
    return [f"     {label}{first}", *(pad + line for line in rest)]
