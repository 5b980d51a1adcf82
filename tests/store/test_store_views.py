"""The store contract of the read API: the session projection, its reads (the events not
routed yet folded in), API keys and plan limits; on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, TypeVar

import pytest

from receiver import events
from receiver.sessions import Fact
from receiver.store import Store, open_store
from receiver.store.base import Tx
from receiver.store.records import SessionQuery
from tests.store.contract.common import run

T = TypeVar("T")


def ev(
    i: int, kind: str = "score.drop", ts: str = "2026-01-01T00:00:00.000Z", **fields: Any
) -> dict[str, Any]:
    fields.setdefault("sessionId", "sess_1")
    return events.sample(kind, id=f"evt_{i}", timestamp=ts, **fields)


async def accept(store: Store, *payloads: dict[str, Any]) -> None:
    for p in payloads:
        e = events.validate(p)
        await store.events.accept(e, json.dumps(p).encode())


async def route(store: Store) -> int:
    """What the router does to the projection: fold each unrouted event once, mark it."""

    def work(tx: Tx) -> int:
        batch = tx.events.unrouted(1000)
        facts = [Fact.from_payload(json.loads(e.body)) for e in batch]
        tx.sessions.project([f for f in facts if f is not None])
        tx.events.mark_routed([e.id for e in batch], 2000.0)
        return len(batch)

    return await store.transact(work)


def test_a_session_is_read_before_and_after_routing_alike(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        await accept(
            store,
            ev(1, "score.drop", "2026-01-01T00:00:01.000Z", score=30, page="/checkout", cohort="b"),
            ev(2, "intervention.fired", "2026-01-01T00:00:02.000Z"),
        )
        before = await store.sessions.get("sess_1")
        history_before = await store.sessions.score_history("sess_1")
        assert await route(store) == 2
        after = await store.sessions.get("sess_1")
        return before, after, history_before, await store.sessions.score_history("sess_1")

    before, after, h1, h2 = run(store_url, go)
    assert before is not None and after is not None
    assert (
        before.as_dict()
        == after.as_dict()
        == {
            "id": "sess_1",
            "userId": "user_42",
            "score": 30,
            "status": "dropped",
            "context": "/checkout",
            "startedAt": "2026-01-01T00:00:01.000000Z",
            "cohort": "b",
            "signals": 1,
            "interventions": 1,
            "updatedAt": "2026-01-01T00:00:02.000000Z",
        }
    )
    assert h1 == h2 == [(30.0, "2026-01-01T00:00:01.000000Z")]


def test_late_and_split_deliveries_give_the_in_order_result(store_url: str) -> None:
    later = ev(1, "score.recover", "2026-01-01T00:00:09.000Z", score=70)
    stop = ev(2, "session.stopped", "2026-01-01T00:00:05.000Z")
    early = ev(3, "score.drop", "2026-01-01T00:00:01.000Z", score=20)

    async def go(store: Store) -> tuple[Any, Any]:
        await accept(store, later, stop)
        await route(store)
        await accept(store, early)  # late: older than what is stored
        mixed = await store.sessions.get("sess_1")  # one routed part, one not
        await route(store)
        return mixed, await store.sessions.get("sess_1")

    mixed, routed = run(store_url, go)
    for s in (mixed, routed):
        assert s.score == 70 and s.status == "stopped"
        assert s.started_at == "2026-01-01T00:00:01.000000Z"
        assert s.last_ts == "2026-01-01T00:00:09.000000Z" and s.signals == 2


def test_unknown_session_is_none(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, Any]:
        return await store.sessions.get("nope"), await store.sessions.score_history("nope")

    assert run(store_url, go) == (None, None)


def test_pages_walk_every_session_once_while_new_ones_arrive(store_url: str) -> None:
    def start(n: int) -> str:
        return f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}.000Z"

    async def go(store: Store) -> tuple[list[str], list[int]]:
        await accept(store, *(ev(i, sessionId=f"s{i:03d}", ts=start(i)) for i in range(25)))
        await route(store)
        await accept(store, *(ev(i, sessionId=f"s{i:03d}", ts=start(i)) for i in range(25, 30)))
        # Lists show routed events only; a single session's read folds the rest in.
        unrouted = await store.sessions.page(SessionQuery(limit=100))
        assert unrouted.total == 25 and len(unrouted.sessions) == 25
        assert await store.sessions.get("s029") is not None
        await route(store)
        seen: list[str] = []
        totals: list[int] = []
        cursor = None
        for turn in range(10):
            page = await store.sessions.page(SessionQuery(limit=7, cursor=cursor))
            seen += [s.id for s in page.sessions]
            totals.append(page.total)
            # newer sessions arrive during the walk; they sort before the cursor
            await accept(store, ev(100 + turn, sessionId=f"new{turn}", ts=start(200 + turn)))
            if turn % 2:
                await route(store)
            cursor = page.cursor
            if cursor is None:
                break
        return seen, totals

    seen, totals = run(store_url, go)
    assert seen == [f"s{i:03d}" for i in range(29, -1, -1)]
    assert totals[0] == 30


def test_totals_add_up_hours_and_count_the_ends_exactly(store_url: str) -> None:
    """`total` from session_hours and the two end hours matches a plain count, for ranges
    inside one hour, across hours and days, open on either side, and after sessions stop
    (they move to another status's count)."""
    rng = random.Random(11)
    starts = [
        f"2026-01-0{1 + rng.randrange(3)}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:"
        f"{rng.randrange(60):02d}.000Z"
        for _ in range(120)
    ]
    ends = sorted({s[:14] + "30:00.000Z" for s in starts[:12]} | {s for s in starts[12:20]})
    # Bounds as the API hands them over (iso(): microseconds), some on a session's start.
    ends = [e.replace(".000Z", ".000000Z") for e in ends]

    async def go(store: Store) -> list[tuple[Any, ...]]:
        await accept(store, *(ev(i, sessionId=f"s{i:03d}", ts=t) for i, t in enumerate(starts)))
        await route(store)
        stopped = [
            ev(500 + i, "session.stopped", sessionId=f"s{i:03d}", ts="2026-01-05T00:00:00.000Z")
            for i in range(0, 120, 3)
        ]
        await accept(store, *stopped)
        await route(store)
        status_of = {}
        for i in range(len(starts)):
            found = await store.sessions.get(f"s{i:03d}")
            assert found is not None
            status_of[i] = found.status
        assert set(status_of.values()) == {"dropped", "stopped"}
        wrong = []
        for status in (None, "dropped", "stopped", "active"):
            for low in (None, *ends[::3]):
                for high in (None, *ends[1::3]):
                    query = SessionQuery(limit=1, status=status, start_from=low, start_to=high)
                    got = (await store.sessions.page(query)).total
                    want = sum(
                        1
                        for i, t in enumerate(starts)
                        if (status is None or status == status_of[i])
                        and (low is None or t.replace(".000Z", ".000000Z") >= low)
                        and (high is None or t.replace(".000Z", ".000000Z") <= high)
                    )
                    if got != want:
                        wrong.append((status, low, high, got, want))
        return wrong

    assert run(store_url, go) == []


def test_filters_total_and_unknown_cursor(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        await accept(
            store,
            ev(1, sessionId="a", userId="u1", ts="2026-01-01T00:00:01.000Z"),
            ev(2, "score.recover", sessionId="b", userId="u1", ts="2026-01-02T00:00:01.000Z"),
            ev(3, sessionId="c", userId="u2", ts="2026-01-03T00:00:01.000Z"),
            ev(4, "session.stopped", sessionId="c", userId="u2", ts="2026-01-03T00:00:02.000Z"),
        )
        await route(store)
        by_user = await store.sessions.page(SessionQuery(user_id="u1"))
        dropped = await store.sessions.page(SessionQuery(status="dropped"))
        ranged = await store.sessions.page(
            SessionQuery(
                start_from="2026-01-02T00:00:00.000000Z", start_to="2026-01-03T00:00:00.000000Z"
            )
        )
        with pytest.raises(KeyError):
            await store.sessions.page(SessionQuery(cursor="nope"))
        return by_user, dropped, ranged

    by_user, dropped, ranged = run(store_url, go)
    assert [s.id for s in by_user.sessions] == ["b", "a"] and by_user.total == 2
    assert by_user.cursor is None
    assert [s.id for s in dropped.sessions] == ["a"]
    assert [s.id for s in ranged.sessions] == ["b"]


def test_score_groups_count_each_session_once_with_its_latest_score(store_url: str) -> None:
    async def go(store: Store) -> dict[str, dict[float, int]]:
        await accept(
            store,
            ev(1, sessionId="a", page="/x", score=10, ts="2026-01-01T10:00:00.000Z"),
            ev(
                2,
                "score.recover",
                sessionId="a",
                page="/x",
                score=50,
                ts="2026-01-01T11:00:00.000Z",
            ),
            ev(3, sessionId="b", page="/x", score=20, ts="2026-01-01T11:00:00.000Z"),
            ev(4, sessionId="c", page="/y", score=30, ts="2026-01-01T11:30:00.000Z"),
            ev(5, sessionId="old", page="/y", score=1, ts="2025-12-01T00:00:00.000Z"),
            ev(6, sessionId="nopage", score=5, ts="2026-01-01T11:00:00.000Z"),
        )
        await route(store)
        await accept(
            store, ev(7, sessionId="d", page="/y", score=40, ts="2026-01-01T11:40:00.000Z")
        )
        unrouted = await store.sessions.score_groups("page", "2026-01-01T00:00:00.000000Z")
        assert {g.key: g.histogram for g in unrouted} == {"/x": {50.0: 1, 20.0: 1}, "/y": {30.0: 1}}
        await route(store)
        groups = await store.sessions.score_groups("page", "2026-01-01T00:00:00.000000Z")
        return {g.key: g.histogram for g in groups}

    assert run(store_url, go) == {"/x": {50.0: 1, 20.0: 1}, "/y": {30.0: 1, 40.0: 1}}


def test_an_upgrade_projects_the_events_routed_before(tmp_path: Any) -> None:
    """A store from before the projection (schema 5) with routed events: opening it with
    this version builds their sessions."""
    import sqlite3

    from receiver.store.events import event_row
    from receiver.store.sqlite.schema import MIGRATIONS

    db = str(tmp_path / "old.db")
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
        for version, script in enumerate(MIGRATIONS[:5], start=1):
            assert isinstance(script, str)
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
        for payload in (
            ev(1, score=33),
            ev(2, "score.recover", score=60, ts="2026-01-01T00:00:05.000Z"),
        ):
            raw = json.dumps(payload).encode()
            conn.execute(
                "INSERT INTO events (id, type, session_id, user_id, score, threshold, event_ts,"
                " received_at, body, routed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1.0)",
                event_row(events.validate(payload), raw, 1.0),
            )

    async def after(store: Store) -> Any:
        listed = await store.sessions.page(SessionQuery(status="active"))
        return (
            await store.sessions.get("sess_1"),
            await store.sessions.score_history("sess_1"),
            listed,
        )

    summary, history, listed = run(db, after)
    assert summary.score == 60 and summary.status == "active" and summary.signals == 2
    assert [s for s, _ in history] == [33.0, 60.0]
    assert listed.total == 1 and [s.id for s in listed.sessions] == ["sess_1"]  # hours counted


# -- API keys and plan limits -----------------------------------------------------------------


def test_keys_are_stored_listed_and_revoked(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        key = await store.keys.add(
            name="ci", key_hash="h1", prefix="ar_ab", plan="pro", role="reader", now=5.0
        )
        with pytest.raises(KeyError):
            await store.keys.add(
                name="ci", key_hash="h2", prefix="ar_cd", plan="pro", role="reader", now=6.0
            )
        found = await store.keys.authorize("h1", now=10.0)
        unknown = await store.keys.authorize("h9", now=10.0)
        revoked = await store.keys.revoke("ci", now=11.0)
        again = await store.keys.revoke("ci", now=12.0)
        after = await store.keys.authorize("h1", now=13.0)
        return key, found, unknown, revoked, again, after, await store.keys.all()

    key, found, unknown, revoked, again, after, listed = run(store_url, go)
    assert (key.name, key.plan, key.role, key.prefix) == ("ci", "pro", "reader", "ar_ab")
    assert found[0] is not None and found[0].name == "ci"
    assert found[1] is not None and found[1].limit == 600 and found[1].remaining == 599
    assert unknown == (None, None)
    assert (revoked, again, after) == (True, False, (None, None))
    assert [(k.name, k.revoked_at) for k in listed] == [("ci", 11.0)]
    assert not any(hasattr(k, "hash") for k in listed)


def test_a_free_key_gets_sixty_a_minute_and_the_sixty_first_is_refused(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        await store.keys.add(
            name="f", key_hash="hf", prefix="ar_f", plan="free", role="reader", now=0.0
        )
        await store.keys.add(
            name="e", key_hash="he", prefix="ar_e", plan="enterprise", role="admin", now=0.0
        )
        burst = [await store.keys.authorize("hf", now=100.0 + i / 100) for i in range(61)]
        later = await store.keys.authorize("hf", now=160.5)  # the first ones have left the window
        unlimited = [await store.keys.authorize("he", now=100.0) for _ in range(100)]
        return burst, later, unlimited

    burst, later, unlimited = run(store_url, go)
    refused = [limit for _, limit in burst if not limit.allowed]
    assert len(refused) == 1 and burst[-1][1] == refused[0]
    assert refused[0].remaining == 0 and refused[0].reset == 60
    assert burst[0][1].remaining == 59
    assert later[1].allowed
    assert all(key is not None and limit is None for key, limit in unlimited)


def test_replicas_share_one_count(pg_url: str) -> None:
    async def go() -> list[bool]:
        a, b = open_store(pg_url), open_store(pg_url)
        await a.open()
        await b.open()
        try:
            await a.keys.add(
                name="f", key_hash="hf", prefix="ar_f", plan="free", role="reader", now=0.0
            )
            results = await asyncio.gather(
                *(s.keys.authorize("hf", now=100.0) for s in [a, b] * 35)
            )
            return [limit.allowed for _, limit in results]
        finally:
            await a.close()
            await b.close()

    allowed = asyncio.run(go())
    assert allowed.count(True) == 60 and allowed.count(False) == 10


# -- webhook subscriptions ----------------------------------------------------------------------


def test_subscriptions_are_kept_changed_and_their_deliveries_listed(store_url: str) -> None:
    from receiver.store.records import subscriber_delivery

    async def go(store: Store) -> tuple[Any, ...]:
        hook = await store.webhooks.add(
            public_id="wh_1",
            url="https://a.example/h",
            events=["score.drop"],
            threshold=None,
            format="service",
            secret="s1",
            now=1.0,
        )
        other = await store.webhooks.add(
            public_id="wh_2",
            url="https://b.example/h",
            events=["score.drop"],
            threshold=40,
            format="standard",
            secret="whsec_x",
            now=2.0,
        )

        def queue(tx: Tx) -> list[int]:
            return [
                tx.outbox.add(
                    f"evt_{i}",
                    subscriber_delivery(hook.id, f"evt_{i}", "{}"),
                    state="pending",
                    now=3.0,
                    kind="webhook",
                )
                for i in range(3)
            ]

        ids = await store.transact(queue)
        page = await store.webhooks.deliveries(hook.id, limit=2)
        rest = await store.webhooks.deliveries(hook.id, limit=2, before=page[-1].id)
        rotated = await store.webhooks.update("wh_1", now=4.0, secret="s2")
        await store.outbox.mark_failed(ids[0], error="HTTP 500", now=5.0, retry_at=None)
        retried = await store.webhooks.retry_delivery(hook.id, ids[0], now=6.0)
        wrong = await store.webhooks.retry_delivery(other.id, ids[0], now=6.0)
        disabled = await store.webhooks.update("wh_2", now=7.0, status="disabled", reason="410")
        active = await store.webhooks.all(active_only=True)
        deleted = await store.webhooks.update("wh_1", now=8.0, status="deleted")
        after = await store.webhooks.deliveries(hook.id, limit=10)
        return (
            hook,
            page,
            rest,
            rotated,
            retried,
            wrong,
            disabled,
            active,
            deleted,
            after,
            await store.webhooks.get("wh_1"),
            await store.webhooks.all(),
        )

    hook, page, rest, rotated, retried, wrong, disabled, active, deleted, after, gone, listed = run(
        store_url, go
    )
    assert hook.events == ["score.drop"] and hook.status == "active" and hook.secret == "s1"
    assert [r.delivery_id for r in page] == ["evt_2", "evt_1"]
    assert [r.delivery_id for r in rest] == ["evt_0"]
    assert rotated.secret == "s2"
    assert retried.state == "pending" and retried.attempts == 0 and retried.next_at == 6.0
    assert wrong is None
    assert disabled.status == "disabled" and disabled.status_reason == "410"
    assert [h.public_id for h in active] == ["wh_1"]
    assert deleted.status == "deleted" and gone is None
    assert {r.state for r in after} == {"cancelled"}  # deleting cancels what is unsent
    assert [h.public_id for h in listed] == ["wh_2"]


def test_threshold_sides_are_kept_per_subscription_and_session(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(
            lambda tx: tx.webhooks.save_sides({(1, "s"): (True, "m1"), (2, "s"): (False, "m2")})
        )
        await store.transact(lambda tx: tx.webhooks.save_sides({(1, "s"): (False, "m3")}))
        return await store.transact(lambda tx: tx.webhooks.sides([1, 2, 3], ["s", "t"]))

    assert run(store_url, go) == {(1, "s"): (False, "m3"), (2, "s"): (False, "m2")}
