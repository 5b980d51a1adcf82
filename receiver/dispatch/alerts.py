"""The alert state machine: which alert an event belongs to, and what it does to it.

A session's attention is an alert: score.drop opens it, score.recover or
session.stopped resolves it; intervention.fired opens an intervention alert that
intervention.resolved closes. Events apply to their alert in the order of their own
timestamp: one older than the newest already applied is stale. It leaves the alert as it
is, so a late drop cannot reopen an alert that has recovered, and lifecycle rules (hold,
resolve or repeat: Rule.follows_alert) send nothing for it. Every other rule forwards it
like any event: a plain rule notifies once for each matching event, in any order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from receiver.events import to_utc, utc_z
from receiver.rules.options import CLOSES, OPENS
from receiver.store.base import Tx
from receiver.store.records import Alert


def alert_id(payload: Mapping[str, Any]) -> str | None:
    """The alert an event belongs to: session:<id> or intervention:<session>:<intervention>."""
    event_type = payload.get("type", "")
    kind = OPENS.get(event_type) or CLOSES.get(event_type)
    if kind == "session":
        return f"session:{payload.get('sessionId', '')}"
    if kind == "intervention":
        return f"intervention:{payload.get('sessionId', '')}:{payload.get('interventionId', '')}"
    return None


def event_time(payload: Mapping[str, Any]) -> str:
    """The event's timestamp normalised so that text order is time order."""
    text = str(payload["timestamp"])
    if (utc := utc_z(text)) is not None:
        return utc
    return to_utc(datetime.fromisoformat(text)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True)
class Transition:
    what: str  # open | update | resolve | close | stale | none
    alert: Alert | None = None


def apply(tx: Tx, payload: Mapping[str, Any], event_id: str, now: float) -> Transition:
    """Apply one event to its alert's stored state and say what happened."""
    aid = alert_id(payload)
    if aid is None:
        return Transition("none")
    ts = event_time(payload)
    alert = tx.alerts.get(aid)
    if alert is not None and ts < alert.last_ts:
        return Transition("stale", alert)
    opening = payload["type"] in OPENS
    if alert is None:
        alert = Alert(aid, "resolved", 0, ts)
    alert.last_ts = ts
    if opening and alert.state != "open":
        alert.state, alert.episode = "open", alert.episode + 1
        alert.opened_ts, alert.opened_event, alert.resolved_ts = ts, event_id, None
        what = "open"
    elif opening:
        what = "update"
    elif alert.state == "open":
        alert.state, alert.resolved_ts = "resolved", ts
        what = "resolve"
    else:
        what = "close"
    tx.alerts.save(alert, now)
    return Transition(what, alert)


def opener(tx: Tx, alert: Alert) -> dict[str, Any]:
    """The payload of the event that opened the alert's episode ({} if it cannot be read)."""
    return payload(tx, alert.opened_event or "") or {}


def payload(tx: Tx, event_id: str) -> dict[str, Any] | None:
    """The payload of a stored event (None if it is gone or cannot be read)."""
    text = tx.events.body(event_id)
    try:
        value = json.loads(text or "null")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def open_seconds(alert: Alert) -> float:
    """How long the alert's episode was open (0 when it has not both opened and resolved)."""
    start, end = alert.opened_ts, alert.resolved_ts
    if not start or not end:
        return 0.0
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


class EpisodeGuess:
    """The episode each event of a batch will open or belong to, guessed before routing
    from its alerts as stored (the action links' tokens name it; receiver.links), the
    batch's events applied in order. A late event can make the guess wrong: its links then
    name an episode that is not the alert's, and do nothing ("resolved already"), never
    act on another episode."""

    def __init__(self, alerts: Mapping[str, Alert | None]) -> None:
        self.state = {a.id: (a.state == "open", a.episode) for a in alerts.values() if a}

    def of(self, alert: str, payload: Mapping[str, Any]) -> int:
        is_open, episode = self.state.get(alert, (False, 0))
        kind = payload.get("type")
        if kind in OPENS and not is_open:
            is_open, episode = True, episode + 1
        elif kind in CLOSES:
            is_open = False
        self.state[alert] = (is_open, episode)
        return episode


def stored_alerts(tx: Tx, alert_ids: Iterable[str]) -> dict[str, Alert | None]:
    """The alerts of these ids as stored now (one read), for EpisodeGuess."""
    ids = list(dict.fromkeys(alert_ids))
    tx.alerts.read_ahead(ids)
    found = {aid: tx.alerts.get(aid) for aid in ids}
    tx.alerts.forget()
    return found
