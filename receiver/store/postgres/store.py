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
  batches; each alert is changed under a transaction-scoped advisory lock on its id, so
  two replicas never both open, resolve or notify one alert. A transaction takes its
  advisory locks in one order, whatever calls for them (receiver.store.postgres.locks): a
  lock it needs out of order makes it run again, that lock taken first, never deadlock.
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
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from receiver.errors import StorageUnavailableError, StoreError
from receiver.events import BaseEvent
from receiver.redact import redact_url
from receiver.store.base import Accepted, OnAccepted, Tx
from receiver.store.events import event_row
from receiver.store.postgres.locks import Key, LockOrderError
from receiver.store.postgres.schema import migrate
from receiver.store.postgres.tx import PostgresTx, query, try_lock
from receiver.store.sql import SQLStore
from receiver.store.statements import POSTGRES, Query

log = logging.getLogger("receiver.store")
T = TypeVar("T")

POOL_SIZE = 8  # connections (and threads) per replica
CONNECT_TIMEOUT = 3.0  # seconds to get a connection before a request is refused (503)
CROWD = 4  # accepts in one batch that mean a burst
PRESSURE_WINDOW = 0.25
MAX_BATCH = 500  # accepts in one INSERT
COMMITS = 2  # batches of accepts committing at once
# Runs of a transaction that needed a lock out of order, each with more locks taken first,
# before the last run waits for any lock (receiver.store.postgres.locks).
LOCK_RUNS = 5
# psycopg's own default: a statement run this many times on one connection is prepared
# there. None never prepares, which a pooler that does not keep prepared statements needs
# (PgBouncer in transaction mode before 1.21): RECEIVER_DB_PREPARE_THRESHOLD=off.
PREPARE_THRESHOLD = 5


def _unavailable(exc: BaseException) -> StorageUnavailableError:
    """A refusal that is safe to show: the database's message without the URL."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    first = redact_url(first)  # libpq quotes a connection string at times
    return StorageUnavailableError(f"storage unavailable: {first}; retry later")


class PostgresStore(SQLStore):
    """The Store on PostgreSQL. Open it inside the event loop that will use it."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = POOL_SIZE,
        connect_timeout: float = CONNECT_TIMEOUT,
        on_accepted: OnAccepted | None = None,
        clock: Callable[[], float] = time.time,
        prepare_threshold: int | None = PREPARE_THRESHOLD,
    ) -> None:
        self.url = url
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        super().__init__(
            POSTGRES,
            on_accepted=on_accepted,
            clock=clock,
            transact=self.transact,
            accept=self._accept,
            quarantine=self._quarantine,
            replay=self._replay,
            prune=self._prune,
            size=self._size,
        )
        self.prepare_threshold = prepare_threshold
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
            kwargs={
                "connect_timeout": max(1, int(self.connect_timeout)),
                "prepare_threshold": self.prepare_threshold,
            },
            name="receiver",
        )

        def start() -> None:
            self._pool.open(wait=True, timeout=max(10.0, self.connect_timeout))
            with self._pool.connection() as conn:
                self.schema_version = migrate(conn)

        try:
            await self._loop.run_in_executor(self._threads, start)
        except Exception as exc:
            await self._loop.run_in_executor(self._threads, self._pool.close)
            self._threads.shutdown(wait=False)
            # A refusal of ours (a schema newer than this program) is not an outage: no
            # "retry later" for it.
            reason = str(exc) if isinstance(exc, StoreError) else _unavailable(exc).message
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

    async def _accept(self, event: BaseEvent, raw: bytes, trace: str | None) -> Accepted:
        if self._loop is None or self._closing:
            raise StorageUnavailableError("store is not open")
        future: asyncio.Future[Accepted] = self._loop.create_future()
        params = event_row(event, raw, self.clock(), trace)
        self._accepts.append((future, params))
        self._wake.set()
        return await future

    def under_pressure(self) -> bool:
        assert self._loop is not None
        return self._loop.time() - self._pressed_at < PRESSURE_WINDOW

    async def _run(self) -> None:
        """Batch after batch: the accepts queued while others commit make up the next, with
        up to COMMITS batches committing at once (each commit waits on the server's disk,
        and one at a time left this process idle most of the time under load)."""
        assert self._loop is not None
        committing: set[asyncio.Task[None]] = set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)
            while self._accepts:
                if len(committing) >= COMMITS:
                    # The accepts queued meanwhile go in the next batch, whole.
                    await asyncio.wait(committing, return_when=asyncio.FIRST_COMPLETED)
                    continue
                batch, self._accepts = self._accepts[:MAX_BATCH], self._accepts[MAX_BATCH:]
                if len(batch) >= CROWD:
                    self._pressed_at = self._loop.time()
                task = asyncio.create_task(self._commit(batch))
                committing.add(task)
                task.add_done_callback(committing.discard)
            if self._closing:
                if committing:
                    await asyncio.wait(committing)
                return

    async def _commit(self, batch: list[tuple[asyncio.Future[Accepted], tuple[Any, ...]]]) -> None:
        params = [p for _, p in batch]
        try:
            results = await self._call(lambda conn: _insert_events(conn, params))
        except Exception as exc:  # noqa: BLE001 - refuse this batch, keep the pump
            error = exc if isinstance(exc, StorageUnavailableError) else _unavailable(exc)
            if not isinstance(exc, StorageUnavailableError):
                log.exception("storing %d events failed", len(batch))
            # The message already says "storage unavailable: ...; retry later".
            reason = error.message.removesuffix("; retry later")
            log.error("%s (%d events refused)", reason, len(batch))
            for future, _ in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (future, _), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        if "new" in results and self.on_accepted is not None:
            self.on_accepted()

    async def _quarantine(
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
        first: frozenset[Key] = frozenset()
        for run in range(1, LOCK_RUNS + 1):
            patient = run == LOCK_RUNS

            def attempt(conn: Any, first: frozenset[Key] = first, patient: bool = patient) -> T:
                return fn(PostgresTx(conn, first=first, patient=patient))

            try:
                return await self._call(attempt)
            except LockOrderError as exc:  # rolled back: again, those locks taken first
                log.debug("transaction run %d: %s", run, exc)
                first |= exc.keys
        raise AssertionError("the last run waits for its locks")  # pragma: no cover

    async def _size(self) -> int:
        """Bytes on disk of the whole database."""
        return int(
            await self.read(
                lambda q: q("SELECT pg_database_size(current_database())", ()).fetchone()[0]
            )
        )

    # -- the roles' statements (receiver.store.statements.Runner) ----------------------------

    async def statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        return await self._call(lambda conn: fn(functools.partial(query, conn)))

    async def read(self, fn: Callable[[Query], T]) -> T:
        """fn(query) in one snapshot, as on SQLite: under READ COMMITTED each statement
        sees its own, and a session read that folds the events not routed yet into the
        projection counted an event routed between its two statements twice."""

        def snapshot(conn: Any) -> T:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return fn(functools.partial(query, conn))

        return await self._call(snapshot)

    async def _replay(
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

    async def _prune(self, before: float, *, limit: int) -> dict[str, int]:
        """One batch of retention, on the replica that holds the retention lock this turn."""

        def delete(conn: Any) -> dict[str, int]:
            counts = {"events": 0, "outbox": 0, "quarantine": 0, "lifecycle": 0}
            if not try_lock(conn, "retention"):
                return counts
            ids = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM events WHERE received_at < %s AND routed_at IS NOT NULL"
                    " ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED",
                    (before, limit),
                )
            ]
            gone = conn.execute(
                "DELETE FROM outbox WHERE event_id = ANY(%s)"
                " AND state NOT IN ('pending', 'held', 'sending') RETURNING id",
                (ids,),
            ).fetchall()
            # Finished rows whose event went first (pruned while they were still to send)
            # belong to no event any more: the head of the outbox, by id, finished before.
            gone += conn.execute(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM (SELECT id, state, updated_at"
                " FROM outbox ORDER BY id LIMIT %s) AS head WHERE updated_at < %s"
                " AND state IN ('delivered', 'dead', 'cancelled')) RETURNING id",
                (limit, before),
            ).fetchall()
            counts["outbox"] = len(gone)
            conn.execute(  # their attempt logs go with them
                "DELETE FROM outbox_attempts WHERE outbox_id = ANY(%s)", ([r[0] for r in gone],)
            )
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
                    "DELETE FROM escalations WHERE (alert, episode, rule) IN (SELECT alert,"
                    " episode, rule FROM escalations WHERE next_at IS NULL"
                    " AND suppressed_since IS NULL AND started_at < %s LIMIT %s)",
                    "DELETE FROM silences WHERE id IN (SELECT id FROM silences"
                    " WHERE ends_at < %s LIMIT %s)",
                    "DELETE FROM replays WHERE id IN (SELECT id FROM replays"
                    " WHERE requested_at < %s LIMIT %s)",
                    "DELETE FROM chat_threads WHERE (key, target) IN (SELECT key, target"
                    " FROM chat_threads WHERE updated_at < %s LIMIT %s)",
                )
            )
            return counts

        return await self._call(delete)


def _insert_events(conn: Any, params: list[tuple[Any, ...]]) -> list[Accepted]:
    """One multi-row INSERT of a batch: "new" for each id it stored; an id already stored,
    or seen earlier in the batch, is a "duplicate", or a "conflict" if its raw body differs
    from the stored one (only a batch with duplicates reads bodies back)."""
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(params))
    stored = {
        row[0]
        for row in conn.execute(
            "INSERT INTO events (id, type, session_id, user_id, score, threshold, event_ts,"
            f" received_at, body, trace) VALUES {values} ON CONFLICT (id) DO NOTHING RETURNING id",
            [value for p in params for value in p],
        )
    }
    results: list[Accepted] = []
    for p in params:
        results.append("new" if p[0] in stored else "duplicate")
        stored.discard(p[0])  # a second copy in the same batch is a duplicate
    dups = [p[0] for p, r in zip(params, results, strict=True) if r == "duplicate"]
    if dups:
        bodies = dict(
            conn.execute(
                "UPDATE events SET duplicates = duplicates + 1 WHERE id = ANY(%s)"
                " RETURNING id, body",
                (dups,),
            )
        )
        results = [
            "conflict" if r == "duplicate" and bodies.get(p[0], p[8]) != p[8] else r
            for p, r in zip(params, results, strict=True)
        ]
    return results
