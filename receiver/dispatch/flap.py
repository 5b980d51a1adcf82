"""Flap detection (a rule's `flap: {changes: 4, within: 10m, quiet: 15m}`): when an alert of
the rule opens or resolves `changes` times within `within`, it is flapping. One message says
so; each change after it is kept as a `flapping` row with its reason, not sent; its
escalation and repeats stop. Once the alert has stayed in one state for `quiet`, one message
says where it settled: settled open, it is the rule's notification again (filed under the
drop that opened it last, so explain shows `flapping`, then `sent`), and its repeats and
escalation start from there; settled resolved, a short note.

The changes are counted in the store (tx.flaps), under the alert's lock, so replicas and
restarts count alike; the settle is a timer (settle(), run with the other timers, once
across replicas).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from receiver.dispatch import escalations
from receiver.dispatch.alerts import Transition, opener
from receiver.dispatch.alerts import payload as stored_payload
from receiver.dispatch.inhibition import suppression
from receiver.dispatch.silences import Active
from receiver.links import Links
from receiver.rules import Rule, Ruleset, format_duration
from receiver.rules.rule import ESCALATE_ONLY, Decision, Rendered
from receiver.store.base import Tx
from receiver.store.flaps import Flap
from receiver.store.records import Alert, Notification

KIND = "flap"  # the outbox kind of the flapping message and of a settled-resolved note
STATE = "flapping"  # the outbox state of what flapping held back
STARTED = "started flapping"  # the head of the flapping message's reason


@dataclass(frozen=True)
class Flapping:
    """A rule's alert is flapping at this event: its rows are kept with reason; started:
    this change made it flap (the one flapping message goes out)."""

    reason: str
    started: bool
    opened: str | None = None  # the event of the alert's last open the rule counted


def count(
    tx: Tx,
    ruleset: Ruleset,
    event_id: str,
    transition: Transition,
    matched: Iterable[str],
    now: float,
) -> dict[str, Flapping]:
    """Count the event's change of its alert under each rule with `flap` that follows it
    (an opening event: the rules it matched; a resolving one: the rules that counted the
    alert before); the rules under which the alert is flapping now (for an update of an open
    alert too, which is no change)."""
    alert = transition.alert
    if alert is None or not ruleset.flaps or transition.what not in ("open", "resolve", "update"):
        return {}
    if transition.what == "update":  # no change, but while it flaps its drops are kept too
        return _still(tx, ruleset, alert, matched)
    names = matched if transition.what == "open" else [f.rule for f in tx.flaps.of(alert.id)]
    found: dict[str, Flapping] = {}
    for name in dict.fromkeys(names):
        rule = ruleset.by_name.get(name)
        spec = rule.flap if rule is not None else None
        if spec is None:
            continue
        old, new = tx.flaps.change(
            name, alert.id, alert.state, event_id, now, changes=spec.changes,
            within=spec.within, quiet=spec.quiet,
        )  # fmt: skip
        if new.since is None:
            continue
        quiet = format_duration(spec.quiet)
        if old.since is None:
            why = f"{STARTED}: {spec.text}; quiet until {quiet} without a change"
        else:
            why = f"{_word(alert.id, alert.state)} again, flapping since {_clock(new.since)}"
            why += f"; quiet until {quiet} without a change"
        found[name] = Flapping(why, old.since is None, new.opened)
    return found


def _still(tx: Tx, ruleset: Ruleset, alert: Alert, matched: Iterable[str]) -> dict[str, Flapping]:
    """The matched rules with flap under which the alert flaps: an update of it (another
    drop while open) is kept as any change would be."""
    names = {n for n in matched if (rule := ruleset.by_name.get(n)) and rule.flap is not None}
    if not names:
        return {}
    return {
        f.rule: Flapping(f"flapping since {_clock(f.since)}, an update of the alert", False)
        for f in tx.flaps.of(alert.id)
        if f.rule in names and f.since is not None
    }


def announce(
    tx: Tx,
    ruleset: Ruleset,
    rule: Rule,
    alert: Alert,
    payload: Mapping[str, Any],
    now: float,
    *,
    silences: Active,
    links: Links | None,
    opened: str | None,
) -> None:
    """The one message saying the alert started flapping, to the rule's targets (a rule that
    only escalates: its first step's), filed under the rule's last opening event of it
    (opened); silenced, muted or inhibited as the event would be."""
    spec = rule.flap
    assert spec is not None
    word = _word(alert.id, alert.state)
    title = f"[{rule.name}] flapping: {alert.id}"
    body = (
        f"{alert.id} is flapping: {spec.text}, now {word}.\n"
        f"No message for each change until it stays {format_duration(spec.quiet)} in one"
        " state; then one saying where it settled."
    )
    body = _linked(body, alert, links)
    why = f"{STARTED}: {spec.text}, now {word}"
    _send(tx, ruleset, rule, alert, opened, payload, title, body, now, silences, why)


def settle(
    tx: Tx,
    ruleset: Ruleset,
    now: float,
    *,
    silences: Active,
    counts: Counter[str],
    links: Links | None = None,
) -> None:
    """End each flapping period whose quiet has passed: one message with the state the alert
    settled in; settled open, its repeats and escalation start again."""
    for flap in tx.flaps.due(now):
        if not tx.flaps.settle(flap.rule, flap.alert, now):
            continue  # another replica's, or it changed again meanwhile
        rule = ruleset.by_name.get(flap.rule)
        alert = tx.alerts.get(flap.alert)
        if rule is None or rule.flap is None or alert is None:
            continue  # the rule is gone, or no longer detects flapping: nothing to say
        counts["flap"] += 1
        since = f"after flapping since {_clock(flap.since or now)}"
        # Open as the rule saw it: the episode its last counted open opened (an episode
        # opened by an event the rule does not match is no change of the rule's).
        if alert.state != "open" or flap.state != "open" or alert.opened_event != flap.opened:
            word = _word(alert.id, "resolved")
            title = f"[{rule.name}] settled {word}: {alert.id}"
            body = f"{alert.id} settled {word} {since}."
            fields = stored_payload(tx, flap.opened or "") or {}
            _send(
                tx, ruleset, rule, alert, flap.opened, fields, title, body, now, silences,
                f"settled {word}",
            )  # fmt: skip
            continue
        _settled_open(tx, ruleset, rule, alert, flap, since, now, silences, links)


def _settled_open(
    tx: Tx,
    ruleset: Ruleset,
    rule: Rule,
    alert: Alert,
    flap: Flap,
    since: str,
    now: float,
    silences: Active,
    links: Links | None,
) -> None:
    """The rule's notification of the drop that opened the alert last, sent now, and its
    repeats and escalation started, as if it had opened now."""
    fields = opener(tx, alert)
    event = alert.opened_event or flap.event or "-"
    note = f"settled {_word(alert.id, 'open')} {since}"
    held = suppression(tx, ruleset, rule, fields, silences, now, alert.id)
    state, why, reason = held if held is not None else ("pending", "pending", note)
    seen = (
        fields if links is None else {**fields, "links": links.for_alert(alert.id, alert.episode)}
    )
    for d in ruleset.on_call(rule.decisions(rule.render(seen), ruleset.notifiers), now):
        if d.notifier == ESCALATE_ONLY:
            continue
        n = _notification(ruleset, d, f"[settled open] {d.title}", f"{d.body}\n{note}")
        tx.outbox.add(
            event, n, state=state, now=now, reason=reason, alert=alert.id,
            episode=alert.episode,
        )  # fmt: skip
    if rule.escalate is not None:
        escalations.start(tx, rule, alert, now, state=state, why=why, event=event)
    elif state == "pending" and (rule.resolve or rule.repeat):
        tx.notices.add(alert.id, alert.episode, rule.name, now, rule.repeat)
    if state != "pending":
        tx.notices.suppress(alert.id, alert.episode, rule.name, now, why, event=event)


def _send(
    tx: Tx,
    ruleset: Ruleset,
    rule: Rule,
    alert: Alert,
    event: str | None,
    fields: Mapping[str, Any],
    title: str,
    body: str,
    now: float,
    silences: Active,
    why: str,
) -> None:
    """One message of kind flap to the rule's targets, filed under event (the rule's last
    opening event of the alert), with why as its reason (or what silences it)."""
    held = suppression(tx, ruleset, rule, fields, silences, now, alert.id)
    state, reason = ("pending", why) if held is None else (held[0], held[2])
    for d in targets(ruleset, rule, title, body, now):
        tx.outbox.add(
            event or alert.opened_event or "-", _notification(ruleset, d, d.title, d.body),
            state=state,
            now=now, reason=reason, kind=KIND, alert=alert.id, episode=alert.episode,
        )  # fmt: skip


def targets(ruleset: Ruleset, rule: Rule, title: str, body: str, now: float) -> list[Decision]:
    """A message to whom the rule notifies (a rule that only escalates: its first step)."""
    rendered = Rendered(title, body, None, None, False)
    names: Iterable[str] = rule.notify
    if not rule.notify and rule.escalate is not None:
        names = [t for t in rule.escalate.steps[0].notify if escalations.defined(ruleset, t)]
    return ruleset.on_call(rule.decisions_for(list(names), rendered, ruleset.notifiers), now)


def _notification(ruleset: Ruleset, d: Decision, title: str, body: str) -> Notification:
    return Notification(
        d.rule, d.notifier, d.target, title, body, channel=ruleset.channel(d.notifier, d.target)
    )


def _linked(body: str, alert: Alert, links: Links | None) -> str:
    return body if links is None else f"{body}\nAlert: {links.alert_page(alert.id)}"


def _word(alert: str, state: str) -> str:
    """What a change did, in the words of the alert's kind: a session's attention dropped or
    recovered; an intervention opened or resolved."""
    if alert.startswith("session:"):
        return "dropped" if state == "open" else "recovered"
    return "open" if state == "open" else "resolved"


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
