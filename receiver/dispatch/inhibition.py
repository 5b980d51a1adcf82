"""Inhibition (rules.yaml's `inhibit:`, receiver.rules.inhibit) inside a routing transaction.

An alert whose opening event matches an inhibition rule's source is noted in the store
(tx.inhibitors) under the values of the rule's equal fields, and forgotten when it resolves.
A notification of an event matching the rule's target, with the same values, is then
`inhibited` while that alert is open, with the reason ("inhibited by covers (evt_abc, open
since 2026-11-23 10:14:03Z)"). The state lives in the store: a restart neither sends what
was inhibited nor forgets it, and replicas agree. What was sent before stays answered: a
resolved message is never inhibited. When the source ends, a lifecycle rule's alert still
open is notified once, "was inhibited by covers since ..." (receiver.dispatch.escalations.wake).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from receiver.dispatch.alerts import Transition
from receiver.dispatch.silences import Active, silencing
from receiver.rules import Rule, Ruleset
from receiver.rules.inhibit import Inhibition
from receiver.rules.maintenance import held_reason, holding
from receiver.store.base import Tx
from receiver.store.records import Inhibitor


def track(
    tx: Tx, ruleset: Ruleset, payload: Mapping[str, Any], transition: Transition, event_id: str
) -> bool:
    """Keep the open sources up to date with what the event did to its alert; whether a
    source ended (what it inhibited may be notified now: escalations.wake)."""
    alert = transition.alert
    if not ruleset.inhibit or alert is None:
        return False
    if transition.what == "open":
        # Rows of an earlier episode that no closing event removed (an operator resolved
        # it): its new opening event says what this episode inhibits.
        tx.inhibitors.remove(alert.id)
        for rule in ruleset.inhibit:
            if rule.is_source(payload) and (key := rule.key(payload)) is not None:
                since = _epoch(alert.opened_ts)
                tx.inhibitors.add(
                    Inhibitor(rule.name, key, alert.id, alert.episode, event_id, since)
                )
    elif transition.what == "resolve":
        return tx.inhibitors.remove(alert.id) > 0
    return False


def inhibiting(
    tx: Tx, ruleset: Ruleset, payload: Mapping[str, Any], alert: str | None
) -> tuple[Inhibition, Inhibitor] | None:
    """The first inhibition rule (in file order) whose target payload matches and whose
    source alert with equal values is open now, with that source; None if none."""
    for rule in ruleset.inhibit:
        if not rule.is_target(payload) or (key := rule.key(payload)) is None:
            continue
        found = _open_source(tx, rule, key, alert)
        if found is not None:
            return rule, found
    return None


def _open_source(tx: Tx, rule: Inhibition, key: str, alert: str | None) -> Inhibitor | None:
    """The oldest source of rule with this key whose alert is open in its episode. A
    source whose alert resolved without a closing event (an operator resolved it) or is
    gone is forgotten as it is met: else a page of those (find's limit) would hide one
    still open behind them."""
    while True:
        forgot = False
        for found in tx.inhibitors.find(rule.name, key):
            if found.alert == alert:
                continue  # an alert never inhibits itself
            source = tx.alerts.peek(found.alert)  # unlocked: locks go in one order
            if source is None or source.state != "open":
                tx.inhibitors.remove(found.alert)
                forgot = True
            elif source.episode == found.episode:
                return found
        if not forgot:
            return None


def suppression(
    tx: Tx,
    ruleset: Ruleset,
    rule: Rule | None,
    opened: Mapping[str, Any],
    silences: Active,
    now: float,
    alert: str | None,
) -> tuple[str, str, str] | None:
    """What keeps rule's notification about an alert (opened: its opening event) from
    going out now: (state, why, reason) with state silenced, muted or inhibited, why the
    words for "was <why> since ..." and reason the row's; None when it may go out."""
    silence = silencing(silences, opened)
    if silence is not None:
        return "silenced", "silenced", f"silence #{silence.id}: {silence.reason}"
    upkeep = holding(ruleset.maintenance, opened, now)
    if upkeep is not None:
        return "maintenance", f"in maintenance: {upkeep.name}", held_reason(upkeep, now)
    if rule is not None and rule.active is not None and not rule.active.contains(now):
        window = rule.active.text
        return "muted", "muted", f"muted outside the active window ({window})"
    held = inhibiting(tx, ruleset, opened, alert) if ruleset.inhibit else None
    if held is not None:
        return "inhibited", f"inhibited by {held[0].name}", reason(*held)
    return None


def reason(rule: Inhibition, found: Inhibitor) -> str:
    return f"inhibited by {rule.name} ({found.event}, open since {clock(found.since)})"


def clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _epoch(stamp: str | None) -> float:
    """An alert's opened_ts (text ending in Z) as seconds; 0.0 if it cannot be read."""
    try:
        return datetime.fromisoformat((stamp or "").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
