"""store.sessions and tx.sessions: the session projection, written by routing, read with
the events not routed yet folded in; pages, totals, score groups, the upgrade."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from receiver import events
from receiver.store import Store
from receiver.store.records import SessionQuery
from tests.store.contract.common import accept, ev, route, run


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
                event_row(events.validate(payload), raw, 1.0)[:9],  # no trace column yet
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


def test_a_read_is_one_snapshot_while_routing_commits_beside_it(store_url: str) -> None:
    """A session read folds the events not routed yet into the projection: both parts must
    come from one snapshot, or an event routed between the two reads is counted twice."""

    async def go(store: Store) -> tuple[Any, Any]:
        await accept(store, ev(1, "score.drop", "2026-01-01T00:00:01.000Z", score=30))
        loop = asyncio.get_running_loop()
        unrouted = "SELECT count(*) FROM events WHERE routed_at IS NULL"

        def read(q: Any) -> tuple[Any, Any]:
            before = q(unrouted, ()).fetchone()[0]
            # Routing commits on another connection while this read is open.
            asyncio.run_coroutine_threadsafe(route(store), loop).result(timeout=30)
            return before, q(unrouted, ()).fetchone()[0]

        seen = await store.read(read)  # type: ignore[attr-defined]
        assert await store.sessions.get("sess_1") is not None
        return seen

    assert run(store_url, go) == (1, 1)
