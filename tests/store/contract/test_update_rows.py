"""An ack or a snooze in one transaction with the messages it updates: tx.alerts.ack,
snooze and record, tx.outbox.updatable, and the action engine's "update" rows (one per
slack-app or ntfy target the episode's messages went to, queued once), on both stores."""

from __future__ import annotations

import asyncio
from typing import Any

from receiver.dispatch import actions, updates
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import Action, Alert, Notification, OutboxQuery
from tests.store.contract.common import run


def _n(rule: str, notifier: str, target: int, channel: str) -> Notification:
    return Notification(rule, notifier, target, "t", "b", channel=channel)


def _paged(tx: Tx) -> None:
    """session:s1 episode 1 paged on Slack (twice: a repeat), ntfy, mail, and a row that
    was never sent; episode 0's and another alert's rows are no concern of its."""
    tx.alerts.save(Alert("session:s1", "open", 1, "2026-01-01T00:00:01Z", "t1", "e1"), 10.0)
    tx.alerts.save(Alert("session:s2", "open", 1, "2026-01-01T00:00:01Z", "t1", "e2"), 10.0)
    tx.notices.add("session:s1", 1, "drop", 10.0, None)
    add = tx.outbox.add
    add("e1", _n("drop", "chat", 0, "slack-app"), state="delivered", now=10.0,
        alert="session:s1", episode=1)  # fmt: skip
    add("e1", _n("drop", "chat", 0, "slack-app"), state="pending", now=11.0, kind="repeat",
        alert="session:s1", episode=1)  # fmt: skip
    add("e1", _n("drop", "phone", 0, "ntfy"), state="delivered", now=10.0,
        alert="session:s1", episode=1)  # fmt: skip
    add("e1", _n("drop", "mail", 0, "notify"), state="delivered", now=10.0,
        alert="session:s1", episode=1)  # fmt: skip
    add("e1", _n("drop", "phone", 1, "ntfy"), state="silenced", now=10.0,
        alert="session:s1", episode=1)  # fmt: skip
    add("e2", _n("drop", "chat", 1, "slack-app"), state="delivered", now=10.0,
        alert="session:s2", episode=1)  # fmt: skip


def test_updatable_is_each_sent_target_of_the_channels_once(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_paged)
        return await store.transact(
            lambda tx: (
                tx.outbox.updatable("session:s1", 1, {"slack-app", "ntfy"}),
                tx.outbox.updatable("session:s1", 1, set()),
                tx.outbox.updatable("session:s1", 2, {"slack-app"}),
            )
        )

    both, none, other = run(store_url, go)
    assert both == [("drop", "chat", 0, "slack-app"), ("drop", "phone", 0, "ntfy")]
    assert none == [] and other == []


def test_ack_snooze_and_record_in_one_transaction(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_paged)

        def act(tx: Tx) -> Any:
            snoozed = tx.alerts.snooze("session:s2", until=500.0)
            first = tx.alerts.ack("session:s1", by="ada", now=20.0)
            again = tx.alerts.ack("session:s1", by="bob", now=21.0)
            tx.alerts.record(Action("session:s1", 1, "ack", "api", "ada", 20.0, "done"))
            return snoozed, first, again, tx.alerts.ack("session:none", by="x", now=1.0)

        done = await store.transact(act)
        return done, await store.alerts.actions(["session:s1"])

    (snoozed, first, again, missing), record = run(store_url, go)
    assert snoozed == 1 and missing is None
    assert first.made and (first.acked_by, first.acked_at) == ("ada", 20.0)
    assert not again.made and again.acked_by == "ada"
    assert [(a.action, a.actor, a.outcome) for a in record] == [("ack", "ada", "done")]


def test_an_ack_queues_one_update_per_target_once(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_paged)
        # Two acks at once (two replicas got the same click): one is made.
        both = await asyncio.gather(
            *(
                actions.perform(store, None, "session:s1", "ack", source=s, by=s, now=20.0)
                for s in ("slack", "link")
            )
        )
        snooze = await actions.perform(
            store, None, "session:s2", "snooze", source="api", by="ops", now=30.0, seconds=60
        )
        rows = await store.outbox.page(OutboxQuery(limit=100))
        return both, snooze, rows

    both, snooze, rows = run(store_url, go)
    assert sorted(o.result for o in both) == ["already", "done"]
    assert snooze.result == "done"
    made = [r for r in rows if r.kind == updates.KIND]
    assert sorted((r.event_id, r.notifier, r.target, r.channel, r.state) for r in made) == [
        ("e1", "chat", 0, "slack-app", "pending"),
        ("e1", "phone", 0, "ntfy", "pending"),
        ("e2", "chat", 1, "slack-app", "pending"),
    ]
    titles = {r.title for r in made if r.event_id == "e1"}
    assert titles in ({"session:s1 acknowledged by slack"}, {"session:s1 acknowledged by link"})
    assert "snoozed by ops" in next(r.title for r in made if r.event_id == "e2")
