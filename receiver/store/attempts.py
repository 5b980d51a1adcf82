"""The outbox's attempt log, as both SQL stores keep it: every send of every row (when, the
HTTP status or the error, how long, a short excerpt of the answer), written in the same
transaction as the row's outcome, and read by the API, the CLI and the admin page."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from receiver.store.records import Attempt

T = TypeVar("T")
Query = Callable[[str, Sequence[Any]], Any]

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

_COLUMNS = "outbox_id, at, duration_ms, status, error, excerpt, number"


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


class SQLAttempts:
    """The Store's reading of attempt logs, both stores alike."""

    async def _statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        raise NotImplementedError

    def _in(self, column: str, values: Iterable[Any]) -> tuple[str, Any]:
        raise NotImplementedError

    async def attempts(self, row_ids: Sequence[int]) -> dict[int, list[Attempt]]:
        """The attempt logs of outbox rows, oldest attempt first; a row never tried (or
        unknown) has none."""
        if not row_ids:
            return {}
        where, param = self._in("outbox_id", row_ids)

        def select(q: Query) -> dict[int, list[Attempt]]:
            found: dict[int, list[Attempt]] = {}
            for row in q(
                f"SELECT {_COLUMNS} FROM outbox_attempts WHERE {where} ORDER BY outbox_id, number",
                (param,),
            ):
                found.setdefault(int(row[0]), []).append(Attempt(*row[1:]))
            return found

        return await self._statements(select, write=False)
