"""The outbox on either SQL store: what routing queues inside its transaction (tx.outbox),
and what the notify workers, the operator commands and the admin page do with it
(store.outbox): claims under a lease, outcomes and their attempt log, retries, listings."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from receiver.store import attempts as attempt_log
from receiver.store.alerts import ReadAhead
from receiver.store.records import (
    SENT_STATES,
    Attempt,
    Notification,
    OutboxQuery,
    OutboxRow,
    row_channel,
)
from receiver.store.statements import Query, Runner, Statements

OUTBOX_COLUMNS = (
    "id, event_id, rule, notifier, target, title, body, state, attempts, next_at,"
    " created_at, updated_at, reason, last_error, kind, replay, delivery_id, subscription_id,"
    " last_status, trace, channel"
)
# A due row whose alert has an earlier message to the same target still to be sent waits
# for it; an earlier row that is held (a hold, a deferred active window: for hours, maybe)
# only for the rows of its own rule, so another rule's page is not kept waiting behind
# it. The index below holds only rows still to be sent, so the check is one short range
# whatever the history; without it SQLite walked every earlier row of the target (0.6 s a
# claim with 50,000 rows kept, against 5 ms).
OUTBOX_ORDER_SCHEMA = """
CREATE INDEX outbox_alert_waiting ON outbox (alert, notifier, target, id)
    WHERE alert IS NOT NULL AND state IN ('pending', 'sending', 'held')
"""
# Each row names the channel that sends it (receiver.notify.registry). Rows queued before
# this step are sent as they were: deliveries to subscribers by the webhook channel,
# everything else by apprise's ("notify").
OUTBOX_CHANNEL_SCHEMA = """
ALTER TABLE outbox ADD COLUMN channel TEXT NOT NULL DEFAULT 'notify';
UPDATE outbox SET channel = 'webhook' WHERE notifier = '@subscriber'
"""
IN_ORDER = (
    "(due.alert IS NULL OR NOT EXISTS (SELECT 1 FROM outbox AS earlier"
    " WHERE earlier.alert = due.alert AND earlier.notifier = due.notifier"
    " AND earlier.target = due.target AND earlier.id < due.id"
    " AND (earlier.state IN ('pending', 'sending')"
    " OR (earlier.state = 'held' AND earlier.rule = due.rule))))"
)


class SQLTxOutbox:
    """tx.outbox (base.TxOutbox) on either SQL store; with the alerts' read-ahead, a
    resolve looks for held rows only of alerts that have some."""

    def __init__(self, st: Statements, ahead: ReadAhead) -> None:
        self.st = st
        self.ahead = ahead

    def add(
        self,
        event_id: str,
        n: Notification,
        *,
        state: str,
        now: float,
        next_at: float | None = None,
        reason: str | None = None,
        kind: str = "event",
        alert: str | None = None,
        episode: int | None = None,
        group_id: int | None = None,
        replay: int | None = None,
    ) -> int:
        if alert is not None and state == "held":
            self.ahead.held.add(alert)
        row = self.st.q(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state, reason,"
            " next_at, created_at, updated_at, kind, alert, episode, group_id, replay,"
            " delivery_id, subscription_id, trace, channel)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                event_id,
                n.rule,
                n.notifier,
                n.target,
                n.title,
                n.body,
                state,
                reason,
                now if next_at is None else next_at,
                now,
                now,
                kind,
                alert,
                episode,
                group_id,
                replay,
                n.delivery_id,
                n.subscription_id,
                n.trace,
                row_channel(n),
            ),
        ).fetchone()
        return int(row[0])

    def add_many(
        self, items: Sequence[tuple[str, Notification]], *, state: str, now: float, kind: str
    ) -> None:
        """Queue many notifications alike but for their event and content (a fan-out),
        in one statement run for each: no ids come back."""
        self.st.many(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state,"
            " next_at, created_at, updated_at, kind, delivery_id, subscription_id, trace,"
            " channel) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (event_id, n.rule, n.notifier, n.target, n.title, n.body, state, now, now, now,
                 kind, n.delivery_id, n.subscription_id, n.trace, row_channel(n))
                for event_id, n in items
            ],
        )  # fmt: skip

    def cancel_held(self, alert: str, episode: int, now: float, reason: str) -> int:
        if not self.ahead.may_have_held(alert):
            return 0
        return int(
            self.st.q(
                "UPDATE outbox SET state = 'cancelled', reason = ?, updated_at = ?"
                " WHERE alert = ? AND episode = ? AND state = 'held' AND kind = 'event'",
                (reason, now, alert, episode),
            ).rowcount
        )

    def sent(self, alert: str, episode: int, rule: str) -> bool:
        """Whether rule's notification about this episode went out (or is on its way)."""
        row = self.st.q(
            "SELECT 1 FROM outbox WHERE alert = ? AND episode = ? AND rule = ? AND kind = 'event'"
            f" AND state IN {SENT_STATES} LIMIT 1",
            (alert, episode, rule),
        ).fetchone()
        return row is not None

    def updatable(
        self, alert: str, episode: int, channels: Collection[str]
    ) -> list[tuple[str, str, int, str]]:
        """Each (rule, notifier, target, channel) of these channels that a message about the
        episode went to (or is on its way to), once each: what an ack updates in place."""
        if not channels:
            return []
        marks = ", ".join("?" * len(channels))
        rows = self.st.q(
            "SELECT MIN(rule), notifier, target, channel FROM outbox WHERE alert = ?"
            " AND episode = ? AND kind IN ('event', 'repeat', 'escalation')"
            f" AND state IN {SENT_STATES} AND channel IN ({marks})"
            " GROUP BY notifier, target, channel ORDER BY notifier, target",
            (alert, episode, *sorted(channels)),
        )
        return [(str(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]


class SQLOutbox:
    """store.outbox (base.Outbox) on either SQL store."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        lease: float,
        lanes: Mapping[tuple[str, int], int] | None = None,
        reclaim: bool = True,
    ) -> list[OutboxRow]:
        """Lease due rows for sending, oldest due first: up to lanes[(notifier, target)]
        rows of each target named in lanes, and up to limit rows of all other targets
        (of every target when lanes is None). Each claim counts as an attempt. Rows being
        sent whose lease ran out are due again, unless reclaim is False.

        The messages of one alert to one target go out in the order they were made: a row
        waits (is not claimed) while an earlier row of its alert to the same notifier and
        target is still to be sent (pending or sending, or held by the same rule), so after
        an outage the resolved message follows its opener instead of overtaking it, and
        another rule's page does not wait for a row held until a window opens."""
        update = (
            "UPDATE outbox SET state = 'sending', lease_until = ?, attempts = attempts + 1,"
            " updated_at = ? WHERE id IN (SELECT id FROM outbox AS due WHERE"
            " state IN ('pending', 'sending', 'held') AND next_at <= ?"
            " AND (state <> 'sending' OR lease_until <= ?) {where}"
            f" AND {IN_ORDER}"
            f" ORDER BY next_at LIMIT ?{self.db.dialect.skip_locked}) RETURNING {OUTBOX_COLUMNS}"
        )
        head = (now + lease, now, now, now if reclaim else float("-inf"))

        def claim(q: Query) -> list[OutboxRow]:
            rows: list[Any] = []
            for (notifier, target), n in (lanes or {}).items():
                if n > 0:
                    sql = update.format(where="AND notifier = ? AND target = ?")
                    rows += q(sql, (*head, notifier, target, n)).fetchall()
            if limit > 0:
                where, params = "", []
                if lanes:
                    values = ", ".join("(?, ?)" for _ in lanes)
                    where = f"AND (notifier, target) NOT IN (VALUES {values})"
                    params = [part for key in lanes for part in key]
                rows += q(update.format(where=where), (*head, *params, limit)).fetchall()
            return sorted((OutboxRow(*row) for row in rows), key=lambda r: r.id)

        return await self.db.statements(claim)

    async def release(self, row_ids: Sequence[int], *, now: float) -> int:
        """Give back rows claimed but not sent (a shutdown abandoned them): pending and due
        now, their attempt not counted. Rows whose outcome was recorded meanwhile are left."""
        if not row_ids:
            return 0
        where, param = self.db.dialect.in_("id", row_ids)
        return await self.db.statements(
            lambda q: (
                q(
                    "UPDATE outbox SET state = 'pending',"
                    " attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,"
                    f" lease_until = NULL, next_at = ?, updated_at = ? WHERE state = 'sending'"
                    f" AND {where}",
                    (now, now, param),
                ).rowcount
            )
        )

    async def next_due(self) -> float | None:
        def select(q: Query) -> float | None:
            row = q(
                "SELECT min(CASE state WHEN 'sending' THEN lease_until ELSE next_at END)"
                " FROM outbox WHERE state IN ('pending', 'sending', 'held')",
                (),
            ).fetchone()
            return None if row[0] is None else float(row[0])

        return await self.db.statements(select, write=False)

    async def mark_delivered(
        self, row_id: int, *, now: float, attempt: Attempt | None = None
    ) -> None:
        """The row went out; attempt (if given) joins its log, its status the row's last."""

        def update(q: Query) -> None:
            q(
                "UPDATE outbox SET state = 'delivered', lease_until = NULL, updated_at = ?,"
                " last_error = NULL, last_status = ? WHERE id = ?",
                (now, attempt.status if attempt else None, row_id),
            )
            if attempt is not None:
                attempt_log.record(q, row_id, attempt)

        await self.db.statements(update)

    async def mark_failed(
        self,
        row_id: int,
        *,
        error: str,
        now: float,
        retry_at: float | None,
        attempt: Attempt | None = None,
    ) -> None:
        """The send failed: pending again at retry_at, or dead (None); attempt (if given)
        joins its log, its status the row's last."""
        state = "pending" if retry_at is not None else "dead"

        def update(q: Query) -> None:
            q(
                "UPDATE outbox SET state = ?, next_at = ?, lease_until = NULL, last_error = ?,"
                " last_status = ?, updated_at = ? WHERE id = ?",
                (
                    state,
                    retry_at if retry_at is not None else now,
                    error,
                    attempt.status if attempt else None,
                    now,
                    row_id,
                ),
            )
            if attempt is not None:
                attempt_log.record(q, row_id, attempt)

        await self.db.statements(update)

    async def deliveries(
        self, *, state: str | None = None, event_id: str | None = None, limit: int = 50
    ) -> list[OutboxRow]:
        where, params = [], []
        if state:
            where.append("state = ?")
            params.append(state)
        if event_id:
            where.append("event_id = ?")
            params.append(event_id)
        sql = f"SELECT {OUTBOX_COLUMNS} FROM outbox"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        return await self.db.statements(
            lambda q: [OutboxRow(*row) for row in q(sql, (*params, limit))], write=False
        )

    async def retry_dead(self, row_id: int | None, *, now: float) -> int:
        sql = (
            "UPDATE outbox SET state = 'pending', next_at = ?, attempts = 0, updated_at = ?"
            " WHERE state = 'dead'"
        )
        params: tuple[Any, ...] = (now, now)
        if row_id is not None:
            sql += " AND id = ?"
            params += (row_id,)
        return await self.db.statements(lambda q: q(sql, params).rowcount)

    async def attempts(self, row_ids: Sequence[int]) -> dict[int, list[Attempt]]:
        """The attempt logs of outbox rows, oldest attempt first; a row never tried (or
        unknown) has none."""
        if not row_ids:
            return {}
        where, param = self.db.dialect.in_("outbox_id", row_ids)

        def select(q: Query) -> dict[int, list[Attempt]]:
            found: dict[int, list[Attempt]] = {}
            for row in q(
                f"SELECT {attempt_log.COLUMNS} FROM outbox_attempts WHERE {where}"
                " ORDER BY outbox_id, number",
                (param,),
            ):
                found.setdefault(int(row[0]), []).append(Attempt(*row[1:]))
            return found

        return await self.db.statements(select, write=False)

    async def page(self, query: OutboxQuery) -> list[OutboxRow]:
        """Notifications and deliveries newest first (by id), after query.before."""
        wanted = [
            ("state = ?", query.state),
            ("notifier = ?", query.notifier),
            ("rule = ?", query.rule),
            ("event_id = ?", query.event_id),
            ("alert = ?", query.alert),
            ("channel = ?", query.channel),
            ("id < ?", query.before),
        ]
        conds = [cond for cond, value in wanted if value is not None]
        params = [value for _, value in wanted if value is not None]
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        sql = f"SELECT {OUTBOX_COLUMNS} FROM outbox{where} ORDER BY id DESC LIMIT ?"
        return await self.db.read(lambda q: [OutboxRow(*r) for r in q(sql, (*params, query.limit))])

    async def count_dead(self, notifier: str | None = None) -> int:
        """Dead notifications (of one notifier): what a bulk retry would touch."""
        sql = "SELECT count(*) FROM outbox WHERE state = 'dead'"
        params: tuple[Any, ...] = ()
        if notifier is not None:
            sql += " AND notifier = ?"
            params = (notifier,)
        return int(await self.db.read(lambda q: q(sql, params).fetchone()[0]))

    async def retry_dead_batch(self, notifier: str | None, *, limit: int, now: float) -> int:
        """Queue up to limit dead notifications (of one notifier) again; how many."""
        cond = "state = 'dead'" + (" AND notifier = ?" if notifier is not None else "")
        params: tuple[Any, ...] = (notifier,) if notifier is not None else ()
        sql = (
            "UPDATE outbox SET state = 'pending', next_at = ?, attempts = 0, updated_at = ?"
            f" WHERE id IN (SELECT id FROM outbox WHERE {cond} ORDER BY id LIMIT ?)"
        )
        return await self.db.statements(lambda q: q(sql, (now, now, *params, limit)).rowcount)

    async def counts(self) -> dict[str, int]:
        """Notifications waiting (pending, held, sending) and dead, for the header strip."""

        def select(q: Query) -> dict[str, int]:
            rows = q(
                "SELECT state, count(*) FROM outbox WHERE state IN"
                " ('pending', 'held', 'sending', 'dead') GROUP BY state",
                (),
            )
            counts = dict(rows)
            return {
                "pending": sum(counts.get(s, 0) for s in ("pending", "held", "sending")),
                "dead": counts.get("dead", 0),
            }

        return await self.db.read(select)

    async def episode(self, row_id: int) -> tuple[str, int] | None:
        """(alert, episode) of the row; None for a row of no alert episode, or no row."""

        def select(q: Query) -> tuple[str, int] | None:
            row = q("SELECT alert, episode FROM outbox WHERE id = ?", (row_id,)).fetchone()
            if row is None or row[0] is None or row[1] is None:
                return None
            return str(row[0]), int(row[1])

        return await self.db.read(select)
