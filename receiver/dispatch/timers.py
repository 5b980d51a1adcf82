"""The lifecycle's timers: repeats of an alert still open (and the end of a snooze), and the
heartbeat that fires when no event has arrived for a while (and resolves when events flow
again)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from receiver.dispatch.alerts import opener
from receiver.dispatch.inhibition import suppression
from receiver.dispatch.silences import Active
from receiver.links import Links
from receiver.rules import Ruleset, format_duration
from receiver.store.base import Tx
from receiver.store.records import Notification

HEARTBEAT = "(heartbeat)"


def repeats(
    tx: Tx,
    ruleset: Ruleset,
    now: float,
    *,
    silences: Active,
    counts: Counter[str],
    links: Links | None = None,
) -> None:
    """Send each due repeat of an alert still open in the episode its rule notified about
    (silenced or muted as the alert's opening event would be now), and schedule the next.
    A snooze (store.alerts.snooze) puts every repeat of the episode off to its end, so the
    alert is notified again then, also by a rule without repeat."""
    for notice in tx.notices.due(now):
        alert = tx.alerts.get(notice.alert)
        rule = ruleset.by_name.get(notice.rule)
        if (
            alert is None
            or alert.state != "open"
            or alert.episode != notice.episode
            or rule is None
            or not tx.outbox.sent(alert.id, alert.episode, rule.name)
        ):
            tx.notices.repeated(notice, None)
            continue
        opened = opener(tx, alert)
        seen = (
            opened
            if links is None
            else {**opened, "links": links.for_alert(alert.id, alert.episode)}
        )
        rendered = rule.render(seen)
        open_for = format_duration(max(1.0, now - notice.notified_at))
        state, reason = "pending", None
        held = suppression(tx, ruleset, rule, opened, silences, now, alert.id)
        if held is not None:
            state, _, reason = held
        for d in ruleset.on_call(rule.decisions(rendered, ruleset.notifiers), now):
            n = Notification(
                d.rule,
                d.notifier,
                d.target,
                f"[still open] {d.title}",
                f"{d.body}\nopen for {open_for}, repeat {notice.repeats + 1}",
                channel=ruleset.channel(d.notifier, d.target),
            )
            tx.outbox.add(
                alert.opened_event or "-",
                n,
                state=state,
                reason=reason,
                now=now,
                kind="repeat",
                alert=alert.id,
                episode=alert.episode,
            )
        counts["repeat"] += 1
        # A rule without repeat has a repeat due only when a snooze ended: notified once.
        tx.notices.repeated(notice, None if rule.repeat is None else now + rule.repeat)


def heartbeat(
    tx: Tx,
    ruleset: Ruleset,
    now: float,
    last_event: float,
    *,
    arrived: bool,
    counts: Counter[str],
) -> None:
    """Fire when nothing arrived for silent_for; resolve when events flow again."""
    beat = ruleset.heartbeat
    firing = bool((tx.state.get("heartbeat") or {}).get("firing"))
    if beat is None:
        return
    silent = now - last_event
    if not firing and not arrived and silent >= beat.silent_for:
        since = datetime.fromtimestamp(last_event).astimezone().strftime("%Y-%m-%d %H:%M %Z")
        _beat(
            tx,
            ruleset,
            now,
            counts,
            beat.notify,
            f"No events for {format_duration(beat.silent_for)}",
            f"No event has arrived since {since}. Is the Attention Scoring "
            "Service still sending to this receiver?",
        )
        tx.state.set("heartbeat", {"firing": True, "since": last_event})
    elif firing and arrived:
        state = tx.state.get("heartbeat") or {}
        gap = format_duration(max(1.0, last_event - float(state.get("since", last_event))))
        _beat(
            tx,
            ruleset,
            now,
            counts,
            beat.notify,
            "Events are arriving again",
            f"Events are arriving again after {gap} of silence.",
            kind="resolved",
        )
        tx.state.set("heartbeat", {"firing": False, "since": last_event})


def _beat(
    tx: Tx,
    ruleset: Ruleset,
    now: float,
    counts: Counter[str],
    names: Sequence[str],
    title: str,
    body: str,
    kind: str = "heartbeat",
) -> None:
    for name in dict.fromkeys(ruleset.target(n, now) for n in names):
        for target in range(len(ruleset.notifiers[name].urls)):
            n = Notification(
                HEARTBEAT, name, target, title, body, channel=ruleset.channel(name, target)
            )
            tx.outbox.add("-", n, state="pending", now=now, kind=kind, alert=HEARTBEAT)
    counts["heartbeat"] += 1
