"""The store contract of the upstream client (receiver.store.upstream_state): the shared request
budget, its hold, the sync cursor and sessions imported into the projection; on SQLite and
PostgreSQL alike."""

from __future__ import annotations

import asyncio
from typing import Any

from receiver.store import Store, open_store
from receiver.store.records import SessionQuery
from receiver.store.upstream_state import bucket_shape, take
from tests.store.contract.common import accept, ev, route, run


def test_the_bucket_lets_a_burst_go_then_one_request_per_refill(store_url: str) -> None:
    async def go(store: Store) -> list[float]:
        waits = [await store.upstream.take("b", per_minute=60, now=100.0) for _ in range(7)]
        waits.append(await store.upstream.take("b", per_minute=60, now=100.0 + 1 / 0.9))
        return waits

    waits = run(store_url, go)
    assert waits[:6] == [0.0] * 6  # the burst: a tenth of the plan
    assert abs(waits[6] - 1 / 0.9) < 1e-9  # empty: wait for one token
    assert waits[7] == 0.0  # refilled


def test_replicas_share_one_bucket(store_url: str) -> None:
    """Two stores open on one database (two replicas): what one drew, the other cannot."""

    async def go() -> list[float]:
        one, two = open_store(store_url), open_store(store_url)
        await one.open()
        await two.open()
        try:
            waits = []
            for i in range(12):
                store = one if i % 2 else two
                waits.append(await store.upstream.take("b", per_minute=60, now=50.0))
            return waits
        finally:
            await one.close()
            await two.close()

    waits = asyncio.run(go())
    assert waits.count(0.0) == 6


def test_a_hold_stops_every_draw_until_it_ends(store_url: str) -> None:
    async def go(store: Store) -> tuple[float, float, float, float]:
        assert await store.upstream.take("b", per_minute=600, now=10.0) == 0.0
        await store.upstream.hold("b", until=40.0)
        await store.upstream.hold("b", until=20.0)  # an earlier end does not shorten it
        during = await store.upstream.take("b", per_minute=600, now=30.0)
        after = await store.upstream.take("b", per_minute=600, now=40.0)
        later = await store.upstream.take("b", per_minute=600, now=41.0)
        other = await store.upstream.take("other", per_minute=600, now=30.0)
        return during, after, later, other

    during, after, later, other = run(store_url, go)
    assert during == 10.0
    assert after > 0.0  # restarts from an empty bucket
    assert later == 0.0
    assert other == 0.0  # another bucket is not held


def test_the_sync_cursor_is_kept_until_cleared(store_url: str) -> None:
    async def go(store: Store) -> list[Any]:
        seen = [await store.upstream.sync_cursor()]
        await store.upstream.set_sync_cursor(
            {"from": "2026-01-01", "to": None, "cursor": "s_9", "done": 20}
        )
        seen.append(await store.upstream.sync_cursor())
        await store.upstream.set_sync_cursor(
            {"from": "2026-01-01", "to": None, "cursor": "s_5", "done": 40}
        )
        seen.append(await store.upstream.sync_cursor())
        await store.upstream.set_sync_cursor(None)
        seen.append(await store.upstream.sync_cursor())
        return seen

    seen = run(store_url, go)
    assert seen[0] is None and seen[3] is None
    assert seen[1]["cursor"] == "s_9" and seen[2] == {
        "from": "2026-01-01", "to": None, "cursor": "s_5", "done": 40,
    }  # fmt: skip


REMOTE = {
    "id": "sess_1",
    "userId": "user_9",
    "score": 35,
    "status": "dropped",
    "context": "/checkout",
    "signals": 12,
    "interventions": 2,
    "startedAt": "2026-01-01T00:00:00.000Z",
    "updatedAt": "2026-01-01T00:10:00.000Z",
}
POINTS = [(70.0, "2026-01-01T00:00:00.000000Z"), (35.0, "2026-01-01T00:10:00.000000Z")]


def test_imported_sessions_are_served_like_received_ones_and_importing_again_changes_nothing(
    store_url: str,
) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        first = await store.sessions.import_upstream([(REMOTE, POINTS)])
        session = await store.sessions.get("sess_1")
        history = await store.sessions.score_history("sess_1")
        again = await store.sessions.import_upstream([(REMOTE, POINTS)])
        moved = await store.sessions.import_upstream([({**REMOTE, "id": "sess_2"}, [])])
        await store.sessions.import_upstream(
            [({**REMOTE, "id": "sess_2", "status": "stopped"}, [])]
        )
        totals = [
            (await store.sessions.page(SessionQuery(limit=1, status=status))).total
            for status in (None, "dropped", "stopped", "active")
        ]
        assert moved == 1 and totals == [2, 1, 1, 0]  # the read API's totals follow
        return (
            first,
            session,
            history,
            again,
            await store.sessions.get("sess_1"),
            (await store.sessions.score_history("sess_1")),
        )

    first, session, history, again, session2, history2 = run(store_url, go)
    assert first == 1 and again == 0
    shown = session.as_dict()
    assert {k: shown[k] for k in ("userId", "score", "status", "context", "signals")} == {
        "userId": "user_9", "score": 35, "status": "dropped", "context": "/checkout",
        "signals": 12,
    }  # fmt: skip
    assert shown["interventions"] == 2
    assert history == POINTS
    assert session2 == session and history2 == history


def test_a_newer_event_received_here_wins_over_an_older_upstream_record(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await accept(
            store,
            ev(1, "score.recover", "2026-01-01T00:20:00.000Z", score=80, userId="user_9",
               page="/home"),
        )  # fmt: skip
        await route(store)
        await store.sessions.import_upstream([(REMOTE, POINTS)])
        return await store.sessions.get("sess_1"), await store.sessions.score_history("sess_1")

    session, history = run(store_url, go)
    assert session.score == 80 and session.status == "active" and session.context == "/home"
    assert session.signals == 12 and session.interventions == 2  # the record's counts
    assert [score for score, _ in history] == [70.0, 35.0, 80.0]


def test_bucket_shape_never_passes_the_plan_in_any_minute() -> None:
    """Drawing as fast as allowed for five minutes: no 60-second window holds more than
    the plan's requests (the service's own count)."""
    for per_minute in (60, 600):
        tokens, updated, now, sent = bucket_shape(per_minute)[0], 0.0, 0.0, []
        for _ in range(100_000):
            if now >= 300:
                break
            left, wait = take(tokens, updated, 0.0, now=now, per_minute=per_minute)
            if wait == 0.0:
                tokens, updated = left, now
                sent.append(now)
            else:
                now += wait
        worst = max(sum(1 for t in sent if start <= t < start + 60) for start in sent)
        assert worst <= per_minute, per_minute
        assert worst >= per_minute * 0.95  # and it uses most of it
