"""What both SQL stores say alike about the upstream service (receiver.upstream): the token
bucket every replica draws its requests from, the hold a 429's Retry-After puts on it, the
cursor of a backfill in progress (store.upstream). Sessions imported from upstream go into
the projection: receiver.store.sessions."""

from __future__ import annotations

import json
from typing import Any

from receiver.store.statements import Query, Runner

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
    """store.upstream (base.Upstream) on either SQL store."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def take(self, name: str, *, per_minute: int, now: float) -> float:
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
                + self.db.dialect.lock_key,
                (name,),
            ).fetchone()
            left, wait = take(tokens, updated_at, held_until, now=now, per_minute=per_minute)
            if wait == 0.0:
                q(
                    "UPDATE upstream_budget SET tokens = ?, updated_at = ? WHERE name = ?",
                    (left, max(now, updated_at), name),
                )
            return wait

        return await self.db.statements(draw)

    async def hold(self, name: str, *, until: float) -> None:
        """No request from the bucket before `until` (a 429's Retry-After), on any replica;
        the bucket is emptied so requests restart slowly."""

        def hold(q: Query) -> None:
            q(
                "INSERT INTO upstream_budget (name, tokens, updated_at, held_until)"
                f" VALUES (?, 0, ?, ?) ON CONFLICT (name) DO UPDATE SET tokens = 0,"
                f" updated_at = {_LATER}, held_until = {_LATER}",
                (name, until, until),
            )

        await self.db.statements(hold)

    async def sync_cursor(self) -> dict[str, Any] | None:
        """Where an unfinished `receiver upstream sync` stopped, or None."""

        def read(q: Query) -> dict[str, Any] | None:
            row = q("SELECT value FROM state WHERE name = ?", (_CURSOR,)).fetchone()
            return None if row is None else json.loads(row[0])

        return await self.db.statements(read, write=False)

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

        await self.db.statements(write)
