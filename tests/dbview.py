"""Read a receiver's database from a test, whichever store it is (SQLite file or PostgreSQL).

Tests look at the rows the server wrote; the product itself reads only through
receiver.store. Placeholders are written `?` and adapted for PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

# One connection a PostgreSQL database, kept: a test polling rows every few milliseconds
# would otherwise start a server process (a backend) for each look.
_kept: dict[str, Any] = {}
_lock = threading.Lock()


def query(url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    if url.startswith(("postgresql://", "postgres://")):
        with _lock:
            return _postgres(url, sql.replace("?", "%s"), params)
    with sqlite3.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def _postgres(url: str, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """On the kept connection; on a new one if that one is gone (a restarted server, a
    test that killed it), once."""
    import psycopg

    for fresh in (False, True):
        conn = _kept.get(url)
        if conn is None or conn.closed or fresh:
            if conn is not None:
                conn.close()
            # No prepared statements: a PgBouncer in transaction mode may be in between.
            conn = _kept[url] = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        try:
            cursor = conn.execute(sql, params)
            return [tuple(row) for row in cursor] if cursor.description else []
        except psycopg.OperationalError:
            if fresh:
                raise
    raise AssertionError("unreachable")


def forget(url: str) -> None:
    """Close the kept connection to url's database (before it is dropped)."""
    with _lock:
        conn = _kept.pop(url, None)
    if conn is not None:
        conn.close()


def forget_all() -> None:
    """Close every kept connection (the session's end)."""
    for url in list(_kept):
        forget(url)
