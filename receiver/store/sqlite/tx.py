"""One routing transaction on the SQLite store: the reads and writes the router and the alert
lifecycle make, inside one store transaction so each batch commits as a whole."""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

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

_savepoints = itertools.count(1)

_SELECT_ALERTS = (
    "SELECT id, state, episode, last_ts, opened_ts, opened_event, resolved_ts FROM alerts"
)
_UPDATE_ALERT = (
    "UPDATE alerts SET state = ?, episode = ?, last_ts = ?, opened_ts = ?, opened_event = ?,"
    " resolved_ts = ?, updated_at = ? WHERE id = ?"
)
_SAVE_ALERT = (
    "INSERT OR REPLACE INTO alerts (id, state, episode, last_ts, opened_ts, opened_event,"
    " resolved_ts, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _alert_row(alert: Alert, now: float) -> tuple[Any, ...]:
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


class SQLiteTx:
    """Synchronous helpers over one connection with an open write transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        # Alerts read ahead for a batch (None: known not to exist), and those changed since:
        # a batch reads and writes each alert once, not once an event.
        self._alerts: dict[str, Alert | None] | None = None
        self._changed: dict[str, tuple[Alert, float]] = {}
        # Of those alerts, the ones with held notifications or notices: a resolve looks for
        # them only there (most alerts have neither, and it saves four statements).
        self._found: set[str] = set()
        self._held: set[str] = set()
        self._noticed: set[str] = set()

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        name = f"sp{next(_savepoints)}"
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.conn.execute(f"ROLLBACK TO {name}")
            self.conn.execute(f"RELEASE {name}")
            raise
        self.conn.execute(f"RELEASE {name}")

    def try_lock(self, name: str) -> bool:
        return True  # one process holds the database's write lock for the transaction

    # -- events ------------------------------------------------------------------------------

    def unrouted(self, limit: int, skip: Iterable[str] = ()) -> list[StoredEvent]:
        skip = set(skip)
        rows = self.conn.execute(
            "SELECT id, type, body, received_at, replay FROM events WHERE routed_at IS NULL"
            " ORDER BY received_at LIMIT ?",
            (limit + len(skip),),
        )
        return [StoredEvent(*row) for row in rows if row[0] not in skip][:limit]

    def mark_routed(self, event_ids: list[str], now: float) -> int:
        """Mark these events routed; how many were not already."""
        cur = self.conn.execute(
            "UPDATE events SET routed_at = ? WHERE id IN (SELECT value FROM json_each(?))"
            " AND routed_at IS NULL",
            (now, json.dumps(event_ids)),
        )
        return cur.rowcount

    def event_body(self, event_id: str) -> str | None:
        row = self.conn.execute("SELECT body FROM events WHERE id = ?", (event_id,)).fetchone()
        return None if row is None else str(row[0])

    def replay_request(self, replay_id: int) -> Replay | None:
        row = self.conn.execute(
            "SELECT id, event_id, requested_at, respect_lifecycle, routed_at FROM replays"
            " WHERE id = ?",
            (replay_id,),
        ).fetchone()
        return None if row is None else Replay(row[0], row[1], row[2], bool(row[3]), row[4])

    def replay_done(self, replay_id: int, now: float) -> None:
        """The replay request is routed: note when, and clear it from its event."""
        self.conn.execute("UPDATE replays SET routed_at = ? WHERE id = ?", (now, replay_id))
        self.conn.execute(
            "UPDATE events SET replay = NULL"
            " WHERE id = (SELECT event_id FROM replays WHERE id = ?) AND replay = ?",
            (replay_id, replay_id),
        )

    def last_received(self) -> float | None:
        # rowid order is arrival order, so this reads one row, not the table.
        row = self.conn.execute(
            "SELECT received_at FROM events ORDER BY rowid DESC LIMIT 1"
        ).fetchone()
        return None if row is None else float(row[0])

    # -- the outbox ----------------------------------------------------------------------------

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
        cur = self.conn.execute(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state, reason,"
            " next_at, created_at, updated_at, kind, alert, episode, group_id, replay)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        )
        return int(cur.lastrowid or 0)

    def throttled(self, rule: str, key: str, now: float, every: float) -> bool:
        """True if (rule, key) notified within the last `every` seconds; else open a window."""
        held = self.conn.execute(
            "SELECT until FROM throttle WHERE rule = ? AND key = ?", (rule, key)
        ).fetchone()
        if held is not None and held[0] > now:
            return True
        self.conn.execute(
            "INSERT OR REPLACE INTO throttle (rule, key, until) VALUES (?, ?, ?)",
            (rule, key, now + every),
        )
        return False

    def cancel_held(self, alert: str, episode: int, now: float, reason: str) -> int:
        if self._alerts is not None and alert in self._alerts and alert not in self._held:
            return 0
        return self.conn.execute(
            "UPDATE outbox SET state = 'cancelled', reason = ?, updated_at = ?"
            " WHERE alert = ? AND episode = ? AND state = 'held' AND kind = 'event'",
            (reason, now, alert, episode),
        ).rowcount

    def sent(self, alert: str, episode: int, rule: str) -> bool:
        """Whether rule's notification about this episode went out (or is on its way)."""
        row = self.conn.execute(
            "SELECT 1 FROM outbox WHERE alert = ? AND episode = ? AND rule = ? AND kind = 'event'"
            f" AND state IN {SENT_STATES} LIMIT 1",
            (alert, episode, rule),
        ).fetchone()
        return row is not None

    # -- alerts and notices ----------------------------------------------------------------------

    def alert(self, alert_id: str) -> Alert | None:
        if self._alerts is not None and alert_id in self._alerts:
            return self._alerts[alert_id]
        row = self.conn.execute(f"{_SELECT_ALERTS} WHERE id = ?", (alert_id,)).fetchone()
        return None if row is None else Alert(*row)

    def save_alert(self, alert: Alert, now: float) -> None:
        if self._alerts is not None and alert.id in self._alerts:
            self._alerts[alert.id] = alert
            self._changed[alert.id] = (alert, now)
            return
        self.conn.execute(_SAVE_ALERT, _alert_row(alert, now))

    def read_alerts(self, alert_ids: Iterable[str]) -> None:
        """Read these alerts ahead; until write_alerts(), alert() and save_alert() keep them
        in memory (the batch must then be written, or its savepoint rolled back)."""
        ids = list(set(alert_ids))
        listed = json.dumps(ids)
        self._alerts = dict.fromkeys(ids)
        rows = self.conn.execute(
            f"{_SELECT_ALERTS} WHERE id IN (SELECT value FROM json_each(?))", (listed,)
        )
        for row in rows:
            self._alerts[row[0]] = Alert(*row)
        self._found = {key for key, alert in self._alerts.items() if alert is not None}
        self._held = {
            alert
            for (alert,) in self.conn.execute(
                "SELECT DISTINCT alert FROM outbox WHERE alert IN (SELECT value FROM json_each(?))"
                " AND state = 'held' AND kind = 'event'",
                (listed,),
            )
        }
        self._noticed = {
            alert
            for (alert,) in self.conn.execute(
                "SELECT DISTINCT alert FROM notices WHERE alert IN"
                " (SELECT value FROM json_each(?))",
                (listed,),
            )
        }

    def write_alerts(self) -> None:
        """Write the alerts changed since read_alerts(), and stop keeping them."""
        assert self._alerts is not None
        found = self._found
        changed = self._changed.values()
        # UPDATE in place where the row exists: REPLACE would delete and reinsert it, and
        # its index entries with it.
        self.conn.executemany(
            _UPDATE_ALERT, [_alert_row(a, now)[1:] + (a.id,) for a, now in changed if a.id in found]
        )
        self.conn.executemany(
            _SAVE_ALERT, [_alert_row(a, now) for a, now in changed if a.id not in found]
        )
        self.forget_alerts()

    def forget_alerts(self) -> None:
        """Drop what read_alerts() kept, written or not (after rolling its writes back)."""
        self._alerts = None
        self._changed.clear()
        self._held.clear()
        self._noticed.clear()

    def open_alerts(self, limit: int = 1000) -> list[Alert]:
        rows = self.conn.execute(
            f"{_SELECT_ALERTS} WHERE state = 'open' ORDER BY opened_ts LIMIT ?", (limit,)
        )
        return [Alert(*row) for row in rows]

    def add_notice(
        self, alert: str, episode: int, rule: str, now: float, repeat: float | None
    ) -> None:
        self._noticed.add(alert)
        self.conn.execute(
            "INSERT OR IGNORE INTO notices (alert, episode, rule, notified_at, next_repeat_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (alert, episode, rule, now, None if repeat is None else now + repeat),
        )

    def notices(self, alert: str, episode: int) -> list[Notice]:
        if self._alerts is not None and alert in self._alerts and alert not in self._noticed:
            return []
        rows = self.conn.execute(
            "SELECT alert, episode, rule, notified_at, next_repeat_at, repeats FROM notices"
            " WHERE alert = ? AND episode = ?",
            (alert, episode),
        )
        return [Notice(*row) for row in rows]

    def end_repeats(self, alert: str, episode: int) -> None:
        if self._alerts is not None and alert in self._alerts and alert not in self._noticed:
            return
        self.conn.execute(
            "UPDATE notices SET next_repeat_at = NULL WHERE alert = ? AND episode = ?",
            (alert, episode),
        )

    def due_repeats(self, now: float, limit: int = 100) -> list[Notice]:
        rows = self.conn.execute(
            "SELECT alert, episode, rule, notified_at, next_repeat_at, repeats FROM notices"
            " WHERE next_repeat_at IS NOT NULL AND next_repeat_at <= ? LIMIT ?",
            (now, limit),
        )
        return [Notice(*row) for row in rows]

    def repeated(self, notice: Notice, next_at: float | None) -> None:
        self.conn.execute(
            "UPDATE notices SET next_repeat_at = ?, repeats = repeats + 1"
            " WHERE alert = ? AND episode = ? AND rule = ?",
            (next_at, notice.alert, notice.episode, notice.rule),
        )

    # -- digests ------------------------------------------------------------------------------

    def open_group(self, rule: str, key: str, now: float) -> Group | None:
        row = self.conn.execute(
            "SELECT id, rule, key, closes_at, count, members FROM groups"
            " WHERE rule = ? AND key = ? AND state = 'open' AND closes_at > ?"
            " ORDER BY id DESC LIMIT 1",
            (rule, key, now),
        ).fetchone()
        if row is None:
            return None
        return Group(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))

    def new_group(self, rule: str, key: str, now: float, closes_at: float) -> Group:
        cur = self.conn.execute(
            "INSERT INTO groups (rule, key, opened_at, closes_at, count, members, state)"
            " VALUES (?, ?, ?, ?, 0, '[]', 'open')",
            (rule, key, now, closes_at),
        )
        return Group(int(cur.lastrowid or 0), rule, key, closes_at, 0, [])

    def update_group(
        self, group: Group, *, title: str, body: str, now: float, release: bool
    ) -> None:
        self.conn.execute(
            "UPDATE groups SET count = ?, members = ?, state = ? WHERE id = ?",
            (group.count, json.dumps(group.members), "sent" if release else "open", group.id),
        )
        self.conn.execute(
            "UPDATE outbox SET title = ?, body = ?, updated_at = ?"
            + (", next_at = ?" if release else "")
            + " WHERE group_id = ? AND kind = 'digest' AND state = 'held'",
            (title, body, now, *((now,) if release else ()), group.id),
        )

    # -- silences and named state -------------------------------------------------------------

    def silences(self, now: float) -> list[Silence]:
        rows = self.conn.execute(
            "SELECT id, matchers, reason, starts_at, ends_at, expired_at, created_at FROM silences"
            " WHERE expired_at IS NULL AND starts_at <= ? AND ends_at > ?",
            (now, now),
        )
        return [Silence(r[0], json.loads(r[1]), *r[2:]) for r in rows]

    def add_silence(self, matchers: dict[str, Any], reason: str, now: float, until: float) -> int:
        cur = self.conn.execute(
            "INSERT INTO silences (matchers, reason, created_at, starts_at, ends_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (json.dumps(matchers), reason, now, now, until),
        )
        return int(cur.lastrowid or 0)

    def expire_silence(self, silence_id: int, now: float) -> bool:
        return (
            self.conn.execute(
                "UPDATE silences SET expired_at = ? WHERE id = ? AND expired_at IS NULL"
                " AND ends_at > ?",
                (now, silence_id, now),
            ).rowcount
            == 1
        )

    def all_silences(self, limit: int = 100) -> list[Silence]:
        rows = self.conn.execute(
            "SELECT id, matchers, reason, starts_at, ends_at, expired_at, created_at"
            " FROM silences ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [Silence(r[0], json.loads(r[1]), *r[2:]) for r in rows]

    def get_state(self, name: str) -> Any:
        row = self.conn.execute("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_state(self, name: str, value: Any) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO state (name, value) VALUES (?, ?)", (name, json.dumps(value))
        )
