"""What the lifecycle would do with an event now, for `receiver explain`: its alert, the
silences that hold it, and each matching rule's window, digest, hold, resolve and repeat."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from receiver.dispatch.alerts import alert_id, event_time
from receiver.dispatch.silences import active_silences, matching
from receiver.events import date_or_why
from receiver.rules import Ruleset, format_duration
from receiver.rules.maintenance import held_reason, holding
from receiver.rules.options import CLOSES, OPENS
from receiver.store.flaps import Flap
from receiver.store.records import Alert, Silence


def explain_now(
    ruleset: Ruleset,
    payload: Mapping[str, Any],
    now: float,
    *,
    silences: Sequence[Silence] = (),
    alert: Alert | None = None,
    notified: Sequence[str] = (),
    flaps: Sequence[Flap] = (),
) -> list[str]:
    """What the lifecycle would do with payload now, one line each, for `receiver explain`.

    notified names the rules whose notification about the alert's open episode was sent:
    a closing event sends a resolved message for each of them that has resolve: true.
    flaps: the alert's flap detection records (tx.flaps.of), by rule.
    """
    lines: list[str] = []
    aid = alert_id(payload)
    stale = aid is not None and alert is not None and event_time(payload) < alert.last_ts
    if aid is not None:
        state = "none yet" if alert is None else f"{alert.state}, newest event {alert.last_ts}"
        lines.append(f"alert {aid}: {state}")
        if stale:
            lines.append(
                "stale: older than the alert's newest event, so rules with hold, resolve or"
                " repeat send nothing; other rules forward it"
            )
        elif payload.get("type") in CLOSES:
            lines.append(_resolves_now(ruleset, alert, notified, now))
    for silence in matching(active_silences(silences), payload):
        until = date_or_why(
            silence.ends_at,
            lambda ts: datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC"),
        )
        lines.append(f"silenced by #{silence.id} until {until} ({silence.reason})")
    upkeep = holding(ruleset.maintenance, payload, now)
    if upkeep is not None:  # "maintenance: weekly-deploy (until ...)", as its rows say
        lines.append(held_reason(upkeep, now))
    opening = payload.get("type") in OPENS
    for name in dict.fromkeys(d.rule for d in ruleset.route(payload)):
        if stale and ruleset.by_name[name].follows_alert:
            lines.append(f"{name}: stale, nothing sent")
            continue
        notes = _rule_notes(ruleset, name, now, opening=opening)
        notes += _flap_notes(ruleset, name, [f for f in flaps if f.rule == name])
        if notes:
            lines.append(f"{name}: " + "; ".join(notes))
    return lines


def _rule_notes(ruleset: Ruleset, name: str, now: float, *, opening: bool) -> list[str]:
    """What the rule's own options do to its notification of the event now."""
    rule = ruleset.by_name[name]
    notes = []
    if rule.active is not None:
        if rule.active.contains(now):
            notes.append(f"inside its active window ({rule.active.text})")
        elif rule.active.defer:
            opens = datetime.fromtimestamp(rule.active.next_open(now), UTC)
            notes.append(f"deferred to {opens:%Y-%m-%d %H:%M UTC} ({rule.active.text})")
        else:
            notes.append(f"muted: outside its active window ({rule.active.text})")
    if rule.group is not None:
        by = ", ".join(rule.group.by) or "nothing"
        notes.append(
            f"grouped into a digest by {by} for {format_duration(rule.group.wait)}"
            f" (at most {rule.group.max})"
        )
    if rule.hold is not None and opening:
        notes.append(f"held {format_duration(rule.hold)}; cancelled if the alert resolves first")
    if rule.resolve:
        notes.append("a resolved message when the alert resolves")
    if rule.repeat is not None:
        notes.append(f"repeated every {format_duration(rule.repeat)} while open")
    if rule.storm is not None:
        over = "held back and not paged (no chain starts)" if rule.escalate else "held back"
        notes.append(
            f"storm guard: past {rule.storm.max} in {format_duration(rule.storm.per)} the rest"
            f" are {over}, counted in one storm message"
        )
    if rule.escalate is not None and opening:
        notes.append(
            f"escalation {rule.escalate.name} starts if the alert opens now (a chain already"
            " running for its episode goes on as frozen)"
        )
    return notes


def _flap_notes(ruleset: Ruleset, name: str, flaps: Sequence[Flap]) -> list[str]:
    """Flap detection of the rule, and whether the alert is flapping under it now."""
    spec = ruleset.by_name[name].flap
    if spec is None:
        return []
    quiet = format_duration(spec.quiet)
    for found in flaps:
        if found.since is not None and found.settle_at is not None:
            settles = datetime.fromtimestamp(found.settle_at, UTC)
            since = datetime.fromtimestamp(found.since, UTC)
            return [
                f"flapping since {since:%Y-%m-%d %H:%M:%S UTC}: its changes are kept, not"
                f" sent, until {quiet} without one (not before {settles:%H:%M:%S UTC})"
            ]
    return [f"flap detection: {spec.text} make its alert flapping (one message, then none"
            f" until {quiet} without a change)"]  # fmt: skip


def _resolves_now(
    ruleset: Ruleset, alert: Alert | None, notified: Sequence[str], now: float
) -> str:
    """What closing the alert now sends besides the rules' own notifications."""
    if alert is None or alert.state != "open":
        return "not open: it resolves nothing, and sends no resolved message"
    rules = [ruleset.by_name[name] for name in notified if name in ruleset.by_name]
    parts = []
    count = 0
    for rule in (r for r in rules if r.resolve):
        # A schedule target is whoever is on call now, as routing would place it.
        names = list(dict.fromkeys(ruleset.target(name, now) for name in rule.notify))
        urls = sum(len(ruleset.notifiers[name].urls) for name in names)
        count += urls
        plural = f" ({urls} urls)" if urls > 1 else ""
        parts.append(f"{rule.name} -> {', '.join(names)}{plural}")
    if not parts:
        return "resolves it; no rule with resolve: true notified about it, so no resolved message"
    return f"resolves it: {count} resolved message{'s' if count != 1 else ''}: {', '.join(parts)}"
