"""The embedded store: one SQLite file (see store.py)."""

from receiver.store.sqlite.schema import MIGRATIONS, migrate
from receiver.store.sqlite.store import SQLiteStore
from receiver.store.sqlite.tx import SQLiteTx

__all__ = ["MIGRATIONS", "SQLiteStore", "SQLiteTx", "migrate"]
