"""Alerts on either SQL store: the lifecycle's alerts and notices inside a routing
transaction (tx.alerts, tx.notices), with the read-ahead a batch shares between them and
the outbox, and what operators do to alerts (store.alerts): acknowledgements, snoozes and
the record of every action."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from receiver.store.escalations import (
    CHAIN_COLUMNS,
    FIRST,
    WAITING_AFTER,
    WAITING_ORDER,
    read_chain,
)
from receiver.store.flaps import FLAP_COLUMNS, Flap, read_flap
from receiver.store.records import Ack, Action, Alert, Chain, Notice, Waiting
from receiver.store.statements import Query, Runner, Statements

SELECT_ALERTS = (
    "SELECT id, state, episode, last_ts, opened_ts, opened_event, resolved_ts FROM alerts"
)
_NOTICE_COLUMNS = (
    "alert, episode, rule, notified_at, next_repeat_at, repeats, suppressed_since, suppressed_why,"
    " suppressed_event"
)
_ACTION_COLUMNS = "alert, episode, action, source, actor, at, outcome, until"
# Escalations an ack or a snooze moves: all but those waiting for a silence to end. One that
# resumed keeps its suppressed_since (its first page says "was silenced since") until that
# page, and must wait for a snooze like any other.
_NOT_WAITING = " AND (next_at IS NOT NULL OR suppressed_since IS NULL)"

# Every action on an alert (ack, resolve, snooze), from a link, the admin page, the API or
# the CLI, newest last; {id}: each store's integer identity.
ACTIONS_SCHEMA = """
    CREATE TABLE alert_actions (
        id {id},
        alert TEXT NOT NULL,
        episode INTEGER NOT NULL,
        action TEXT NOT NULL,
        source TEXT NOT NULL,
        actor TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        outcome TEXT NOT NULL,
        until DOUBLE PRECISION
    );
    CREATE INDEX alert_actions_alert ON alert_actions (alert, id);
"""


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


class ReadAhead:
    """A batch's alerts read ahead (tx.alerts.read_ahead(); None: known not to exist), and
    those changed since: a batch reads and writes each alert once, not once an event. Of
    those alerts, the ones with held notifications or notices: a resolve looks for them
    only there (most alerts have neither; each look is a statement, and on PostgreSQL a
    round trip). Shared by the transaction's alerts, notices and outbox."""

    def __init__(self) -> None:
        self.alerts: dict[str, Alert | None] | None = None
        self.changed: dict[str, tuple[Alert, float]] = {}
        self.held: set[str] = set()
        self.noticed: set[str] = set()

    def read_marks(self, st: Statements, alert_ids: Sequence[str]) -> None:
        """Which of a batch's alerts have held notifications, and which notices."""
        among, listed = st.dialect.in_("alert", alert_ids)
        self.held = {
            alert
            for (alert,) in st.q(
                f"SELECT DISTINCT alert FROM outbox WHERE {among} AND state = 'held'"
                " AND kind = 'event'",
                (listed,),
            )
        }
        self.noticed = {
            alert
            for (alert,) in st.q(f"SELECT DISTINCT alert FROM notices WHERE {among}", (listed,))
        }

    def may_have_held(self, alert: str) -> bool:
        return self.alerts is None or alert not in self.alerts or alert in self.held

    def may_have_notices(self, alert: str) -> bool:
        return self.alerts is None or alert not in self.alerts or alert in self.noticed

    def clear(self) -> None:
        self.alerts = None
        self.changed.clear()
        self.held.clear()
        self.noticed.clear()

    def keep(self, alert: Alert, now: float) -> bool:
        """Keep a changed alert read ahead, to be written at flush(); False if it was not
        read ahead (the caller writes it now)."""
        if self.alerts is None or alert.id not in self.alerts:
            return False
        self.alerts[alert.id] = alert
        self.changed[alert.id] = (alert, now)
        return True


class SQLTxAlerts:
    """What tx.alerts (base.TxAlerts) says alike on both stores; each store's subclass
    reads, writes and (PostgreSQL) locks alerts its way."""

    def __init__(self, st: Statements, ahead: ReadAhead) -> None:
        self.st = st
        self.ahead = ahead

    def forget(self) -> None:
        """Drop what read_ahead() kept, written or not (after rolling its writes back)."""
        self.ahead.clear()

    def peek(self, alert_id: str) -> Alert | None:
        """The alert as this transaction sees it (read ahead, else stored), unlocked."""
        kept = self.ahead.alerts
        if kept is not None and alert_id in kept:
            return kept[alert_id]
        row = self.st.q(f"{SELECT_ALERTS} WHERE id = ?", (alert_id,)).fetchone()
        return None if row is None else Alert(*row)

    def list_open(self, limit: int = 1000) -> list[Alert]:
        rows = self.st.q(
            f"{SELECT_ALERTS} WHERE state = 'open' ORDER BY opened_ts LIMIT ?", (limit,)
        )
        return [Alert(*row) for row in rows]

    def ack(self, alert_id: str, *, by: str, now: float) -> Ack | None:
        return ack(self.st.q, alert_id, by, now)

    def snooze(self, alert_id: str, *, until: float) -> int | None:
        return snooze(self.st.q, alert_id, until)

    def record(self, action: Action) -> None:
        record(self.st.q, action)


class SQLTxNotices:
    """tx.notices (base.TxNotices) on either SQL store."""

    def __init__(self, st: Statements, ahead: ReadAhead) -> None:
        self.st = st
        self.ahead = ahead

    def add(self, alert: str, episode: int, rule: str, now: float, repeat: float | None) -> None:
        self.ahead.noticed.add(alert)
        # The first note stands, unless it was a suppressed one: now it has been notified.
        self.st.q(
            "INSERT INTO notices (alert, episode, rule, notified_at, next_repeat_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (alert, episode, rule) DO UPDATE SET"
            " notified_at = excluded.notified_at, next_repeat_at = excluded.next_repeat_at,"
            " suppressed_since = NULL, suppressed_why = NULL, suppressed_event = NULL"
            " WHERE notices.suppressed_since IS NOT NULL",
            (alert, episode, rule, now, None if repeat is None else now + repeat),
        )

    def suppress(
        self, alert: str, episode: int, rule: str, now: float, why: str, event: str | None = None
    ) -> None:
        self.ahead.noticed.add(alert)
        self.st.q(
            "INSERT INTO notices (alert, episode, rule, notified_at, suppressed_since,"
            " suppressed_why, suppressed_event) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (alert, episode, rule, now, now, why, event),
        )

    def suppressed(self, after: Waiting | None, limit: int = 200) -> list[Notice]:
        rows = self.st.q(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE suppressed_since IS NOT NULL"
            f" AND {WAITING_AFTER} ORDER BY {WAITING_ORDER} LIMIT ?",
            (*(after or FIRST), limit),
        )
        return [Notice(*row) for row in rows]

    def woke(self, notice: Notice, now: float, repeat: float | None) -> None:
        """A suppressed notice's silence ended: notified now (repeat: its next repeat in),
        or, when repeat is None and nothing was sent, just no longer waiting."""
        self.st.q(
            "UPDATE notices SET suppressed_since = NULL, suppressed_why = NULL,"
            " suppressed_event = NULL, notified_at = ?, next_repeat_at = ?"
            " WHERE alert = ? AND episode = ? AND rule = ?",
            (
                now,
                None if repeat is None else now + repeat,
                notice.alert,
                notice.episode,
                notice.rule,
            ),
        )

    def of(self, alert: str, episode: int) -> list[Notice]:
        if not self.ahead.may_have_notices(alert):
            return []
        rows = self.st.q(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE alert = ? AND episode = ?",
            (alert, episode),
        )
        return [Notice(*row) for row in rows]

    def end_repeats(self, alert: str, episode: int) -> None:
        if self.ahead.may_have_notices(alert):
            self.st.q(
                "UPDATE notices SET next_repeat_at = NULL WHERE alert = ? AND episode = ?",
                (alert, episode),
            )

    def due(self, now: float, limit: int = 100) -> list[Notice]:
        rows = self.st.q(
            f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE next_repeat_at IS NOT NULL"
            " AND next_repeat_at <= ? AND NOT EXISTS (SELECT 1 FROM acks"
            " WHERE acks.alert = notices.alert AND acks.episode = notices.episode)"
            f" LIMIT ?{self.st.dialect.skip_locked}",
            (now, limit),
        )
        return [Notice(*row) for row in rows]

    def repeated(self, notice: Notice, next_at: float | None) -> None:
        self.st.q(
            "UPDATE notices SET next_repeat_at = ?, repeats = repeats + 1"
            " WHERE alert = ? AND episode = ? AND rule = ?",
            (next_at, notice.alert, notice.episode, notice.rule),
        )


class SQLAlerts:
    """store.alerts (base.Alerts) on either SQL store."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def ack(self, alert_id: str, *, by: str, now: float) -> Ack | None:
        """Acknowledge an open alert: its repeats stop, and it shows who acked it and when,
        until it resolves. None if no alert of that id is open; else the episode's ack,
        made by this call or not (Ack.made)."""
        return await self.db.statements(lambda q: ack(q, alert_id, by, now))

    async def acks(self, alert_ids: Iterable[str]) -> dict[tuple[str, int], Ack]:
        ids = list(alert_ids)
        if not ids:
            return {}
        cond, param = self.db.dialect.in_("alert", ids)

        def select(q: Query) -> dict[tuple[str, int], Ack]:
            rows = q(f"SELECT alert, episode, acked_by, acked_at FROM acks WHERE {cond}", (param,))
            return {(r[0], int(r[1])): Ack(r[0], int(r[1]), r[2], r[3]) for r in rows}

        return await self.db.read(select)

    async def get(self, alert_id: str) -> Alert | None:
        def select(q: Query) -> Alert | None:
            row = q(f"{SELECT_ALERTS} WHERE id = ?", (alert_id,)).fetchone()
            return None if row is None else Alert(*row)

        return await self.db.read(select)

    async def page(
        self,
        *,
        state: str | None = None,
        rule: str | None = None,
        session: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[Alert]:
        """Alerts by id, after the id `after`: those in state, of a session (its session
        alert and its interventions'), or that rule notified about. An alert that never
        opened (episode 0: only a closing event came, kept so that a late opener is stale)
        is no alert to list."""
        where: list[str] = ["episode > 0"]
        params: list[Any] = []
        if state is not None:
            where.append("state = ?")
            params.append(state)
        if session is not None:
            where.append("(id = ? OR substr(id, 1, ?) = ?)")
            prefix = f"intervention:{session}:"
            params += [f"session:{session}", len(prefix), prefix]
        if rule is not None:
            where.append(
                "EXISTS (SELECT 1 FROM notices WHERE notices.alert = alerts.id AND rule = ?)"
            )
            params.append(rule)
        if after is not None:
            where.append("id > ?")
            params.append(after)

        def select(q: Query) -> list[Alert]:
            rows = q(
                f"{SELECT_ALERTS} WHERE {' AND '.join(where)} ORDER BY id LIMIT ?",
                (*params, limit),
            )
            return [Alert(*row) for row in rows]

        return await self.db.read(select)

    async def snooze(self, alert_id: str, *, until: float) -> int | None:
        """Put an open alert's repeats off until `until`; then the timers notify again
        about it if it is still open (receiver.dispatch.timers). The episode snoozed, or
        None if no alert of that id is open."""
        return await self.db.statements(lambda q: snooze(q, alert_id, until))

    async def chains(self, alert_id: str) -> list[Chain]:
        """The alert's escalations, every episode's, newest episode first."""

        def select(q: Query) -> list[Chain]:
            rows = q(
                f"SELECT {CHAIN_COLUMNS} FROM escalations WHERE alert = ?"
                " ORDER BY episode DESC, rule",
                (alert_id,),
            )
            return [read_chain(row) for row in rows]

        return await self.db.read(select)

    async def flaps(self, alert_id: str) -> list[Flap]:
        """Flap detection's records of the alert, by rule."""

        def select(q: Query) -> list[Flap]:
            rows = q(f"SELECT {FLAP_COLUMNS} FROM flaps WHERE alert = ? ORDER BY rule", (alert_id,))
            return [read_flap(row) for row in rows]

        return await self.db.read(select)

    async def record(self, action: Action) -> None:
        """Keep an action in the alert's record."""
        await self.db.statements(lambda q: record(q, action))

    async def actions(self, alert_ids: Iterable[str], *, limit: int = 100) -> list[Action]:
        """The newest actions on these alerts (at most limit), oldest first."""
        ids = list(alert_ids)
        if not ids:
            return []
        cond, param = self.db.dialect.in_("alert", ids)

        def select(q: Query) -> list[Action]:
            rows = q(
                f"SELECT {_ACTION_COLUMNS} FROM alert_actions WHERE {cond}"
                " ORDER BY id DESC LIMIT ?",
                (param, limit),
            )
            return [Action(*row) for row in reversed(list(rows))]

        return await self.db.read(select)


# What an operator does to an alert, as statements: store.alerts runs each in a transaction
# of its own, tx.alerts in the action's transaction (with the messages it queues).


def ack(q: Query, alert_id: str, by: str, now: float) -> Ack | None:
    """store.alerts.ack's statements (base.Alerts.ack)."""
    row = q("SELECT episode FROM alerts WHERE id = ? AND state = 'open'", (alert_id,)).fetchone()
    if row is None:
        return None
    episode = int(row[0])
    # The one decision between acks at once: the insert that finds no row makes the ack;
    # the others wait for it (PostgreSQL: its unique index; SQLite: the one writer) and
    # insert nothing.
    made = (
        q(
            "INSERT INTO acks (alert, episode, acked_by, acked_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (alert, episode) DO NOTHING",
            (alert_id, episode, by, now),
        ).rowcount
        == 1
    )
    if made:
        q(
            "UPDATE notices SET next_repeat_at = NULL WHERE alert = ? AND episode = ?",
            (alert_id, episode),
        )
        # Its escalation looks at once, sees the ack and stops (or waits for reack).
        q(
            f"UPDATE escalations SET next_at = ? WHERE alert = ? AND episode = ?{_NOT_WAITING}",
            (now, alert_id, episode),
        )
    found = q(
        "SELECT alert, episode, acked_by, acked_at FROM acks WHERE alert = ? AND episode = ?",
        (alert_id, episode),
    ).fetchone()
    return Ack(found[0], int(found[1]), found[2], found[3], made=made)


def snooze(q: Query, alert_id: str, until: float) -> int | None:
    """store.alerts.snooze's statements (base.Alerts.snooze)."""
    row = q("SELECT episode FROM alerts WHERE id = ? AND state = 'open'", (alert_id,)).fetchone()
    if row is None:
        return None
    q(
        "UPDATE notices SET next_repeat_at = ? WHERE alert = ? AND episode = ?",
        (until, alert_id, int(row[0])),
    )
    # Its escalation goes on from where it is when the snooze ends (a step due later than
    # that stays when it was).
    q(
        "UPDATE escalations SET next_at = CASE WHEN next_at > ? THEN next_at ELSE ? END"
        f" WHERE alert = ? AND episode = ?{_NOT_WAITING}",
        (until, until, alert_id, int(row[0])),
    )
    return int(row[0])


def record(q: Query, action: Action) -> None:
    """store.alerts.record's statement."""
    q(
        f"INSERT INTO alert_actions ({_ACTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            action.alert,
            action.episode,
            action.action,
            action.source,
            action.actor,
            action.at,
            action.outcome,
            action.until,
        ),
    )
