"""Replays of a subscription's events since a time (POST /v1/webhooks/:id/replay), on
either SQL store: the job, and each step of it in one transaction.

A step reads the next page of events received in [since, until), oldest first, after the
job's cursor; asks pick (the fan-out's, above the store) which delivery (webhook-id and
body) each makes for the subscription as it is now (its types and current filter); and
queues each: a delivery still pending (a retry waiting) is made due now instead of queued
twice; a failed or cancelled one is sent again under its own row and webhook-id; a
delivered one only with all; one never made (the subscription was disabled, or made
later) gets a row of its own, with the event's id as webhook-id. The cursor and the
counts move in the same transaction, so a crash (kill -9) between steps loses nothing and
queues nothing twice, and replicas stepping one job take turns on its row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from receiver.store.records import Webhook, subscriber_delivery
from receiver.store.statements import Query


@dataclass(frozen=True)
class ReplayJob:
    """A replay of a subscription's events received in [since, until) (receiver.store.
    webhook_replays): running until its cursor has passed the last of them."""

    id: int
    webhook_id: int
    since: float
    until: float
    all: bool  # delivered ones too
    state: str  # running or done
    queued: int  # deliveries queued again (or for the first time)
    replaced: int  # pending ones made due now instead of queued twice
    skipped: int  # events the subscription does not match now, or delivered (without all)
    created_at: float
    finished_at: float | None


# {id}: each store's identity column; {real}: its float. SQLite's migration 27,
# PostgreSQL's 24.
REPLAYS_SCHEMA = """
    CREATE TABLE webhook_replays (
        id {id},
        webhook_id BIGINT NOT NULL,
        since {real} NOT NULL,
        until {real} NOT NULL,
        all_deliveries INTEGER NOT NULL,
        state TEXT NOT NULL,
        after_at {real},
        after_id TEXT,
        queued INTEGER NOT NULL DEFAULT 0,
        replaced INTEGER NOT NULL DEFAULT 0,
        skipped INTEGER NOT NULL DEFAULT 0,
        created_at {real} NOT NULL,
        finished_at {real}
    );
    CREATE INDEX webhook_replays_running ON webhook_replays (state) WHERE state = 'running'
"""
JOB_COLUMNS = (
    "id, webhook_id, since, until, all_deliveries, state, queued, replaced, skipped,"
    " created_at, finished_at"
)

# (the subscription, the event's id, its stored body) -> (webhook-id, body), or None if it
# makes no delivery to the subscription now; a body of None: re-send its delivery only if
# one was made (a threshold's derived event, which depends on the sides at the time).
Pick = Callable[[Webhook, str, str], tuple[str, str | None] | None]


def job(row: Any) -> ReplayJob:
    values = list(row)
    values[4] = bool(values[4])
    return ReplayJob(*values)


def step(
    q: Query, hook: Webhook, job_id: int, *, now: float, limit: int, pick: Pick
) -> ReplayJob | None:
    """One step of a running job (see the module); the job after it."""
    found = q(
        "UPDATE webhook_replays SET state = state WHERE id = ? AND state = 'running'"
        " RETURNING since, until, all_deliveries, after_at, after_id",
        (job_id,),
    ).fetchone()
    if found is None:
        return None
    since, until, all_, after_at, after_id = found
    sql = "SELECT id, received_at, body FROM events WHERE received_at >= ? AND received_at < ?"
    params: list[Any] = [since, until]
    if after_at is not None:
        sql += " AND (received_at > ? OR (received_at = ? AND id > ?))"
        params += [after_at, after_at, after_id]
    rows = q(sql + " ORDER BY received_at, id LIMIT ?", (*params, limit)).fetchall()
    counts = {"queued": 0, "replaced": 0, "skipped": 0}
    for n, (event_id, _, body) in enumerate(rows):
        made = pick(hook, event_id, body if isinstance(body, str) else body.decode())
        outcome = "skipped" if made is None else _queue(q, hook, event_id, made, all_, now, n)
        counts[outcome] += 1
    last = rows[-1] if rows else None
    q(
        "UPDATE webhook_replays SET queued = queued + ?, replaced = replaced + ?,"
        " skipped = skipped + ?, after_at = coalesce(?, after_at),"
        " after_id = coalesce(?, after_id), state = ?, finished_at = ? WHERE id = ?",
        (
            counts["queued"],
            counts["replaced"],
            counts["skipped"],
            None if last is None else last[1],
            None if last is None else last[0],
            "running" if len(rows) == limit else "done",
            None if len(rows) == limit else now,
            job_id,
        ),
    )
    return job(q(f"SELECT {JOB_COLUMNS} FROM webhook_replays WHERE id = ?", (job_id,)).fetchone())


def _queue(
    q: Query,
    hook: Webhook,
    event_id: str,
    made: tuple[str, str | None],
    all_: int,
    now: float,
    n: int,
) -> str:
    """Queue one replayed delivery; "queued", "replaced" (a pending one made due) or
    "skipped" (delivered, without all; or being sent just now)."""
    delivery_id, body = made
    at = now + n * 1e-6  # due in event order: the claim takes a lane's rows by next_at
    row = q(
        "SELECT id, state FROM outbox WHERE notifier = '@subscriber' AND target = ?"
        " AND delivery_id = ? ORDER BY id DESC LIMIT 1",
        (hook.id, delivery_id),
    ).fetchone()
    if row is None and body is None:
        return "skipped"
    if row is None:
        assert body is not None
        n_ = subscriber_delivery(hook.id, delivery_id, body)
        q(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state, next_at,"
            " created_at, updated_at, kind, delivery_id, subscription_id, channel)"
            " VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, 'webhook', ?, ?, ?)",
            (event_id, n_.rule, n_.notifier, n_.target, n_.title, n_.body, at, now, now,
             delivery_id, hook.id, n_.channel),
        )  # fmt: skip
        return "queued"
    row_id, state = row
    if state == "sending" or (state == "delivered" and not all_):
        return "skipped"
    q(
        "UPDATE outbox SET state = 'pending', attempts = 0, next_at = ?, updated_at = ?"
        " WHERE id = ?",
        (at, now, row_id),
    )
    return "replaced" if state in ("pending", "held") else "queued"
