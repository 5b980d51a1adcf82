"""tests/pg.py's databases at the newest schema: one a test had is emptied for the next (its
rows gone, its ids from 1 again), unless the test changed its shape or left a session on
it; then it is dropped, and the next test gets a fresh copy of the template."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.pg import ThrowawayPostgres

ROW = "INSERT INTO quarantine (received_at, reason, body) VALUES (1, 'x', '') RETURNING id"


def _exists(postgres: ThrowawayPostgres, url: str) -> bool:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(postgres.admin_url) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        return found.fetchone() is not None


def test_a_database_is_emptied_for_the_next_test(postgres: ThrowawayPostgres) -> None:
    url = postgres.create_database(migrated=True)
    with psycopg.connect(url) as conn:
        assert [conn.execute(ROW).fetchone() for _ in range(3)] == [(1,), (2,), (3,)]
    postgres.drop_database(url)
    again = postgres.create_database(migrated=True)
    try:
        assert again == url
        with psycopg.connect(again) as conn:
            assert conn.execute("SELECT count(*) FROM quarantine").fetchone() == (0,)
            assert conn.execute(ROW).fetchone() == (1,)
            versions = conn.execute("SELECT count(*) FROM schema_version").fetchone()
            assert versions is not None and versions[0] > 0  # still at the newest schema
    finally:
        postgres.drop_database(again)


def _add_column(conn: psycopg.Connection) -> None:
    conn.execute("ALTER TABLE quarantine ADD COLUMN extra TEXT")


def _newer_version(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO schema_version SELECT max(version) + 1 FROM schema_version")


def _rename_table(conn: psycopg.Connection) -> None:
    conn.execute("ALTER TABLE alerts RENAME TO alerts_away")


@pytest.mark.parametrize(
    "change",
    [_add_column, _newer_version, _rename_table],
    ids=["a-column", "a-newer-version", "a-renamed-table"],
)
def test_a_database_whose_shape_changed_is_dropped(
    postgres: ThrowawayPostgres, change: Callable[[psycopg.Connection], None]
) -> None:
    url = postgres.create_database(migrated=True)
    with psycopg.connect(url) as conn:
        change(conn)
    postgres.drop_database(url)
    assert not _exists(postgres, url)
    fresh = postgres.create_database(migrated=True)
    try:
        assert fresh != url
    finally:
        postgres.drop_database(fresh)


def test_a_database_with_a_session_left_on_it_is_dropped(postgres: ThrowawayPostgres) -> None:
    url = postgres.create_database(migrated=True)
    with psycopg.connect(url, autocommit=True) as left:
        left.execute("SELECT 1")
        postgres.drop_database(url)  # ends the session, as DROP DATABASE WITH (FORCE) does
    assert not _exists(postgres, url)
