"""The outbox's attempt log, as both SQL stores keep it: every send of every row (when, the
HTTP status or the error, how long, a short excerpt of the answer), written in the same
transaction as the row's outcome (store.outbox.mark_delivered / mark_failed), and read by
the API, the CLI and the admin page (store.outbox.attempts)."""

from __future__ import annotations

from receiver.store.records import Attempt
from receiver.store.statements import Query

# Subscriber deliveries get columns of their own (they kept their delivery id in title and
# their subscription in target), the outbox the status of each row's last attempt, and
# every attempt a row of outbox_attempts. Rows already there move over: the delivery id
# out of title, the status out of an "HTTP 503 ..." last error.
ATTEMPTS_SCHEMA = """
    ALTER TABLE outbox ADD COLUMN delivery_id TEXT;
    ALTER TABLE outbox ADD COLUMN subscription_id BIGINT;
    ALTER TABLE outbox ADD COLUMN last_status INTEGER;
    UPDATE outbox SET delivery_id = title, subscription_id = target, title = ''
        WHERE kind = 'webhook';
    UPDATE outbox SET last_status = CAST(substr(last_error, 6, 3) AS INTEGER)
        WHERE kind = 'webhook' AND {has_status};
    CREATE INDEX outbox_subscription ON outbox (subscription_id, id)
        WHERE subscription_id IS NOT NULL;
    CREATE TABLE outbox_attempts (
        id {id},
        outbox_id BIGINT NOT NULL,
        number INTEGER NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        status INTEGER,
        duration_ms INTEGER NOT NULL,
        error TEXT,
        excerpt TEXT
    );
    CREATE INDEX outbox_attempts_row ON outbox_attempts (outbox_id, number)
"""
# An error that starts with an HTTP status ("HTTP 503 Service Unavailable: ..."), each
# store's way.
SQLITE_HAS_STATUS = "last_error GLOB 'HTTP [0-9][0-9][0-9]*'"
POSTGRES_HAS_STATUS = "last_error ~ '^HTTP [0-9][0-9][0-9]'"

COLUMNS = "outbox_id, at, duration_ms, status, error, excerpt, number"


def record(q: Query, row_id: int, attempt: Attempt) -> None:
    """Add attempt to row_id's log, numbered after the ones it has (one statement)."""
    q(
        "INSERT INTO outbox_attempts (outbox_id, number, at, status, duration_ms, error,"
        " excerpt) SELECT ?, coalesce(max(number), 0) + 1, ?, ?, ?, ?, ? FROM outbox_attempts"
        " WHERE outbox_id = ?",
        (
            row_id,
            attempt.at,
            attempt.status,
            attempt.duration_ms,
            attempt.error,
            attempt.excerpt,
            row_id,
        ),
    )
