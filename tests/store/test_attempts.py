"""The outbox's attempt log and subscriber deliveries' own columns, on SQLite and PostgreSQL
alike: every attempt recorded with the row's outcome, the last one's status kept on the row,
logs pruned with their rows, and databases from before the log upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import WEBHOOK_NOTIFIER, Attempt, subscriber_delivery
from tests.store.contract.common import event, note, queue, run, schema_before


async def _subscriber_row(store: Store, event_no: int = 1) -> tuple[int, int]:
    """A subscription and one delivery of event_no to it, as routing queues them; their ids."""
    hook = await store.webhooks.add(
        public_id=f"wh_{event_no}",
        url="https://hooks.example.com/in",
        events=["score.drop"],
        threshold=None,
        format="service",
        secret="s",
        now=1.0,
    )
    assert hook is not None
    await store.events.accept(*event(event_no))
    delivery = subscriber_delivery(hook.id, f"evt_{event_no}", "{}")

    def work(tx: Tx) -> None:
        tx.events.mark_routed([f"evt_{event_no}"], 1.0)
        tx.outbox.add_many(
            [(f"evt_{event_no}", delivery)], state="pending", now=1.0, kind="webhook"
        )

    await store.transact(work)
    (row,) = await store.webhooks.deliveries(hook.id, limit=5)
    return hook.id, row.id


def test_each_attempt_is_logged_and_the_last_status_kept(store_url: str) -> None:
    async def go(store: Store) -> Any:
        hook, row_id = await _subscriber_row(store)
        (claimed,) = await store.outbox.claim_due(now=2.0, limit=5, lease=30)
        failed = Attempt(2.0, 120, 503, "HTTP 503 Service Unavailable", excerpt="busy")
        await store.outbox.mark_failed(
            row_id, error="HTTP 503", now=2.1, retry_at=3.0, attempt=failed
        )
        pending = await store.webhooks.delivery(hook, row_id)
        await store.outbox.claim_due(now=3.0, limit=5, lease=30)
        await store.outbox.mark_delivered(row_id, now=3.1, attempt=Attempt(3.0, 40, 200))
        delivered = await store.webhooks.delivery(hook, row_id)
        # A manual retry counts the row's attempts afresh; the log goes on numbering.
        await store.webhooks.retry_delivery(hook, row_id, now=4.0)
        await store.outbox.claim_due(now=4.0, limit=5, lease=30)
        await store.outbox.mark_delivered(row_id, now=4.1, attempt=Attempt(4.0, 30, 204))
        return claimed, pending, delivered, await store.outbox.attempts([row_id, 999])

    claimed, pending, delivered, logs = run(store_url, go)
    assert claimed.delivery_id == "evt_1" and claimed.title == ""
    assert claimed.subscription_id == claimed.target
    assert (pending.state, pending.last_status, pending.last_error) == ("pending", 503, "HTTP 503")
    assert (delivered.state, delivered.last_status, delivered.last_error) == (
        "delivered",
        200,
        None,
    )
    (log,) = logs.values()
    assert [(a.number, a.at, a.duration_ms, a.status, a.error, a.excerpt) for a in log] == [
        (1, 2.0, 120, 503, "HTTP 503 Service Unavailable", "busy"),
        (2, 3.0, 40, 200, None, None),
        (3, 4.0, 30, 204, None, None),
    ]


def test_a_delivery_belongs_to_its_subscription_only(store_url: str) -> None:
    async def go(store: Store) -> Any:
        hook, row_id = await _subscriber_row(store, 1)
        other, _ = await _subscriber_row(store, 2)
        return (
            await store.webhooks.delivery(hook, row_id),
            await store.webhooks.delivery(other, row_id),
            await store.webhooks.delivery(hook, row_id + 100),
        )

    mine, others, missing = run(store_url, go)
    assert mine is not None and mine.delivery_id == "evt_1"
    assert others is None and missing is None


def test_notifications_of_every_channel_keep_a_log(store_url: str) -> None:
    """Chat and email notifications are logged as deliveries are; a status is optional."""

    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))
        await queue(store, "evt_1", [note(notifier="oncall")], now=1.0)
        (row,) = await store.outbox.claim_due(now=1.0, limit=5, lease=30)
        failed = Attempt(1.0, 5, None, "oncall[0]: json target timed out after 1s")
        await store.outbox.mark_failed(
            row.id, error="timed out", now=1.5, retry_at=None, attempt=failed
        )
        return (await store.outbox.deliveries())[0], await store.outbox.attempts([row.id])

    row, logs = run(store_url, go)
    assert row.state == "dead" and row.last_status is None
    assert [(a.number, a.error) for a in logs[row.id]] == [
        (1, "oncall[0]: json target timed out after 1s")
    ]


def test_prune_takes_the_attempt_logs_with_their_rows(store_url: str) -> None:
    async def go(store: Store) -> Any:
        ids = []
        for i in (1, 2):
            await store.events.accept(*event(i))
            await queue(store, f"evt_{i}", [note()], now=1.0)
        for row in await store.outbox.claim_due(now=1.0, limit=5, lease=30):
            ids.append(row.id)
            retry = None if row.event_id == "evt_1" else 5000.0
            await store.outbox.mark_failed(
                row.id, error="e", now=2.0, retry_at=retry, attempt=Attempt(1.0, 3, 500, "e")
            )
        pruned = await store.events.prune(before=3000.0, limit=100)
        return ids, pruned, await store.outbox.attempts(ids)

    (dead, waiting), pruned, logs = run(store_url, go, clock=3000.0)
    assert pruned["outbox"] == 1
    assert list(logs) == [waiting]  # the dead row's log went with it; the waiting one's stays


# -- upgrades: rows from before the attempt log ----------------------------------------------


def _old_rows(execute: Any, mark: str) -> None:
    """A subscription, a failed delivery with its id in title (the old form), and a rule's
    notification, written as the schema before the attempt log held them."""
    execute(
        "INSERT INTO webhooks (id, public_id, url, events, format, secret, status, created_at,"
        " updated_at) VALUES (7, 'wh_old', 'https://h.example/in', '[]', 'service', 's',"
        " 'active', 1, 1)"
    )
    for kind, notifier, target, title, error in (
        ("webhook", WEBHOOK_NOTIFIER, 7, "evt_1", "HTTP 503 Service Unavailable: busy"),
        ("event", "oncall", 0, "Attention dropped", "oncall[0]: json target answered HTTP 500"),
    ):
        execute(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state,"
            " attempts, next_at, last_error, created_at, updated_at, kind) VALUES"
            f" ('evt_1', 'r', {mark}, {mark}, {mark}, '{{}}', 'pending', 1, 1, {mark}, 1, 1,"
            f" {mark})",
            (notifier, target, title, error, kind),
        )


def _check_upgraded(store_url: str) -> None:
    async def after(store: Store) -> Any:
        delivery = await store.webhooks.delivery(7, 1)
        return delivery, (await store.outbox.deliveries())[0], await store.outbox.attempts([1, 2])

    delivery, notification, logs = run(store_url, after)
    assert delivery is not None
    assert (delivery.delivery_id, delivery.subscription_id, delivery.title) == ("evt_1", 7, "")
    assert delivery.last_status == 503  # read back from its last error
    assert (notification.notifier, notification.title) == ("oncall", "Attention dropped")
    assert notification.delivery_id is None and notification.last_status is None
    # Rows from before channels were recorded go to the channel that sent them then.
    assert (delivery.channel, notification.channel) == ("webhook", "notify")
    assert logs == {}  # attempts made before the log was kept are not made up


def _old_schema(conn: Any, migrations: list[Any], mark: str) -> None:
    """conn's database at the schema before the attempt log (the migrations before the one
    that makes it), holding _old_rows."""
    schema_before(conn, migrations, mark, "outbox_attempts (")
    _old_rows(lambda sql, params=(): conn.execute(sql, params), mark)


def test_a_sqlite_database_from_before_the_log_is_upgraded(tmp_path: Path) -> None:
    from receiver.store.sqlite.schema import MIGRATIONS

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        _old_schema(conn, MIGRATIONS, "?")
    _check_upgraded(str(db))


def test_a_postgres_database_from_before_the_log_is_upgraded(pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from receiver.store.postgres.schema import MIGRATIONS

    with psycopg.connect(pg_url) as conn, conn.transaction():
        _old_schema(conn, MIGRATIONS, "%s")
    _check_upgraded(pg_url)
