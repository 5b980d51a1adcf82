"""The SQLite schema and its migrations (receiver.store.sqlite.schema): a file of an older
version keeps its rows, a migrated file is not migrated again, and processes opening a new
file together migrate it once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from receiver.store.sqlite.schema import MIGRATIONS
from tests.store.contract.common import event
from tests.store.test_store import run


def test_a_version_2_database_keeps_its_events_and_drops_the_session_index(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
    for version, script in enumerate(MIGRATIONS[:2], start=1):
        for statement in filter(str.strip, script.split(";")):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", [version])
    conn.execute(
        "INSERT INTO events (id, type, session_id, event_ts, received_at, body)"
        " VALUES ('evt_old', 'score.drop', 'sess_1', '2026-01-01T00:00:00Z', 1.0, '{}')"
    )
    conn.close()

    run(db, lambda s: s.events.accept(*event(1)))
    conn = sqlite3.connect(db)
    ids = [row[0] for row in conn.execute("SELECT id FROM events ORDER BY rowid")]
    indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert ids == ["evt_old", "evt_1"]
    assert "events_session" not in indexes and "events_unrouted" in indexes


def test_schema_is_versioned_and_reopening_does_not_migrate_again(tmp_path: Path) -> None:
    run(tmp_path / "r.db", lambda s: s.events.accept(*event(1)))
    run(tmp_path / "r.db", lambda s: s.check_writable())
    versions = (
        sqlite3.connect(tmp_path / "r.db").execute("SELECT version FROM schema_version").fetchall()
    )
    assert versions == [(v,) for v in range(1, len(MIGRATIONS) + 1)]


def test_processes_opening_a_new_file_together_migrate_it_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    db = tmp_path / "new.db"
    script = (
        "import asyncio, sys; from receiver.store import SQLiteStore\n"
        "async def main():\n"
        "    s = SQLiteStore(sys.argv[1], busy_timeout=10); await s.open(); await s.close()\n"
        "asyncio.run(main())\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(db)], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    try:
        errors = [proc.communicate(timeout=60)[1].decode() for proc in procs]
    finally:
        for proc in procs:
            with proc:  # on the way out: closes its pipe, waits for it
                if proc.poll() is None:
                    proc.kill()
    for proc, err in zip(procs, errors, strict=True):
        assert proc.returncode == 0, err
    versions = sqlite3.connect(db).execute("SELECT version FROM schema_version").fetchall()
    assert versions == [(v,) for v in range(1, len(MIGRATIONS) + 1)]
