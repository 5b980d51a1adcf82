"""What both SQL stores say alike: the transaction's statements (SQLTx) and the outbox's
columns. Written with `?` placeholders; each store's subclass runs them its way (_q) and
adds what is its own: locks between replicas on PostgreSQL, read-ahead caches on SQLite.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from receiver.events import _Event as Event
from receiver.events import iso
from receiver.sessions import Fact
from receiver.store import attempts, views
from receiver.store.records import (
    SENT_STATES,
    Alert,
    Attempt,
    Group,
    Notice,
    Notification,
    OutboxRow,
    Replay,
    Silence,
    Webhook,
)

T = TypeVar("T")

OUTBOX_COLUMNS = (
    "id, event_id, rule, notifier, target, title, body, state, attempts, next_at,"
    " created_at, updated_at, reason, last_error, kind, replay, delivery_id, subscription_id,"
    " last_status"
)
SELECT_ALERTS = (
    "SELECT id, state, episode, last_ts, opened_ts, opened_event, resolved_ts FROM alerts"
)
WEBHOOK_COLUMNS = (
    "id, public_id, url, events, threshold, format, secret, status, created_at, status_reason"
)
_NOTICE_COLUMNS = "alert, episode, rule, notified_at, next_repeat_at, repeats"
_SILENCE_COLUMNS = "id, matchers, reason, starts_at, ends_at, expired_at, created_at"


def event_row(event: Event, raw: bytes, received_at: float) -> tuple[Any, ...]:
    """An accepted event's values for the events table, in its column order: id, type,
    session_id, user_id, score, threshold, event_ts, received_at, body."""
    return (
        event.id,
        event.type,
        event.sessionId,
        event.userId,
        _real(event.score),
        _real(event.threshold),
        iso(event.timestamp),
        received_at,
        raw.decode("utf-8"),
    )


def webhook(row: Sequence[Any]) -> Webhook:
    values = list(row)
    values[3] = json.loads(values[3])
    return Webhook(*values)


def _real(value: float | None) -> float | None:
    """A score for its REAL column; an integer too large even for a float is left out (the
    raw body keeps it), rather than failing the whole group commit."""
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def alert_row(alert: Alert, now: float) -> tuple[Any, ...]:
    """An alert as the alerts table's columns, in order (updated_at: now)."""
    return (
        alert.id,
        alert.state,
        alert.episode,
        alert.last_ts,
        alert.opened_ts,
        alert.opened_event,
        alert.resolved_ts,
        now,
    )


class SQLTx:
    """The statements of a Tx (receiver.store.base) both stores share."""

    # Appended to the repeats due: PostgreSQL's replicas take disjoint ones.
    _skip_locked = ""

    def __init__(self) -> None:
        # A batch's alerts read ahead (read_alerts(); None: known not to exist), and those
        # changed since: a batch reads and writes each alert once, not once an event.
        self._alerts: dict[str, Alert | None] | None = None
        self._changed: dict[str, tuple[Alert, float]] = {}
        # Of those alerts, the ones with held notifications or notices: a resolve looks for
        # them only there (most alerts have neither; each look is a statement, and on
        # PostgreSQL a round trip).
        self._held: set[str] = set()
        self._noticed: set[str] = set()

    def _q(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (`?` placeholders); its cursor."""
        raise NotImplementedError

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement (`?` placeholders) for each of rows."""
        for row in rows:
            self._q(sql, row)

    def _in(self, column: str, values: Iterable[Any]) -> tuple[str, Any]:
        """A condition "column is one of values", and its one parameter."""
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))

    def _read_marks(self, alert_ids: Sequence[str]) -> None:
        """Which of a batch's alerts have held notifications, and which notices."""
        among, listed = self._in("alert", alert_ids)
        self._held = {
            alert
            for (alert,) in self._q(
                f"SELECT DISTINCT alert FROM outbox WHERE {among} AND state = 'held'"
                " AND kind = 'event'",
                (listed,),
            )
        }
        self._noticed = {
            alert
            for (alert,) in self._q(f"SELECT DISTINCT alert FROM notices WHERE {among}", (listed,))
        }

    def _may_have_held(self, alert: str) -> bool:
        return self._alerts is None or alert not in self._alerts or alert in self._held

    def _may_have_notices(self, alert: str) -> bool:
        return self._alerts is None or alert not in self._alerts or alert in self._noticed

    def forget_alerts(self) -> None:
        """Drop what read_alerts() kept, written or not (after rolling its writes back)."""
        self._alerts = None
        self._changed.clear()
        self._held.clear()
        self._noticed.clear()

    def _lock_group(self, rule: str, key: str) -> None:
        pass

    # -- events -----------------------------------------------------------------------------

    # PostgreSQL: replicas folding the same session take turns (views.project).
    _lock_sessions = False

    def project(self, facts: Sequence[Fact]) -> None:
        """Fold routed events into the session projection (the read API's)."""
        views.project(self._q, self._in, facts, lock=self._lock_sessions)

    # -- webhook subscribers (the fan-out: receiver.dispatch.fanout) ------------------------

    def subscriptions(self) -> list[Webhook]:
        return [
            webhook(row)
            for row in self._q(
                f"SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE status = 'active' ORDER BY id"
            )
        ]

    def sides(
        self, webhook_ids: Iterable[int], session_ids: Iterable[str]
    ) -> dict[tuple[int, str], tuple[bool, str]]:
        hooks, hook_param = self._in("webhook_id", webhook_ids)
        sessions, session_param = self._in("session_id", session_ids)
        return {
            (hook_id, session_id): (bool(below), mark)
            for hook_id, session_id, below, mark in self._q(
                f"SELECT webhook_id, session_id, below, mark FROM webhook_sides WHERE {hooks}"
                f" AND {sessions}",
                (hook_param, session_param),
            )
        }

    def save_sides(self, changed: Mapping[tuple[int, str], tuple[bool, str]]) -> None:
        for (hook_id, session_id), (below, mark) in changed.items():
            self._q(
                "INSERT INTO webhook_sides (webhook_id, session_id, below, mark)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (webhook_id, session_id) DO UPDATE"
                " SET below = excluded.below, mark = excluded.mark",
                (hook_id, session_id, int(below), mark),
            )

    def mark_routed(self, event_ids: list[str], now: float) -> int:
        """Mark these events routed; how many were not already."""
        where, param = self._in("id", event_ids)
        return int(
            self._q(
                f"UPDATE events SET routed_at = ? WHERE {where} AND routed_at IS NULL",
                (now, param),
            ).rowcount
        )

    def event_body(self, event_id: str) -> str | None:
        row = self._q("SELECT body FROM events WHERE id = ?", (event_id,)).fetchone()
        return None if row is None else str(row[0])

    def replay_request(self, replay_id: int) -> Replay | None:
        row = self._q(
            "SELECT id, event_id, requested_at, respect_lifecycle, routed_at FROM replays"
            " WHERE id = ?",
            (replay_id,),
        ).fetchone()
        return None if row is None else Replay(row[0], row[1], row[2], bool(row[3]), row[4])

    def replay_done(self, replay_id: int, now: float) -> None:
        """The replay request is routed: note when, and clear it from its event."""
        self._q("UPDATE replays SET routed_at = ? WHERE id = ?", (now, replay_id))
        self._q(
            "UPDATE events SET replay = NULL"
            " WHERE id = (SELECT event_id FROM replays WHERE id = ?) AND replay = ?",
            (replay_id, replay_id),
        )

    # -- the outbox -------------------------------------------------------------------------

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
            self._held.add(alert)
        row = self._q(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state, reason,"
            " next_at, created_at, updated_at, kind, alert, episode, group_id, replay,"
            " delivery_id, subscription_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
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
            ),
        ).fetchone()
        return int(row[0])

    def add_many(
        self, items: Sequence[tuple[str, Notification]], *, state: str, now: float, kind: str
    ) -> None:
        """Queue many notifications alike but for their event and content (a fan-out),
        in one statement run for each: no ids come back."""
        self._many(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state,"
            " next_at, created_at, updated_at, kind, delivery_id, subscription_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (event_id, n.rule, n.notifier, n.target, n.title, n.body, state, now, now, now,
                 kind, n.delivery_id, n.subscription_id)
                for event_id, n in items
            ],
        )  # fmt: skip

    def throttled(self, rule: str, key: str, now: float, every: float) -> bool:
        """True if (rule, key) notified within the last `every` seconds; else open a window.
        One statement: under PostgreSQL's row lock, one replica opens a window at a time."""
        opened = self._q(
            "INSERT INTO throttle (rule, key, until) VALUES (?, ?, ?)"
            " ON CONFLICT (rule, key) DO UPDATE SET until = excluded.until"
            " WHERE throttle.until <= ? RETURNING 1",
            (rule, key, now + every, now),
        ).fetchone()
        return opened is None

    def cancel_held(self, alert: str, episode: int, now: float, reason: str) -> int:
        if not self._may_have_held(alert):
            return 0
        return int(
            self._q(
                "UPDATE outbox SET state = 'cancelled', reason = ?, updated_at = ?"
                " WHERE alert = ? AND episode = ? AND state = 'held' AND kind = 'event'",
                (reason, now, alert, episode),
            ).rowcount
        )

    def sent(self, alert: str, episode: int, rule: str) -> bool:
        """Whether rule's notification about this episode went out (or is on its way)."""
        row = self._q(
            "SELECT 1 FROM outbox WHERE alert = ? AND episode = ? AND rule = ? AND kind = 'event'"
            f" AND state IN {SENT_STATES} LIMIT 1",
            (alert, episode, rule),
        ).fetchone()
        return row is not None

    # -- alerts and notices -----------------------------------------------------------------

    def open_alerts(self, limit: int = 1000) -> list[Alert]:
        rows = self._q(f"{SELECT_ALERTS} WHERE state = 'open' ORDER BY opened_ts LIMIT ?", (limit,))
        return [Alert(*row) for row in rows]

    def add_notice(
        self, alert: str, episode: int, rule: str, now: float, repeat: float | None
    ) -> None:
        self._noticed.add(alert)
        self._q(
            "INSERT INTO notices (alert, episode, rule, notified_at, next_repeat_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (alert, episode, rule, now, None if repeat is None else now + repeat),
        )

    def notices(self, alert: str, episode: int) -> list[Notice]:
        if not self._may_have_notices(alert):
            return []
        rows = self._q(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE alert = ? AND episode = ?",
            (alert, episode),
        )
        return [Notice(*row) for row in rows]

    def end_repeats(self, alert: str, episode: int) -> None:
        if self._may_have_notices(alert):
            self._q(
                "UPDATE notices SET next_repeat_at = NULL WHERE alert = ? AND episode = ?",
                (alert, episode),
            )

    def due_repeats(self, now: float, limit: int = 100) -> list[Notice]:
        rows = self._q(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE next_repeat_at IS NOT NULL"
            " AND next_repeat_at <= ? AND NOT EXISTS (SELECT 1 FROM acks"
            " WHERE acks.alert = notices.alert AND acks.episode = notices.episode)"
            f" LIMIT ?{self._skip_locked}",
            (now, limit),
        )
        return [Notice(*row) for row in rows]

    def repeated(self, notice: Notice, next_at: float | None) -> None:
        self._q(
            "UPDATE notices SET next_repeat_at = ?, repeats = repeats + 1"
            " WHERE alert = ? AND episode = ? AND rule = ?",
            (next_at, notice.alert, notice.episode, notice.rule),
        )

    # -- digests ----------------------------------------------------------------------------

    def open_group(self, rule: str, key: str, now: float) -> Group | None:
        self._lock_group(rule, key)
        row = self._q(
            "SELECT id, rule, key, closes_at, count, members FROM groups"
            " WHERE rule = ? AND key = ? AND state = 'open' AND closes_at > ?"
            " ORDER BY id DESC LIMIT 1",
            (rule, key, now),
        ).fetchone()
        if row is None:
            return None
        return Group(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))

    def new_group(self, rule: str, key: str, now: float, closes_at: float) -> Group:
        row = self._q(
            "INSERT INTO groups (rule, key, opened_at, closes_at, count, members, state)"
            " VALUES (?, ?, ?, ?, 0, '[]', 'open') RETURNING id",
            (rule, key, now, closes_at),
        ).fetchone()
        return Group(int(row[0]), rule, key, closes_at, 0, [])

    def update_group(
        self, group: Group, *, title: str, body: str, now: float, release: bool
    ) -> None:
        self._q(
            "UPDATE groups SET count = ?, members = ?, state = ? WHERE id = ?",
            (group.count, json.dumps(group.members), "sent" if release else "open", group.id),
        )
        self._q(
            "UPDATE outbox SET title = ?, body = ?, updated_at = ?"
            + (", next_at = ?" if release else "")
            + " WHERE group_id = ? AND kind = 'digest' AND state = 'held'",
            (title, body, now, *((now,) if release else ()), group.id),
        )

    # -- silences and named state -----------------------------------------------------------

    def silences(self, now: float) -> list[Silence]:
        rows = self._q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences"
            " WHERE expired_at IS NULL AND starts_at <= ? AND ends_at > ?",
            (now, now),
        )
        return [Silence(r[0], json.loads(r[1]), *r[2:]) for r in rows]

    def add_silence(self, matchers: dict[str, Any], reason: str, now: float, until: float) -> int:
        row = self._q(
            "INSERT INTO silences (matchers, reason, created_at, starts_at, ends_at)"
            " VALUES (?, ?, ?, ?, ?) RETURNING id",
            (json.dumps(matchers), reason, now, now, until),
        ).fetchone()
        return int(row[0])

    def expire_silence(self, silence_id: int, now: float) -> bool:
        # Its end moves to now too: retention prunes silences by their end, and one that
        # was to end in the year 9999 (or later) must go once expired like any other.
        done = self._q(
            "UPDATE silences SET expired_at = ?, ends_at = ? WHERE id = ? AND expired_at IS NULL"
            " AND ends_at > ?",
            (now, now, silence_id, now),
        )
        return bool(done.rowcount == 1)

    def all_silences(self, limit: int = 100) -> list[Silence]:
        rows = self._q(
            f"SELECT {_SILENCE_COLUMNS} FROM silences ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [Silence(r[0], json.loads(r[1]), *r[2:]) for r in rows]

    def get_state(self, name: str) -> Any:
        row = self._q("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_state(self, name: str, value: Any) -> None:
        self._q(
            "INSERT INTO state (name, value) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, json.dumps(value)),
        )


Query = Callable[[str, Sequence[Any]], Any]  # (sql with ? placeholders, params) -> cursor


# A due row whose alert has an earlier message to the same target still to be sent waits
# for it. The index below holds only rows still to be sent, so the check is one short range
# whatever the history; without it SQLite walked every earlier row of the target (0.6 s a
# claim with 50,000 rows kept, against 5 ms).
OUTBOX_ORDER_SCHEMA = """
CREATE INDEX outbox_alert_waiting ON outbox (alert, notifier, target, id)
    WHERE alert IS NOT NULL AND state IN ('pending', 'sending', 'held')
"""
_IN_ORDER = (
    "(due.alert IS NULL OR NOT EXISTS (SELECT 1 FROM outbox AS earlier"
    " WHERE earlier.alert = due.alert AND earlier.notifier = due.notifier"
    " AND earlier.target = due.target AND earlier.id < due.id"
    " AND earlier.state IN ('pending', 'sending', 'held')))"
)


class SQLOutbox:
    """The Store's outbox and operator methods both stores share (claims under a lease,
    outcomes, listings), over the store's own way to run statements (_statements)."""

    # In a claim's subquery: PostgreSQL's replicas claim disjoint rows.
    _claim_lock = ""

    async def _statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        """fn(query) in one transaction of the store."""
        raise NotImplementedError

    def _in(self, column: str, values: Iterable[Any]) -> tuple[str, Any]:
        return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))

    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        lease: float,
        lanes: Mapping[tuple[str, int], int] | None = None,
    ) -> list[OutboxRow]:
        """Lease due rows for sending, oldest due first: up to lanes[(notifier, target)]
        rows of each target named in lanes, and up to limit rows of all other targets
        (of every target when lanes is None). Each claim counts as an attempt.

        The messages of one alert to one target go out in the order they were made: a row
        waits (is not claimed) while an earlier row of its alert to the same notifier and
        target is still to be sent (pending, held, or sending), so after an outage the
        resolved message follows its opener instead of overtaking it."""
        update = (
            "UPDATE outbox SET state = 'sending', lease_until = ?, attempts = attempts + 1,"
            " updated_at = ? WHERE id IN (SELECT id FROM outbox AS due WHERE"
            " state IN ('pending', 'sending', 'held') AND next_at <= ?"
            " AND (state <> 'sending' OR lease_until <= ?) {where}"
            f" AND {_IN_ORDER}"
            f" ORDER BY next_at LIMIT ?{self._claim_lock}) RETURNING {OUTBOX_COLUMNS}"
        )
        head = (now + lease, now, now, now)

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

        return await self._statements(claim)

    async def release(self, row_ids: Sequence[int], *, now: float) -> int:
        """Give back rows claimed but not sent (a shutdown abandoned them): pending and due
        now, their attempt not counted. Rows whose outcome was recorded meanwhile are left."""
        if not row_ids:
            return 0
        where, param = self._in("id", row_ids)
        return await self._statements(
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

        return await self._statements(select, write=False)

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
                attempts.record(q, row_id, attempt)

        await self._statements(update)

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
                attempts.record(q, row_id, attempt)

        await self._statements(update)

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
        return await self._statements(
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
        return await self._statements(lambda q: q(sql, params).rowcount)

    async def replay_status(self, replay_id: int) -> tuple[Replay | None, list[OutboxRow]]:
        """A replay request as it stands, and the outbox rows it has produced so far."""

        def select(q: Query) -> tuple[Replay | None, list[OutboxRow]]:
            found = q(
                "SELECT id, event_id, requested_at, respect_lifecycle, routed_at FROM replays"
                " WHERE id = ?",
                (replay_id,),
            ).fetchone()
            request = (
                None
                if found is None
                else Replay(found[0], found[1], found[2], bool(found[3]), found[4])
            )
            rows = q(
                f"SELECT {OUTBOX_COLUMNS} FROM outbox WHERE replay = ? ORDER BY id", (replay_id,)
            )
            return request, [OutboxRow(*row) for row in rows]

        return await self._statements(select, write=False)
