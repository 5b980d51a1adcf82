"""tx.outbox and the Store's outbox: rows queued by routing, claimed under a lease, retried,
dead, released, listed."""

from __future__ import annotations

from typing import Any

from receiver.store import Notification, Store
from receiver.store.base import Tx
from receiver.store.records import OutboxQuery, subscriber_delivery
from tests.store.contract.common import event, note, queue, run


def test_add_many_queues_each_row_as_add_would(tx_url: str) -> None:
    async def go(store: Store) -> list[tuple[str, str, int, str, str, str, float, str]]:
        await store.events.accept(*event(1))
        await store.events.accept(*event(2))
        items = [("evt_1", note("w", "@subscriber", 7)), ("evt_2", note("w", "@subscriber", 8))]
        await store.transact(
            lambda tx: tx.outbox.add_many(items, state="pending", now=5.0, kind="webhook")
        )
        await store.transact(
            lambda tx: tx.outbox.add_many([], state="pending", now=6.0, kind="webhook")
        )
        return sorted(
            (r.event_id, r.notifier, r.target, r.title, r.body, r.state, r.next_at, r.kind)
            for r in await store.outbox.deliveries()
        )

    assert run(tx_url, go) == [
        ("evt_1", "@subscriber", 7, "t", "b", "pending", 5.0, "webhook"),
        ("evt_2", "@subscriber", 8, "t", "b", "pending", 5.0, "webhook"),
    ]


def test_each_row_records_the_channel_that_sends_it(tx_url: str) -> None:
    """The channel a notification names (receiver.notify.registry), any name at all; one
    that names none gets the channel its notifier had before rows recorded theirs."""

    async def go(store: Store) -> list[tuple[int, str, str | None]]:
        await store.events.accept(*event(1))
        tiny = Notification("r", "room", 0, "t", "b", channel="tiny")
        hooks = [
            ("evt_1", subscriber_delivery(7, "d1", "{}")),
            ("evt_1", note("w", "@subscriber", 8)),
        ]

        def work(tx: Tx) -> None:
            tx.outbox.add("evt_1", tiny, state="pending", now=5.0)
            tx.outbox.add("evt_1", note(target=1), state="pending", now=5.0)
            tx.outbox.add_many(hooks, state="pending", now=5.0, kind="webhook")

        await store.transact(work)
        return sorted((r.target, r.notifier, r.channel) for r in await store.outbox.deliveries())

    assert run(tx_url, go) == [
        (0, "room", "tiny"),
        (1, "console", "notify"),
        (7, "@subscriber", "webhook"),
        (8, "@subscriber", "webhook"),
    ]


def test_claims_and_pages_carry_the_channel_and_filter_by_it(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        tiny = Notification("r", "room", 0, "t", "b", channel="tiny")
        await queue(store, "evt_1", [tiny, note()], now=100.0)
        claimed = await store.outbox.claim_due(now=100.0, limit=5, lease=30)
        return (
            sorted((r.notifier, r.channel) for r in claimed),
            [r.notifier for r in await store.outbox.page(OutboxQuery(channel="tiny"))],
            [r.notifier for r in await store.outbox.page(OutboxQuery(channel="notify"))],
            await store.outbox.page(OutboxQuery(channel="webhook")),
        )

    claimed, tiny, notify, webhook = run(store_url, go)
    assert claimed == [("console", "notify"), ("room", "tiny")]
    assert (tiny, notify, webhook) == (["room"], ["console"], [])


def test_held_rows_are_cancelled_and_sent_is_known(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            tx.outbox.add(
                "e1", note("hold"), state="held", now=1.0, next_at=60.0, alert="a", episode=1
            )
            tx.outbox.add("e1", note("now"), state="pending", now=1.0, alert="a", episode=1)
            before = (
                tx.outbox.sent("a", 1, "hold"),
                tx.outbox.sent("a", 1, "now"),
                tx.outbox.sent("a", 2, "now"),
            )
            cancelled = tx.outbox.cancel_held("a", 1, 2.0, "resolved before it was sent")
            return before, cancelled

        before, cancelled = await store.transact(work)
        return before, cancelled, await store.outbox.deliveries()

    before, cancelled, rows = run(tx_url, go)
    assert before == (False, True, False) and cancelled == 1
    assert {(r.rule, r.state, r.reason) for r in rows} == {
        ("hold", "cancelled", "resolved before it was sent"),
        ("now", "pending", None),
    }


def test_claim_lease_retry_and_dead(store_url: str) -> None:
    async def go(store: Store) -> None:
        await store.events.accept(*event(1))
        await queue(store, "evt_1", [note()], now=100.0)
        [row] = await store.outbox.claim_due(now=100.0, limit=5, lease=30)
        assert row.state == "sending" and row.attempts == 1
        assert await store.outbox.claim_due(now=110.0, limit=5, lease=30) == []  # leased
        [again] = await store.outbox.claim_due(now=131.0, limit=5, lease=30)  # lease ran out
        assert again.attempts == 2
        await store.outbox.mark_failed(row.id, error="down", now=131.0, retry_at=200.0)
        assert await store.outbox.next_due() == 200.0
        assert await store.outbox.claim_due(now=150.0, limit=5, lease=30) == []
        [third] = await store.outbox.claim_due(now=200.0, limit=5, lease=30)
        await store.outbox.mark_failed(third.id, error="still down", now=201.0, retry_at=None)
        [dead] = await store.outbox.deliveries(state="dead")
        assert dead.last_error == "still down"
        assert await store.outbox.retry_dead(None, now=300.0) == 1
        [fourth] = await store.outbox.claim_due(now=300.0, limit=5, lease=30)
        await store.outbox.mark_delivered(fourth.id, now=301.0)
        assert (await store.outbox.deliveries())[0].state == "delivered"
        assert await store.outbox.next_due() is None

    run(store_url, go)


def test_a_lapsed_lease_is_claimed_again_only_when_asked(store_url: str) -> None:
    # A worker back from an outage leaves rows whose lease ran out meanwhile to the worker
    # that sent them (it records their outcome), and still claims the rows that are due.
    async def go(store: Store) -> None:
        await store.events.accept(*event(1))
        await queue(store, "evt_1", [note("sent", "a")], now=100.0)
        [sent] = await store.outbox.claim_due(now=100.0, limit=5, lease=30)
        await store.events.accept(*event(2))
        await queue(store, "evt_2", [note("new", "b")], now=140.0)
        lanes = {("a", 0): 5, ("b", 0): 5}
        [due] = await store.outbox.claim_due(
            now=140.0, limit=5, lease=30, lanes=lanes, reclaim=False
        )
        assert due.rule == "new"
        assert await store.outbox.claim_due(now=140.0, limit=5, lease=30, reclaim=False) == []
        [again] = await store.outbox.claim_due(now=141.0, limit=5, lease=30)
        assert (again.id, again.attempts) == (sent.id, 2)

    run(store_url, go)


def test_claims_keep_to_each_targets_lane(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        notes = [note(f"r{i}", "slow") for i in range(5)] + [
            note(f"f{i}", "fast") for i in range(3)
        ]
        notes += [note("gone", "removed")]
        await queue(store, "evt_1", notes, now=100.0)
        lanes = {("slow", 0): 2, ("fast", 0): 8}
        first = await store.outbox.claim_due(now=100.0, limit=0, lease=30, lanes=lanes)
        full = dict.fromkeys(lanes, 0)  # both lanes busy now
        others = await store.outbox.claim_due(now=100.0, limit=5, lease=30, lanes=full)
        return first, others

    first, others = run(store_url, go)
    assert sorted(r.notifier for r in first) == ["fast"] * 3 + ["slow"] * 2
    assert [r.notifier for r in others] == ["removed"]  # targets not in lanes, only via limit


def test_release_gives_back_an_abandoned_send(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        await queue(store, "evt_1", [note("a"), note("b")], now=100.0)
        a, b = await store.outbox.claim_due(now=100.0, limit=5, lease=30)
        await store.outbox.mark_delivered(b.id, now=101.0)
        released = await store.outbox.release([a.id, b.id], now=102.0)
        rows = {r.rule: r for r in await store.outbox.deliveries()}
        return released, rows, await store.outbox.claim_due(now=102.0, limit=5, lease=30)

    released, rows, reclaimed = run(store_url, go)
    assert released == 1  # the delivered one keeps its outcome
    assert (rows["a"].state, rows["a"].attempts, rows["a"].next_at) == ("pending", 0, 102.0)
    assert rows["b"].state == "delivered"
    assert [(r.rule, r.attempts) for r in reclaimed] == [("a", 1)]


def test_deliveries_filter_by_state_and_event(store_url: str) -> None:
    async def go(store: Store) -> Any:
        for i in (1, 2):
            await store.events.accept(*event(i))
            await queue(store, f"evt_{i}", [note()], now=100.0)
        [row, _] = await store.outbox.claim_due(now=100.0, limit=5, lease=30)
        await store.outbox.mark_delivered(row.id, now=101.0)
        return (
            [r.event_id for r in await store.outbox.deliveries(state="delivered")],
            [r.event_id for r in await store.outbox.deliveries(event_id="evt_2")],
            len(await store.outbox.deliveries(limit=1)),
        )

    delivered, of_two, limited = run(store_url, go)
    assert delivered == ["evt_1"] and of_two == ["evt_2"] and limited == 1
