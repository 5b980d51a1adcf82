"""The store contract: what ingest, the router, the lifecycle and the notify worker rely on,
through the interface only (receiver.store.base: Store and Tx), on SQLite and on a real
PostgreSQL alike. Each test gets an empty store of each kind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from receiver import events
from receiver.errors import StoreError
from receiver.store import Notification, Store, open_store
from receiver.store.base import Tx
from receiver.store.memory import MemoryStore
from receiver.store.records import WEBHOOK_NOTIFIER, Alert, Backlog, Replay

T = TypeVar("T")
MEMORY = "memory:"  # the backtest's scratch store (receiver.store.memory): routing tests only


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def tx_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of each kind for the routing-transaction tests: the scratch store in memory
    is held to the same contract as SQLite and PostgreSQL."""
    if request.param == "memory":
        return MEMORY
    if request.param == "sqlite":
        return str(tmp_path / "receiver.db")
    return str(request.getfixturevalue("pg_url"))


def run(url: str, fn: Callable[[Store], Awaitable[T]], clock: float = 1000.0) -> T:
    async def main() -> T:
        store: Any = MemoryStore(clock=lambda: clock) if url == MEMORY else None
        store = store or open_store(url, clock=lambda: clock)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def event(i: int | str, **fields: Any) -> tuple[events._Event, bytes]:
    """Event i; the same bytes each time (a redelivery), unless fields differ (a conflict)."""
    fields.setdefault("timestamp", "2026-01-01T00:00:00.000Z")
    e = events.validate(events.sample("score.drop", id=f"evt_{i}", **fields))
    return e, e.model_dump_json().encode()


def note(rule: str = "r", notifier: str = "console", target: int = 0) -> Notification:
    return Notification(rule=rule, notifier=notifier, target=target, title="t", body="b")


async def queue(store: Store, event_id: str, notes: list[Notification], now: float) -> int:
    """Mark event_id routed and queue notes for it, as the router does; rows written."""

    def work(tx: Tx) -> int:
        if not tx.events.mark_routed([event_id], now):
            return 0
        return len([tx.outbox.add(event_id, n, state="pending", now=now) for n in notes])

    return await store.transact(work)


# -- ingest ---------------------------------------------------------------------------------


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


def test_check_writable_passes_on_a_healthy_store(store_url: str) -> None:
    run(store_url, lambda s: s.check_writable())


# -- routing transactions -------------------------------------------------------------------


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
            await store.deliveries(),
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


def test_a_failing_transaction_writes_nothing(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))

        def fail(tx: Tx) -> None:
            tx.events.mark_routed(["evt_1"], 5.0)
            tx.outbox.add("evt_1", note(), state="pending", now=5.0)
            raise ValueError("a bug in the middle of routing")

        with pytest.raises(ValueError, match="a bug"):
            await store.transact(fail)
        return await store.transact(lambda tx: tx.events.unrouted(5)), await store.deliveries()

    unrouted, rows = run(tx_url, go)
    assert [e.id for e in unrouted] == ["evt_1"] and rows == []


def test_a_savepoint_rolls_back_its_own_writes_only(tx_url: str) -> None:
    async def go(store: Store) -> list[str]:
        await store.events.accept(*event(1))

        def work(tx: Tx) -> None:
            tx.outbox.add("evt_1", note("kept"), state="pending", now=5.0)
            with pytest.raises(ValueError), tx.savepoint():
                tx.outbox.add("evt_1", note("undone"), state="pending", now=5.0)
                raise ValueError
            with tx.savepoint():
                tx.outbox.add("evt_1", note("also kept"), state="pending", now=5.0)

        await store.transact(work)
        return [row.rule for row in await store.deliveries()]

    assert run(tx_url, go) == ["also kept", "kept"]


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
            for r in await store.deliveries()
        )

    assert run(tx_url, go) == [
        ("evt_1", "@subscriber", 7, "t", "b", "pending", 5.0, "webhook"),
        ("evt_2", "@subscriber", 8, "t", "b", "pending", 5.0, "webhook"),
    ]


def test_throttle_opens_a_window_and_holds_within_it(tx_url: str) -> None:
    async def go(store: Store) -> list[bool]:
        def check(now: float) -> Callable[[Tx], bool]:
            return lambda tx: tx.throttle.throttled("r", "user_1", now, 60.0)

        return [
            await store.transact(check(100.0)),  # opens [100, 160)
            await store.transact(check(159.0)),
            await store.transact(lambda tx: tx.throttle.throttled("r", "user_2", 159.0, 60.0)),
            await store.transact(check(160.0)),  # a new window
            await store.transact(check(200.0)),
        ]

    assert run(tx_url, go) == [False, True, False, False, True]


def test_alerts_read_ahead_written_once_and_listed_open(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def batch(tx: Tx) -> None:
            tx.alerts.read_ahead(["a", "b"])
            assert tx.alerts.get("a") is None
            tx.alerts.save(Alert("a", "open", 1, "2026-01-01T00:00:01Z", "t1", "evt_1"), 10.0)
            tx.alerts.save(Alert("b", "resolved", 1, "2026-01-01T00:00:02Z"), 10.0)
            assert tx.alerts.get("a") is not None  # the batch sees its own change
            tx.alerts.flush()

        await store.transact(batch)

        def reopen(tx: Tx) -> None:
            a = tx.alerts.get("a")
            assert a is not None
            a.state, a.episode = "resolved", 1
            tx.alerts.save(a, 11.0)
            tx.alerts.save(Alert("c", "open", 2, "2026-01-01T00:00:03Z", "t3", "evt_3"), 11.0)

        await store.transact(reopen)
        return await store.transact(
            lambda tx: (tx.alerts.list_open(), tx.alerts.get("b"), tx.alerts.get("x"))
        )

    open_alerts, b, missing = run(tx_url, go)
    assert [(a.id, a.episode, a.opened_event) for a in open_alerts] == [("c", 2, "evt_3")]
    assert b == Alert("b", "resolved", 1, "2026-01-01T00:00:02Z") and missing is None


def test_notices_repeat_and_end(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            tx.notices.add("a", 1, "r", 100.0, 60.0)
            tx.notices.add("a", 1, "r", 105.0, 60.0)  # once per (alert, episode, rule)
            tx.notices.add("a", 1, "q", 100.0, None)
            [due] = tx.notices.due(200.0)
            tx.notices.repeated(due, 260.0)
            early = tx.notices.due(200.0)
            notices = sorted(tx.notices.of("a", 1), key=lambda n: n.rule)
            tx.notices.end_repeats("a", 1)
            return early, notices, tx.notices.due(1000.0)

        return await store.transact(work)

    early, notices, after = run(tx_url, go)
    assert early == [] and after == []
    assert [(n.rule, n.next_repeat_at, n.repeats) for n in notices] == [
        ("q", None, 0),
        ("r", 260.0, 1),
    ]


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
        return before, cancelled, await store.deliveries()

    before, cancelled, rows = run(tx_url, go)
    assert before == (False, True, False) and cancelled == 1
    assert {(r.rule, r.state, r.reason) for r in rows} == {
        ("hold", "cancelled", "resolved before it was sent"),
        ("now", "pending", None),
    }


def test_a_batch_finds_held_rows_and_notices_from_before_it_and_its_own(tx_url: str) -> None:
    """Read ahead, a batch looks for held rows and notices only on alerts that have some:
    those stored before the batch and those it adds itself are still found."""

    async def go(store: Store) -> Any:
        def before(tx: Tx) -> None:
            tx.outbox.add(
                "e1", note("hold"), state="held", now=1.0, next_at=60.0, alert="a", episode=1
            )
            tx.notices.add("a", 1, "hold", 1.0, None)

        await store.transact(before)

        def batch(tx: Tx) -> Any:
            tx.alerts.read_ahead(["a", "b", "c"])
            tx.outbox.add(
                "e2", note("hold"), state="held", now=2.0, next_at=60.0, alert="b", episode=1
            )
            tx.notices.add("b", 1, "hold", 2.0, None)
            found = [
                (tx.outbox.cancel_held(alert, 1, 3.0, "resolved"), len(tx.notices.of(alert, 1)))
                for alert in ("a", "b", "c")
            ]
            tx.alerts.flush()
            return found

        return await store.transact(batch)

    assert run(tx_url, go) == [(1, 1), (1, 1), (0, 0)]


def test_digest_groups_open_fill_and_release(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def first(tx: Tx) -> int:
            assert tx.digests.find_open("r", "k", 100.0) is None
            group = tx.digests.new("r", "k", 100.0, 160.0)
            tx.outbox.add("e1", note("r"), state="held", now=100.0, next_at=160.0, kind="digest",
                   group_id=group.id)  # fmt: skip
            group.members.append({"id": "e1"})
            tx.digests.update(group, title="1 event", body="e1", now=100.0, release=False)
            return group.id

        gid = await store.transact(first)

        def second(tx: Tx) -> Any:
            group = tx.digests.find_open("r", "k", 120.0)
            assert group is not None and group.id == gid and group.members == [{"id": "e1"}]
            tx.digests.update(group, title="2 events", body="e1 e2", now=130.0, release=True)
            return tx.digests.find_open("r", "k", 170.0)

        closed = await store.transact(second)
        return closed, await store.deliveries()

    closed, [row] = run(tx_url, go)
    assert closed is None
    assert (row.title, row.body, row.next_at, row.kind) == ("2 events", "e1 e2", 130.0, "digest")


def test_silences_added_listed_and_expired(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        sid = await store.transact(
            lambda tx: tx.silences.add({"userId": "u1"}, "maintenance", 100.0, 200.0)
        )
        active = await store.transact(lambda tx: tx.silences.active(150.0))
        expired = await store.transact(lambda tx: tx.silences.expire(sid, 160.0))
        again = await store.transact(lambda tx: tx.silences.expire(sid, 161.0))
        return (
            sid,
            active,
            expired,
            again,
            await store.transact(lambda tx: tx.silences.active(170.0)),
        )

    sid, [active], expired, again, after = run(tx_url, go)
    assert (active.id, active.matchers, active.reason) == (sid, {"userId": "u1"}, "maintenance")
    assert expired is True and again is False and after == []


def test_named_state_round_trips_json(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(lambda tx: tx.state.set("heartbeat", {"firing": True}))
        await store.transact(lambda tx: tx.state.set("heartbeat", {"firing": False, "n": 2}))
        return await store.transact(lambda tx: (tx.state.get("heartbeat"), tx.state.get("x")))

    assert run(tx_url, go) == ({"firing": False, "n": 2}, None)


def test_timers_lock_is_held_with_one_process(tx_url: str) -> None:
    assert run(tx_url, lambda s: s.transact(lambda tx: tx.try_lock("timers"))) is True


# -- delivery -------------------------------------------------------------------------------


def test_claim_lease_retry_and_dead(store_url: str) -> None:
    async def go(store: Store) -> None:
        await store.events.accept(*event(1))
        await queue(store, "evt_1", [note()], now=100.0)
        [row] = await store.claim_due(now=100.0, limit=5, lease=30)
        assert row.state == "sending" and row.attempts == 1
        assert await store.claim_due(now=110.0, limit=5, lease=30) == []  # leased
        [again] = await store.claim_due(now=131.0, limit=5, lease=30)  # lease ran out
        assert again.attempts == 2
        await store.mark_failed(row.id, error="down", now=131.0, retry_at=200.0)
        assert await store.next_due() == 200.0
        assert await store.claim_due(now=150.0, limit=5, lease=30) == []
        [third] = await store.claim_due(now=200.0, limit=5, lease=30)
        await store.mark_failed(third.id, error="still down", now=201.0, retry_at=None)
        [dead] = await store.deliveries(state="dead")
        assert dead.last_error == "still down"
        assert await store.retry_dead(None, now=300.0) == 1
        [fourth] = await store.claim_due(now=300.0, limit=5, lease=30)
        await store.mark_delivered(fourth.id, now=301.0)
        assert (await store.deliveries())[0].state == "delivered"
        assert await store.next_due() is None

    run(store_url, go)


def test_backlog_counts_unrouted_events_and_waiting_rows_by_channel(store_url: str) -> None:
    """The backlog gauges: what is unrouted and what waits to be sent, with the ages of the
    oldest; rows held on purpose, delivered or dead are not waiting."""

    async def go(store: Store) -> list[Backlog]:
        seen = [await store.stats.backlog(1010.0)]
        for i in range(4):
            await store.events.accept(*event(i))  # received at 1000 (the store's clock)
        seen.append(await store.stats.backlog(1010.0))
        hook = Notification("webhook", WEBHOOK_NOTIFIER, 7, "1", "{}")

        def route(tx: Tx) -> None:
            tx.events.mark_routed(["evt_0", "evt_1"], 1004.0)
            for n in (note(), note(target=1)):
                tx.outbox.add("evt_0", n, state="pending", now=1004.0)
            tx.outbox.add("evt_1", note("digest", "mail"), state="held", now=1001.0, next_at=2000.0)
            tx.outbox.add_many([("evt_1", hook)], state="pending", now=1006.0, kind="webhook")

        await store.transact(route)
        seen.append(await store.stats.backlog(1010.0))
        [first, second] = await store.claim_due(
            now=1008.0, limit=0, lease=30, lanes={("console", 0): 1, ("console", 1): 1}
        )
        await store.mark_delivered(first.id, now=1009.0)
        await store.mark_failed(second.id, error="x", now=1009.0, retry_at=None)  # dead
        seen.append(await store.stats.backlog(1012.0))
        return seen

    empty, accepted, routed, sent = run(store_url, go)
    zero = {"notify": 0, "webhook": 0}
    assert empty == Backlog(
        lag=0.0, unrouted=0, pending=zero, oldest={"notify": 0.0, "webhook": 0.0}
    )
    assert (accepted.unrouted, accepted.lag, accepted.pending) == (4, 10.0, zero)
    assert (routed.unrouted, routed.lag) == (2, 10.0)
    assert routed.pending == {"notify": 2, "webhook": 1}
    assert routed.oldest == {"notify": 6.0, "webhook": 4.0}
    assert sent.pending == {"notify": 0, "webhook": 1}
    assert sent.oldest == {"notify": 0.0, "webhook": 6.0}


def test_claims_keep_to_each_targets_lane(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        notes = [note(f"r{i}", "slow") for i in range(5)] + [
            note(f"f{i}", "fast") for i in range(3)
        ]
        notes += [note("gone", "removed")]
        await queue(store, "evt_1", notes, now=100.0)
        lanes = {("slow", 0): 2, ("fast", 0): 8}
        first = await store.claim_due(now=100.0, limit=0, lease=30, lanes=lanes)
        full = dict.fromkeys(lanes, 0)  # both lanes busy now
        others = await store.claim_due(now=100.0, limit=5, lease=30, lanes=full)
        return first, others

    first, others = run(store_url, go)
    assert sorted(r.notifier for r in first) == ["fast"] * 3 + ["slow"] * 2
    assert [r.notifier for r in others] == ["removed"]  # targets not in lanes, only via limit


def test_release_gives_back_an_abandoned_send(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        await queue(store, "evt_1", [note("a"), note("b")], now=100.0)
        a, b = await store.claim_due(now=100.0, limit=5, lease=30)
        await store.mark_delivered(b.id, now=101.0)
        released = await store.release([a.id, b.id], now=102.0)
        rows = {r.rule: r for r in await store.deliveries()}
        return released, rows, await store.claim_due(now=102.0, limit=5, lease=30)

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
        [row, _] = await store.claim_due(now=100.0, limit=5, lease=30)
        await store.mark_delivered(row.id, now=101.0)
        return (
            [r.event_id for r in await store.deliveries(state="delivered")],
            [r.event_id for r in await store.deliveries(event_id="evt_2")],
            len(await store.deliveries(limit=1)),
        )

    delivered, of_two, limited = run(store_url, go)
    assert delivered == ["evt_1"] and of_two == ["evt_2"] and limited == 1


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
        before = await store.replay_status(replayed)

        def route(tx: Tx) -> None:
            tx.outbox.add("evt_1", note("r"), state="pending", now=3.0, replay=replayed)
            tx.events.replay_done(replayed, 3.0)
            tx.events.mark_routed(["evt_1"], 3.0)

        await store.transact(route)
        return replayed, missing, before, await store.replay_status(replayed)

    replayed, missing, (request, rows), (done, [row]) = run(store_url, go)
    assert missing is None and rows == []
    assert request == Replay(replayed, "evt_1", 2.0, respect_lifecycle=True, routed_at=None)
    assert done is not None and done.routed_at == 3.0
    assert (row.event_id, row.replay, row.state) == ("evt_1", replayed, "pending")


# -- retention ------------------------------------------------------------------------------


def test_prune_deletes_what_is_old_and_finished_only(store_url: str) -> None:
    async def go(store: Store) -> Any:
        for i in range(4):
            await store.events.accept(*event(i))
        await queue(store, "evt_0", [note("done")], now=1.0)
        await queue(store, "evt_1", [note("waiting")], now=1.0)
        [done, _] = await store.claim_due(now=1.0, limit=5, lease=30)  # both in flight
        await store.mark_delivered(done.id, now=2.0)
        await store.events.quarantine(
            b"\xff{", reason="invalid_json", client="127.0.0.1", event_id=None
        )
        counts = await store.events.prune(before=2000.0, limit=100)
        left = [e.id for e in await store.transact(lambda tx: tx.events.unrouted(10))]
        return counts, left, [(r.event_id, r.state) for r in await store.deliveries()]

    counts, left, rows = run(store_url, go)
    # evt_0 and evt_1 were routed; evt_1's notification is still pending, so only its event
    # goes; evt_2 and evt_3 were never routed and stay.
    assert counts["events"] == 2 and counts["outbox"] == 1 and counts["quarantine"] == 1
    assert sorted(left) == ["evt_2", "evt_3"]
    assert rows == [("evt_1", "sending")]


# -- several replicas on one database (PostgreSQL) ------------------------------------------


def test_two_replicas_route_disjoint_batches_and_claim_disjoint_rows(pg_url: str) -> None:
    async def go() -> Any:
        a, b = open_store(pg_url, clock=lambda: 100.0), open_store(pg_url, clock=lambda: 100.0)
        await a.open()
        await b.open()
        try:
            for i in range(20):
                await (a if i % 2 else b).accept(*event(i))
            hold = threading.Event()
            taken = threading.Event()

            def slow(tx: Tx) -> list[str]:
                ids = [e.id for e in tx.events.unrouted(8)]
                taken.set()
                hold.wait(10)
                return ids

            first = asyncio.create_task(a.transact(slow))
            await asyncio.get_running_loop().run_in_executor(None, taken.wait, 10)
            second = await b.transact(lambda tx: [e.id for e in tx.events.unrouted(20)])
            hold.set()
            first_ids = await first
            for i in range(20):
                await queue(a, f"evt_{i}", [note()], now=100.0)
            claims = await asyncio.gather(
                a.claim_due(now=100.0, limit=15, lease=30),
                b.claim_due(now=100.0, limit=15, lease=30),
            )
            return first_ids, second, claims
        finally:
            await a.close()
            await b.close()

    first, second, (claims_a, claims_b) = asyncio.run(go())
    assert len(first) == 8 and len(second) == 12 and not set(first) & set(second)
    ids_a, ids_b = {r.id for r in claims_a}, {r.id for r in claims_b}
    assert not ids_a & ids_b and len(ids_a | ids_b) == 20


def test_one_replica_at_a_time_holds_the_timers(pg_url: str) -> None:
    async def go() -> Any:
        a, b = open_store(pg_url), open_store(pg_url)
        await a.open()
        await b.open()
        try:
            hold, held = threading.Event(), threading.Event()

            def keep(tx: Tx) -> bool:
                got = tx.try_lock("timers")
                held.set()
                hold.wait(10)
                return got

            first = asyncio.create_task(a.transact(keep))
            await asyncio.get_running_loop().run_in_executor(None, held.wait, 10)
            while_held = await b.transact(lambda tx: tx.try_lock("timers"))
            hold.set()
            return await first, while_held, await b.transact(lambda tx: tx.try_lock("timers"))
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(go()) == (True, False, True)  # and it fails over once released


def test_the_throttle_lets_one_replica_through(pg_url: str) -> None:
    async def go() -> list[bool]:
        stores = [open_store(pg_url) for _ in range(4)]
        for store in stores:
            await store.open()
        try:
            return await asyncio.gather(
                *(
                    s.transact(lambda tx: tx.throttle.throttled("r", "user_1", 100.0, 60.0))
                    for s in stores
                )
            )
        finally:
            for store in stores:
                await store.close()

    assert sorted(asyncio.run(go())) == [False, True, True, True]
