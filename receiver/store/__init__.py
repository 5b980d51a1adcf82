"""Storage: one interface by role (base.Store, base.Tx; the roles in roles.py and base.py),
SQLite (embedded, the default) and PostgreSQL (several replicas on one database) behind it,
and the backtest's store in memory (scratch())."""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from receiver.store.base import Notification, OutboxRow, ScratchTx, Store, StoredEvent
from receiver.store.memory import MemoryTx
from receiver.store.memory_tables import Row as ScratchRow
from receiver.store.sqlite import SQLiteStore
from receiver.store.statements import RetryTransaction

__all__ = [
    "MemoryTx",
    "Notification",
    "OutboxRow",
    "RetryTransaction",
    "SQLiteStore",
    "ScratchRow",
    "ScratchTx",
    "Store",
    "StoredEvent",
    "open_store",
    "scratch",
    "systemic",
]


def open_store(url: str, **options: Any) -> Store:
    """The store for RECEIVER_DB: a file path (SQLite) or a postgresql:// URL.

    Options a store does not have are dropped: `synchronous` is SQLite's,
    `prepare_threshold` PostgreSQL's (psycopg's; None never prepares statements).
    """
    if url.startswith(("postgres://", "postgresql://")):
        from receiver.store.postgres import PostgresStore

        options.pop("synchronous", None)  # SQLite's; PostgreSQL commits durably as configured
        return PostgresStore(url, **options)
    options.pop("prepare_threshold", None)  # psycopg's (RECEIVER_DB_PREPARE_THRESHOLD)
    if url.startswith("sqlite:///"):
        url = url.removeprefix("sqlite:///")
    return SQLiteStore(url, **options)


def scratch() -> ScratchTx:
    """An empty routing transaction in memory that nothing else sees (`receiver backtest`):
    the Tx contract and tx.scratch (base.Scratch), kept lean (rows that can no longer change
    leave memory)."""
    return MemoryTx(lean=True)


def systemic(exc: BaseException) -> bool:
    """Whether a database error raised while routing is the database's fault, not the
    event's: a missing privilege or table, a broken prepared statement or connection, a
    locked or full disk. Routing then stops for the supervisor to retry, instead of
    setting events aside one by one. Bad data (a value the column refuses, a broken
    constraint) is the event's: False, as for anything that is not a database error. A
    transaction the store runs again (RetryTransaction: a lock needed out of order) is
    systemic too: it must reach the store untouched."""
    if isinstance(exc, RetryTransaction):
        return True
    if isinstance(exc, sqlite3.Error):
        return not isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError)
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(exc, psycopg.Error):
        return not isinstance(exc, psycopg.IntegrityError | psycopg.DataError)
    return False
