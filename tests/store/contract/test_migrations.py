"""One migration runner for both SQL stores (receiver/store/migrations.py): a database that a
newer program has migrated is refused with the same StoreError on SQLite and PostgreSQL, and
a clear message, not an outage to retry."""

from __future__ import annotations

import asyncio
import sqlite3

import psycopg
import pytest

from receiver.errors import StoreError
from receiver.store import open_store


def _newer(url: str) -> int:
    """Record one schema version past the newest this program knows; that version."""
    if url.startswith("postgresql://"):
        with psycopg.connect(url, autocommit=True) as conn:
            version = int(conn.execute("SELECT max(version) FROM schema_version").fetchone()[0])
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version + 1,))
            return version + 1
    conn = sqlite3.connect(url, isolation_level=None)
    try:
        version = int(conn.execute("SELECT max(version) FROM schema_version").fetchone()[0])
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version + 1,))
        return version + 1
    finally:
        conn.close()


def test_a_schema_newer_than_the_program_is_refused_with_a_store_error(store_url: str) -> None:
    async def open_and_close() -> int:
        store = open_store(store_url)
        await store.open()
        await store.close()
        return int(store.schema_version)

    known = asyncio.run(open_and_close())
    newer = _newer(store_url)
    with pytest.raises(StoreError) as refused:
        asyncio.run(open_and_close())
    message = str(refused.value)
    assert f"database schema version {newer} is newer than this program ({known})" in message
    assert "upgrade attention-receiver" in message
    assert "retry later" not in message and "storage unavailable" not in message
