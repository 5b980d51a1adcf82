"""The PostgreSQL store: several receivers (replicas) on one database behave as one.

    RECEIVER_DB=postgresql://receiver:secret@db:5432/receiver

psycopg 3 with psycopg_pool's (synchronous) connection pool, driven from a small thread
pool. The store's interface hands the router and the lifecycle a synchronous
transaction (Tx), which a thread serves naturally; a statement here is a round trip to
the server, so it must not run on the event loop anyway.

What makes replicas one receiver:

- Dedupe on the events primary key: a duplicate answers 200 on whichever replica it
  reaches. Accepts are group-committed: those queued while a batch commits make up the
  next, one multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING id and one commit each.
- Routing takes unrouted events FOR UPDATE SKIP LOCKED, so replicas route disjoint
  batches; each alert is changed under a transaction-scoped advisory lock on its id
  (taken in sorted order), so two replicas never both open, resolve or notify one alert.
- The throttle is one INSERT ... ON CONFLICT DO UPDATE ... WHERE the window has passed:
  the row lock decides which replica's notification goes out.
- Outbox rows are claimed FOR UPDATE SKIP LOCKED under a lease: a killed replica's
  claims go to the others once the lease runs out.
- Timers (repeats, heartbeat, digests) and retention run on whichever replica wins a
  transaction-scoped pg_try_advisory_xact_lock; the others skip that turn (failover is
  the next turn of any replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from receiver.errors import StorageUnavailableError, StoreError
from receiver.events import _Event as Event
from receiver.events import to_utc
from receiver.store.base import Accepted, OnAccepted, OutboxRow, Tx
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

log = logging.getLogger("receiver.store")
T = TypeVar("T")

POOL_SIZE = 8  # connections (and threads) per replica
CONNECT_TIMEOUT = 3.0  # seconds to get a connection before a request is refused (503)
CROWD = 4  # accepts in one batch that mean a burst
PRESSURE_WINDOW = 0.25
MAX_BATCH = 500  # accepts in one INSERT
# Advisory lock keys: one number for migrations, and one a timer (by name).
_MIGRATE_LOCK = 0x5EC0DE01

_OUTBOX_COLUMNS = (
    "id, event_id, rule, notifier, target, title, body, state, attempts, next_at,"
    " created_at, updated_at, reason, last_error, kind, replay"
)
_SELECT_ALERTS = (
    "SELECT id, state, episode, last_ts, opened_ts, opened_event, resolved_ts FROM alerts"
)

MIGRATIONS: list[str] = [
    # 1: everything SQLite's schemas 1 to 4 hold, in one step.
    """
    CREATE TABLE events (
        id TEXT PRIMARY KEY,
        type TEXT NOT NULL,
        session_id TEXT,
        user_id TEXT,
        score DOUBLE PRECISION,
        threshold DOUBLE PRECISION,
        event_ts TEXT NOT NULL,
        received_at DOUBLE PRECISION NOT NULL,
        body TEXT NOT NULL,
        routed_at DOUBLE PRECISION
    );
    CREATE INDEX events_unrouted ON events (received_at) WHERE routed_at IS NULL;
    CREATE INDEX events_received ON events (received_at);
    CREATE TABLE quarantine (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        received_at DOUBLE PRECISION NOT NULL,
        reason TEXT NOT NULL,
        client TEXT,
        event_id TEXT,
        body BYTEA NOT NULL
    );
    CREATE TABLE outbox (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id TEXT NOT NULL,
        rule TEXT NOT NULL,
        notifier TEXT NOT NULL,
        target INTEGER NOT NULL,
        title TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at DOUBLE PRECISION NOT NULL,
        lease_until DOUBLE PRECISION,
        last_error TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL DEFAULT 'event',
        alert TEXT,
        episode INTEGER,
        group_id BIGINT
    );
    CREATE INDEX outbox_due ON outbox (next_at) WHERE state IN ('pending', 'sending', 'held');
    CREATE INDEX outbox_target_due ON outbox (notifier, target, next_at)
        WHERE state IN ('pending', 'sending', 'held');
    CREATE INDEX outbox_event ON outbox (event_id);
    CREATE INDEX outbox_alert ON outbox (alert, episode) WHERE alert IS NOT NULL;
    CREATE TABLE throttle (
        rule TEXT NOT NULL,
        key TEXT NOT NULL,
        until DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (rule, key)
    );
    CREATE TABLE alerts (
        id TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        episode INTEGER NOT NULL,
        opened_ts TEXT,
        opened_event TEXT,
        last_ts TEXT NOT NULL,
        resolved_ts TEXT,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX alerts_open ON alerts (state) WHERE state = 'open';
    CREATE TABLE notices (
        alert TEXT NOT NULL,
        episode INTEGER NOT NULL,
        rule TEXT NOT NULL,
        notified_at DOUBLE PRECISION NOT NULL,
        next_repeat_at DOUBLE PRECISION,
        repeats INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (alert, episode, rule)
    );
    CREATE INDEX notices_repeat ON notices (next_repeat_at) WHERE next_repeat_at IS NOT NULL;
    CREATE TABLE groups (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        rule TEXT NOT NULL,
        key TEXT NOT NULL,
        opened_at DOUBLE PRECISION NOT NULL,
        closes_at DOUBLE PRECISION NOT NULL,
        count INTEGER NOT NULL,
        members TEXT NOT NULL,
        state TEXT NOT NULL
    );
    CREATE INDEX groups_open ON groups (rule, key) WHERE state = 'open';
    CREATE TABLE silences (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        matchers TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        starts_at DOUBLE PRECISION NOT NULL,
        ends_at DOUBLE PRECISION NOT NULL,
        expired_at DOUBLE PRECISION
    );
    CREATE TABLE state (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 2: `receiver replay` (SQLite's schema 5): an operator's request to route an event
    # again; the event names its open request, the outbox rows it produced name it too.
    """
    CREATE TABLE replays (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id TEXT NOT NULL,
        requested_at DOUBLE PRECISION NOT NULL,
        respect_lifecycle BOOLEAN NOT NULL,
        routed_at DOUBLE PRECISION
    );
    ALTER TABLE events ADD COLUMN replay BIGINT;
    ALTER TABLE outbox ADD COLUMN replay BIGINT;
    CREATE INDEX outbox_replay ON outbox (replay) WHERE replay IS NOT NULL;
    """,
]


def lock_key(name: str) -> int:
    """A stable 32-bit advisory lock key for a name (the same on every replica)."""
    return zlib.crc32(name.encode())


def migrate(conn: Any) -> int:
    """Bring the database to the newest schema under an advisory lock, so replicas starting
    together migrate it once; the version it is at."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
        current = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        if current > len(MIGRATIONS):
            raise StoreError(
                f"database schema version {current} is newer than this program "
                f"({len(MIGRATIONS)}); upgrade attention-receiver"
            )
        for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
    return len(MIGRATIONS)


def _real(value: float | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _unavailable(exc: BaseException) -> StorageUnavailableError:
    """A refusal that is safe to show: the database's message without the URL."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StorageUnavailableError(f"storage unavailable: {first}; retry later")


class PostgresStore:
    """The Store on PostgreSQL. Open it inside the event loop that will use it."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = POOL_SIZE,
        connect_timeout: float = CONNECT_TIMEOUT,
        on_accepted: OnAccepted | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self.on_accepted = on_accepted
        self.clock = clock
        # Why the last statement failed, while none has succeeded since (/readyz). With a
        # server at the other end, reads fail the same way writes do, so both count.
        self.last_write_error: str | None = None
        self._pool: Any = None
        self._threads: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepts: list[tuple[asyncio.Future[Accepted], tuple[Any, ...]]] = []
        self._wake = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._closing = False
        self._pressed_at = float("-inf")

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        from psycopg_pool import ConnectionPool

        self._loop = asyncio.get_running_loop()
        self._threads = ThreadPoolExecutor(
            max_workers=self.pool_size, thread_name_prefix="receiver-pg"
        )
        self._pool = ConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            timeout=self.connect_timeout,
            check=ConnectionPool.check_connection,
            kwargs={"connect_timeout": max(1, int(self.connect_timeout))},
            name="receiver",
        )

        def start() -> None:
            self._pool.open(wait=True, timeout=max(10.0, self.connect_timeout))
            with self._pool.connection() as conn:
                migrate(conn)

        try:
            await self._loop.run_in_executor(self._threads, start)
        except Exception as exc:
            await self._loop.run_in_executor(self._threads, self._pool.close)
            self._threads.shutdown(wait=False)
            reason = _unavailable(exc).message
            raise StoreError(f"cannot open the PostgreSQL database: {reason}") from None
        self._wake = asyncio.Event()
        self._pump = asyncio.create_task(self._run(), name="receiver-store")

    async def close(self) -> None:
        if self._pump is None or self._threads is None or self._loop is None:
            return
        self._closing = True
        self._wake.set()
        await self._pump
        self._pump = None
        await self._loop.run_in_executor(self._threads, self._pool.close)
        self._threads.shutdown(wait=True)
        self._threads = None

    # -- running statements in the pool -----------------------------------------------------

    async def _call(self, fn: Callable[[Any], T]) -> T:
        """fn(connection) in one transaction, in a pool thread; database errors become
        StorageUnavailableError (503 to a sender, a retry for the router)."""
        if self._threads is None or self._loop is None or self._closing:
            raise StorageUnavailableError("store is not open")
        try:
            result = await self._loop.run_in_executor(self._threads, self._in_transaction, fn)
        except StorageUnavailableError as exc:
            self.last_write_error = exc.message.removesuffix("; retry later")
            raise
        self.last_write_error = None
        return result

    def _in_transaction(self, fn: Callable[[Any], T]) -> T:
        import psycopg
        import psycopg_pool

        try:
            with self._pool.connection() as conn, conn.transaction():
                return fn(conn)
        # The server is down or restarting, the connection broke, no connection came in
        # time, or two replicas deadlocked (a TransactionRollback, also Operational): all
        # pass; the caller retries (a sender on 503, the router and worker by themselves).
        except (psycopg.OperationalError, psycopg.InterfaceError, psycopg_pool.PoolTimeout) as exc:
            raise _unavailable(exc) from None

    # -- ingest: group commit ---------------------------------------------------------------

    async def accept(self, event: Event, raw: bytes) -> Accepted:
        if self._loop is None or self._closing:
            raise StorageUnavailableError("store is not open")
        future: asyncio.Future[Accepted] = self._loop.create_future()
        params = (
            event.id,
            event.type,
            event.sessionId,
            event.userId,
            _real(event.score),
            _real(event.threshold),
            to_utc(event.timestamp).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            self.clock(),
            raw.decode("utf-8"),
        )
        self._accepts.append((future, params))
        self._wake.set()
        return await future

    def under_pressure(self) -> bool:
        assert self._loop is not None
        return self._loop.time() - self._pressed_at < PRESSURE_WINDOW

    async def _run(self) -> None:
        """Batch after batch: the accepts queued while one commits make up the next."""
        assert self._loop is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)
            while self._accepts:
                batch, self._accepts = self._accepts[:MAX_BATCH], self._accepts[MAX_BATCH:]
                if len(batch) >= CROWD:
                    self._pressed_at = self._loop.time()
                await self._commit(batch)
            if self._closing:
                return

    async def _commit(self, batch: list[tuple[asyncio.Future[Accepted], tuple[Any, ...]]]) -> None:
        params = [p for _, p in batch]
        try:
            results = await self._call(lambda conn: _insert_events(conn, params))
        except Exception as exc:  # noqa: BLE001 - refuse this batch, keep the pump
            error = exc if isinstance(exc, StorageUnavailableError) else _unavailable(exc)
            if not isinstance(exc, StorageUnavailableError):
                log.exception("storing %d events failed", len(batch))
            log.error("storage unavailable: %s (%d events refused)", error.message, len(batch))
            for future, _ in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (future, _), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        if "new" in results and self.on_accepted is not None:
            self.on_accepted()

    async def quarantine(
        self, raw: bytes, *, reason: str, client: str | None, event_id: str | None
    ) -> None:
        now = self.clock()
        await self._call(
            lambda conn: conn.execute(
                "INSERT INTO quarantine (received_at, reason, client, event_id, body)"
                " VALUES (%s, %s, %s, %s, %s)",
                (now, reason, client, event_id, raw),
            )
        )

    async def check_writable(self) -> None:
        """Commit a one-row write (the schema version, rewritten as it is)."""
        await self._call(
            lambda conn: conn.execute(
                "UPDATE schema_version SET version = version"
                " WHERE version = (SELECT max(version) FROM schema_version)"
            )
        )

    # -- routing ----------------------------------------------------------------------------

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        return await self._call(lambda conn: fn(PostgresTx(conn)))

    # -- delivery ---------------------------------------------------------------------------

    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        lease: float,
        lanes: Mapping[tuple[str, int], int] | None = None,
    ) -> list[OutboxRow]:
        update = (
            "UPDATE outbox SET state = 'sending', lease_until = %s, attempts = attempts + 1,"
            " updated_at = %s WHERE id IN (SELECT id FROM outbox WHERE"
            " state IN ('pending', 'sending', 'held') AND next_at <= %s"
            " AND (state <> 'sending' OR lease_until <= %s) {where}"
            " ORDER BY next_at LIMIT %s FOR UPDATE SKIP LOCKED)"
            f" RETURNING {_OUTBOX_COLUMNS}"
        )
        head = (now + lease, now, now, now)

        def claim(conn: Any) -> list[OutboxRow]:
            rows: list[Any] = []
            for (notifier, target), n in (lanes or {}).items():
                if n > 0:
                    sql = update.format(where="AND notifier = %s AND target = %s")
                    rows += conn.execute(sql, (*head, notifier, target, n)).fetchall()
            if limit > 0:
                where, params = "", []
                if lanes:
                    values = ", ".join("(%s, %s)" for _ in lanes)
                    where = f"AND (notifier, target) NOT IN (VALUES {values})"
                    params = [part for key in lanes for part in key]
                rows += conn.execute(update.format(where=where), (*head, *params, limit)).fetchall()
            return sorted((OutboxRow(*row) for row in rows), key=lambda r: r.id)

        return await self._call(claim)

    async def release(self, row_ids: Sequence[int], *, now: float) -> int:
        if not row_ids:
            return 0
        return await self._call(
            lambda conn: (
                conn.execute(
                    "UPDATE outbox SET state = 'pending', attempts = greatest(attempts - 1, 0),"
                    " lease_until = NULL, next_at = %s, updated_at = %s WHERE state = 'sending'"
                    " AND id = ANY(%s)",
                    (now, now, list(row_ids)),
                ).rowcount
            )
        )

    async def next_due(self) -> float | None:
        def select(conn: Any) -> float | None:
            row = conn.execute(
                "SELECT min(CASE state WHEN 'sending' THEN lease_until ELSE next_at END)"
                " FROM outbox WHERE state IN ('pending', 'sending', 'held')"
            ).fetchone()
            return None if row[0] is None else float(row[0])

        return await self._call(select)

    async def mark_delivered(self, row_id: int, *, now: float) -> None:
        await self._call(
            lambda conn: conn.execute(
                "UPDATE outbox SET state = 'delivered', lease_until = NULL, updated_at = %s,"
                " last_error = NULL WHERE id = %s",
                (now, row_id),
            )
        )

    async def mark_failed(
        self, row_id: int, *, error: str, now: float, retry_at: float | None
    ) -> None:
        state = "pending" if retry_at is not None else "dead"
        await self._call(
            lambda conn: conn.execute(
                "UPDATE outbox SET state = %s, next_at = %s, lease_until = NULL,"
                " last_error = %s, updated_at = %s WHERE id = %s",
                (state, retry_at if retry_at is not None else now, error, now, row_id),
            )
        )

    # -- operator commands ------------------------------------------------------------------

    async def deliveries(
        self, *, state: str | None = None, event_id: str | None = None, limit: int = 50
    ) -> list[OutboxRow]:
        where, params = [], []
        if state:
            where.append("state = %s")
            params.append(state)
        if event_id:
            where.append("event_id = %s")
            params.append(event_id)
        sql = f"SELECT {_OUTBOX_COLUMNS} FROM outbox"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT %s"
        return await self._call(
            lambda conn: [OutboxRow(*row) for row in conn.execute(sql, (*params, limit))]
        )

    async def retry_dead(self, row_id: int | None, *, now: float) -> int:
        sql = (
            "UPDATE outbox SET state = 'pending', next_at = %s, attempts = 0, updated_at = %s"
            " WHERE state = 'dead'"
        )
        params: tuple[Any, ...] = (now, now)
        if row_id is not None:
            sql += " AND id = %s"
            params += (row_id,)
        return await self._call(lambda conn: conn.execute(sql, params).rowcount)

    async def replay(
        self, event_id: str, *, now: float, respect_lifecycle: bool = False
    ) -> int | None:
        def request(conn: Any) -> int | None:
            row = conn.execute(
                "SELECT routed_at, replay FROM events WHERE id = %s FOR UPDATE", (event_id,)
            ).fetchone()
            if row is None:
                return None
            if row[0] is None and row[1] is None:
                raise StoreError(
                    f"event {event_id} has not been routed yet; the server routes it in turn"
                    " (replay it once it has been)"
                )
            (replay_id,) = conn.execute(
                "INSERT INTO replays (event_id, requested_at, respect_lifecycle)"
                " VALUES (%s, %s, %s) RETURNING id",
                (event_id, now, respect_lifecycle),
            ).fetchone()
            conn.execute(
                "UPDATE events SET routed_at = NULL, replay = %s WHERE id = %s",
                (replay_id, event_id),
            )
            return int(replay_id)

        return await self._call(request)

    async def replay_status(self, replay_id: int) -> tuple[Replay | None, list[OutboxRow]]:
        def select(conn: Any) -> tuple[Replay | None, list[OutboxRow]]:
            rows = conn.execute(
                f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE replay = %s ORDER BY id",
                (replay_id,),
            )
            return PostgresTx(conn).replay_request(replay_id), [OutboxRow(*row) for row in rows]

        return await self._call(select)

    async def prune(self, before: float, *, limit: int) -> dict[str, int]:
        """One batch of retention, on the replica that holds the retention lock this turn."""

        def delete(conn: Any) -> dict[str, int]:
            counts = {"events": 0, "outbox": 0, "quarantine": 0, "lifecycle": 0}
            if not _try_lock(conn, "retention"):
                return counts
            ids = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM events WHERE received_at < %s AND routed_at IS NOT NULL"
                    " ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED",
                    (before, limit),
                )
            ]
            counts["outbox"] = conn.execute(
                "DELETE FROM outbox WHERE event_id = ANY(%s)"
                " AND state NOT IN ('pending', 'held', 'sending')",
                (ids,),
            ).rowcount
            counts["events"] = conn.execute(
                "DELETE FROM events WHERE id = ANY(%s)", (ids,)
            ).rowcount
            counts["quarantine"] = conn.execute(
                "DELETE FROM quarantine WHERE id IN (SELECT id FROM quarantine"
                " WHERE received_at < %s ORDER BY id LIMIT %s)",
                (before, limit),
            ).rowcount
            counts["lifecycle"] = sum(
                conn.execute(sql, (before, limit)).rowcount
                for sql in (
                    "DELETE FROM alerts WHERE id IN (SELECT id FROM alerts"
                    " WHERE state = 'resolved' AND updated_at < %s LIMIT %s)",
                    "DELETE FROM notices WHERE (alert, episode, rule) IN (SELECT alert,"
                    " episode, rule FROM notices WHERE next_repeat_at IS NULL"
                    " AND notified_at < %s LIMIT %s)",
                    "DELETE FROM groups WHERE id IN (SELECT id FROM groups"
                    " WHERE closes_at < %s LIMIT %s)",
                    "DELETE FROM silences WHERE id IN (SELECT id FROM silences"
                    " WHERE ends_at < %s LIMIT %s)",
                    "DELETE FROM replays WHERE id IN (SELECT id FROM replays"
                    " WHERE requested_at < %s LIMIT %s)",
                )
            )
            return counts

        return await self._call(delete)


def _insert_events(conn: Any, params: list[tuple[Any, ...]]) -> list[Accepted]:
    """One multi-row INSERT of a batch: "new" for each id it stored; an id already stored,
    or seen earlier in the batch, is a "duplicate", or a "conflict" if its raw body differs
    from the stored one (only a batch with duplicates reads bodies back)."""
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(params))
    stored = {
        row[0]
        for row in conn.execute(
            "INSERT INTO events (id, type, session_id, user_id, score, threshold, event_ts,"
            f" received_at, body) VALUES {values} ON CONFLICT (id) DO NOTHING RETURNING id",
            [value for p in params for value in p],
        )
    }
    results: list[Accepted] = []
    for p in params:
        results.append("new" if p[0] in stored else "duplicate")
        stored.discard(p[0])  # a second copy in the same batch is a duplicate
    dups = [p[0] for p, r in zip(params, results, strict=True) if r == "duplicate"]
    if dups:
        bodies = dict(conn.execute("SELECT id, body FROM events WHERE id = ANY(%s)", (dups,)))
        results = [
            "conflict" if r == "duplicate" and bodies.get(p[0], p[8]) != p[8] else r
            for p, r in zip(params, results, strict=True)
        ]
    return results


def _try_lock(conn: Any, name: str) -> bool:
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
        return _try_lock(self.conn, name)

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
