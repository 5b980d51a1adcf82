"""tx.inhibitors, the open sources of inhibition rules, on every store: add, find (oldest
first, up to limit, only that rule and key), add again (the newest episode, event and since),
remove (every row of the alert); databases from before the inhibitors table upgraded in
place."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import Inhibitor
from tests.store.contract.common import run, schema_before

KEY = '["s1"]'


def _inhibitor(
    alert: str = "intervention:s1:i1",
    since: float = 100.0,
    *,
    rule: str = "covers",
    key: str = KEY,
    episode: int = 1,
    event: str = "evt_1",
) -> Inhibitor:
    return Inhibitor(rule, key, alert, episode, event, since)


def _add(*found: Inhibitor) -> Any:
    def work(tx: Tx) -> None:
        for one in found:
            tx.inhibitors.add(one)

    return work


def test_find_is_oldest_first_up_to_limit(tx_url: str) -> None:
    rows = [_inhibitor(f"intervention:s1:i{n}", since, event=f"evt_{n}") for n, since in
            [(1, 300.0), (2, 100.0), (3, 200.0), (4, 400.0)]]  # fmt: skip

    async def go(store: Store) -> Any:
        await store.transact(_add(*rows))
        return await store.transact(
            lambda tx: (
                tx.inhibitors.find("covers", KEY),
                tx.inhibitors.find("covers", KEY, limit=2),
                tx.inhibitors.find("covers", KEY, limit=1),
            )
        )

    every, two, one = run(tx_url, go)
    assert every == [rows[1], rows[2], rows[0], rows[3]]
    assert two == [rows[1], rows[2]]
    assert one == [rows[1]]


def test_find_returns_only_that_rule_and_key(tx_url: str) -> None:
    mine = _inhibitor()
    others = [
        _inhibitor("intervention:s2:i1", 50.0, key='["s2"]'),
        _inhibitor("intervention:s1:i2", 60.0, rule="other"),
        _inhibitor("intervention:s1:i3", 70.0, key='["s1","u1"]'),
        _inhibitor("intervention:s1:i4", 80.0, key='["S1"]'),  # case matters
    ]

    async def go(store: Store) -> Any:
        await store.transact(_add(mine, *others))
        return await store.transact(
            lambda tx: (
                tx.inhibitors.find("covers", KEY),
                tx.inhibitors.find("other", KEY),
                tx.inhibitors.find("covers", '["s3"]'),
                tx.inhibitors.find("nobody", KEY),
            )
        )

    covers, other, nothing, unknown = run(tx_url, go)
    assert covers == [mine]
    assert other == [others[1]]
    assert nothing == [] and unknown == []


def test_one_alert_is_a_source_of_several_rules_and_keys(tx_url: str) -> None:
    """An alert whose opening event matches two rules' sources is a row of each."""
    first = _inhibitor()
    second = _inhibitor(rule="other", key='["u1"]')

    async def go(store: Store) -> Any:
        await store.transact(_add(first, second))
        return await store.transact(
            lambda tx: (tx.inhibitors.find("covers", KEY), tx.inhibitors.find("other", '["u1"]'))
        )

    assert run(tx_url, go) == ([first], [second])


def test_add_again_keeps_the_newest_episode_event_and_since(tx_url: str) -> None:
    first = _inhibitor(since=100.0, episode=1, event="evt_1")
    again = _inhibitor(since=500.0, episode=2, event="evt_9")
    earlier = _inhibitor("intervention:s1:i2", since=300.0, event="evt_5")

    async def go(store: Store) -> Any:
        await store.transact(_add(first, earlier))
        await store.transact(_add(again))
        return await store.transact(lambda tx: tx.inhibitors.find("covers", KEY))

    # One row for the alert, with the new values: ordered by its new since.
    assert run(tx_url, go) == [earlier, again]


def test_add_again_in_one_transaction_keeps_the_last(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_add(_inhibitor(since=1.0), _inhibitor(since=2.0, episode=2)))
        return await store.transact(lambda tx: tx.inhibitors.find("covers", KEY))

    assert run(tx_url, go) == [_inhibitor(since=2.0, episode=2)]


def test_remove_drops_every_row_of_the_alert_and_no_other(tx_url: str) -> None:
    alert = "intervention:s1:i1"
    gone = [_inhibitor(alert), _inhibitor(alert, rule="other"), _inhibitor(alert, key='["x"]')]
    kept = [_inhibitor("intervention:s1:i2", 200.0), _inhibitor("intervention:s1:i10", 300.0)]

    async def go(store: Store) -> Any:
        await store.transact(_add(*gone, *kept))
        await store.transact(lambda tx: tx.inhibitors.remove(alert))
        await store.transact(lambda tx: tx.inhibitors.remove("intervention:nobody"))  # no-op
        return await store.transact(
            lambda tx: (
                tx.inhibitors.find("covers", KEY),
                tx.inhibitors.find("other", KEY),
                tx.inhibitors.find("covers", '["x"]'),
            )
        )

    assert run(tx_url, go) == (kept, [], [])


def test_an_alert_removed_and_added_again_is_found_again(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(_add(_inhibitor()))
        await store.transact(lambda tx: tx.inhibitors.remove("intervention:s1:i1"))
        await store.transact(_add(_inhibitor(since=900.0, episode=2, event="evt_2")))
        return await store.transact(lambda tx: tx.inhibitors.find("covers", KEY))

    assert run(tx_url, go) == [_inhibitor(since=900.0, episode=2, event="evt_2")]


def test_a_savepoint_rolled_back_takes_its_rows_with_it(tx_url: str) -> None:
    """The router routes a batch in a savepoint and, when it fails, event by event: what
    the failed attempt added or removed must not stay."""

    class Boom(Exception):
        pass

    def work(tx: Tx) -> Any:
        tx.inhibitors.add(_inhibitor())
        try:
            with tx.savepoint():
                tx.inhibitors.add(_inhibitor("intervention:s1:i2", 200.0))
                tx.inhibitors.remove("intervention:s1:i1")
                raise Boom
        except Boom:
            pass
        return tx.inhibitors.find("covers", KEY)

    async def go(store: Store) -> Any:
        inside = await store.transact(work)
        return inside, await store.transact(lambda tx: tx.inhibitors.find("covers", KEY))

    inside, after = run(tx_url, go)
    assert inside == after == [_inhibitor()]


def test_rows_keep_every_field(tx_url: str) -> None:
    odd = Inhibitor(
        "rule.with-dots_1", '[{"a":1},"x y",null]', "intervention:s é:i", 7, "evt_ü", 1.5e9 + 0.25
    )

    async def go(store: Store) -> Any:
        await store.transact(_add(odd))
        return await store.transact(lambda tx: tx.inhibitors.find(odd.rule, odd.key))

    assert run(tx_url, go) == [odd]


# -- upgrades: a database from before inhibitors ----------------------------------------------


def _old_schema(conn: Any, migrations: list[Any], mark: str) -> None:
    """conn's database at the schema before inhibitors (the migrations before the one that
    makes the table), with an open intervention alert."""
    schema_before(conn, migrations, mark, "CREATE TABLE inhibitors")
    conn.execute(
        "INSERT INTO alerts (id, state, episode, opened_ts, opened_event, last_ts, updated_at)"
        " VALUES ('intervention:s1:i1', 'open', 1, 't1', 'evt_1', '2026-01-01T00:00:01Z', 10)"
    )


def _check_upgraded(url: str) -> None:
    async def after(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            tx.inhibitors.add(_inhibitor())
            return tx.alerts.get("intervention:s1:i1"), tx.inhibitors.find("covers", KEY)

        return await store.transact(work)

    alert, found = run(url, after)
    assert alert is not None and alert.state == "open"
    assert found == [_inhibitor()]


def test_the_inhibitors_migration_comes_after_escalations() -> None:
    """SQLite's 17 and PostgreSQL's 14, each the one after the escalations table's: the
    upgrade tests below start from the schema just before it."""
    from receiver.store.postgres import schema as postgres
    from receiver.store.sqlite import schema as sqlite

    for migrations, number in ((sqlite.MIGRATIONS, 17), (postgres.MIGRATIONS, 14)):
        script = migrations[number - 1]
        assert isinstance(script, str) and "CREATE TABLE inhibitors" in script
        before = migrations[number - 2]
        assert isinstance(before, str) and "CREATE TABLE escalations" in before


def test_a_sqlite_database_from_before_inhibitors_is_upgraded(tmp_path: Path) -> None:
    from receiver.store.sqlite.schema import MIGRATIONS

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        _old_schema(conn, MIGRATIONS, "?")
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (16,)
    _check_upgraded(str(db))
    versions = sqlite3.connect(db).execute("SELECT max(version) FROM schema_version").fetchone()
    assert versions == (len(MIGRATIONS),)


def test_a_postgres_database_from_before_inhibitors_is_upgraded(pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from receiver.store.postgres.schema import MIGRATIONS

    with psycopg.connect(pg_url) as conn, conn.transaction():
        _old_schema(conn, MIGRATIONS, "%s")
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (13,)
    _check_upgraded(pg_url)
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    assert version == (len(MIGRATIONS),)
