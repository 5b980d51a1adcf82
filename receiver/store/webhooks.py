"""Webhook subscribers on either SQL store (store.webhooks): the subscriptions, and their
deliveries, which are outbox rows (notifier "@subscriber", kind "webhook", subscription_id
and target the subscription's id, delivery_id the delivery's stable id). The side of its
threshold each session was last on is routing's: receiver.store.subscribers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from receiver.store import webhook_health, webhook_replays
from receiver.store.outbox import OUTBOX_COLUMNS
from receiver.store.records import OutboxRow, Webhook
from receiver.store.statements import Query, Runner
from receiver.store.webhook_health import HEALTH_COLUMNS, EventMaker, HealthPolicy
from receiver.store.webhook_replays import ReplayJob

WEBHOOK_COLUMNS = (
    "id, public_id, url, events, threshold, format, secret, status, created_at, status_reason"
)
# The subscriptions read here carry their owner and health too (routing's reads need
# not): the record's last fields, so webhook() reads either form.
SUBSCRIPTION_COLUMNS = _COLUMNS = (
    f"{WEBHOOK_COLUMNS}, owner, {HEALTH_COLUMNS}, previous_secret, previous_until, rate_limit,"
    " filter"
)
_FILTER = 18  # the filter's place in those columns (JSON text, or NULL)

WEBHOOK_OWNER_SCHEMA = """
    ALTER TABLE webhooks ADD COLUMN owner BIGINT;
    CREATE INDEX webhooks_owner ON webhooks (owner, status)
"""

# A rotation with an overlap keeps the secret before until its end (SQLite's migration 24,
# PostgreSQL's 21). {real}: each store's float.
ROTATION_SCHEMA = """
    ALTER TABLE webhooks ADD COLUMN previous_secret TEXT;
    ALTER TABLE webhooks ADD COLUMN previous_until {real}
"""

# A subscription's rate limit, and when its next delivery may start: the theoretical
# arrival time of the generic cell rate algorithm, shared by every replica (SQLite's
# migration 25, PostgreSQL's 22). {real}: each store's float.
RATE_SCHEMA = """
    ALTER TABLE webhooks ADD COLUMN rate_limit {real};
    ALTER TABLE webhooks ADD COLUMN rate_tat {real}
"""

# A subscription's filter: a rule's match mapping, as JSON (SQLite's migration 26,
# PostgreSQL's 23).
FILTER_SCHEMA = """
    ALTER TABLE webhooks ADD COLUMN filter TEXT
"""

WEBHOOKS_SCHEMA = """
    CREATE TABLE webhooks (
        id {id},
        public_id TEXT NOT NULL UNIQUE,
        url TEXT NOT NULL,
        events TEXT NOT NULL,
        threshold DOUBLE PRECISION,
        format TEXT NOT NULL,
        secret TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        status_reason TEXT
    );
    CREATE TABLE webhook_sides (
        webhook_id BIGINT NOT NULL,
        session_id TEXT NOT NULL,
        below INTEGER NOT NULL,
        mark TEXT NOT NULL,
        PRIMARY KEY (webhook_id, session_id)
    ){without_rowid};
    CREATE INDEX outbox_target ON outbox (notifier, target, id)
"""


def webhook(row: Sequence[Any]) -> Webhook:
    values = list(row)
    values[3] = json.loads(values[3])
    if len(values) > _FILTER and values[_FILTER] is not None:
        values[_FILTER] = json.loads(values[_FILTER])
    return Webhook(*values)


class SQLWebhooks:
    """store.webhooks (base.Webhooks) on either SQL store."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def add(
        self,
        *,
        public_id: str,
        url: str,
        events: list[str],
        threshold: float | None,
        format: str,
        secret: str,
        now: float,
        owner: int | None = None,
        cap: int | None = None,
        rate_limit: float | None = None,
        filter: dict[str, Any] | None = None,
    ) -> Webhook | None:
        def insert(q: Query) -> Webhook | None:
            if owner is not None and cap is not None:
                # The key's row, locked for this transaction (PostgreSQL: a row lock; SQLite
                # writes one at a time anyway): two creates of one key at once counted the
                # same subscriptions under READ COMMITTED and both got past the cap.
                q("UPDATE api_keys SET plan = plan WHERE id = ?", (owner,))
                (count,) = q(
                    "SELECT count(*) FROM webhooks WHERE owner = ? AND status <> 'deleted'",
                    (owner,),
                ).fetchone()
                if count >= cap:
                    return None
            row = q(
                "INSERT INTO webhooks (public_id, url, events, threshold, format, secret, status,"
                " created_at, updated_at, owner, rate_limit, filter)"
                " VALUES (?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?)"
                f" RETURNING {_COLUMNS}",
                (
                    public_id,
                    url,
                    json.dumps(events),
                    threshold,
                    format,
                    secret,
                    now,
                    now,
                    owner,
                    rate_limit,
                    None if filter is None else json.dumps(filter),
                ),
            ).fetchone()
            return webhook(row)

        return await self.db.statements(insert)

    async def all(self, *, active_only: bool = False, owner: int | None = None) -> list[Webhook]:
        """Every subscription but the deleted ones (with active_only: the active ones);
        with owner, those of that API key only."""
        where = "status = 'active'" if active_only else "status <> 'deleted'"
        params: tuple[int, ...] = ()
        if owner is not None:
            where += " AND owner = ?"
            params = (owner,)

        def select(q: Query) -> list[Webhook]:
            return [
                webhook(row)
                for row in q(f"SELECT {_COLUMNS} FROM webhooks WHERE {where} ORDER BY id", params)
            ]

        return await self.db.statements(select, write=False)

    async def get(self, public_id: str) -> Webhook | None:
        def select(q: Query) -> Webhook | None:
            row = q(
                f"SELECT {_COLUMNS} FROM webhooks WHERE public_id = ? AND status <> 'deleted'",
                (public_id,),
            ).fetchone()
            return webhook(row) if row else None

        return await self.db.statements(select, write=False)

    async def update(
        self,
        public_id: str,
        *,
        now: float,
        status: str | None = None,
        reason: str | None = None,
        secret: str | None = None,
    ) -> Webhook | None:
        """Change a subscription's status (deleted: its pending deliveries are cancelled)
        or secret; None if there is none of that id (deleted ones included)."""

        def update(q: Query) -> Webhook | None:
            row = q(
                "UPDATE webhooks SET status = coalesce(?, status), status_reason = ?,"
                " secret = coalesce(?, secret), updated_at = ?"
                f" WHERE public_id = ? AND status <> 'deleted' RETURNING {_COLUMNS}",
                (status, reason, secret, now, public_id),
            ).fetchone()
            if row is None:
                return None
            found = webhook(row)
            if status in ("deleted", "disabled"):
                q(
                    "UPDATE outbox SET state = 'cancelled', reason = ?, updated_at = ?"
                    " WHERE subscription_id = ? AND state IN ('pending', 'held')",
                    (f"subscription {status}", now, found.id),
                )
            return found

        return await self.db.statements(update)

    async def deliveries(
        self, webhook_id: int, *, limit: int, before: int | None = None
    ) -> list[OutboxRow]:
        """A subscription's deliveries, newest first; before: a delivery id (a page's end)."""

        def select(q: Query) -> list[OutboxRow]:
            rows = q(
                f"SELECT {OUTBOX_COLUMNS} FROM outbox WHERE subscription_id = ?"
                " AND id < ? ORDER BY id DESC LIMIT ?",
                (webhook_id, before if before is not None else 2**62, limit),
            ).fetchall()
            return [OutboxRow(*row) for row in rows]

        return await self.db.statements(select, write=False)

    async def delivery(self, webhook_id: int, delivery_id: int) -> OutboxRow | None:
        """One delivery of a subscription (its outbox row id), or None if it has none such."""

        def select(q: Query) -> OutboxRow | None:
            row = q(
                f"SELECT {OUTBOX_COLUMNS} FROM outbox WHERE id = ? AND subscription_id = ?",
                (delivery_id, webhook_id),
            ).fetchone()
            return OutboxRow(*row) if row else None

        return await self.db.statements(select, write=False)

    async def retry_delivery(
        self, webhook_id: int, delivery_id: int, *, now: float
    ) -> OutboxRow | None:
        """Send a delivery again now, its attempts counted afresh (a failed one, or any
        not in flight); None if the subscription has no such delivery."""

        def update(q: Query) -> OutboxRow | None:
            row = q(
                "UPDATE outbox SET state = CASE WHEN state = 'sending' THEN state ELSE 'pending'"
                " END, attempts = CASE WHEN state = 'sending' THEN attempts ELSE 0 END,"
                " next_at = CASE WHEN state = 'sending' THEN next_at ELSE ? END, updated_at = ?"
                " WHERE id = ? AND subscription_id = ?"
                f" RETURNING {OUTBOX_COLUMNS}",
                (now, now, delivery_id, webhook_id),
            ).fetchone()
            return OutboxRow(*row) if row else None

        return await self.db.statements(update)

    async def record_delivery(
        self,
        webhook_id: int,
        *,
        ok: bool,
        now: float,
        policy: HealthPolicy,
        make_event: EventMaker,
        error: str | None = None,
        gone: bool = False,
        hold_until: float | None = None,
    ) -> tuple[Webhook, str | None] | None:
        """Count one delivery's outcome towards its subscription's health (see
        receiver.store.webhook_health): the subscription after it and the health event
        stored for the change (None: no change); None if it is no longer active. While
        failing, its other pending deliveries wait until hold_until (the next probe); a
        recovery sends them at once; disabling cancels them."""
        return await self.db.statements(
            lambda q: webhook_health.record(
                q,
                _COLUMNS,
                webhook,
                webhook_id,
                ok=ok,
                error=error,
                gone=gone,
                now=now,
                policy=policy,
                hold_until=hold_until,
                make_event=make_event,
            )
        )

    async def enable(self, public_id: str, *, now: float, make_event: EventMaker) -> Webhook | None:
        """A disabled subscription active and healthy again (its webhook.recovered stored
        with it); None if no subscription of that id is disabled (another request enabled it
        first, or it is active or deleted)."""
        return await self.db.statements(
            lambda q: webhook_health.enable(
                q, _COLUMNS, webhook, public_id, now=now, make_event=make_event
            )
        )

    async def rotate(
        self, public_id: str, *, secret: str, now: float, overlap_until: float | None
    ) -> Webhook | None:
        """A new signing secret; with overlap_until, the one before goes on signing beside
        it until then (else it stops at once). None if no subscription has that id."""

        def update(q: Query) -> Webhook | None:
            row = q(
                "UPDATE webhooks SET previous_secret = CASE WHEN ? = 1 THEN secret END,"
                " previous_until = ?, secret = ?, updated_at = ?"
                f" WHERE public_id = ? AND status <> 'deleted' RETURNING {_COLUMNS}",
                (int(overlap_until is not None), overlap_until, secret, now, public_id),
            ).fetchone()
            return webhook(row) if row else None

        return await self.db.statements(update)

    async def configure(
        self, public_id: str, *, now: float, changes: Mapping[str, Any]
    ) -> Webhook | None:
        """Set a subscription's rate limit, filter or both (see Webhooks.configure)."""
        values: list[Any] = []
        sets = []
        for column in ("rate_limit", "filter"):
            if column in changes:
                value = changes[column]
                sets.append(f"{column} = ?")
                values.append(json.dumps(value) if column == "filter" and value else value)

        def update(q: Query) -> Webhook | None:
            row = q(
                f"UPDATE webhooks SET {''.join(s + ', ' for s in sets)}updated_at = ?"
                f" WHERE public_id = ? AND status <> 'deleted' RETURNING {_COLUMNS}",
                (*values, now, public_id),
            ).fetchone()
            return None if row is None else webhook(row)

        return await self.db.statements(update)

    async def take_slot(self, webhook_id: int, *, rate: float, now: float) -> float:
        """When the next delivery to the subscription may start, at most rate a second
        across every replica (GCRA): now, or later while deliveries come faster. The slot
        is taken: a caller must wait until then, then send."""

        def update(q: Query) -> float:
            row = q(
                "UPDATE webhooks SET rate_tat = CASE WHEN rate_tat IS NULL OR rate_tat < ?"
                " THEN ? ELSE rate_tat END + ? WHERE id = ? RETURNING rate_tat",
                (now, now, 1.0 / rate, webhook_id),
            ).fetchone()
            return now if row is None else float(row[0]) - 1.0 / rate

        return await self.db.statements(update)

    async def start_replay(
        self, webhook_id: int, *, since: float, until: float, all: bool, now: float
    ) -> ReplayJob:
        """A replay job of the subscription's events received in [since, until), running."""
        return await self.db.statements(
            lambda q: webhook_replays.job(
                q(
                    "INSERT INTO webhook_replays (webhook_id, since, until, all_deliveries,"
                    " state, created_at) VALUES (?, ?, ?, ?, 'running', ?)"
                    f" RETURNING {webhook_replays.JOB_COLUMNS}",
                    (webhook_id, since, until, int(all), now),
                ).fetchone()
            )
        )

    async def replay_job(self, webhook_id: int, job_id: int) -> ReplayJob | None:
        """One of the subscription's replay jobs, or None."""
        return await self.db.statements(
            lambda q: (
                None
                if (
                    row := q(
                        f"SELECT {webhook_replays.JOB_COLUMNS} FROM webhook_replays"
                        " WHERE id = ? AND webhook_id = ?",
                        (job_id, webhook_id),
                    ).fetchone()
                )
                is None
                else webhook_replays.job(row)
            ),
            write=False,
        )

    async def running_replays(self) -> list[ReplayJob]:
        """The replay jobs still running, oldest first."""
        return await self.db.statements(
            lambda q: [
                webhook_replays.job(row)
                for row in q(
                    f"SELECT {webhook_replays.JOB_COLUMNS} FROM webhook_replays"
                    " WHERE state = 'running' ORDER BY id",
                    (),
                )
            ],
            write=False,
        )

    async def replay_step(
        self, hook: Webhook, job_id: int, *, now: float, limit: int, pick: webhook_replays.Pick
    ) -> ReplayJob | None:
        """Queue the next limit events of a running job (receiver.store.webhook_replays); the
        job after it, or None if it is not running."""
        return await self.db.statements(
            lambda q: webhook_replays.step(q, hook, job_id, now=now, limit=limit, pick=pick)
        )
