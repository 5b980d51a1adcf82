"""The store contract of the backtest's reads (receiver.store.replay): the period's rows
(id, received_at, body) in store.history.between()'s order and pages, on SQLite and
PostgreSQL alike."""

from __future__ import annotations

from typing import Any

from receiver.store import Store, replay
from tests.store.contract.test_history import BASE, accept, run


def test_the_replay_rows_are_the_period_events_in_order_in_pages(store_url: str) -> None:
    async def go(store: Store, clock: list[float]) -> Any:
        # Arrival order differs from id order; two arrive at the same time (then by id).
        for event_id, at in [("b", 10), ("a", 20), ("d", 20), ("c", 5), ("e", 40), ("f", 50)]:
            await accept(store, clock, event_id, BASE + at)
        whole = await store.history.between(BASE + 5, BASE + 50, after=None, limit=100)
        want = [(e.id, e.received_at, e.body) for e in whole]
        got = []
        for limit in (1, 2, 3):  # with 2 and 3, the two at 20 fall on two pages
            rows, after = [], None
            while page := await replay.page(store, BASE + 5, BASE + 50, after=after, limit=limit):
                rows += [tuple(r) for r in page]
                after = (page[-1][1], page[-1][0])
            got.append(rows)
        return want, got

    want, got = run(store_url, go)
    assert [w[0] for w in want] == ["c", "b", "a", "d", "e"]
    assert got == [want, want, want]
