"""The migration runner both SQL stores share: a schema's scripts applied in order from the
version a database is at, each version recorded as it lands. Each store brings its own
numbered list (sqlite/schema.py, postgres/schema.py) and its own lock around the run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from receiver.errors import StoreError

# A migration: statements separated by ";", or a function of the connection for what SQL
# alone cannot say (a backfill).
Migration = str | Callable[[Any], None]


def too_new(current: int, known: int) -> StoreError:
    """The refusal for a database a newer program has migrated: this one does not know its
    tables, so it must not write to them."""
    return StoreError(
        f"database schema version {current} is newer than this program ({known}); "
        "upgrade attention-receiver"
    )


def apply(conn: Any, migrations: Sequence[Migration], current: int, record: str) -> int:
    """Apply migrations[current:] on conn, inserting each version with record (an INSERT
    INTO schema_version with one placeholder in the store's style); the version reached.
    The caller holds the transaction and the lock that make the run happen once."""
    if current > len(migrations):
        raise too_new(current, len(migrations))
    for version, script in enumerate(migrations[current:], start=current + 1):
        if callable(script):
            script(conn)
        else:
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
        conn.execute(record, (version,))
    return len(migrations)
