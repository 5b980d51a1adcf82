"""Storage: one interface (base.Store, base.Tx), SQLite (embedded, the default) and PostgreSQL
(several replicas on one database) behind it."""

from __future__ import annotations

from typing import Any

from receiver.store.base import Notification, OutboxRow, Store, StoredEvent
from receiver.store.sqlite import SQLiteStore

__all__ = ["Notification", "OutboxRow", "SQLiteStore", "Store", "StoredEvent", "open_store"]


def open_store(url: str, **options: Any) -> Store:
    """The store for RECEIVER_DB: a file path (SQLite) or a postgresql:// URL."""
    if url.startswith(("postgres://", "postgresql://")):
        from receiver.store.postgres import PostgresStore

        options.pop("synchronous", None)  # SQLite's; PostgreSQL commits durably as configured
        return PostgresStore(url, **options)
    if url.startswith("sqlite:///"):
        url = url.removeprefix("sqlite:///")
    return SQLiteStore(url, **options)
