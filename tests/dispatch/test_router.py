"""The router yields to ingest under a burst only while its lag is small (dispatch/router.py)."""

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import cast

import pytest

from receiver import events
from receiver.dispatch.router import BATCH, LAG_EASY, LAG_LIMIT, MAX_BATCH, ROUTING_SHARE, Router
from receiver.metrics import Metrics
from receiver.rules.load import load_text
from receiver.store import SQLiteStore, Store

RULES = load_text('notifiers:\n  log: "json://127.0.0.1:9/x"\nrules: []\n')


@pytest.mark.parametrize(
    ("lag", "share"),
    [
        pytest.param(0.0, ROUTING_SHARE, id="caught-up"),
        pytest.param(LAG_EASY, ROUTING_SHARE, id="easy"),
        pytest.param((LAG_EASY + LAG_LIMIT) / 2, (ROUTING_SHARE + 1) / 2, id="halfway"),
        pytest.param(LAG_LIMIT, 1.0, id="limit"),
        pytest.param(60.0, 1.0, id="far-behind"),
    ],
)
def test_routing_share_grows_with_lag(lag: float, share: float) -> None:
    r = Router(cast(Store, None), lambda: RULES, metrics=Metrics(), on_routed=lambda: None)
    r.lag = lag
    assert r.share() == pytest.approx(share)


def test_batches_grow_while_behind_and_shrink_once_caught_up(tmp_path: Path) -> None:
    received = 1000.0
    now = [received + 2 * LAG_LIMIT]  # the router's clock: far behind at first

    async def main() -> list[tuple[int, float]]:
        store = SQLiteStore(tmp_path / "r.db", clock=lambda: received)
        await store.open()
        try:
            stored = [
                events.validate(
                    events.sample("score.drop", id=f"evt_{i}", timestamp="2026-01-01T00:00:00Z")
                )
                for i in range(BATCH * 8)
            ]
            await asyncio.gather(
                *(store.events.accept(e, e.model_dump_json().encode()) for e in stored)
            )
            r = Router(
                store,
                lambda: RULES,
                metrics=Metrics(),
                on_routed=lambda: None,
                clock=lambda: now[0],
            )
            seen = [(await r.route_pending(), r.lag)]
            seen.append((await r.route_pending(), r.lag))
            now[0] = received + LAG_EASY / 2  # caught up (by this clock)
            seen.append((await r.route_pending(), r.lag))
            seen.append((await r.route_pending(), r.lag))
            return seen
        finally:
            await store.close()

    seen = asyncio.run(main())  # 8 batches' worth: 1, 2, 4 while behind, then 1 again
    assert [n for n, _ in seen] == [BATCH, 2 * BATCH, 4 * BATCH, BATCH]
    assert [lag for _, lag in seen] == pytest.approx([2 * LAG_LIMIT] * 2 + [LAG_EASY / 2] * 2)
    assert MAX_BATCH >= 4 * BATCH


INHIBITING = load_text(
    'notifiers:\n  log: "json://127.0.0.1:9/x"\n'
    "rules:\n- name: drop\n  match: {type: score.drop}\n  notify: [log]\n  resolve: true\n"
    "inhibit:\n- name: iv\n  source: {type: intervention.fired}\n"
    "  target: {type: score.drop}\n  equal: [sessionId]\n"
)


def test_what_a_source_held_wakes_at_the_next_look_after_it_closes(tmp_path: Path) -> None:
    """The timers look for what to wake once a WAKE_EVERY; a source that closes makes the
    next look wake what it held, as an expired silence does (and as the backtest wakes it
    as the source closes): within one instant, before a later event resolves it (seed 201)."""
    now = 1000.0

    def body(kind: str, n: int, **fields: object) -> events.Event:
        return events.validate(
            {"id": f"evt_{n}", "type": kind, "sessionId": "s1", "userId": "u1",
             "timestamp": "2026-01-01T00:00:00Z", **fields}
        )  # fmt: skip

    async def main() -> None:
        store = SQLiteStore(tmp_path / "r.db", clock=lambda: now)
        await store.open()
        try:
            r = Router(
                store, lambda: INHIBITING, metrics=Metrics(), on_routed=lambda: None,
                clock=lambda: now,
            )  # fmt: skip
            for event in (
                body("intervention.fired", 1, interventionId="iv1"),
                body("score.drop", 2, score=22, threshold=40),
            ):
                await store.events.accept(event, event.model_dump_json().encode())
                await r.route_pending()
                await r.tick()  # the timers looked just now
            ended = body("intervention.resolved", 3, interventionId="iv1")
            await store.events.accept(ended, ended.model_dump_json().encode())
            await r.route_pending()
            await r.tick()  # the same instant: no WAKE_EVERY since the last look
        finally:
            await store.close()

    asyncio.run(main())
    with contextlib.closing(sqlite3.connect(tmp_path / "r.db")) as db:
        rows = db.execute("SELECT state, event_id FROM outbox WHERE rule = 'drop'").fetchall()
    assert ("inhibited", "evt_2") in rows and ("pending", "evt_2") in rows, rows
