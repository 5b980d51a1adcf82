"""Storage: one interface (base.Store, base.Tx), SQLite (embedded, the default) and PostgreSQL
(several replicas on one database) behind it."""

from __future__ import annotations

from typing import Any

from receiver.store.base import Notification, OutboxRow, Store, StoredEvent
from receiver.store.memory import MemoryTx
from receiver.store.memory import Row as ScratchRow
from receiver.store.sqlite import SQLiteStore

__all__ = [
    "MemoryTx",
    "Notification",
    "OutboxRow",
    "SQLiteStore",
    "ScratchRow",
    "Store",
    "StoredEvent",
    "open_store",
    "scratch",
]


def open_store(url: str, **options: Any) -> Store:
    """The store for RECEIVER_DB: a file path (SQLite) or a postgresql:// URL."""
    if url.startswith(("postgres://", "postgresql://")):
        from receiver.store.postgres import PostgresStore

        options.pop("synchronous", None)  # SQLite's; PostgreSQL commits durably as configured
        return PostgresStore(url, **options)
    if url.startswith("sqlite:///"):
        url = url.removeprefix("sqlite:///")
    return SQLiteStore(url, **options)


def scratch() -> MemoryTx:
    """An empty routing transaction in memory that nothing else sees (`receiver backtest`):
    the Tx contract, kept lean (rows that can no longer change leave memory)."""
    return MemoryTx(lean=True)
