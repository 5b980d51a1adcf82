"""The session projection on either SQL store (store.sessions, tx.sessions): written by the
router's transaction, read with the events not routed yet folded in, merged with sessions
imported from upstream; and the read API's tables (the API keys' among them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from receiver.events import load_stored
from receiver.sessions import COLUMNS, Aggregate, Fact, Summary, fold_all, merge_remote
from receiver.store.records import SessionPage, SessionQuery
from receiver.store.statements import Query, Runner, Statements

# The tables (both stores; {id}: the dialect's auto-numbered key). The marks are text
# (receiver.sessions.Fact.mark); timestamps are iso() text, whose order is time order.
VIEWS_SCHEMA = """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        user_id TEXT,
        user_mark TEXT NOT NULL DEFAULT '',
        score DOUBLE PRECISION,
        score_mark TEXT NOT NULL DEFAULT '',
        trend TEXT,
        trend_mark TEXT NOT NULL DEFAULT '',
        stopped INTEGER NOT NULL DEFAULT 0,
        context TEXT,
        context_mark TEXT NOT NULL DEFAULT '',
        cohort TEXT,
        cohort_mark TEXT NOT NULL DEFAULT '',
        signals_sent BIGINT,
        signals_mark TEXT NOT NULL DEFAULT '',
        score_events INTEGER NOT NULL DEFAULT 0,
        interventions INTEGER NOT NULL DEFAULT 0,
        started_sent TEXT,
        first_ts TEXT,
        last_ts TEXT,
        status TEXT NOT NULL DEFAULT 'active',
        started_at TEXT
    );
    CREATE INDEX sessions_started ON sessions (started_at, id);
    CREATE INDEX sessions_user ON sessions (user_id, started_at, id);
    CREATE INDEX sessions_status ON sessions (status, started_at, id);
    CREATE INDEX sessions_scored ON sessions (score_mark, context, cohort, user_id, score);
    CREATE TABLE session_scores (
        session_id TEXT NOT NULL,
        ts TEXT NOT NULL,
        event_id TEXT NOT NULL,
        score DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (session_id, ts, event_id)
    ){without_rowid};
    CREATE TABLE api_keys (
        id {id},
        name TEXT NOT NULL UNIQUE,
        hash TEXT NOT NULL UNIQUE,
        prefix TEXT NOT NULL,
        plan TEXT NOT NULL,
        role TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        last_used_at DOUBLE PRECISION
    );
    CREATE TABLE rate_hits (
        key_id BIGINT NOT NULL,
        at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX rate_hits_key ON rate_hits (key_id, at)
"""
# What the read API's totals and aggregates read instead of scanning the sessions:
# - session_hours: how many listed sessions each status has per hour of startedAt (the
#   hour: iso()'s first 13 characters, "2026-11-23T22"), kept by project(). `total` adds
#   up whole hours here and counts only the hours at its range's two ends.
# - an index per groupBy in group order, so GET /v1/scores reads one in order and needs
#   no sort (the one on score_mark first made it sort every session: 0.7 s of 1 s).
AGGREGATES_SCHEMA = """
    CREATE TABLE session_hours (
        status TEXT NOT NULL,
        hour TEXT NOT NULL,
        n BIGINT NOT NULL,
        PRIMARY KEY (status, hour)
    );
    INSERT INTO session_hours (status, hour, n)
        SELECT status, substr(started_at, 1, 13), count(*) FROM sessions
        WHERE started_at IS NOT NULL GROUP BY status, substr(started_at, 1, 13);
    DROP INDEX sessions_scored;
    CREATE INDEX sessions_page_scores ON sessions (context, score, score_mark);
    CREATE INDEX sessions_cohort_scores ON sessions (cohort, score, score_mark);
    CREATE INDEX sessions_user_scores ON sessions (user_id, score, score_mark)
"""
_HOUR = 13  # len("2026-11-23T22")
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM sessions"
# Beside Summary's fields, the sessions table keeps the two the read API filters and
# sorts on, derived from them: status and started_at.
_WRITE_COLUMNS = (*COLUMNS, "status", "started_at")
_UPSERT = (
    f"INSERT INTO sessions ({', '.join(_WRITE_COLUMNS)}) VALUES {{rows}}"
    " ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _WRITE_COLUMNS if c != "id")
)
_ROW = "(" + ", ".join("?" * len(_WRITE_COLUMNS)) + ")"
_CHUNK = 200  # rows per multi-row statement
# The read API folds in the events not routed yet; under a burst this many at most.
UNROUTED_FOLD_LIMIT = 50_000
GROUP_COLUMNS = {"page": "context", "cohort": "cohort", "userId": "user_id"}


def _summary(row: Sequence[Any]) -> Summary:
    summary = Summary(*row)
    summary.stopped = bool(summary.stopped)
    return summary


def _values(s: Summary) -> tuple[Any, ...]:
    return (
        *(getattr(s, c) if c != "stopped" else int(s.stopped) for c in COLUMNS),
        s.status,
        s.started_at,
    )


def facts_of(bodies: Iterable[str]) -> list[Fact]:
    facts = []
    for body in bodies:
        try:
            payload = load_stored(body)
        except ValueError:
            continue
        if isinstance(payload, dict) and (fact := Fact.from_payload(payload)) is not None:
            facts.append(fact)
    return facts


# -- writing: the router's transaction and the upgrade --------------------------------------


def project(
    q: Query,
    in_: Callable[[str, Iterable[Any]], tuple[str, Any]],
    facts: Sequence[Fact],
    *,
    lock: bool = False,
    count_hours: bool = True,
) -> None:
    """Fold facts into the stored summaries and score histories, in the open transaction,
    and keep session_hours (unless count_hours is False: a migration before it existed).

    With lock (PostgreSQL), the rows are created first if missing and read FOR UPDATE in
    id order, so replicas folding the same session at once take turns (never lose one's
    fold).
    """
    if not facts:
        return
    ids = sorted({f.session_id for f in facts})
    if lock:
        _insert_rows(
            q,
            "INSERT INTO sessions (id) VALUES {rows} ON CONFLICT (id) DO NOTHING",
            "(?)",
            [(i,) for i in ids],
        )
    where, param = in_("id", ids)
    suffix = " ORDER BY id FOR UPDATE" if lock else ""
    stored = {row[0]: _summary(row) for row in q(f"{_SELECT} WHERE {where}{suffix}", (param,))}
    before = {i: _hour_key(s) for i, s in stored.items()}
    folded = fold_all(stored, list(facts))
    _insert_rows(q, _UPSERT, _ROW, [_values(s) for s in folded.values()])
    if count_hours:
        _count_hours(q, [(before.get(i), _hour_key(s)) for i, s in folded.items()])
    points = [(f.session_id, f.ts, f.event_id, f.score) for f in facts if f.score is not None]
    _insert_rows(
        q,
        "INSERT INTO session_scores (session_id, ts, event_id, score) VALUES {rows}"
        " ON CONFLICT DO NOTHING",
        "(?, ?, ?, ?)",
        points,
    )


def _hour_key(s: Summary) -> tuple[str, str] | None:
    """Where a session counts in session_hours: (status, hour started); None if unlisted."""
    started = s.started_at
    return None if started is None else (s.status, started[:_HOUR])


def _count_hours(q: Query, moves: Sequence[tuple[Any, Any]]) -> None:
    """Apply (before, after) hour keys of folded sessions to session_hours, in key order
    (replicas updating the same hours lock them in one order)."""
    deltas: dict[tuple[str, str], int] = {}
    for before, after in moves:
        if before == after:
            continue
        if before is not None:
            deltas[before] = deltas.get(before, 0) - 1
        if after is not None:
            deltas[after] = deltas.get(after, 0) + 1
    rows = [(status, hour, n) for (status, hour), n in sorted(deltas.items()) if n]
    _insert_rows(
        q,
        "INSERT INTO session_hours (status, hour, n) VALUES {rows}"
        " ON CONFLICT (status, hour) DO UPDATE SET n = session_hours.n + excluded.n",
        "(?, ?, ?)",
        rows,
    )


def _insert_rows(q: Query, sql: str, row: str, values: Sequence[Sequence[Any]]) -> None:
    """Run sql (its VALUES written {rows}) for all values, _CHUNK rows a statement."""
    for start in range(0, len(values), _CHUNK):
        chunk = values[start : start + _CHUNK]
        q(sql.format(rows=", ".join([row] * len(chunk))), [v for r in chunk for v in r])


def backfill(q: Query, in_: Callable[[str, Iterable[Any]], tuple[str, Any]]) -> int:
    """Project the events routed before the projection existed (an upgrade); how many."""
    done, last = 0, ""
    while True:
        rows = q(
            "SELECT id, body FROM events WHERE id > ? AND routed_at IS NOT NULL"
            " ORDER BY id LIMIT 5000",
            (last,),
        ).fetchall()
        if not rows:
            return done
        project(q, in_, facts_of(body for _, body in rows), count_hours=False)
        done += len(rows)
        last = rows[-1][0]


# -- reading --------------------------------------------------------------------------------


def _unrouted(q: Query, session_id: str) -> list[Fact]:
    """The facts of a session's events not routed yet. (A replayed event is folded
    already: it is left out.)"""
    rows = q(
        "SELECT body FROM events WHERE routed_at IS NULL AND replay IS NULL"
        " AND session_id = ? ORDER BY received_at LIMIT ?",
        (session_id, UNROUTED_FOLD_LIMIT),
    ).fetchall()
    return facts_of(body for (body,) in rows)


def _pending(q: Query, session_id: str) -> dict[str, Summary]:
    """The session's summary with its events not routed yet folded in, if it has any."""
    facts = _unrouted(q, session_id)
    if not facts:
        return {}
    stored = {row[0]: _summary(row) for row in q(f"{_SELECT} WHERE id = ?", (session_id,))}
    return fold_all(stored, facts)


class SQLTxSessions:
    """tx.sessions (base.TxSessions): the router's fold of routed events."""

    def __init__(self, st: Statements) -> None:
        self.st = st

    def project(self, facts: Sequence[Fact]) -> None:
        """Fold routed events into the session projection (the read API's)."""
        project(self.st.q, self.st.dialect.in_, facts, lock=self.st.dialect.lock_sessions)


class SQLSessions:
    """store.sessions (base.Sessions) on either SQL store: reads off the event loop, beside
    ingest; the import from upstream as one write."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def get(self, session_id: str) -> Summary | None:
        def read(q: Query) -> Summary | None:
            pending = _pending(q, session_id)
            if session_id in pending:
                return pending[session_id]
            row = q(f"{_SELECT} WHERE id = ?", (session_id,)).fetchone()
            return _summary(row) if row is not None and row[0] is not None else None

        return await self.db.read(read)

    async def score_history(self, session_id: str) -> list[tuple[float, str]] | None:
        """(score, timestamp) ascending by timestamp; None if no such session."""

        def read(q: Query) -> list[tuple[float, str]] | None:
            unrouted = _unrouted(q, session_id)
            known = unrouted or q("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if not known:
                return None
            points = {
                (ts, event_id): score
                for ts, event_id, score in q(
                    "SELECT ts, event_id, score FROM session_scores WHERE session_id = ?",
                    (session_id,),
                )
            }
            for fact in unrouted:
                if fact.score is not None:
                    points[(fact.ts, fact.event_id)] = fact.score
            return [(points[k], k[0]) for k in sorted(points)]

        return await self.db.read(read)

    async def page(self, query: SessionQuery) -> SessionPage:
        """A page of sessions, newest startedAt first (then id, descending). KeyError if
        query.cursor names no session. Lists and their totals show the routed events
        (routing runs about a second behind under load): folding every unrouted event in,
        as a single session's read does, cost each list a parse of the whole backlog."""

        def read(q: Query) -> SessionPage:
            conds, params = _filters(query)
            where = " AND ".join(conds)
            total = _count(q, query, where, params)
            page_conds, page_params = [where], list(params)
            if query.cursor is not None:
                row = q(f"{_SELECT} WHERE id = ?", (query.cursor,)).fetchone()
                if row is None or row[0] is None:
                    raise KeyError(query.cursor)
                at = _summary(row)
                started = at.started_at or ""
                page_conds.append("(started_at < ? OR (started_at = ? AND id < ?))")
                page_params += [started, started, at.id]
            rows = q(
                f"{_SELECT} WHERE {' AND '.join(page_conds)}"
                " ORDER BY started_at DESC, id DESC LIMIT ?",
                (*page_params, query.limit + 1),
            ).fetchall()
            page = [_summary(r) for r in rows[: query.limit]]
            more = len(rows) > query.limit
            return SessionPage(page, total, page[-1].id if more and page else None)

        return await self.db.read(read)

    async def score_groups(self, group_by: str, since: str) -> list[Aggregate]:
        """Per key of group_by (page, cohort or userId), the histogram of the latest scores
        of the sessions scored at or after since (an iso() timestamp); routed events only,
        as lists."""
        column = GROUP_COLUMNS[group_by]

        def read(q: Query) -> list[Aggregate]:
            groups: dict[str, dict[float, int]] = {}
            for key, score, n in q(
                f"SELECT {column}, score, count(*) FROM sessions WHERE {column} IS NOT NULL"
                f" AND score IS NOT NULL AND score_mark >= ? GROUP BY {column}, score",
                (since,),
            ):
                groups.setdefault(key, {})[score] = n
            return [Aggregate(key, histogram) for key, histogram in groups.items()]

        return await self.db.read(read)

    async def import_upstream(
        self, items: Sequence[tuple[dict[str, Any], Sequence[tuple[float, str]]]]
    ) -> int:
        """Merge upstream sessions (part 2's single-session form) and their score points
        (score, iso() timestamp) into the projection; how many sessions changed.

        Idempotent: the same items again change nothing. A point is added only where the
        session has none at that instant (an event received here may have carried it).
        """

        def merge(q: Query) -> int:
            ids = sorted({str(remote["id"]) for remote, _ in items})
            if not ids:
                return 0
            where, param = self.db.dialect.in_("id", ids)
            lock = self.db.dialect.lock_key
            stored = {
                row[0]: _summary(row)
                for row in q(f"{_SELECT} WHERE {where} ORDER BY id{lock}", (param,))
            }
            changed, moves = [], []
            for remote, points in items:
                before = stored.get(str(remote["id"]))
                summary = Summary(id=str(remote["id"])) if before is None else before
                old = _values(summary) if before is not None else None
                was = _hour_key(summary) if before is not None else None
                merge_remote(summary, remote)
                if _values(summary) != old:
                    changed.append(_values(summary))
                    moves.append((was, _hour_key(summary)))
                stored[summary.id] = summary
                _add_points(q, summary.id, points)
            _insert_rows(q, _UPSERT, _ROW, changed)
            _count_hours(q, moves)  # the read API's totals, as project() keeps them
            return len(changed)

        return await self.db.statements(merge)


def _add_points(q: Query, session_id: str, points: Sequence[tuple[float, str]]) -> None:
    """Score points at instants the session has none at yet, keyed by the event id
    "upstream" (a session's points from elsewhere are never duplicated)."""
    if not points:
        return
    have = {ts for (ts,) in q("SELECT ts FROM session_scores WHERE session_id = ?", (session_id,))}
    new = sorted({ts: score for score, ts in points if ts not in have}.items())
    _insert_rows(
        q,
        "INSERT INTO session_scores (session_id, ts, event_id, score) VALUES {rows}"
        " ON CONFLICT DO NOTHING",
        "(?, ?, ?, ?)",
        [(session_id, ts, "upstream", score) for ts, score in new],
    )


def _filters(query: SessionQuery) -> tuple[list[str], list[Any]]:
    wanted = [
        ("user_id = ?", query.user_id),
        ("status = ?", query.status),
        ("started_at >= ?", query.start_from),
        ("started_at <= ?", query.start_to),
    ]
    conds = ["started_at IS NOT NULL"] + [cond for cond, value in wanted if value is not None]
    return conds, [value for _, value in wanted if value is not None]


def _count(q: Query, query: SessionQuery, where: str, params: Sequence[Any]) -> int:
    """How many sessions match: whole hours of the range from session_hours, the hours at
    its two ends from the index (so a count reads at most two hours of sessions)."""
    low, high = query.start_from, query.start_to
    low_hour = None if low is None else low[:_HOUR]
    high_hour = None if high is None else high[:_HOUR]
    if low is not None and high is not None and low > high:
        return 0
    low_end = None if low_hour is None else _next_hour(low_hour)
    if (
        query.user_id is not None
        or (low_hour is not None and (low_hour == high_hour or low_end is None))
        or (high_hour is not None and _next_hour(high_hour) is None)
    ):
        return int(q(f"SELECT count(*) FROM sessions WHERE {where}", params).fetchone()[0])
    conds, values = ["1 = 1"], []
    if query.status is not None:
        conds.append("status = ?")
        values.append(query.status)
    hours = list(conds)
    hour_values = list(values)
    if low_hour is not None:
        hours.append("hour > ?")
        hour_values.append(low_hour)
    if high_hour is not None:
        hours.append("hour < ?")
        hour_values.append(high_hour)
    total = q(
        f"SELECT coalesce(sum(n), 0) FROM session_hours WHERE {' AND '.join(hours)}", hour_values
    ).fetchone()[0]
    ends = []
    if low is not None and low_end is not None:
        ends.append(("started_at >= ? AND started_at < ?", [low, low_end]))
    if high is not None and high_hour is not None:
        ends.append(("started_at >= ? AND started_at <= ?", [high_hour, high]))
    for cond, bounds in ends:
        total += q(
            f"SELECT count(*) FROM sessions WHERE {' AND '.join(conds)} AND {cond}",
            [*values, *bounds],
        ).fetchone()[0]
    return int(total)


def _next_hour(hour: str) -> str | None:
    """ "2026-11-23T23" -> "2026-11-24T00": the first instant after the hour, as a prefix;
    None if hour is not one (the count then reads the sessions)."""
    try:
        start = datetime.strptime(hour, "%Y-%m-%dT%H")
        after = start + timedelta(hours=1)
    except ValueError:
        return None
    except OverflowError:  # the last hour of year 9999
        return hour[:11] + "24"
    return f"{after.year:04d}-{after.month:02d}-{after.day:02d}T{after.hour:02d}"
