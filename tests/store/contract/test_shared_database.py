"""Several stores on one database (worker processes on one SQLite file, replicas on one
PostgreSQL) hold the timers one at a time, so a timer fires once: on SQLite the write
transaction holds the file's write lock (BEGIN IMMEDIATE), which no other connection, in
this process or another, can take until it commits; on PostgreSQL an advisory lock."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from receiver.store import open_store
from receiver.store.base import Tx
from tests.store.contract.common import event, run

TURNS = 12  # timer turns per store, all at once
SPIN = 0.002  # seconds each turn holding the timers keeps them (the window for a race)


def test_a_timer_due_fires_once_across_stores_on_one_database(store_url: str) -> None:
    held: list[tuple[float, float, str]] = []  # (from, to, store) of each turn holding them

    def turn(tx: Tx, name: str) -> int:
        if not tx.try_lock("timers"):
            return 0
        since = time.monotonic()
        due = tx.state.get("timer")
        fired = due is None or due <= 100.0  # due now: fire it, and set the next one
        if fired:
            tx.state.set("timer", 160.0)
        while time.monotonic() - since < SPIN:  # another holder would overlap here
            tx.state.get("timer")
        held.append((since, time.monotonic(), name))
        return int(fired)

    async def one(name: str) -> list[int]:
        store = open_store(store_url)
        await store.open()
        try:
            return await asyncio.gather(
                *(store.transact(lambda tx: turn(tx, name)) for _ in range(TURNS))
            )
        finally:
            await store.close()

    run(store_url, lambda store: store.events.accept(*event(1)))  # the schema, made once
    # Each store on an event loop of its own thread, as each process has its own.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda name: asyncio.run(one(name)), ["a", "b"]))
    assert sum(results[0]) + sum(results[1]) == 1
    spans = sorted(held)
    overlaps = [(x, y) for x, y in zip(spans, spans[1:], strict=False) if y[0] < x[1]]
    assert {name for _, _, name in held} <= {"a", "b"} and overlaps == []


def test_the_timers_lock_is_taken_again_after_the_holder_committed(store_url: str) -> None:
    async def go() -> Any:
        a, b = open_store(store_url), open_store(store_url)
        await a.open()
        await b.open()
        try:
            first = await a.transact(lambda tx: tx.try_lock("timers"))
            return first, await b.transact(lambda tx: tx.try_lock("timers"))
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(go()) == (True, True)
