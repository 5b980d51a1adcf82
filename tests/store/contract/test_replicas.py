"""Several replicas on one PostgreSQL database behave as one store: disjoint batches and
claims, one timer holder, one throttle window."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from receiver.store import open_store
from receiver.store.base import Tx
from tests.store.contract.common import event, note, queue


def test_two_replicas_route_disjoint_batches_and_claim_disjoint_rows(pg_url: str) -> None:
    async def go() -> Any:
        a, b = open_store(pg_url, clock=lambda: 100.0), open_store(pg_url, clock=lambda: 100.0)
        await a.open()
        await b.open()
        try:
            for i in range(20):
                await (a if i % 2 else b).events.accept(*event(i))
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
                a.outbox.claim_due(now=100.0, limit=15, lease=30),
                b.outbox.claim_due(now=100.0, limit=15, lease=30),
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
