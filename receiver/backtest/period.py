"""A backtest's period read from the real store: its events in pages, oldest first, routed
through every rules file's Backtest in one pass (receiver.backtest.replay)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence

from receiver.backtest.replay import Backtest, route_all
from receiver.backtest.result import Result
from receiver.events import load_stored
from receiver.rules import Ruleset
from receiver.store import Store, replay

PAGE = 20_000  # events read at a time


async def replay_period(
    store: Store,
    backtests: Sequence[Backtest],
    *,
    page: int = PAGE,
    progress: Callable[[int], None] | None = None,
) -> float:
    """Feed the stored events of the backtests' period to each of them, oldest first, the
    next page read while this one is routed; the seconds it took."""
    started = time.perf_counter()
    start, end = backtests[0].result.start, backtests[0].result.end
    reading = asyncio.ensure_future(replay.page(store, start, end, after=None, limit=page))
    decode = load_stored
    try:
        while rows := await reading:
            last_id, last_at, _ = rows[-1]
            reading = asyncio.ensure_future(
                replay.page(store, start, end, after=(last_at, last_id), limit=page)
            )
            for event_id, received_at, body in rows:
                route_all(backtests, event_id, received_at, body, decode(body))
            if progress is not None:
                progress(len(rows))
    finally:
        # Routing a page failed (or was interrupted): the next page's read is not waited
        # for, so it is cancelled, and its outcome read either way (never left unseen).
        if not reading.done():
            reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
    return time.perf_counter() - started


async def run(
    store: Store,
    rulesets: Sequence[Ruleset],
    *,
    start: float,
    end: float,
    progress: Callable[[int], None] | None = None,
    texts: bool = False,
) -> tuple[list[Result], float]:
    """Backtest each ruleset over [start, end) of the store's events, in one pass: the
    results, and the seconds the pass took. texts: render every title and body too."""
    silences = await store.transact(lambda tx: tx.silences.recent(limit=100_000))
    backtests = [
        Backtest(r, start=start, end=end, silences=silences, texts=texts) for r in rulesets
    ]
    for follower in backtests[1:]:
        follower.follow(backtests[0])
    with fewer_collections():
        took = await replay_period(store, backtests, progress=progress)
        return [b.finish() for b in backtests], took


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector rarely while millions of long-lived dicts and tuples
    pile up (alerts, notified episodes): with the default thresholds its full passes over
    them took about a sixth of a replay (600,000 events: 43 s, 37 s with these)."""
    before = gc.get_threshold()
    gc.set_threshold(50_000, 20, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*before)
