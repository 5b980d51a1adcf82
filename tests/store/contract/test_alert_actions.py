"""store.alerts beyond acks: an alert by id, the API's pages of alerts, snoozes that put an
episode's repeats off, and the record of every action on an alert."""

from __future__ import annotations

from typing import Any

from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import Action, Alert, OutboxQuery
from tests.store.contract.common import note, run


def _alerts(tx: Tx) -> None:
    tx.alerts.save(Alert("session:s1", "open", 1, "2026-01-01T00:00:01Z", "t1", "e1"), 10.0)
    tx.alerts.save(Alert("intervention:s1:i1", "open", 1, "2026-01-01T00:00:02Z", "t", "e2"), 10.0)
    tx.alerts.save(Alert("session:s2", "resolved", 2, "2026-01-01T00:00:03Z"), 10.0)
    tx.alerts.save(Alert("session:s10", "open", 1, "2026-01-01T00:00:04Z", "t4", "e4"), 10.0)
    # only a session.stopped came: the row makes a late drop stale, and is no alert to list
    tx.alerts.save(Alert("session:s3", "resolved", 0, "2026-01-01T00:00:05Z"), 10.0)
    tx.notices.add("session:s1", 1, "deep-drop", 10.0, 600.0)
    tx.notices.add("session:s1", 1, "log", 10.0, None)
    tx.notices.add("session:s2", 2, "deep-drop", 10.0, None)


def test_alerts_are_got_and_paged_by_state_session_and_rule(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_alerts)
        a = store.alerts
        return (
            await a.get("session:s1"),
            await a.get("session:nope"),
            [x.id for x in await a.page()],
            [x.id for x in await a.page(state="open", limit=2)],
            [x.id for x in await a.page(state="open", after="session:s1")],
            [x.id for x in await a.page(session="s1")],
            [x.id for x in await a.page(rule="deep-drop")],
            [x.id for x in await a.page(rule="deep-drop", state="resolved")],
            [x.id for x in await a.page(session="s3")],
            [x.id for x in await a.page(state="resolved")],
        )

    got, missing, every, first, rest, of_s1, by_rule, resolved, of_s3, closed = run(store_url, go)
    assert got == Alert("session:s1", "open", 1, "2026-01-01T00:00:01Z", "t1", "e1")
    assert missing is None
    assert every == ["intervention:s1:i1", "session:s1", "session:s10", "session:s2"]
    assert first == ["intervention:s1:i1", "session:s1"] and rest == ["session:s10"]
    assert of_s1 == ["intervention:s1:i1", "session:s1"]  # not session:s10
    assert by_rule == ["session:s1", "session:s2"] and resolved == ["session:s2"]
    assert of_s3 == [] and closed == ["session:s2"]  # never opened: not listed


def test_a_snooze_puts_every_repeat_of_the_open_episode_off(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_alerts)
        episode = await store.alerts.snooze("session:s1", until=5000.0)
        closed = await store.alerts.snooze("session:s2", until=5000.0)
        unknown = await store.alerts.snooze("session:x", until=5000.0)
        before = await store.transact(lambda tx: tx.notices.due(4999.0))
        at_end = await store.transact(lambda tx: tx.notices.due(5000.0))
        return episode, closed, unknown, before, at_end

    episode, closed, unknown, before, at_end = run(store_url, go)
    assert episode == 1 and closed is None and unknown is None
    assert before == []
    assert sorted((n.rule, n.next_repeat_at) for n in at_end) == [
        ("deep-drop", 5000.0),
        ("log", 5000.0),  # a rule without repeat is notified again when the snooze ends
    ]


def test_an_ack_ends_a_snooze(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_alerts)
        await store.alerts.snooze("session:s1", until=5000.0)
        await store.alerts.ack("session:s1", by="ops", now=20.0)
        return await store.transact(lambda tx: tx.notices.due(9999.0))

    assert run(store_url, go) == []


def test_actions_are_recorded_and_listed_oldest_first(store_url: str) -> None:
    snooze = Action("session:s1", 1, "snooze", "link", "link", 20.0, "done", 3620.0)
    ack = Action("session:s1", 1, "ack", "api", "ops-key", 30.0, "done")
    again = Action("session:s1", 1, "ack", "cli", "cli", 40.0, "already")
    other = Action("session:s2", 2, "resolve", "admin", "admin-key", 50.0, "already")

    async def go(store: Store) -> Any:
        for action in (snooze, ack, again, other):
            await store.alerts.record(action)
        a = store.alerts
        return (
            await a.actions(["session:s1"]),
            await a.actions(["session:s1"], limit=2),
            await a.actions(["session:s1", "session:s2"]),
            await a.actions([]),
        )

    one, newest, both, none = run(store_url, go)
    assert one == [snooze, ack, again]
    assert newest == [ack, again]
    assert both == [snooze, ack, again, other] and none == []


def test_the_notifications_about_an_alert_are_paged_by_alert(store_url: str) -> None:
    """Who was paged when (GET /v1/alerts/:id): store.outbox.page by alert."""

    async def go(store: Store) -> Any:
        def rows(tx: Tx) -> None:
            tx.outbox.add(
                "e1", note("drop"), state="pending", now=1.0, alert="session:s1", episode=1
            )
            tx.outbox.add(
                "e2", note("drop"), state="pending", now=2.0, alert="session:s2", episode=1
            )
            tx.outbox.add("e1", note("log"), state="pending", now=3.0)

        await store.transact(rows)
        return await store.outbox.page(OutboxQuery(alert="session:s1"))

    [row] = run(store_url, go)
    assert (row.event_id, row.rule) == ("e1", "drop")
