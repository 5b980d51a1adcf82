"""The SQLite schema, as forward-only migrations numbered from 1."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from receiver.store.alerts import ACTIONS_SCHEMA
from receiver.store.attempts import ATTEMPTS_SCHEMA, SQLITE_HAS_STATUS
from receiver.store.escalations import ESCALATIONS_SCHEMA, NOTICE_EVENT_SCHEMA
from receiver.store.events import ADMIN_SCHEMA, RULESETS_SCHEMA, TRACE_SCHEMA
from receiver.store.flaps import FLAPS_SCHEMA
from receiver.store.inhibitors import INHIBITORS_SCHEMA
from receiver.store.maintenance import MAINTENANCE_SCHEMA
from receiver.store.migrations import apply
from receiver.store.outbox import OUTBOX_CHANNEL_SCHEMA, OUTBOX_ORDER_SCHEMA
from receiver.store.sessions import AGGREGATES_SCHEMA, VIEWS_SCHEMA, backfill
from receiver.store.silences import SILENCE_UNTIL_RESOLVED_SCHEMA
from receiver.store.storms import STORMS_SCHEMA
from receiver.store.threads import THREADS_SCHEMA
from receiver.store.upstream_state import UPSTREAM_SCHEMA
from receiver.store.webhook_health import HEALTH_SCHEMA
from receiver.store.webhook_replays import REPLAYS_SCHEMA
from receiver.store.webhooks import (
    FILTER_SCHEMA,
    RATE_SCHEMA,
    ROTATION_SCHEMA,
    WEBHOOK_OWNER_SCHEMA,
    WEBHOOKS_SCHEMA,
)


def _in(column: str, values: Iterable[Any]) -> tuple[str, Any]:
    return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))


MIGRATIONS: list[str | Callable[[sqlite3.Connection], Any]] = [
    # 1: events, quarantine, the outbox and throttle windows.
    """
    CREATE TABLE events (
        id TEXT PRIMARY KEY,
        type TEXT NOT NULL,
        session_id TEXT,
        user_id TEXT,
        score REAL,
        threshold REAL,
        event_ts TEXT NOT NULL,
        received_at REAL NOT NULL,
        body TEXT NOT NULL,
        routed_at REAL
    );
    CREATE INDEX events_unrouted ON events (received_at) WHERE routed_at IS NULL;
    CREATE INDEX events_session ON events (session_id, event_ts);
    CREATE TABLE quarantine (
        id INTEGER PRIMARY KEY,
        received_at REAL NOT NULL,
        reason TEXT NOT NULL,
        client TEXT,
        event_id TEXT,
        body BLOB NOT NULL
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        event_id TEXT NOT NULL,
        rule TEXT NOT NULL,
        notifier TEXT NOT NULL,
        target INTEGER NOT NULL,
        title TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        lease_until REAL,
        last_error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX outbox_due ON outbox (next_at) WHERE state IN ('pending', 'sending');
    CREATE INDEX outbox_event ON outbox (event_id);
    CREATE TABLE throttle (
        rule TEXT NOT NULL,
        key TEXT NOT NULL,
        until REAL NOT NULL,
        PRIMARY KEY (rule, key)
    );
    """,
    # 2: the alert lifecycle: alert state, what each rule notified, digests, silences,
    # and small named state (the heartbeat). Outbox rows learn their alert and kind.
    """
    ALTER TABLE outbox ADD COLUMN kind TEXT NOT NULL DEFAULT 'event';
    ALTER TABLE outbox ADD COLUMN alert TEXT;
    ALTER TABLE outbox ADD COLUMN episode INTEGER;
    ALTER TABLE outbox ADD COLUMN group_id INTEGER;
    DROP INDEX outbox_due;
    CREATE INDEX outbox_due ON outbox (next_at) WHERE state IN ('pending', 'sending', 'held');
    CREATE INDEX outbox_alert ON outbox (alert, episode) WHERE alert IS NOT NULL;
    CREATE TABLE alerts (
        id TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        episode INTEGER NOT NULL,
        opened_ts TEXT,
        opened_event TEXT,
        last_ts TEXT NOT NULL,
        resolved_ts TEXT,
        updated_at REAL NOT NULL
    );
    CREATE INDEX alerts_open ON alerts (state) WHERE state = 'open';
    CREATE TABLE notices (
        alert TEXT NOT NULL,
        episode INTEGER NOT NULL,
        rule TEXT NOT NULL,
        notified_at REAL NOT NULL,
        next_repeat_at REAL,
        repeats INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (alert, episode, rule)
    );
    CREATE INDEX notices_repeat ON notices (next_repeat_at) WHERE next_repeat_at IS NOT NULL;
    CREATE TABLE groups (
        id INTEGER PRIMARY KEY,
        rule TEXT NOT NULL,
        key TEXT NOT NULL,
        opened_at REAL NOT NULL,
        closes_at REAL NOT NULL,
        count INTEGER NOT NULL,
        members TEXT NOT NULL,
        state TEXT NOT NULL
    );
    CREATE INDEX groups_open ON groups (rule, key) WHERE state = 'open';
    CREATE TABLE silences (
        id INTEGER PRIMARY KEY,
        matchers TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at REAL NOT NULL,
        starts_at REAL NOT NULL,
        ends_at REAL NOT NULL,
        expired_at REAL
    );
    CREATE TABLE state (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 3: no query reads events by session, and with events from many sessions interleaved
    # this index dirtied a page per event: 23 of the 32 pages each commit wrote to the WAL
    # (bench stream, 200 sessions, 25 events a commit). The read API will index for what
    # it asks.
    """
    DROP INDEX events_session;
    """,
    # 4: the notify worker claims due rows target by target (one slow target must not
    # hold up the others), so it seeks them by target.
    """
    CREATE INDEX outbox_target_due ON outbox (notifier, target, next_at)
        WHERE state IN ('pending', 'sending', 'held');
    """,
    # 5: `receiver replay`: an operator's request to route an event again, sent whatever
    # the lifecycle says unless it asks to respect it. The event names its open request;
    # the outbox rows it produced name it too, so the command can report each one.
    """
    CREATE TABLE replays (
        id INTEGER PRIMARY KEY,
        event_id TEXT NOT NULL,
        requested_at REAL NOT NULL,
        respect_lifecycle INTEGER NOT NULL,
        routed_at REAL
    );
    ALTER TABLE events ADD COLUMN replay INTEGER;
    ALTER TABLE outbox ADD COLUMN replay INTEGER;
    CREATE INDEX outbox_replay ON outbox (replay) WHERE replay IS NOT NULL;
    """,
    # 6: the read API: the session projection and score histories (receiver.sessions),
    # API keys (hashes only) and the requests each key made in the last minute.
    VIEWS_SCHEMA.format(id="INTEGER PRIMARY KEY", without_rowid=" WITHOUT ROWID"),
    # 7: the sessions of the events already routed before 6 (an upgrade).
    lambda conn: backfill(conn.execute, _in),
    # 8: the webhook subscribers (POST /v1/webhooks) and their threshold sides.
    WEBHOOKS_SCHEMA.format(id="INTEGER PRIMARY KEY", without_rowid=" WITHOUT ROWID"),
    # 9: the admin page: duplicate counts, event pages by time and user, acknowledgements.
    ADMIN_SCHEMA,
    # 10: the shared request budget towards the upstream service (receiver.upstream).
    UPSTREAM_SCHEMA,
    # 11: the read API's totals and aggregates without a scan.
    AGGREGATES_SCHEMA,
    # 12: a subscription belongs to the API key that made it (NULL: an operator's, made
    # with the CLI or before this step, which admin keys manage).
    WEBHOOK_OWNER_SCHEMA,
    # 13: the messages of one alert to one target go out in order: a claim finds the rows
    # still to be sent ahead of a row of its alert at once (PostgreSQL's 10).
    OUTBOX_ORDER_SCHEMA,
    # 14: subscriber deliveries' own columns (delivery id, subscription), the status of
    # each row's last attempt, and the attempt log.
    ATTEMPTS_SCHEMA.format(id="INTEGER PRIMARY KEY", has_status=SQLITE_HAS_STATUS),
    # 15: what operators did to alerts (ack, resolve, snooze), from where, by whom.
    ACTIONS_SCHEMA.format(id="INTEGER PRIMARY KEY"),
    # 16: escalation chains, and notices silenced until their silence ends.
    ESCALATIONS_SCHEMA.format(real="REAL"),
    # 17: the open sources of inhibition rules.
    INHIBITORS_SCHEMA.format(real="REAL"),
    # 18: the storm guard's window of each rule that has one.
    STORMS_SCHEMA.format(real="REAL"),
    # 19: the rules file each event was routed with, for explaining it later.
    RULESETS_SCHEMA.format(real="REAL"),
    # 20: the trace context of each event and of each outbox row (receiver.tracing).
    TRACE_SCHEMA,
    # 21: the event whose notification a suppressed notice holds (woken under it).
    NOTICE_EVENT_SCHEMA,
    # 22: the channel that sends each outbox row (receiver.notify.registry).
    OUTBOX_CHANNEL_SCHEMA,
    # 23: the one chat message per alert episode and target (receiver.store.threads).
    THREADS_SCHEMA.format(real="REAL"),
    # 24: flap detection's record of each alert under each rule with `flap:`.
    FLAPS_SCHEMA.format(real="REAL"),
    # 25: silences that end with their alerts.
    SILENCE_UNTIL_RESOLVED_SCHEMA.format(real="REAL"),
    # 26: subscribers' endpoint health (receiver.store.webhook_health).
    HEALTH_SCHEMA.format(real="REAL"),
    # 27: a rotated secret's overlap (the secret before, until when it still signs).
    ROTATION_SCHEMA.format(real="REAL"),
    # 28: a subscription's rate limit and the time its next delivery may start.
    RATE_SCHEMA.format(real="REAL"),
    # 29: a subscription's filter (a rule's match mapping).
    FILTER_SCHEMA,
    # 30: replays of a subscription's events since a time (POST /v1/webhooks/:id/replay).
    REPLAYS_SCHEMA.format(id="INTEGER PRIMARY KEY", real="REAL"),
    # 31: the notices of maintenance windows, each claimed once (receiver.store.maintenance).
    MAINTENANCE_SCHEMA.format(real="REAL"),
]


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database to the newest schema; return the version it is at.

    One write transaction reads the version and applies what is missing, so
    processes starting together on a new file migrate it once, not each. A file already
    at the newest version is only read: a process opening it (a worker, `receiver
    backtest` beside a busy server) takes no write lock and never waits for one.
    """
    if _has_versions(conn):
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
        if version == len(MIGRATIONS):
            return version
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not _has_versions(conn):
            conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        version = apply(
            conn, MIGRATIONS, row[0] or 0, "INSERT INTO schema_version (version) VALUES (?)"
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return version


def _has_versions(conn: sqlite3.Connection) -> bool:
    """Whether the file has its schema_version table yet."""
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    return found is not None
