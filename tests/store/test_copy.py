"""What `receiver db copy` moves (receiver.store.copy): every column of every table of the
SQLite schema, but for the few it leaves behind on purpose."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from receiver.store.copy import TABLES
from tests.cli.test_db import run

# Tables `receiver db copy` leaves behind on purpose: per-minute request counts and the
# upstream's request budget start afresh, and each store keeps its own schema version.
NOT_COPIED = {"schema_version", "rate_hits", "session_hours", "upstream_budget"}


def test_copy_names_every_column_of_every_table_it_should_move(tmp_path: Path) -> None:
    """A migration that adds a table or a column must add it to the copy too: escalation
    chains, inhibitors, storm windows and trace contexts were once left behind."""
    source = str(tmp_path / "receiver.db")
    run(source, lambda store: asyncio.sleep(0))
    with sqlite3.connect(source) as conn:
        tables = {
            name: {row[1] for row in conn.execute(f"PRAGMA table_info({name})")}
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        }
    assert {name for name in tables if name not in NOT_COPIED} == set(TABLES)
    assert {name: set(columns) for name, columns in TABLES.items()} == {
        name: tables[name] for name in TABLES
    }
