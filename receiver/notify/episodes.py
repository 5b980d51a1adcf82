"""The alert episode an outbox row belongs to, and how that episode stands now.

A channel that keeps one message per alert episode (the Slack app's message updated in
place, ntfy's notification replaced by its sequence id) needs, for each row it sends: which
episode it is about, whether that episode is still open, who acknowledged it and when, until
when it is snoozed, and the action links of that episode. The row records its alert and
episode (the opener, its repeats, escalation steps and the resolved message all do; a
digest, a storm notice, the heartbeat and a subscriber delivery do not); the rest is read
from the store now, so a message sent late tells the state as it is, not as it was.

    episode = await episode_of(store, row, links)
    if episode is not None:
        send(..., id=episode.key, open=episode.state == "open", ack=episode.links.get("ack"))
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from receiver.links import Links
from receiver.store import OutboxRow, Store

__all__ = ["KEY_LENGTH", "Episode", "episode_of", "key_of"]

KEY_LENGTH = 32  # hex digits of an episode's key: well inside ntfy's 64-character limit


def key_of(alert: str, episode: int) -> str:
    """A stable key of (alert, episode): letters and digits only, KEY_LENGTH long, the same
    on every replica and after a restart (safe as an ntfy sequence id or a Slack
    metadata value), and naming neither the alert nor anything secret.

    >>> key_of("session:sess_1", 1) == key_of("session:sess_1", 1) != key_of("session:sess_1", 2)
    True
    """
    digest = hashlib.sha256(f"{alert}\n{episode}".encode()).hexdigest()
    return digest[:KEY_LENGTH]


@dataclass(frozen=True)
class Episode:
    """One episode of an alert as it stands now.

    state: "open" while this episode is the alert's current one and open; "resolved"
    once it closed (or the alert has opened a newer episode since). acked_by/acked_at:
    its acknowledgement, if it has one now (a reack removes it). snoozed_until: the end
    of its newest snooze (past or not: compare it with the clock). links: its action
    links, "ack", "resolve", "snooze" and "alert" (the alert's page), each signed for
    this episode; empty when no RECEIVER_PUBLIC_URL is set.
    """

    alert: str
    episode: int
    state: str
    acked_by: str | None = None
    acked_at: float | None = None
    snoozed_until: float | None = None
    links: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def key(self) -> str:
        """key_of(alert, episode): one per episode, safe as an ntfy sequence id."""
        return key_of(self.alert, self.episode)

    @property
    def open(self) -> bool:
        return self.state == "open"

    @property
    def acked(self) -> bool:
        return self.acked_by is not None

    def snoozed(self, now: float) -> bool:
        """Whether its repeats and escalation are put off at now."""
        return self.snoozed_until is not None and self.snoozed_until > now


async def episode_of(store: Store, row: OutboxRow, links: Links | None) -> Episode | None:
    """The episode row belongs to, as it stands now; None for a row of no alert episode
    (a digest, a storm notice, the heartbeat, a subscriber delivery), or one whose alert
    the store no longer has (pruned). links: the app's action links, or None (none)."""
    found = await store.outbox.episode(row.id)
    if found is None:
        return None
    alert_id, episode = found
    alert = await store.alerts.get(alert_id)
    if alert is None:
        return None
    current = alert.episode == episode and alert.state == "open"
    ack = (await store.alerts.acks([alert_id])).get((alert_id, episode))
    snoozes = [
        a.until
        for a in await store.alerts.actions([alert_id])
        if a.episode == episode and a.action == "snooze" and a.outcome == "done"
        if a.until is not None
    ]
    return Episode(
        alert=alert_id,
        episode=episode,
        state="open" if current else "resolved",
        acked_by=ack.acked_by if ack else None,
        acked_at=ack.acked_at if ack else None,
        snoozed_until=snoozes[-1] if snoozes else None,
        links=dict(links.for_alert(alert_id, episode)) if links is not None else {},
    )
