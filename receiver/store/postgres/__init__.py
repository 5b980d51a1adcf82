"""The PostgreSQL store: several replicas on one database (see store.py)."""

from receiver.store.postgres.schema import MIGRATIONS, migrate
from receiver.store.postgres.store import PostgresStore
from receiver.store.postgres.tx import PostgresTx

__all__ = ["MIGRATIONS", "PostgresStore", "PostgresTx", "migrate"]
