"""The router yields to ingest under a burst only while its lag is small (dispatch/router.py)."""

import asyncio
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
