"""Events on either SQL store: the admin page's reads of them and of the quarantine
(store.events, beside each store's own accept, quarantine, replay and prune), and what the
router reads and marks (tx.events, beside each store's own unrouted and last_received)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from receiver.events import BaseEvent, iso
from receiver.store.base import Accepted
from receiver.store.outbox import OUTBOX_COLUMNS
from receiver.store.records import EventQuery, EventRow, OutboxRow, Quarantined, Replay
from receiver.store.statements import Query, Runner, Statements

# Event pages sort by (received_at, id). Type and "delivered more than once" have an index
# each (few distinct values: appending to them touches few pages). Session and user have
# none: with events of many sessions interleaved, such an index dirties a page per event
# and slowed ingest (docs/performance.md: the figures behind code choices); the admin page
# bounds those filters in time.
ADMIN_SCHEMA = """
    ALTER TABLE events ADD COLUMN duplicates INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX events_received_id ON events (received_at, id);
    CREATE INDEX events_type ON events (type, received_at, id);
    CREATE INDEX events_duplicated ON events (received_at, id) WHERE duplicates > 0;
    CREATE INDEX outbox_dead ON outbox (notifier) WHERE state = 'dead';
    CREATE TABLE acks (
        alert TEXT NOT NULL,
        episode INTEGER NOT NULL,
        acked_by TEXT NOT NULL,
        acked_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (alert, episode)
    )
"""
_EVENT_COLUMNS = (
    "id, type, session_id, user_id, score, event_ts, received_at, routed_at, duplicates, rules,"
    " trace"
)
# What routing records for `GET /v1/events/:id/explain`: each event's rules file (its
# digest, set with routed_at in the batch's one UPDATE), and each rules file routed with,
# once (SQLite's migration 19, PostgreSQL's 16). {real}: each store's float.
RULESETS_SCHEMA = """
    ALTER TABLE events ADD COLUMN rules TEXT;
    CREATE TABLE rulesets (
        digest TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        text TEXT NOT NULL,
        seen_at {real} NOT NULL
    );
"""
# The W3C trace context of each event's ingest span, so routing and every send continue
# the sender's trace, later and on any replica (receiver.tracing); and of the routing
# decision that queued each outbox row, so its send attempts, retries hours later
# included, are spans of that trace. NULL while tracing is off (SQLite's migration 20,
# PostgreSQL's 17).
TRACE_SCHEMA = """
    ALTER TABLE events ADD COLUMN trace TEXT;
    ALTER TABLE outbox ADD COLUMN trace TEXT;
"""
SELECT_REPLAY = (
    "SELECT id, event_id, requested_at, respect_lifecycle, routed_at FROM replays WHERE id = ?"
)


def event_row(
    event: BaseEvent, raw: bytes, received_at: float, trace: str | None = None
) -> tuple[Any, ...]:
    """An accepted event's values for the events table, in its column order: id, type,
    session_id, user_id, score, threshold, event_ts, received_at, body, trace."""
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
        trace,
    )


def _real(value: float | None) -> float | None:
    """A score for its REAL column; an integer too large even for a float is left out (the
    raw body keeps it), rather than failing the whole group commit."""
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return None


class SQLEvents:
    """store.events (base.Events) on either SQL store: the reads both stores share, and the
    writes each store makes its own way (its group commit, its locks), handed in."""

    def __init__(
        self,
        db: Runner,
        *,
        accept: Callable[[BaseEvent, bytes, str | None], Awaitable[Accepted]],
        quarantine: Callable[..., Awaitable[None]],
        replay: Callable[..., Awaitable[int | None]],
        prune: Callable[..., Awaitable[dict[str, int]]],
    ) -> None:
        self.db = db
        self._accept = accept
        self._quarantine = quarantine
        self._replay = replay
        self._prune = prune

    async def accept(self, event: BaseEvent, raw: bytes, trace: str | None = None) -> Accepted:
        """Keep event durably: "new"; or, its id already stored, "duplicate" if the stored
        raw body is the same bytes, "conflict" if not (the stored one is kept, and so is
        its trace context: a duplicate's is not)."""
        return await self._accept(event, raw, trace)

    async def quarantine(
        self, raw: bytes, *, reason: str, client: str | None, event_id: str | None
    ) -> None:
        """Keep a body that was signed but is no event, with why (nothing is lost)."""
        await self._quarantine(raw, reason=reason, client=client, event_id=event_id)

    async def replay(
        self, event_id: str, *, now: float, respect_lifecycle: bool = False
    ) -> int | None:
        """Ask the router to route a stored event again; the request's id, or None if no
        event has that id. See records.Replay. StoreError for an event never routed yet
        (its first routing must apply it to its alert); a request still waiting is
        replaced by this one."""
        return await self._replay(event_id, now=now, respect_lifecycle=respect_lifecycle)

    async def prune(self, before: float, *, limit: int) -> dict[str, int]:
        """Delete one batch of what is older than before: see each store's own."""
        return await self._prune(before, limit=limit)

    async def replay_status(self, replay_id: int) -> tuple[Replay | None, list[OutboxRow]]:
        """A replay request as it stands, and the outbox rows it has produced so far."""

        def select(q: Query) -> tuple[Replay | None, list[OutboxRow]]:
            found = q(SELECT_REPLAY, (replay_id,)).fetchone()
            request = (
                None
                if found is None
                else Replay(found[0], found[1], found[2], bool(found[3]), found[4])
            )
            rows = q(
                f"SELECT {OUTBOX_COLUMNS} FROM outbox WHERE replay = ? ORDER BY id", (replay_id,)
            )
            return request, [OutboxRow(*row) for row in rows]

        return await self.db.statements(select, write=False)

    async def page(self, query: EventQuery) -> list[EventRow]:
        """Events newest first (received_at, then id), after query.before if given."""
        wanted = [
            ("type = ?", query.type),
            ("session_id = ?", query.session_id),
            ("user_id = ?", query.user_id),
            ("received_at >= ?", query.since),
            ("received_at < ?", query.until),
        ]
        conds = [cond for cond, value in wanted if value is not None]
        params: list[Any] = [value for _, value in wanted if value is not None]
        if query.duplicated:
            conds.append("duplicates > 0")
        if query.before is not None:
            conds.append("(received_at < ? OR (received_at = ? AND id < ?))")
            params += [query.before[0], query.before[0], query.before[1]]
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events{where} ORDER BY received_at DESC, id DESC LIMIT ?"
        )
        return await self.db.read(lambda q: [EventRow(*r) for r in q(sql, (*params, query.limit))])

    async def get(self, event_id: str) -> tuple[EventRow, str] | None:
        """One event and its raw body."""

        def select(q: Query) -> tuple[EventRow, str] | None:
            row = q(
                f"SELECT {_EVENT_COLUMNS}, body FROM events WHERE id = ?", (event_id,)
            ).fetchone()
            return (EventRow(*row[:-1]), row[-1]) if row else None

        return await self.db.read(select)

    async def rules(self, digest: str) -> tuple[str, str] | None:
        """(source, text) of the rules file of this digest, as routing kept it."""

        def select(q: Query) -> tuple[str, str] | None:
            row = q("SELECT source, text FROM rulesets WHERE digest = ?", (digest,)).fetchone()
            return None if row is None else (str(row[0]), str(row[1]))

        return await self.db.read(select)

    async def traces(self, event_ids: Sequence[str]) -> dict[str, str]:
        """The stored trace context of each of these events that has one."""
        if not event_ids:
            return {}

        def select(q: Query) -> dict[str, str]:
            where, param = self.db.dialect.in_("id", list(event_ids))
            sql = f"SELECT id, trace FROM events WHERE {where} AND trace IS NOT NULL"
            return {str(row[0]): str(row[1]) for row in q(sql, (param,))}

        return await self.db.read(select)

    async def quarantined(self, *, before: int | None, limit: int) -> list[Quarantined]:
        def select(q: Query) -> list[Quarantined]:
            rows = q(
                "SELECT id, received_at, reason, client, event_id, body FROM quarantine"
                " WHERE id < ? ORDER BY id DESC LIMIT ?",
                (before if before is not None else 2**62, limit),
            )
            return [
                Quarantined(r[0], r[1], r[2], r[3], r[4], bytes(r[5]).decode("utf-8", "replace"))
                for r in rows
            ]

        return await self.db.read(select)


class SQLTxEvents:
    """The statements of tx.events (base.TxEvents) both stores share; each store's
    subclass adds unrouted and last_received."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def mark_routed(self, event_ids: list[str], now: float, rules: str | None = None) -> int:
        """Mark these events routed (by the rules file of digest rules); how many were not
        already."""
        where, param = self.st.dialect.in_("id", event_ids)
        return int(
            self.st.q(
                f"UPDATE events SET routed_at = ?, rules = ? WHERE {where} AND routed_at IS NULL",
                (now, rules, param),
            ).rowcount
        )

    def keep_rules(self, digest: str, source: str, text: str, now: float) -> None:
        """Keep a rules file routed with (once a digest), for explaining its events later."""
        self.st.q(
            "INSERT INTO rulesets (digest, source, text, seen_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (digest) DO NOTHING",
            (digest, source, text, now),
        )

    def body(self, event_id: str) -> str | None:
        row = self.st.q("SELECT body FROM events WHERE id = ?", (event_id,)).fetchone()
        return None if row is None else str(row[0])

    def replay_request(self, replay_id: int) -> Replay | None:
        row = self.st.q(SELECT_REPLAY, (replay_id,)).fetchone()
        return None if row is None else Replay(row[0], row[1], row[2], bool(row[3]), row[4])

    def replay_done(self, replay_id: int, now: float) -> None:
        """The replay request is routed: note when, and clear it from its event."""
        self.st.q("UPDATE replays SET routed_at = ? WHERE id = ?", (now, replay_id))
        self.st.q(
            "UPDATE events SET replay = NULL"
            " WHERE id = (SELECT event_id FROM replays WHERE id = ?) AND replay = ?",
            (replay_id, replay_id),
        )
