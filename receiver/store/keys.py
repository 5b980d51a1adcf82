"""API keys and the per-key request counts behind the plan limits on either SQL store
(store.keys): a key's hash only, never the key; the counts shared by every replica."""

from __future__ import annotations

import math

from receiver.store.records import PLANS, ROLES, ApiKey, RateLimit
from receiver.store.statements import Query, Runner

_KEY_COLUMNS = "id, name, prefix, plan, role, created_at, revoked_at, last_used_at"


class SQLKeys:
    """store.keys (base.Keys) on either SQL store."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def add(
        self, *, name: str, key_hash: str, prefix: str, plan: str, role: str, now: float
    ) -> ApiKey:
        """Store a new key (its hash only); KeyError if the name is taken."""

        def insert(q: Query) -> ApiKey:
            if q("SELECT 1 FROM api_keys WHERE name = ?", (name,)).fetchone():
                raise KeyError(name)
            row = q(
                "INSERT INTO api_keys (name, hash, prefix, plan, role, created_at)"
                f" VALUES (?, ?, ?, ?, ?, ?) RETURNING {_KEY_COLUMNS}",
                (name, key_hash, prefix, plan, role, now),
            ).fetchone()
            return ApiKey(*row)

        return await self.db.statements(insert)

    async def all(self) -> list[ApiKey]:
        def select(q: Query) -> list[ApiKey]:
            return [
                ApiKey(*row) for row in q(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY id", ())
            ]

        return await self.db.statements(select, write=False)

    async def revoke(self, name: str, *, now: float) -> bool:
        """Revoke the key of this name (at once: every request looks its key up); False if
        no key has that name, or it is revoked already."""

        def update(q: Query) -> bool:
            cur = q(
                "UPDATE api_keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
                (now, name),
            )
            return bool(cur.rowcount)

        return await self.db.statements(update)

    async def authorize(
        self, key_hash: str, *, now: float, window: float = 60.0, role: str = "reader"
    ) -> tuple[ApiKey | None, RateLimit | None]:
        """The live key with this hash (None: unknown or revoked), and for a plan with a
        limit, whether this request is within it: requests counted over the last `window`
        seconds (a sliding log), shared by every replica. A refused request is not counted,
        nor is one the key's role may not make (below `role`: no limit is looked at)."""
        select = f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE hash = ? AND revoked_at IS NULL"

        def look(q: Query) -> ApiKey | None:
            row = q(select, (key_hash,)).fetchone()
            return ApiKey(*row) if row else None

        key = await self.db.read(look)
        if key is None or PLANS.get(key.plan) is None:
            return key, None
        if ROLES.index(key.role) < ROLES.index(role):  # refused for its role: not counted
            return key, None
        limit = PLANS[key.plan]
        assert limit is not None

        def count(q: Query) -> tuple[ApiKey | None, RateLimit | None]:
            row = q(select + self.db.dialect.lock_key, (key_hash,)).fetchone()
            if row is None:  # revoked just now
                return None, None
            live = ApiKey(*row)
            q("DELETE FROM rate_hits WHERE key_id = ? AND at <= ?", (live.id, now - window))
            used, oldest = q(
                "SELECT count(*), min(at) FROM rate_hits WHERE key_id = ?", (live.id,)
            ).fetchone()
            allowed = used < limit
            if allowed:
                q("INSERT INTO rate_hits (key_id, at) VALUES (?, ?)", (live.id, now))
                used += 1
                oldest = now if oldest is None else oldest
            reset = max(1, math.ceil(oldest + window - now))
            return live, RateLimit(allowed, limit, limit - used, reset)

        return await self.db.statements(count)
