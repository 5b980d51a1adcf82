"""What operators do to an alert, wherever they ask (a one-click link, the admin page, the
API, the CLI): ack, resolve, snooze. Each is idempotent (acking an acked alert answers
"already acknowledged") and recorded with its source, who and when (store.alerts.record).

resolve closes the alert now as if its closing event had come: held notifications are
cancelled and everyone notified gets the resolved message (receiver.dispatch.pipeline).
snooze puts the alert's repeats off; when it ends and the alert is still open, the timers
notify again (receiver.dispatch.timers).
"""

from __future__ import annotations

from dataclasses import dataclass

from receiver.dispatch import updates
from receiver.dispatch.alerts import opener
from receiver.dispatch.pipeline import Pipeline
from receiver.durations import format_duration
from receiver.events import iso_epoch
from receiver.links import Links, LinkSource
from receiver.rules import Ruleset
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import Action

SNOOZE_LINK = 3600.0  # how long a snooze link puts repeats off


@dataclass(frozen=True)
class Outcome:
    """What an action did: done, or "already" so (nothing changed), "stale" (the episode
    a link named is over: nothing changed), or missing (no alert of that id); message says
    it in words."""

    alert: str
    action: str
    result: str  # done | already | stale | missing
    message: str
    episode: int | None = None
    until: float | None = None


async def perform(
    store: Store,
    ruleset: Ruleset | None,
    alert_id: str,
    action: str,
    *,
    source: str,
    by: str,
    now: float,
    seconds: float | None = None,
    episode: int | None = None,
    links: LinkSource | None = None,
) -> Outcome:
    """Do action (ack | resolve | snooze for `seconds`) to the alert, and record it;
    ruleset: the rules that render a resolve's messages (only resolve needs them).

    episode: the episode a link was made for; when the alert has moved on (resolved, or
    opened again since), the link's episode is over: nothing changes, and it is recorded
    as "stale".

    links: the one-click links (RECEIVER_PUBLIC_URL), if on: a resolve's messages carry
    them as routing's do."""
    alert = await store.alerts.get(alert_id)
    if alert is None:
        return Outcome(alert_id, action, "missing", f"there is no alert {alert_id!r}")
    if episode is not None and (episode != alert.episode or alert.state != "open"):
        # The link's episode ended (the alert resolved, perhaps opened again since): a
        # stale link, recorded as such on the episode it named.
        outcome = _noted(alert_id, action, "stale", f"{alert_id} was resolved already", episode)
    elif alert.state != "open":
        outcome = _noted(alert_id, action, "already", _already_resolved(alert_id), alert.episode)
    elif action == "ack":
        # One transaction: the ack, its record and the messages it updates (updates.queue).
        return await store.transact(lambda tx: _ack(tx, alert_id, source, by, now))
    elif action == "resolve":
        if ruleset is None:
            raise ValueError("resolving needs the rules that render its messages")
        rs, made = ruleset, await links.get() if links is not None else None
        outcome = await store.transact(lambda tx: _resolve(tx, rs, alert_id, source, by, now, made))
    elif action == "snooze":
        wait = SNOOZE_LINK if seconds is None else seconds
        return await store.transact(lambda tx: _snooze(tx, alert_id, source, by, now, wait))
    else:
        raise ValueError(f'unknown action "{action}"; use ack, resolve or snooze')
    if outcome.episode is not None and outcome.result != "missing":
        await store.alerts.record(
            Action(
                alert_id,
                outcome.episode,
                action,
                source,
                by,
                now,
                outcome.result,
                outcome.until,
            )
        )
    return outcome


def _noted(alert_id: str, action: str, result: str, message: str, episode: int) -> Outcome:
    return Outcome(alert_id, action, result, message, episode)


def _already_resolved(alert_id: str) -> str:
    return f"{alert_id} is resolved already"


def _ack(tx: Tx, alert_id: str, source: str, by: str, now: float) -> Outcome:
    # The store decides which of acks at once (two links, a link and the API, on two
    # replicas) made it: read first and two would both see none and both say done. Only
    # the one that made it queues the updates, so each message is updated once.
    alert = tx.alerts.get(alert_id)  # locked (PostgreSQL) before its ack, as routing does
    ack = tx.alerts.ack(alert_id, by=by, now=now)
    if alert is None or ack is None:  # resolved meanwhile
        return Outcome(alert_id, "ack", "already", _already_resolved(alert_id))
    if ack.made:
        updates.queue(tx, alert, "ack", by=by, now=now)
        outcome = Outcome(alert_id, "ack", "done", f"{alert_id} acknowledged", ack.episode)
    else:
        when = iso_epoch(ack.acked_at)[:19].replace("T", " ")
        outcome = Outcome(
            alert_id,
            "ack",
            "already",
            f"{alert_id} was acknowledged already, by {ack.acked_by} at {when} UTC",
            ack.episode,
        )
    return _recorded(tx, outcome, source, by, now)


def _snooze(tx: Tx, alert_id: str, source: str, by: str, now: float, seconds: float) -> Outcome:
    alert = tx.alerts.get(alert_id)
    if alert is None or alert.state != "open":
        return Outcome(alert_id, "snooze", "already", _already_resolved(alert_id))
    acked = tx.escalations.acked(alert_id, alert.episode)
    if acked is not None:
        message = f"{alert_id} was acknowledged already, by {acked[0]}"
        outcome = Outcome(alert_id, "snooze", "already", message, alert.episode)
        return _recorded(tx, outcome, source, by, now)
    until = now + seconds
    snoozed = tx.alerts.snooze(alert_id, until=until)
    if snoozed is None:
        return Outcome(alert_id, "snooze", "already", _already_resolved(alert_id))
    updates.queue(tx, alert, "snooze", by=by, now=now, until=until)
    message = f"{alert_id} snoozed for {format_duration(seconds)}"
    outcome = Outcome(alert_id, "snooze", "done", message, snoozed, until)
    return _recorded(tx, outcome, source, by, now)


def _recorded(tx: Tx, outcome: Outcome, source: str, by: str, now: float) -> Outcome:
    """outcome, kept in the alert's record in the action's transaction."""
    assert outcome.episode is not None
    tx.alerts.record(
        Action(
            outcome.alert,
            outcome.episode,
            outcome.action,
            source,
            by,
            now,
            outcome.result,
            outcome.until,
        )  # fmt: skip
    )
    return outcome


def _resolve(
    tx: Tx,
    ruleset: Ruleset,
    alert_id: str,
    source: str,
    by: str,
    now: float,
    links: Links | None,
) -> Outcome:
    """Close the alert now as its closing event would: held rows cancelled, resolved
    messages to everyone its episode notified."""
    alert = tx.alerts.get(alert_id)
    if alert is None:
        return Outcome(alert_id, "resolve", "missing", f"there is no alert {alert_id!r}")
    if alert.state != "open":
        return Outcome(alert_id, "resolve", "already", _already_resolved(alert_id), alert.episode)
    ts = iso_epoch(now, digits=6)
    alert.state, alert.resolved_ts, alert.last_ts = "resolved", ts, max(alert.last_ts, ts)
    tx.alerts.save(alert, now)
    # The resolved message's "ended by {{ type }} at {{ timestamp }}": who resolved it.
    payload = {**opener(tx, alert), "type": f"{by} ({source})", "timestamp": ts}
    Pipeline(tx, ruleset, now, links=links).resolve(alert, payload)
    return Outcome(alert_id, "resolve", "done", f"{alert_id} resolved", alert.episode)
