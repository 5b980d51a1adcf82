"""store.events and tx.events: ingest keeps each event once with its raw body; the router
takes unrouted events and marks them routed; replays; retention."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from receiver.errors import StoreError
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import EventQuery, Replay
from tests.store.contract.common import event, note, queue, run


def test_accept_is_new_then_duplicate_or_conflict(store_url: str) -> None:
    e, raw = event(1)
    other = raw.replace(b'"score":22', b'"score":23')
    assert other != raw

    async def go(store: Store) -> list[str]:
        return [
            await store.events.accept(e, raw),
            await store.events.accept(e, raw),
            await store.events.accept(e, other),
        ]

    assert run(store_url, go) == ["new", "duplicate", "conflict"]


def test_a_conflict_keeps_the_first_body_alone_and_within_one_group_commit(
    store_url: str,
) -> None:
    first, other = event(1, score=10), event(1, score=11)

    async def go(store: Store) -> tuple[list[str], list[str | None]]:
        alone = [await store.events.accept(*first), await store.events.accept(*other)]
        # In one group commit too: the second and third copies are checked against the first.
        together = await asyncio.gather(
            store.events.accept(*event(2, score=1)),
            store.events.accept(*event(2, score=1)),
            store.events.accept(*event(2, score=2)),
            store.events.accept(*other),
            store.events.accept(*first),
        )
        bodies = await store.transact(lambda tx: [tx.events.body(f"evt_{i}") for i in (1, 2)])
        return alone + list(together), bodies

    results, bodies = run(store_url, go)
    assert results == [
        "new", "conflict", "new", "duplicate", "conflict", "conflict", "duplicate"
    ]  # fmt: skip
    assert bodies == [first[1].decode(), event(2, score=1)[1].decode()]


def test_concurrent_accepts_of_one_id_store_it_once(store_url: str) -> None:
    copies = [event(i) for i in range(50)]

    async def go(store: Store) -> tuple[list[str], list[Any]]:
        results = await asyncio.gather(*(store.events.accept(*copies[i % 50]) for i in range(200)))
        unrouted = await store.transact(lambda tx: tx.events.unrouted(500))
        return results, unrouted

    results, unrouted = run(store_url, go)
    assert results.count("new") == 50 and results.count("duplicate") == 150
    assert sorted(e.id for e in unrouted) == sorted(f"evt_{i}" for i in range(50))


def test_accepts_arriving_while_batches_commit_store_each_id_once(store_url: str) -> None:
    """Copies of one id in different group commits, some committing at once (PostgreSQL
    runs two at a time): one is new, every other a duplicate."""
    copies = [event(f"w{i}") for i in range(20)]

    async def go(store: Store) -> list[str]:
        async def later(i: int) -> str:
            await asyncio.sleep(0.002 * (i % 7))  # arrivals spread over several commits
            return await store.events.accept(*copies[i % 20])

        return list(await asyncio.gather(*(later(i) for i in range(140))))

    results = run(store_url, go)
    assert results.count("new") == 20 and results.count("duplicate") == 120


def test_ids_stay_duplicates_after_reopening(store_url: str) -> None:
    e, raw = event(1)
    run(store_url, lambda s: s.events.accept(e, raw))
    assert run(store_url, lambda s: s.events.accept(e, raw)) == "duplicate"


def test_stored_event_keeps_its_raw_body_and_arrival(store_url: str) -> None:
    e, raw = event(7, context="checkout")

    async def go(store: Store) -> Any:
        await store.events.accept(e, raw)
        return await store.transact(
            lambda tx: (tx.events.unrouted(5), tx.events.body("evt_7"), tx.events.last_received())
        )

    [stored], body, last = run(store_url, go, clock=1234.5)
    assert (stored.id, stored.type, stored.body, stored.received_at) == (
        "evt_7",
        "score.drop",
        raw.decode(),
        1234.5,
    )
    assert body == raw.decode() and last == 1234.5


def test_route_writes_the_outbox_once_and_marks_routed(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        [pending] = await store.transact(lambda tx: tx.events.unrouted(10))
        first = await queue(store, pending.id, [note(), note("s")], now=100.0)
        again = await queue(store, pending.id, [note()], now=101.0)  # a racing second pass
        return (
            first,
            again,
            await store.transact(lambda tx: tx.events.unrouted(10)),
            await store.outbox.deliveries(),
        )

    first, again, unrouted, rows = run(tx_url, go)
    assert first == 2 and again == 0 and unrouted == []
    assert [(r.rule, r.state) for r in rows] == [("s", "pending"), ("r", "pending")]


def test_unrouted_skips_the_ids_it_is_told_to(tx_url: str) -> None:
    async def go(store: Store) -> list[str]:
        for i in range(3):
            await store.events.accept(*event(i))
        return [e.id for e in await store.transact(lambda tx: tx.events.unrouted(10, {"evt_1"}))]

    assert sorted(run(tx_url, go)) == ["evt_0", "evt_2"]


def test_an_event_not_routed_yet_cannot_be_replayed(store_url: str) -> None:
    async def go(store: Store) -> None:
        await store.events.accept(*event(1))
        with pytest.raises(StoreError, match="event evt_1 has not been routed yet"):
            await store.events.replay("evt_1", now=2.0)

    run(store_url, go)


def test_replay_routes_a_stored_event_again_and_reports_its_rows(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        await queue(store, "evt_1", [note()], now=1.0)
        replayed = await store.events.replay("evt_1", now=2.0, respect_lifecycle=True)
        missing = await store.events.replay("nope", now=2.0)
        [again] = await store.transact(lambda tx: tx.events.unrouted(5))
        assert replayed is not None and again.replay == replayed
        before = await store.events.replay_status(replayed)

        def route(tx: Tx) -> None:
            tx.outbox.add("evt_1", note("r"), state="pending", now=3.0, replay=replayed)
            tx.events.replay_done(replayed, 3.0)
            tx.events.mark_routed(["evt_1"], 3.0)

        await store.transact(route)
        return replayed, missing, before, await store.events.replay_status(replayed)

    replayed, missing, (request, rows), (done, [row]) = run(store_url, go)
    assert missing is None and rows == []
    assert request == Replay(replayed, "evt_1", 2.0, respect_lifecycle=True, routed_at=None)
    assert done is not None and done.routed_at == 3.0
    assert (row.event_id, row.replay, row.state) == ("evt_1", replayed, "pending")


def test_prune_deletes_what_is_old_and_finished_only(store_url: str) -> None:
    async def go(store: Store) -> Any:
        for i in range(4):
            await store.events.accept(*event(i))
        await queue(store, "evt_0", [note("done")], now=1.0)
        await queue(store, "evt_1", [note("waiting")], now=1.0)
        [done, _] = await store.outbox.claim_due(now=1.0, limit=5, lease=30)  # both in flight
        await store.outbox.mark_delivered(done.id, now=2.0)
        await store.events.quarantine(
            b"\xff{", reason="invalid_json", client="127.0.0.1", event_id=None
        )
        counts = await store.events.prune(before=2000.0, limit=100)
        left = [e.id for e in await store.transact(lambda tx: tx.events.unrouted(10))]
        return counts, left, [(r.event_id, r.state) for r in await store.outbox.deliveries()]

    counts, left, rows = run(store_url, go)
    # evt_0 and evt_1 were routed; evt_1's notification is still pending, so only its event
    # goes; evt_2 and evt_3 were never routed and stay.
    assert counts["events"] == 2 and counts["outbox"] == 1 and counts["quarantine"] == 1
    assert sorted(left) == ["evt_2", "evt_3"]
    assert rows == [("evt_1", "sending")]


def test_pages_of_events_and_of_quarantine_newest_first(store_url: str) -> None:
    async def go(store: Store) -> Any:
        for i in range(5):
            await store.events.accept(*event(i, sessionId=f"s{i % 2}"))
        await store.events.accept(*event(3, sessionId="s1"))  # delivered twice
        for reason in ("invalid_json", "invalid_event"):
            await store.events.quarantine(b"\xff{", reason=reason, client="10.0.0.1", event_id=None)
        first = await store.events.page(EventQuery(limit=3))
        rest = await store.events.page(
            EventQuery(limit=3, before=(first[-1].received_at, first[-1].id))
        )
        of_s1 = await store.events.page(EventQuery(session_id="s1"))
        twice = await store.events.page(EventQuery(duplicated=True))
        one = await store.events.get("evt_2")
        [newest] = await store.events.quarantined(before=None, limit=1)
        older = await store.events.quarantined(before=newest.id, limit=5)
        return first, rest, of_s1, twice, one, await store.events.get("nope"), newest, older

    first, rest, of_s1, twice, one, missing, newest, older = run(store_url, go)
    assert [r.id for r in first + rest] == [f"evt_{i}" for i in (4, 3, 2, 1, 0)]
    assert {r.id for r in of_s1} == {"evt_1", "evt_3"}
    assert [(r.id, r.duplicates) for r in twice] == [("evt_3", 1)]
    row, body = one
    assert (row.id, row.session_id, row.routed_at) == ("evt_2", "s0", None)
    assert '"id":"evt_2"' in body.replace(" ", "") and missing is None
    assert (newest.reason, newest.client, newest.body) == ("invalid_event", "10.0.0.1", "\ufffd{")
    assert [q.reason for q in older] == ["invalid_json"]
