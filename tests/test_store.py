import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from receiver import events
from receiver.errors import StorageUnavailableError
from receiver.store import Notification, SQLiteStore
from receiver.store.schema import MIGRATIONS

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


def event(i: int | str, **fields: Any) -> tuple[events._Event, bytes]:
    e = events.validate(events.sample("score.drop", id=f"evt_{i}", **fields))
    return e, e.model_dump_json().encode()


def test_accept_is_new_then_duplicate(tmp_path: Path) -> None:
    async def go(store: SQLiteStore) -> list[bool]:
        return [await store.accept(*event(1)), await store.accept(*event(1))]

    assert run(tmp_path / "r.db", go) == [True, False]


def test_rows_keep_columns_and_raw_body(tmp_path: Path) -> None:
    e, raw = event(1, context="checkout")
    run(tmp_path / "r.db", lambda s: s.accept(e, raw))
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


def test_a_version_2_database_keeps_its_events_and_drops_the_session_index(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    for version, script in enumerate(MIGRATIONS[:2], start=1):
        for statement in filter(str.strip, script.split(";")):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", [version])
    conn.execute(
        "INSERT INTO events (id, type, session_id, event_ts, received_at, body)"
        " VALUES ('evt_old', 'score.drop', 'sess_1', '2026-01-01T00:00:00Z', 1.0, '{}')"
    )
    conn.close()

    run(db, lambda s: s.accept(*event(1)))
    conn = sqlite3.connect(db)
    ids = [row[0] for row in conn.execute("SELECT id FROM events ORDER BY rowid")]
    indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert ids == ["evt_old", "evt_1"]
    assert "events_session" not in indexes and "events_unrouted" in indexes


def test_concurrent_accepts_share_commits_and_dedupe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = []
    real = SQLiteStore._cycle

    async def counting(self: SQLiteStore, jobs: list[Any]) -> None:
        batches.append(len(jobs))
        await real(self, jobs)

    monkeypatch.setattr(SQLiteStore, "_cycle", counting)

    async def go(store: SQLiteStore) -> list[bool]:
        # 400 deliveries of 100 distinct ids, all in flight at once.
        return await asyncio.gather(*(store.accept(*event(i % 100)) for i in range(400)))

    results = run(tmp_path / "r.db", go)
    assert sum(results) == 100
    assert sum(batches) == 400 and len(batches) < 400  # group commit: fewer commits than events
    count = sqlite3.connect(tmp_path / "r.db").execute("SELECT count(*) FROM events").fetchone()
    assert count == (100,)


def test_schema_is_versioned_and_reopening_does_not_migrate_again(tmp_path: Path) -> None:
    run(tmp_path / "r.db", lambda s: s.accept(*event(1)))
    run(tmp_path / "r.db", lambda s: s.check_writable())
    versions = (
        sqlite3.connect(tmp_path / "r.db").execute("SELECT version FROM schema_version").fetchall()
    )
    assert versions == [(v,) for v in range(1, len(MIGRATIONS) + 1)]


def test_ids_stay_duplicates_after_reopening(tmp_path: Path) -> None:
    run(tmp_path / "r.db", lambda s: s.accept(*event(1)))
    assert run(tmp_path / "r.db", lambda s: s.accept(*event(1))) is False


def test_locked_database_is_unavailable_then_recovers(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    run(db, lambda s: s.check_writable())  # create it

    async def go(store: SQLiteStore) -> list[Any]:
        locker = sqlite3.connect(db, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StorageUnavailableError, match="database is locked"):
            await store.accept(*event(1))
        with pytest.raises(StorageUnavailableError):
            await store.check_writable()
        locker.execute("ROLLBACK")
        locker.close()
        return [await store.accept(*event(1)), await store.accept(*event(1))]

    assert run(db, go, busy_timeout=0.2) == [True, False]


def test_quarantine_keeps_the_bytes(tmp_path: Path) -> None:
    run(
        tmp_path / "r.db",
        lambda s: s.quarantine(
            b"\xff{", reason="invalid_json: x", client="127.0.0.1", event_id=None
        ),
    )
    row = (
        sqlite3.connect(tmp_path / "r.db")
        .execute("SELECT reason, client, body FROM quarantine")
        .fetchone()
    )
    assert row == ("invalid_json: x", "127.0.0.1", b"\xff{")


def note(rule: str = "r", **fields: Any) -> Notification:
    return Notification(rule=rule, notifier="console", target=0, title="t", body="b", **fields)


async def queue(store: SQLiteStore, event_id: str, notes: list[Notification], now: float) -> int:
    """Mark event_id routed and queue notes for it, as the router does; rows written."""

    def work(tx: Any) -> int:
        if not tx.mark_routed([event_id], now):
            return 0
        return len([tx.add(event_id, n, state="pending", now=now) for n in notes])

    return await store.transact(work)


def test_route_writes_outbox_once_and_marks_routed(tmp_path: Path) -> None:
    async def go(store: SQLiteStore) -> Any:
        await store.accept(*event(1))
        [pending] = await store.transact(lambda tx: tx.unrouted(10))
        first = await queue(store, pending.id, [note(), note("s")], now=100.0)
        again = await queue(store, pending.id, [note()], now=101.0)  # a racing second pass
        return (
            first,
            again,
            await store.transact(lambda tx: tx.unrouted(10)),
            await store.deliveries(),
        )

    first, again, unrouted, rows = run(tmp_path / "r.db", go)
    assert first == 2 and again == 0 and unrouted == []
    assert [(r.rule, r.state) for r in rows] == [("s", "pending"), ("r", "pending")]


def test_claim_lease_retry_and_dead(tmp_path: Path) -> None:
    async def go(store: SQLiteStore) -> None:
        await store.accept(*event(1))
        await queue(store, "evt_1", [note()], now=100.0)
        [row] = await store.claim_due(now=100.0, limit=5, lease=30)
        assert row.state == "sending" and row.attempts == 1
        assert await store.claim_due(now=110.0, limit=5, lease=30) == []  # leased
        [again] = await store.claim_due(
            now=131.0, limit=5, lease=30
        )  # lease ran out: at least once
        assert again.attempts == 2
        await store.mark_failed(row.id, error="down", now=131.0, retry_at=200.0)
        assert await store.next_due() == 200.0
        assert await store.claim_due(now=150.0, limit=5, lease=30) == []
        [third] = await store.claim_due(now=200.0, limit=5, lease=30)
        await store.mark_failed(third.id, error="still down", now=201.0, retry_at=None)
        [dead] = await store.deliveries(state="dead")
        assert dead.last_error == "still down"
        assert await store.retry_dead(None, now=300.0) == 1
        [fourth] = await store.claim_due(now=300.0, limit=5, lease=30)
        await store.mark_delivered(fourth.id, now=301.0)
        assert (await store.deliveries())[0].state == "delivered"
        assert await store.next_due() is None

    run(tmp_path / "r.db", go)


def test_replay_routes_a_stored_event_again(tmp_path: Path) -> None:
    async def go(store: SQLiteStore) -> Any:
        await store.accept(*event(1))
        await queue(store, "evt_1", [note()], now=1.0)
        return (
            await store.replay("evt_1"),
            await store.replay("nope"),
            await store.transact(lambda tx: tx.unrouted(5)),
        )

    replayed, missing, unrouted = run(tmp_path / "r.db", go)
    assert replayed is True and missing is False and [e.id for e in unrouted] == ["evt_1"]


def test_processes_opening_a_new_file_together_migrate_it_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    db = tmp_path / "new.db"
    script = (
        "import asyncio, sys; from receiver.store import SQLiteStore\n"
        "async def main():\n"
        "    s = SQLiteStore(sys.argv[1], busy_timeout=10); await s.open(); await s.close()\n"
        "asyncio.run(main())\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(db)], stderr=subprocess.PIPE)
        for _ in range(8)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
    versions = sqlite3.connect(db).execute("SELECT version FROM schema_version").fetchall()
    assert versions == [(v,) for v in range(1, len(MIGRATIONS) + 1)]
