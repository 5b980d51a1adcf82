"""Storage: one interface (base.Store), the embedded SQLite implementation behind it."""

from __future__ import annotations

from typing import Any

from receiver.errors import ConfigError
from receiver.store.base import Notification, OutboxRow, Store, StoredEvent
from receiver.store.sqlite import SQLiteStore

__all__ = ["Notification", "OutboxRow", "SQLiteStore", "Store", "StoredEvent", "open_store"]


def open_store(url: str, **options: Any) -> Store:
    """The store for RECEIVER_DB: a file path (SQLite) or, later, a postgresql:// URL."""
    if url.startswith(("postgres://", "postgresql://")):
        raise ConfigError(
            "RECEIVER_DB: the PostgreSQL store is not available in this version; "
            "use a SQLite file path"
        )
    if url.startswith("sqlite:///"):
        url = url.removeprefix("sqlite:///")
    return SQLiteStore(url, **options)
