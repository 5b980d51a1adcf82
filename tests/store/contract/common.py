"""What the store's contract tests share: a store of each kind opened around a test's
coroutine, sample events and notifications, the router's write of a routed event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from receiver import events
from receiver.sessions import Fact
from receiver.store import Notification, Store, open_store
from receiver.store.base import Tx
from receiver.store.memory import MemoryStore

T = TypeVar("T")
MEMORY = "memory:"  # the backtest's scratch store (receiver.store.memory): the Tx roles only


def run(url: str, fn: Callable[[Any], Awaitable[T]], clock: float = 1000.0) -> T:
    """fn(store) on an open store of url (MEMORY: the in-memory one), closed after."""

    async def main() -> T:
        store: Any = MemoryStore(clock=lambda: clock) if url == MEMORY else None
        store = store or open_store(url, clock=lambda: clock)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def event(i: int | str, **fields: Any) -> tuple[events.BaseEvent, bytes]:
    """Event i; the same bytes each time (a redelivery), unless fields differ (a conflict)."""
    fields.setdefault("timestamp", "2026-01-01T00:00:00.000Z")
    e = events.validate(events.sample("score.drop", id=f"evt_{i}", **fields))
    return e, e.model_dump_json().encode()


def note(rule: str = "r", notifier: str = "console", target: int = 0) -> Notification:
    return Notification(rule=rule, notifier=notifier, target=target, title="t", body="b")


async def queue(store: Store, event_id: str, notes: list[Notification], now: float) -> int:
    """Mark event_id routed and queue notes for it, as the router does; rows written."""

    def work(tx: Tx) -> int:
        if not tx.events.mark_routed([event_id], now):
            return 0
        return len([tx.outbox.add(event_id, n, state="pending", now=now) for n in notes])

    return await store.transact(work)


# -- the session projection's events ---------------------------------------------------------


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


# -- upgrades ---------------------------------------------------------------------------------


def schema_before(conn: Any, migrations: list[Any], mark: str, text: str) -> None:
    """conn's database (sqlite3 or psycopg, whose placeholder is mark) at the schema before
    the first migration whose script holds text: every migration before it run, each
    recorded in schema_version, as a database of that release would be."""
    new = next(i for i, m in enumerate(migrations) if isinstance(m, str) and text in m)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    for version, script in enumerate(migrations[:new], start=1):
        if callable(script):
            script(conn)
        else:
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
        conn.execute(f"INSERT INTO schema_version VALUES ({mark})", (version,))
