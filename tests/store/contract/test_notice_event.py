"""tx.notices keeps the event whose notification a suppressed notice holds (the woken
notification is filed under it, receiver.dispatch.escalations): the first note's event
stands, and it is gone once the notice wakes or is notified. Databases from before the
column are upgraded in place, their waiting notices without an event."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import run, schema_before


def test_a_suppressed_notice_keeps_its_event_until_it_wakes(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            n = tx.notices
            n.suppress("a", 1, "r", 100.0, "silenced", event="evt_2")
            n.suppress("a", 1, "r", 150.0, "muted", event="evt_3")  # the first note stands
            n.suppress("a", 1, "q", 120.0, "muted", event="evt_4")
            n.suppress("b", 1, "r", 130.0, "silenced")  # no event said: none kept
            waiting = [(x.alert, x.rule, x.suppressed_event) for x in n.suppressed(None)]
            of = [(x.rule, x.suppressed_event) for x in sorted(n.of("a", 1), key=lambda x: x.rule)]
            [first, *_] = n.suppressed(None)
            n.woke(first, 300.0, 60.0)
            n.add("a", 1, "q", 310.0, None)  # notified otherwise: no longer waiting
            after = [(x.rule, x.suppressed_event) for x in n.of("a", 1)]
            return waiting, of, sorted(after), n.suppressed(None)

        return await store.transact(work)

    waiting, of, after, left = run(tx_url, go)
    assert waiting == [("a", "r", "evt_2"), ("a", "q", "evt_4"), ("b", "r", None)]
    assert of == [("q", "evt_4"), ("r", "evt_2")]
    assert after == [("q", None), ("r", None)]
    assert [(x.alert, x.suppressed_event) for x in left] == [("b", None)]


# -- upgrades: a database from before the column ----------------------------------------------


def _before_column(conn: Any, migrations: list[Any], mark: str) -> None:
    """conn's database at the schema before the notices' suppressed_event, with a notice
    waiting for its silence to end."""
    schema_before(conn, migrations, mark, "suppressed_event")
    conn.execute(
        "INSERT INTO notices (alert, episode, rule, notified_at, suppressed_since, suppressed_why)"
        " VALUES ('a', 1, 'r', 10, 10, 'silenced')"
    )


def _check_upgraded(url: str) -> None:
    async def after(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            tx.notices.suppress("b", 1, "r", 20.0, "muted", event="evt_9")
            return [
                (x.alert, x.suppressed_why, x.suppressed_event) for x in tx.notices.suppressed(None)
            ]

        return await store.transact(work)

    assert run(url, after) == [("a", "silenced", None), ("b", "muted", "evt_9")]


def test_a_sqlite_database_from_before_the_notice_event_is_upgraded(tmp_path: Path) -> None:
    from receiver.store.sqlite.schema import MIGRATIONS

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        _before_column(conn, MIGRATIONS, "?")
    _check_upgraded(str(db))
    versions = sqlite3.connect(db).execute("SELECT max(version) FROM schema_version").fetchone()
    assert versions == (len(MIGRATIONS),)


def test_a_postgres_database_from_before_the_notice_event_is_upgraded(pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from receiver.store.postgres.schema import MIGRATIONS

    with psycopg.connect(pg_url) as conn, conn.transaction():
        _before_column(conn, MIGRATIONS, "%s")
    _check_upgraded(pg_url)
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    assert version == (len(MIGRATIONS),)
