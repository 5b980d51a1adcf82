"""One routing transaction on PostgreSQL (receiver.store.base.Tx): the same statements as
SQLite's, plus the locks that let several replicas share the tables."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from receiver.store.postgres.schema import lock_key
from receiver.store.records import (
    SENT_STATES,
    Alert,
    Group,
    Notice,
    Notification,
    Replay,
    Silence,
    StoredEvent,
)

_SELECT_ALERTS = (
    "SELECT id, state, episode, last_ts, opened_ts, opened_event, resolved_ts FROM alerts"
)


def try_lock(conn: Any, name: str) -> bool:
    """Take the named timer's lock for this transaction, if no other replica holds it."""
    return bool(
        conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (lock_key(name),)).fetchone()[0]
    )


class PostgresTx:
    """One routing transaction on PostgreSQL (see receiver.store.base.Tx)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._locked: set[str] = set()  # alerts locked by this transaction
        self._alerts: dict[str, Alert | None] | None = None
        self._changed: dict[str, tuple[Alert, float]] = {}

    def _q(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        return self.conn.execute(sql, params)

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        with self.conn.transaction():
            yield

    def try_lock(self, name: str) -> bool:
        return try_lock(self.conn, name)

    def _lock_alerts(self, alert_ids: Iterable[str]) -> None:
        """Serialize changes to these alerts across replicas (sorted: no deadlock between
        two batches)."""
        todo = sorted(set(alert_ids) - self._locked)
        if todo:
            self._q(
                "SELECT pg_advisory_xact_lock(hashtextextended(id, 0)) FROM unnest(%s::text[])"
                " AS id ORDER BY id",
                (todo,),
            ).fetchall()
            self._locked.update(todo)

    # -- events -----------------------------------------------------------------------------

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        rows = self._q(
            "SELECT id, type, body, received_at, replay FROM events WHERE routed_at IS NULL"
            " AND NOT (id = ANY(%s)) ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED",
            (list(skip), limit),
        )
        return [StoredEvent(*row) for row in rows]

    def mark_routed(self, event_ids: list[str], now: float) -> int:
        return int(
            self._q(
                "UPDATE events SET routed_at = %s WHERE id = ANY(%s) AND routed_at IS NULL",
                (now, event_ids),
            ).rowcount
        )

    def event_body(self, event_id: str) -> str | None:
        row = self._q("SELECT body FROM events WHERE id = %s", (event_id,)).fetchone()
        return None if row is None else str(row[0])

    def replay_request(self, replay_id: int) -> Replay | None:
        row = self._q(
            "SELECT id, event_id, requested_at, respect_lifecycle, routed_at FROM replays"
            " WHERE id = %s",
            (replay_id,),
        ).fetchone()
        return None if row is None else Replay(row[0], row[1], row[2], bool(row[3]), row[4])

    def replay_done(self, replay_id: int, now: float) -> None:
        self._q("UPDATE replays SET routed_at = %s WHERE id = %s", (now, replay_id))
        self._q(
            "UPDATE events SET replay = NULL"
            " WHERE id = (SELECT event_id FROM replays WHERE id = %s) AND replay = %s",
            (replay_id, replay_id),
        )

    def last_received(self) -> float | None:
        row = self._q("SELECT max(received_at) FROM events").fetchone()
        return None if row is None or row[0] is None else float(row[0])

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
        row = self._q(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state, reason,"
            " next_at, created_at, updated_at, kind, alert, episode, group_id, replay) VALUES"
            " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
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
            ),
        ).fetchone()
        return int(row[0])

    def throttled(self, rule: str, key: str, now: float, every: float) -> bool:
        opened = self._q(
            "INSERT INTO throttle (rule, key, until) VALUES (%s, %s, %s)"
            " ON CONFLICT (rule, key) DO UPDATE SET until = EXCLUDED.until"
            " WHERE throttle.until <= %s RETURNING 1",
            (rule, key, now + every, now),
        ).fetchone()
        return opened is None

    def cancel_held(self, alert: str, episode: int, now: float, reason: str) -> int:
        return int(
            self._q(
                "UPDATE outbox SET state = 'cancelled', reason = %s, updated_at = %s"
                " WHERE alert = %s AND episode = %s AND state = 'held' AND kind = 'event'",
                (reason, now, alert, episode),
            ).rowcount
        )

    def sent(self, alert: str, episode: int, rule: str) -> bool:
        row = self._q(
            "SELECT 1 FROM outbox WHERE alert = %s AND episode = %s AND rule = %s"
            " AND kind = 'event' AND state = ANY(%s) LIMIT 1",
            (alert, episode, rule, list(SENT_STATES)),
        ).fetchone()
        return row is not None

    # -- alerts and notices -----------------------------------------------------------------

    def alert(self, alert_id: str) -> Alert | None:
        if self._alerts is not None and alert_id in self._alerts:
            return self._alerts[alert_id]
        self._lock_alerts([alert_id])
        row = self._q(f"{_SELECT_ALERTS} WHERE id = %s", (alert_id,)).fetchone()
        return None if row is None else Alert(*row)

    def save_alert(self, alert: Alert, now: float) -> None:
        if self._alerts is not None and alert.id in self._alerts:
            self._alerts[alert.id] = alert
            self._changed[alert.id] = (alert, now)
            return
        self._lock_alerts([alert.id])
        self._save(alert, now)

    def _save(self, a: Alert, now: float) -> None:
        self._q(
            "INSERT INTO alerts (id, state, episode, last_ts, opened_ts, opened_event,"
            " resolved_ts, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, episode = EXCLUDED.episode,"
            " last_ts = EXCLUDED.last_ts, opened_ts = EXCLUDED.opened_ts,"
            " opened_event = EXCLUDED.opened_event, resolved_ts = EXCLUDED.resolved_ts,"
            " updated_at = EXCLUDED.updated_at",
            (a.id, a.state, a.episode, a.last_ts, a.opened_ts, a.opened_event, a.resolved_ts, now),
        )

    def read_alerts(self, alert_ids: Iterable[str]) -> None:
        ids = sorted(set(alert_ids))
        self._lock_alerts(ids)
        self._alerts = dict.fromkeys(ids)
        for row in self._q(f"{_SELECT_ALERTS} WHERE id = ANY(%s)", (ids,)):
            self._alerts[row[0]] = Alert(*row)

    def write_alerts(self) -> None:
        for alert, now in self._changed.values():
            self._save(alert, now)
        self.forget_alerts()

    def forget_alerts(self) -> None:
        self._alerts = None
        self._changed.clear()

    def open_alerts(self, limit: int = 1000) -> list[Alert]:
        rows = self._q(
            f"{_SELECT_ALERTS} WHERE state = 'open' ORDER BY opened_ts LIMIT %s", (limit,)
        )
        return [Alert(*row) for row in rows]

    def add_notice(
        self, alert: str, episode: int, rule: str, now: float, repeat: float | None
    ) -> None:
        self._q(
            "INSERT INTO notices (alert, episode, rule, notified_at, next_repeat_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (alert, episode, rule, now, None if repeat is None else now + repeat),
        )

    def notices(self, alert: str, episode: int) -> list[Notice]:
        rows = self._q(
            "SELECT alert, episode, rule, notified_at, next_repeat_at, repeats FROM notices"
            " WHERE alert = %s AND episode = %s",
            (alert, episode),
        )
        return [Notice(*row) for row in rows]

    def end_repeats(self, alert: str, episode: int) -> None:
        self._q(
            "UPDATE notices SET next_repeat_at = NULL WHERE alert = %s AND episode = %s",
            (alert, episode),
        )

    def due_repeats(self, now: float, limit: int = 100) -> list[Notice]:
        rows = self._q(
            "SELECT alert, episode, rule, notified_at, next_repeat_at, repeats FROM notices"
            " WHERE next_repeat_at IS NOT NULL AND next_repeat_at <= %s LIMIT %s"
            " FOR UPDATE SKIP LOCKED",
            (now, limit),
        )
        return [Notice(*row) for row in rows]

    def repeated(self, notice: Notice, next_at: float | None) -> None:
        self._q(
            "UPDATE notices SET next_repeat_at = %s, repeats = repeats + 1"
            " WHERE alert = %s AND episode = %s AND rule = %s",
            (next_at, notice.alert, notice.episode, notice.rule),
        )

    # -- digests ----------------------------------------------------------------------------

    def open_group(self, rule: str, key: str, now: float) -> Group | None:
        # One digest per (rule, key) across replicas: whoever looks first holds the key.
        self._q("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (rule, key))
        row = self._q(
            "SELECT id, rule, key, closes_at, count, members FROM groups"
            " WHERE rule = %s AND key = %s AND state = 'open' AND closes_at > %s"
            " ORDER BY id DESC LIMIT 1",
            (rule, key, now),
        ).fetchone()
        if row is None:
            return None
        return Group(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))

    def new_group(self, rule: str, key: str, now: float, closes_at: float) -> Group:
        row = self._q(
            "INSERT INTO groups (rule, key, opened_at, closes_at, count, members, state)"
            " VALUES (%s, %s, %s, %s, 0, '[]', 'open') RETURNING id",
            (rule, key, now, closes_at),
        ).fetchone()
        return Group(int(row[0]), rule, key, closes_at, 0, [])

    def update_group(
        self, group: Group, *, title: str, body: str, now: float, release: bool
    ) -> None:
        self._q(
            "UPDATE groups SET count = %s, members = %s, state = %s WHERE id = %s",
            (group.count, json.dumps(group.members), "sent" if release else "open", group.id),
        )
        self._q(
            "UPDATE outbox SET title = %s, body = %s, updated_at = %s"
            + (", next_at = %s" if release else "")
            + " WHERE group_id = %s AND kind = 'digest' AND state = 'held'",
            (title, body, now, *((now,) if release else ()), group.id),
        )

    # -- silences and named state -----------------------------------------------------------

    def silences(self, now: float) -> list[Silence]:
        rows = self._q(
            "SELECT id, matchers, reason, starts_at, ends_at, expired_at, created_at FROM silences"
            " WHERE expired_at IS NULL AND starts_at <= %s AND ends_at > %s",
            (now, now),
        )
        return [Silence(r[0], json.loads(r[1]), *r[2:]) for r in rows]

    def add_silence(self, matchers: dict[str, Any], reason: str, now: float, until: float) -> int:
        row = self._q(
            "INSERT INTO silences (matchers, reason, created_at, starts_at, ends_at)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (json.dumps(matchers), reason, now, now, until),
        ).fetchone()
        return int(row[0])

    def expire_silence(self, silence_id: int, now: float) -> bool:
        return bool(
            self._q(
                "UPDATE silences SET expired_at = %s WHERE id = %s AND expired_at IS NULL"
                " AND ends_at > %s",
                (now, silence_id, now),
            ).rowcount
            == 1
        )

    def all_silences(self, limit: int = 100) -> list[Silence]:
        rows = self._q(
            "SELECT id, matchers, reason, starts_at, ends_at, expired_at, created_at"
            " FROM silences ORDER BY id DESC LIMIT %s",
            (limit,),
        )
        return [Silence(r[0], json.loads(r[1]), *r[2:]) for r in rows]

    def get_state(self, name: str) -> Any:
        row = self._q("SELECT value FROM state WHERE name = %s", (name,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_state(self, name: str, value: Any) -> None:
        self._q(
            "INSERT INTO state (name, value) VALUES (%s, %s)"
            " ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
            (name, json.dumps(value)),
        )
