"""Read a receiver's database from a test, whichever store it is (SQLite file or PostgreSQL).

Tests look at the rows the server wrote; the product itself reads only through
receiver.store. Placeholders are written `?` and adapted for PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any


def query(url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    if url.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.execute(sql.replace("?", "%s"), params)
            return [tuple(row) for row in cursor] if cursor.description else []
    with sqlite3.connect(url) as conn:
        return conn.execute(sql, params).fetchall()
