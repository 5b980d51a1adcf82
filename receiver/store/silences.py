"""Silences: the ones operators make, from the CLI, the admin page and the API, through one
role (store.silences), the one way a silence is added (add_silence), until resolved too, and
the routing transaction's role on either SQL store (tx.silences)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from receiver.matchers import compile_match
from receiver.store.records import Alert, Silence
from receiver.store.statements import Statements

_SILENCE_COLUMNS = (
    "id, matchers, reason, starts_at, ends_at, expired_at, created_at, resolve_after, alerts"
)
# Silences that end with their alerts (SQLite's migration 24, PostgreSQL's 21): how long
# the alerts it matched when it was made (a JSON list) must have been resolved.
SILENCE_UNTIL_RESOLVED_SCHEMA = """
    ALTER TABLE silences ADD COLUMN resolve_after {real};
    ALTER TABLE silences ADD COLUMN alerts TEXT
"""


def _silence(row: Any) -> Silence:
    alerts = tuple(json.loads(row[8])) if row[8] else ()
    return Silence(
        row[0], json.loads(row[1]), row[2], row[3], row[4], row[5], row[6], row[7], alerts
    )


T = TypeVar("T")
Transact = Callable[[Callable[[Any], T]], Awaitable[T]]


def _opening(tx: Any, alert: Alert) -> dict[str, Any]:
    """The fields of the event that opened the alert's episode ({} if it is gone)."""
    try:
        found = json.loads(tx.events.body(alert.opened_event or "") or "null")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def add_silence(
    tx: Any,
    matchers: dict[str, Any],
    reason: str,
    now: float,
    until: float,
    *,
    after: float | None = None,
) -> Silence:
    """Add a silence from now to until, in the routing transaction tx. With after (until
    resolved) it notes the open alerts whose opening event it matches now: it ends once
    every one has stayed resolved for after seconds (receiver.dispatch.silences.end_resolved;
    a flap re-firing inside keeps it), one that matches none after seconds after now."""
    alerts: tuple[str, ...] = ()
    if after is not None:
        conditions, _ = compile_match(matchers)  # checked by parse_matchers already
        alerts = tuple(
            a.id
            for a in tx.alerts.list_open(limit=100_000)
            if all(c.holds(_opening(tx, a)) for c in conditions)
        )
    silence_id = tx.silences.add(matchers, reason, now, until, after=after, alerts=alerts)
    found: Silence = tx.silences.get(silence_id)
    return found


class StoreSilences:
    """store.silences (roles.Silences) on any store, over its routing transaction."""

    def __init__(self, transact: Transact[Any]) -> None:
        self._transact = transact

    async def add(
        self, matchers: dict[str, Any], reason: str, now: float, until: float, *,
        after: float | None = None,
    ) -> Silence:  # fmt: skip
        added: Silence = await self._transact(
            lambda tx: add_silence(tx, matchers, reason, now, until, after=after)
        )
        return added

    async def recent(self, limit: int = 100) -> list[Silence]:
        found: list[Silence] = await self._transact(lambda tx: tx.silences.recent(limit))
        return found

    async def expire(self, silence_id: int, now: float) -> tuple[bool, Silence | None]:
        def work(tx: Any) -> tuple[bool, Silence | None]:
            return tx.silences.expire(silence_id, now), tx.silences.get(silence_id)

        done: tuple[bool, Silence | None] = await self._transact(work)
        return done


class SQLTxSilences:
    """tx.silences (base.TxSilences) on either SQL store."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def active(self, now: float) -> list[Silence]:
        rows = self.st.q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences"
            " WHERE expired_at IS NULL AND starts_at <= ? AND ends_at > ?",
            (now, now),
        )
        return [_silence(r) for r in rows]

    def add(
        self, matchers: dict[str, Any], reason: str, now: float, until: float, *,
        after: float | None = None, alerts: tuple[str, ...] = (),
    ) -> int:  # fmt: skip
        row = self.st.q(
            "INSERT INTO silences (matchers, reason, created_at, starts_at, ends_at,"
            " resolve_after, alerts) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (json.dumps(matchers), reason, now, now, until, after,
             None if after is None else json.dumps(list(alerts))),
        ).fetchone()  # fmt: skip
        return int(row[0])

    def expire(self, silence_id: int, now: float) -> bool:
        # Its end moves to now too: retention prunes silences by their end, and one that
        # was to end in the year 9999 (or later) must go once expired like any other.
        done = self.st.q(
            "UPDATE silences SET expired_at = ?, ends_at = ? WHERE id = ? AND expired_at IS NULL"
            " AND ends_at > ?",
            (now, now, silence_id, now),
        )
        return bool(done.rowcount == 1)

    def get(self, silence_id: int) -> Silence | None:
        row = self.st.q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences WHERE id = ?", (silence_id,)
        ).fetchone()
        return None if row is None else _silence(row)

    def recent(self, limit: int = 100) -> list[Silence]:
        rows = self.st.q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [_silence(r) for r in rows]
