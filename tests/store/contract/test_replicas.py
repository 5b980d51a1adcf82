"""Several replicas on one PostgreSQL database behave as one store: disjoint batches and
claims, one timer holder, one throttle window."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from receiver.store import open_store
from receiver.store.base import Tx
from receiver.store.records import Alert
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


def _waiting_for_a_lock(tx: Tx) -> bool:
    """Whether some transaction waits for an advisory lock now."""
    tx_conn = tx.conn  # type: ignore[attr-defined]
    row = tx_conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    ).fetchone()
    return bool(row[0])


def test_alert_locks_taken_out_of_order_do_not_deadlock(pg_url: str) -> None:
    # The timers' transaction locks the alert of a due repeat ("b"), then the alerts of
    # the due escalations ("a", "b"), while a routing batch locks its alerts at once, in
    # order ("a", then "b"): each holds what the other waits for. Here in that order, step
    # by step: the second must not wait for "a" while it holds "b" (PostgreSQL would break
    # the circle after deadlock_timeout, failing one of them with "deadlock detected").
    async def go() -> Any:
        a, b = open_store(pg_url), open_store(pg_url)
        await a.open()
        await b.open()
        holds_b, runs = threading.Event(), []

        def timers(tx: Tx) -> list[str | None]:
            runs.append(1)
            first = tx.alerts.get("alert:b")
            if len(runs) == 1:  # the first run: wait until the batch waits for "b"
                holds_b.set()
                deadline = time.monotonic() + 30
                while not _waiting_for_a_lock(tx):
                    assert time.monotonic() < deadline, "the batch never waited for alert:b"
                    time.sleep(0.01)
            second = tx.alerts.get("alert:a")
            return [None if x is None else x.id for x in (first, second)]

        def batch(tx: Tx) -> str:
            assert holds_b.wait(30)
            tx.alerts.read_ahead(["alert:a", "alert:b"])  # "a" at once, then waits for "b"
            tx.alerts.save(Alert("alert:a", "open", 1, "2026-01-01T00:00:00Z"), 100.0)
            tx.alerts.flush()
            return "routed"

        try:
            return await asyncio.gather(a.transact(timers), b.transact(batch)), len(runs)
        finally:
            await a.close()
            await b.close()

    (timers, batch), runs = asyncio.run(go())
    # The batch went first; the timers ran again with both alerts locked first, and saw it.
    assert batch == "routed"
    assert timers == [None, "alert:a"]
    assert runs == 2
