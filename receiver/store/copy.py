"""`receiver db copy`: a SQLite store's whole history into an empty PostgreSQL store.

Events, the outbox, quarantine, alert state (alerts, notices, digests, throttle windows,
named state), silences and replay requests, with their ids, in one PostgreSQL
transaction: the target ends up with all of it, or (on any error) none. Both stores are
first brought to their newest schema. Run it with the receiver stopped (or expect the
events it accepts meanwhile to stay behind in the SQLite file).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from receiver.errors import StoreError
from receiver.sessions import COLUMNS
from receiver.store.postgres import PostgresStore
from receiver.store.postgres.store import PREPARE_THRESHOLD
from receiver.store.sqlite import SQLiteStore

# Table -> columns, in an order both schemas share; tables with an identity id last in
# their own list so their sequences can be moved past the copied ids.
TABLES: dict[str, tuple[str, ...]] = {
    "events": (
        "id", "type", "session_id", "user_id", "score", "threshold", "event_ts",
        "received_at", "body", "routed_at", "replay", "duplicates", "rules", "trace",
    ),
    "rulesets": ("digest", "source", "text", "seen_at"),
    "quarantine": ("id", "received_at", "reason", "client", "event_id", "body"),
    "outbox": (
        "id", "event_id", "rule", "notifier", "target", "title", "body", "state", "reason",
        "attempts", "next_at", "lease_until", "last_error", "created_at", "updated_at", "kind",
        "alert", "episode", "group_id", "replay", "delivery_id", "subscription_id",
        "last_status", "trace", "channel",
    ),
    "outbox_attempts": (
        "id", "outbox_id", "number", "at", "status", "duration_ms", "error", "excerpt",
    ),
    "throttle": ("rule", "key", "until"),
    "alerts": (
        "id", "state", "episode", "opened_ts", "opened_event", "last_ts", "resolved_ts",
        "updated_at",
    ),
    "notices": (
        "alert", "episode", "rule", "notified_at", "next_repeat_at", "repeats",
        "suppressed_since", "suppressed_why", "suppressed_event",
    ),
    "escalations": (
        "alert", "episode", "rule", "policy", "step", "round", "next_at", "started_at",
        "suppressed_since", "suppressed_why", "log",
    ),
    "inhibitors": ("rule", "key", "alert", "episode", "event", "since"),
    "storms": ("rule", "start", "count", "prev"),
    # The Slack app's message of each alert episode: later notifications update it.
    "chat_threads": (
        "key", "target", "channel_id", "ts", "card", "claimed_until", "created_at", "updated_at",
    ),
    "flaps": ("alert", "rule", "changes", "since", "settle_at", "state", "event", "opened"),
    "maintenance_notices": ("name", "start", "kind", "claimed_at"),
    "groups": ("id", "rule", "key", "opened_at", "closes_at", "count", "members", "state"),
    "silences": (
        "id", "matchers", "reason", "created_at", "starts_at", "ends_at", "expired_at",
        "resolve_after", "alerts",
    ),
    "state": ("name", "value"),
    "replays": ("id", "event_id", "requested_at", "respect_lifecycle", "routed_at"),
    # The read API's (the per-minute request counts are not worth moving).
    "sessions": (*COLUMNS, "status", "started_at"),
    "session_scores": ("session_id", "ts", "event_id", "score"),
    "api_keys": (
        "id", "name", "hash", "prefix", "plan", "role", "created_at", "revoked_at",
        "last_used_at",
    ),
    # Webhook subscribers (their deliveries are outbox rows) and alert acknowledgements.
    "webhooks": (
        "id", "public_id", "url", "events", "threshold", "format", "secret", "status",
        "created_at", "updated_at", "status_reason", "owner", "health", "failures",
        "failing_since", "last_error", "previous_secret", "previous_until", "rate_limit",
        "rate_tat", "filter",
    ),
    "webhook_sides": ("webhook_id", "session_id", "below", "mark"),
    "webhook_replays": (
        "id", "webhook_id", "since", "until", "all_deliveries", "state", "after_at", "after_id",
        "queued", "replaced", "skipped", "created_at", "finished_at",
    ),
    "acks": ("alert", "episode", "acked_by", "acked_at"),
    "alert_actions": (
        "id", "alert", "episode", "action", "source", "actor", "at", "outcome", "until",
    ),
}  # fmt: skip
_IDENTITY = (
    "quarantine", "outbox", "outbox_attempts", "groups", "silences", "replays", "api_keys",
    "webhooks", "alert_actions", "webhook_replays",
)  # fmt: skip
_BOOLEAN = {("replays", "respect_lifecycle")}
CHUNK = 5000

Progress = Callable[[str, int], None]  # (table, rows just copied)


def count_rows(source: str | Path) -> dict[str, int]:
    """Rows per table in the SQLite store at source (brought to the newest schema first)."""
    asyncio.run(_migrate_sqlite(source))
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def copy_to_postgres(
    source: str | Path,
    target: str,
    progress: Progress,
    *,
    prepare_threshold: int | None = PREPARE_THRESHOLD,
) -> dict[str, int]:
    """Copy the SQLite store at source into the PostgreSQL store at target, which must hold
    no events and no notifications yet; rows copied per table. prepare_threshold is
    psycopg's (None never prepares: behind PgBouncer in transaction mode)."""
    import psycopg

    _reach(target)
    asyncio.run(_migrate_postgres(target, prepare_threshold))
    copied = dict.fromkeys(TABLES, 0)
    with (
        sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src,
        psycopg.connect(target, prepare_threshold=prepare_threshold) as dst,
        dst.transaction(),
    ):
        for table in ("events", "outbox", "alerts", "silences"):
            if dst.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone():
                raise StoreError(
                    f"the target database already holds {table}: copy only into an empty store"
                )
        for table, columns in TABLES.items():
            rows = src.execute(f"SELECT {', '.join(columns)} FROM {table}")
            with dst.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                while chunk := rows.fetchmany(CHUNK):
                    for row in chunk:
                        copy.write_row(_adapt(table, columns, row))
                    copied[table] += len(chunk)
                    progress(table, len(chunk))
        for table in _IDENTITY:
            dst.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                f" coalesce((SELECT max(id) FROM {table}), 0) + 1, false)"
            )
    return copied


def _reach(target: str) -> None:
    """Raise StoreError saying why, if the PostgreSQL server at target takes no connection:
    the store's pool would only say "pool initialization incomplete" after 10 s."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        psycopg.connect(target, connect_timeout=10).close()
    except psycopg.Error as exc:
        info = conninfo_to_dict(target)
        where = f"{info.get('host') or 'localhost'}:{info.get('port') or 5432}"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        # 'connection to server at "127.0.0.1", port 1 failed: Connection refused'
        reason = first.rpartition(" failed: ")[2].strip() or first
        raise StoreError(
            f"cannot connect to PostgreSQL at {where}: {reason[:1].lower()}{reason[1:]}"
        ) from None


def _adapt(table: str, columns: tuple[str, ...], row: tuple[Any, ...]) -> tuple[Any, ...]:
    if not any((table, c) in _BOOLEAN for c in columns):
        return row
    return tuple(
        bool(v) if (table, c) in _BOOLEAN and v is not None else v
        for c, v in zip(columns, row, strict=True)
    )


async def _migrate_sqlite(source: str | Path) -> None:
    if not Path(source).exists():
        raise StoreError(f"no SQLite database at {source}")
    store = SQLiteStore(source)
    await store.open()
    await store.close()


async def _migrate_postgres(target: str, prepare_threshold: int | None) -> None:
    store = PostgresStore(target, prepare_threshold=prepare_threshold)
    await store.open()
    await store.close()
