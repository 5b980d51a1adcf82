import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from receiver.errors import StorageUnavailableError
from receiver.store import SQLiteStore
from tests.store.contract.common import event

T = TypeVar("T")


def run(db: Path, fn: Callable[[SQLiteStore], Awaitable[T]], **options: Any) -> T:
    async def main() -> T:
        store = SQLiteStore(db, **options)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def test_rows_keep_columns_and_raw_body(tmp_path: Path) -> None:
    e, raw = event(1, context="checkout")
    run(tmp_path / "r.db", lambda s: s.events.accept(e, raw))
    row = (
        sqlite3.connect(tmp_path / "r.db")
        .execute(
            "SELECT id, type, session_id, user_id, score, threshold, body, routed_at FROM events"
        )
        .fetchone()
    )
    assert row == ("evt_1", "score.drop", "sess_demo", "user_42", 22, 40, raw.decode(), None)


def test_wal_full_sync_and_memory_temp_store_by_default(tmp_path: Path) -> None:
    async def go(store: SQLiteStore) -> tuple[Any, ...]:
        def pragmas(conn: sqlite3.Connection) -> tuple[Any, ...]:
            return tuple(
                conn.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("journal_mode", "synchronous", "temp_store")
            )

        return await store._call(pragmas, write=False)

    # 2 = FULL; temp_store 2 = MEMORY (savepoint journals never become temporary files)
    assert run(tmp_path / "r.db", go) == ("wal", 2, 2)
    assert run(tmp_path / "n.db", go, synchronous="normal") == ("wal", 1, 2)


def test_concurrent_accepts_share_commits_and_dedupe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = []
    real = SQLiteStore._cycle

    async def counting(self: SQLiteStore, jobs: list[Any]) -> None:
        batches.append(len(jobs))
        await real(self, jobs)

    monkeypatch.setattr(SQLiteStore, "_cycle", counting)

    async def go(store: SQLiteStore) -> list[str]:
        # 400 deliveries of 100 distinct ids, all in flight at once.
        return await asyncio.gather(*(store.events.accept(*event(i % 100)) for i in range(400)))

    results = run(tmp_path / "r.db", go)
    assert results.count("new") == 100 and results.count("duplicate") == 300
    assert sum(batches) == 400 and len(batches) < 400  # group commit: fewer commits than events
    count = sqlite3.connect(tmp_path / "r.db").execute("SELECT count(*) FROM events").fetchone()
    assert count == (100,)


def test_locked_database_is_unavailable_then_recovers(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    run(db, lambda s: s.check_writable())  # create it

    async def go(store: SQLiteStore) -> list[Any]:
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StorageUnavailableError, match="database is locked"):
            await store.events.accept(*event(1))
        with pytest.raises(StorageUnavailableError):
            await store.check_writable()
        locker.execute("ROLLBACK")
        locker.close()
        return [await store.events.accept(*event(1)), await store.events.accept(*event(1))]

    assert run(db, go, busy_timeout=0.2) == ["new", "duplicate"]


def test_a_failed_write_is_remembered_until_a_write_commits(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    run(db, lambda s: s.check_writable())  # create it

    async def go(store: SQLiteStore) -> list[str | None]:
        seen = [store.last_write_error]
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StorageUnavailableError):
            await store.events.accept(*event(1))
        seen.append(store.last_write_error)
        locker.execute("ROLLBACK")
        locker.close()
        # Reads, and writes that change nothing (nothing due, a duplicate), need no disk
        # space: they prove nothing, so the failure stays.
        await store.outbox.next_due()
        await store.outbox.claim_due(now=0, limit=10, lease=10)
        seen.append(store.last_write_error)
        await store.check_writable()  # a real write: it clears
        seen.append(store.last_write_error)
        return seen

    seen = run(db, go, busy_timeout=0.2)
    assert seen[0] is None and seen[3] is None
    assert seen[1] is not None and "locked" in seen[1] and seen[2] == seen[1]


def test_quarantine_keeps_the_bytes(tmp_path: Path) -> None:
    run(
        tmp_path / "r.db",
        lambda s: s.events.quarantine(
            b"\xff{", reason="invalid_json: x", client="127.0.0.1", event_id=None
        ),
    )
    row = (
        sqlite3.connect(tmp_path / "r.db")
        .execute("SELECT reason, client, body FROM quarantine")
        .fetchone()
    )
    assert row == ("invalid_json: x", "127.0.0.1", b"\xff{")
