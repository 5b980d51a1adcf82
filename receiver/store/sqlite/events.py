"""The SQLite store's own statements about events: a group of accepts in few multi-row
INSERTs, quarantine, replay requests and retention (store.events hands them on)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from receiver.errors import StoreError
from receiver.store.base import Accepted

_INSERT_EVENT = (
    "INSERT OR IGNORE INTO events (id, type, session_id, user_id, score, threshold,"
    " event_ts, received_at, body, trace) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# A group in few statements: multi-row INSERTs that return the ids they stored, so what
# they did not store is a duplicate.
_CHUNKS = (64, 16, 4, 1)  # rows per INSERT; few distinct statements for the statement cache
_INSERT_ROWS = {
    n: _INSERT_EVENT.removesuffix("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * n)
    + " RETURNING id"
    for n in _CHUNKS
}


def insert_batch(conn: sqlite3.Connection, accepts: list[tuple[Any, ...]]) -> list[Accepted]:
    """Insert a group of accepted events in the open transaction; "new" for each one new.

    An id already stored, or seen earlier in the same group, is a "duplicate", or a
    "conflict" if its raw body differs from the stored one. Only a group with duplicates
    pays for reading bodies back: one SELECT for all of them.
    """
    stored: set[str] = set()
    for start in range(0, len(accepts), _CHUNKS[0]):
        rows = accepts[start : start + _CHUNKS[0]]
        done = 0
        while done < len(rows):
            size = next(n for n in _CHUNKS if n <= len(rows) - done)
            params = [value for job in rows[done : done + size] for value in job]
            stored.update(row[0] for row in conn.execute(_INSERT_ROWS[size], params))
            done += size
    results: list[Accepted] = []
    for job in accepts:
        event_id = job[0]
        results.append("new" if event_id in stored else "duplicate")
        stored.discard(event_id)  # a second copy in the same group is a duplicate
    if "duplicate" in results:
        ids = json.dumps(
            [job[0] for job, r in zip(accepts, results, strict=True) if r == "duplicate"]
        )
        # The first copy of an id repeated within the group is already in, so it is read too.
        # Counted for the admin page; the UPDATE reads the bodies back too.
        bodies = dict(
            conn.execute(
                "UPDATE events SET duplicates = duplicates + 1"
                " WHERE id IN (SELECT value FROM json_each(?)) RETURNING id, body",
                (ids,),
            ).fetchall()
        )
        for i, (job, result) in enumerate(zip(accepts, results, strict=True)):
            if result == "duplicate" and bodies.get(job[0], job[8]) != job[8]:
                results[i] = "conflict"
    return results


def quarantine(
    conn: sqlite3.Connection,
    now: float,
    raw: bytes,
    reason: str,
    client: str | None,
    event_id: str | None,
) -> None:
    """Keep a body that was signed but is no event, with why."""
    conn.execute(
        "INSERT INTO quarantine (received_at, reason, client, event_id, body)"
        " VALUES (?, ?, ?, ?, ?)",
        (now, reason, client, event_id, raw),
    )


def request_replay(
    conn: sqlite3.Connection, event_id: str, now: float, respect_lifecycle: bool
) -> int | None:
    """Ask the router to route a stored event again; the request's id, or None if no
    event has that id. See records.Replay. StoreError for an event never routed yet
    (its first routing must apply it to its alert); a request still waiting is
    replaced by this one."""
    row = conn.execute("SELECT routed_at, replay FROM events WHERE id = ?", (event_id,)).fetchone()
    if row is None:
        return None
    if row[0] is None and row[1] is None:
        raise StoreError(
            f"event {event_id} has not been routed yet; the server routes it in turn"
            " (replay it once it has been)"
        )
    cur = conn.execute(
        "INSERT INTO replays (event_id, requested_at, respect_lifecycle) VALUES (?, ?, ?)",
        (event_id, now, int(respect_lifecycle)),
    )
    replay_id = int(cur.lastrowid or 0)
    conn.execute(
        "UPDATE events SET routed_at = NULL, replay = ? WHERE id = ?", (replay_id, event_id)
    )
    return replay_id


def prune(conn: sqlite3.Connection, before: float, limit: int) -> dict[str, int]:
    """Delete one batch of what is older than before (received_at, epoch seconds).

    Looks only at the oldest `limit` rows by arrival (rowid) order, so a batch costs the
    same on a table of ten million rows as on a small one and needs no index; a row that
    arrived out of clock order is pruned once it reaches the head. Unrouted events, and
    notifications still to send (pending, held, sending), are kept.
    """
    ids = conn.execute(
        "SELECT json_group_array(id) FROM (SELECT id, received_at, routed_at FROM events"
        " ORDER BY rowid LIMIT ?) WHERE received_at < ? AND routed_at IS NOT NULL",
        (limit, before),
    ).fetchone()[0]
    gone = conn.execute(
        "DELETE FROM outbox WHERE event_id IN (SELECT value FROM json_each(?))"
        " AND state NOT IN ('pending', 'held', 'sending') RETURNING id",
        (ids,),
    ).fetchall()
    # Finished rows whose event went first (pruned while they were still to send)
    # belong to no event any more: the head of the outbox, by id, finished before.
    gone += conn.execute(
        "DELETE FROM outbox WHERE id IN (SELECT id FROM (SELECT id, state, updated_at"
        " FROM outbox ORDER BY id LIMIT ?) WHERE updated_at < ?"
        " AND state IN ('delivered', 'dead', 'cancelled')) RETURNING id",
        (limit, before),
    ).fetchall()
    outbox = len(gone)
    conn.execute(  # their attempt logs go with them
        "DELETE FROM outbox_attempts WHERE outbox_id IN (SELECT value FROM json_each(?))",
        (json.dumps([row[0] for row in gone]),),
    )
    events = conn.execute(
        "DELETE FROM events WHERE id IN (SELECT value FROM json_each(?))", (ids,)
    ).rowcount
    quarantine = conn.execute(
        "DELETE FROM quarantine WHERE id IN (SELECT id FROM quarantine ORDER BY id"
        " LIMIT ?) AND received_at < ?",
        (limit, before),
    ).rowcount
    # The lifecycle's own state: resolved alerts, finished notices, digests, silences.
    # A resolved alert pruned here cannot make a late event stale any more, but by
    # then RECEIVER_MAX_EVENT_AGE (shorter than retention) refuses such an event.
    lifecycle = sum(
        conn.execute(sql, (before, limit)).rowcount
        for sql in (
            "DELETE FROM alerts WHERE rowid IN (SELECT rowid FROM alerts"
            " WHERE state = 'resolved' AND updated_at < ? LIMIT ?)",
            "DELETE FROM notices WHERE rowid IN (SELECT rowid FROM notices"
            " WHERE next_repeat_at IS NULL AND notified_at < ? LIMIT ?)",
            "DELETE FROM groups WHERE id IN (SELECT id FROM groups WHERE closes_at < ? LIMIT ?)",
            "DELETE FROM escalations WHERE rowid IN (SELECT rowid FROM escalations"
            " WHERE next_at IS NULL AND suppressed_since IS NULL AND started_at < ? LIMIT ?)",
            "DELETE FROM silences WHERE id IN (SELECT id FROM silences WHERE ends_at < ? LIMIT ?)",
            "DELETE FROM replays WHERE id IN (SELECT id FROM replays"
            " WHERE requested_at < ? LIMIT ?)",
            "DELETE FROM chat_threads WHERE rowid IN (SELECT rowid FROM chat_threads"
            " WHERE updated_at < ? LIMIT ?)",
        )
    )
    return {
        "events": events,
        "outbox": outbox,
        "quarantine": quarantine,
        "lifecycle": lifecycle,
    }
