"""The "update" rows an ack or a snooze queues: one per target whose channel keeps one
message per alert episode (the Slack app's message, ntfy's notification by sequence id),
for each such target a message of the episode went to. The channel renders the episode as
it stands when it sends (receiver.notify.episodes): the Slack message updated in place
with a threaded reply, the ntfy notification replaced without its Ack action. Channels
that cannot change a message sent (apprise's mail, chat, push; subscribers) get nothing.

They are queued in the action's own transaction, and only by the action that was done
(the store decides which of two acks at once made it), so each is queued exactly once.
"""

from __future__ import annotations

from receiver.events import iso_epoch
from receiver.notify import registry
from receiver.store.base import Tx
from receiver.store.records import Alert, Notification

KIND = "update"


def queue(
    tx: Tx, alert: Alert, action: str, *, by: str, now: float, until: float | None = None
) -> int:
    """Queue the episode's update rows for action (ack | snooze) done by `by`; how many."""
    said = {"ack": "acknowledged", "snooze": "snoozed"}[action]
    # The title alone: each channel says the episode's state itself (ntfy's status line,
    # the Slack message), and a Slack reply is this line.
    title = f"{alert.id} {said} by {by}"
    if until is not None:
        title += f" until {_clock(until)} UTC"
    found = tx.outbox.updatable(alert.id, alert.episode, registry.updating())
    for rule, notifier, target, channel in found:
        tx.outbox.add(
            alert.opened_event or "-",
            Notification(rule, notifier, target, title, "", channel=channel),
            state="pending",
            now=now,
            kind=KIND,
            alert=alert.id,
            episode=alert.episode,
        )
    return len(found)


def _clock(at: float) -> str:
    return iso_epoch(at)[:16].replace("T", " ")
