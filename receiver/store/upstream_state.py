"""What both SQL stores say alike about the upstream service (receiver.upstream): the token
bucket every replica draws its requests from, the hold a 429's Retry-After puts on it, the
cursor of a backfill in progress, and sessions imported from upstream into the projection.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from receiver.sessions import Summary, merge_remote
from receiver.store.sql import Query
from receiver.store.views import (
    _ROW,
    _SELECT,
    _UPSERT,
    _count_hours,
    _hour_key,
    _insert_rows,
    _summary,
    _values,
)

T = TypeVar("T")

UPSTREAM_SCHEMA = """
    CREATE TABLE upstream_budget (
        name TEXT PRIMARY KEY,
        tokens DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        held_until DOUBLE PRECISION NOT NULL DEFAULT 0
    )
"""
_CURSOR = "upstream.sync"  # the state row of a backfill in progress
# The later of the held_until stored and the one given: a hold is never shortened.
_LATER = (
    "CASE WHEN upstream_budget.held_until > excluded.held_until"
    " THEN upstream_budget.held_until ELSE excluded.held_until END"
)


def bucket_shape(per_minute: int) -> tuple[float, float]:
    """(capacity, refill per second) of a bucket that never exceeds per_minute requests in
    any 60 seconds, the way the service counts: a burst of a tenth of the plan, then
    the other nine tenths spread over the minute.

    >>> bucket_shape(60)
    (6.0, 0.9)
    """
    capacity = max(1.0, per_minute / 10)
    return capacity, (per_minute - capacity) / 60


def take(
    tokens: float, updated_at: float, held_until: float, *, now: float, per_minute: int
) -> tuple[float, float]:
    """One request from a bucket that held `tokens` at `updated_at`: the tokens left and
    0.0 when it may go now, else the tokens unchanged and the seconds to wait.

    >>> take(0.0, 100.0, 0.0, now=100.0, per_minute=60)
    (0.0, 1.1111111111111112)
    """
    if now < held_until:
        return tokens, held_until - now
    capacity, rate = bucket_shape(per_minute)
    available = min(capacity, tokens + max(0.0, now - updated_at) * rate)
    if available >= 1.0 - 1e-9:  # float error must not leave a wait of 1e-16 s
        return max(0.0, available - 1.0), 0.0
    return available, (1.0 - available) / rate


class SQLUpstream:
    """The Store's upstream methods both stores share."""

    async def _statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        raise NotImplementedError

    def _in(self, column: str, values: Iterable[Any]) -> tuple[str, Any]:
        raise NotImplementedError

    _lock_key = ""  # PostgreSQL: FOR UPDATE, so replicas draw from the bucket in turn

    async def take_upstream(self, name: str, *, per_minute: int, now: float) -> float:
        """Draw one request from the bucket `name` (shared by every replica): 0.0 when it
        is drawn, else the seconds to wait before asking again (nothing drawn)."""

        def draw(q: Query) -> float:
            capacity, _ = bucket_shape(per_minute)
            q(
                "INSERT INTO upstream_budget (name, tokens, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, capacity, now),
            )
            tokens, updated_at, held_until = q(
                "SELECT tokens, updated_at, held_until FROM upstream_budget WHERE name = ?"
                + self._lock_key,
                (name,),
            ).fetchone()
            left, wait = take(tokens, updated_at, held_until, now=now, per_minute=per_minute)
            if wait == 0.0:
                q(
                    "UPDATE upstream_budget SET tokens = ?, updated_at = ? WHERE name = ?",
                    (left, max(now, updated_at), name),
                )
            return wait

        return await self._statements(draw)

    async def hold_upstream(self, name: str, *, until: float) -> None:
        """No request from the bucket before `until` (a 429's Retry-After), on any replica;
        the bucket is emptied so requests restart slowly."""

        def hold(q: Query) -> None:
            q(
                "INSERT INTO upstream_budget (name, tokens, updated_at, held_until)"
                f" VALUES (?, 0, ?, ?) ON CONFLICT (name) DO UPDATE SET tokens = 0,"
                f" updated_at = {_LATER}, held_until = {_LATER}",
                (name, until, until),
            )

        await self._statements(hold)

    async def sync_cursor(self) -> dict[str, Any] | None:
        """Where an unfinished `receiver upstream sync` stopped, or None."""

        def read(q: Query) -> dict[str, Any] | None:
            row = q("SELECT value FROM state WHERE name = ?", (_CURSOR,)).fetchone()
            return None if row is None else json.loads(row[0])

        return await self._statements(read, write=False)

    async def set_sync_cursor(self, value: dict[str, Any] | None) -> None:
        """Remember where a sync is (None: it finished)."""

        def write(q: Query) -> None:
            if value is None:
                q("DELETE FROM state WHERE name = ?", (_CURSOR,))
                return
            q(
                "INSERT INTO state (name, value) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (_CURSOR, json.dumps(value)),
            )

        await self._statements(write)

    async def import_sessions(
        self, items: Sequence[tuple[dict[str, Any], Sequence[tuple[float, str]]]]
    ) -> int:
        """Merge upstream sessions (part 2's single-session form) and their score points
        (score, iso() timestamp) into the projection; how many sessions changed.

        Idempotent: the same items again change nothing. A point is added only where the
        session has none at that instant (an event received here may have carried it).
        """

        def merge(q: Query) -> int:
            ids = sorted({str(remote["id"]) for remote, _ in items})
            if not ids:
                return 0
            where, param = self._in("id", ids)
            stored = {
                row[0]: _summary(row)
                for row in q(f"{_SELECT} WHERE {where} ORDER BY id{self._lock_key}", (param,))
            }
            changed, moves = [], []
            for remote, points in items:
                before = stored.get(str(remote["id"]))
                summary = Summary(id=str(remote["id"])) if before is None else before
                old = _values(summary) if before is not None else None
                was = _hour_key(summary) if before is not None else None
                merge_remote(summary, remote)
                if _values(summary) != old:
                    changed.append(_values(summary))
                    moves.append((was, _hour_key(summary)))
                stored[summary.id] = summary
                _add_points(q, summary.id, points)
            _insert_rows(q, _UPSERT, _ROW, changed)
            _count_hours(q, moves)  # the read API's totals, as project() keeps them
            return len(changed)

        return await self._statements(merge)


def _add_points(q: Query, session_id: str, points: Sequence[tuple[float, str]]) -> None:
    """Score points at instants the session has none at yet, keyed by the event id
    "upstream" (a session's points from elsewhere are never duplicated)."""
    if not points:
        return
    have = {ts for (ts,) in q("SELECT ts FROM session_scores WHERE session_id = ?", (session_id,))}
    new = sorted({ts: score for score, ts in points if ts not in have}.items())
    _insert_rows(
        q,
        "INSERT INTO session_scores (session_id, ts, event_id, score) VALUES {rows}"
        " ON CONFLICT DO NOTHING",
        "(?, ?, ?, ?)",
        [(session_id, ts, "upstream", score) for ts, score in new],
    )
