"""The embedded store: one SQLite file in WAL mode, one connection, group commit.

Every write goes through one queue of jobs. The jobs that arrive while a
commit is in progress make up the next transaction (group commit), so many
senders share one fsync instead of paying one each. Statements run on the
event loop (they only touch memory); the commit, which waits on the disk, and
a wait for another process's lock run in one helper thread, so the event loop
never waits on either.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from receiver.errors import StorageUnavailableError, StoreError
from receiver.events import BaseEvent
from receiver.store.base import Accepted, OnAccepted
from receiver.store.events import event_row
from receiver.store.sql import SQLStore
from receiver.store.sqlite import events
from receiver.store.sqlite.schema import migrate
from receiver.store.sqlite.tx import SQLiteTx
from receiver.store.statements import SQLITE, Query

log = logging.getLogger("receiver.store")
T = TypeVar("T")

# Page cache, instead of SQLite's default 2 MiB: ids from the service land all over the id
# index, and this keeps its pages in memory. (Not measured to matter for the bench's
# sequential ids; it costs up to 64 MiB of memory.)
CACHE_KIB = 64 * 1024
READERS = 2  # threads (each with its own connection) for the read API
CROWD = 4  # accepts in one cycle that mean a burst
PRESSURE_WINDOW = 0.25  # seconds a burst is remembered
# Free space the readiness probe wants beside the database: the probe's own one-row write
# can still commit into a WAL that has room while an event, which needs new pages, cannot.
DISK_HEADROOM = 256 * 1024
Result = tuple["asyncio.Future[Any]", Any, BaseException | None]


class _Accept:
    __slots__ = ("future", "params")

    def __init__(self, future: asyncio.Future[Accepted], params: tuple[Any, ...]) -> None:
        self.future = future
        self.params = params


class _Call:
    __slots__ = ("future", "fn", "write")

    def __init__(
        self, future: asyncio.Future[Any], fn: Callable[[sqlite3.Connection], Any], write: bool
    ) -> None:
        self.future = future
        self.fn = fn
        self.write = write


class _TransactionLost(Exception):
    """SQLite rolled the whole transaction back (disk full, I/O error): the cycle failed."""

    def __init__(self, cause: sqlite3.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _undo(conn: sqlite3.Connection, savepoint: str, exc: Exception) -> None:
    """Roll back to a savepoint, or raise _TransactionLost if SQLite already ended it all."""
    if not conn.in_transaction:
        raise _TransactionLost(exc if isinstance(exc, sqlite3.Error) else sqlite3.Error(exc))
    conn.execute(f"ROLLBACK TO {savepoint}")
    conn.execute(f"RELEASE {savepoint}")


class SQLiteStore(SQLStore):
    """The Store on one SQLite file. Open it inside the event loop that will use it."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "full",
        busy_timeout: float = 2.0,
        on_accepted: OnAccepted | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        self.busy_timeout = busy_timeout
        super().__init__(
            SQLITE,
            on_accepted=on_accepted,
            clock=clock,
            transact=self.transact,
            accept=self._accept,
            quarantine=self._quarantine,
            replay=self._replay,
            prune=self._prune,
            size=self._size,
        )
        self._conn: sqlite3.Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The one thread that waits on the disk (COMMIT's fsync) or on another process's lock.
        self._disk: ThreadPoolExecutor | None = None
        self._jobs: list[_Accept | _Call] = []  # for the next cycle
        self._wake = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._closing = False
        self._pressed_at = float("-inf")  # when a cycle last took a crowd of accepts
        # Why the last write cycle failed, until one commits a change again (readiness).
        self.last_write_error: str | None = None
        # The read API's reads: WAL readers in threads of their own, off the event loop and
        # beside the writer (they never wait for it, nor it for them).
        self._readers: ThreadPoolExecutor | None = None
        self._reader_local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="receiver-store")
        try:
            self._conn = await self._loop.run_in_executor(self._disk, self._connect)
        except Exception as exc:
            self._disk.shutdown(wait=False)
            raise StoreError(f"cannot open database {self.path}: {exc}") from exc
        self._readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="receiver-read")
        self._wake = asyncio.Event()
        self._pump = asyncio.create_task(self._run(), name="receiver-store")

    async def close(self) -> None:
        if self._pump is None or self._conn is None or self._disk is None:
            return
        self._closing = True
        self._wake.set()
        await self._pump  # finishes what is queued first
        conn, self._conn, self._pump = self._conn, None, None
        if self._readers is not None:
            self._readers.shutdown(wait=True)
            self._readers = None
        for reader in self._reader_conns:
            reader.close()
        self._reader_conns.clear()
        await asyncio.get_running_loop().run_in_executor(self._disk, conn.close)
        self._disk.shutdown(wait=True)
        self._disk = None

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=self.busy_timeout, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            conn.execute("PRAGMA temp_store=MEMORY")
            self.schema_version = migrate(conn)
            # From now on the event loop must never wait on a lock: it gets "locked" at once
            # and hands the wait to the disk thread (_begin_waiting).
            conn.execute("PRAGMA busy_timeout=0")
        except BaseException:
            conn.close()
            raise
        return conn

    # -- cycles: one transaction, one commit, for everything queued --------------------------

    def _queue(self, job: _Accept | _Call) -> None:
        self._jobs.append(job)
        self._wake.set()

    async def _run(self) -> None:
        """Cycle after cycle while there is work: jobs queued during one cycle's commit make
        up the next (group commit), so many senders share one fsync."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let this loop turn's other requests queue theirs too
            while self._jobs:
                jobs, self._jobs = self._jobs, []
                await self._cycle(jobs)
            if self._closing:
                return

    async def _cycle(self, jobs: list[_Accept | _Call]) -> None:
        """One transaction for the jobs: the accepted events, then each call in its own
        savepoint; one commit (one fsync, in the disk thread) makes all of it durable.

        The statements run here, on the event loop: they touch only memory (the page
        cache), and running them in a thread made every statement wait to win the GIL
        back from the busy loop. A call that raises is rolled back alone and gets its
        error; an error that costs the whole transaction (the disk is full, the file is
        locked) fails every job in it.
        """
        conn, loop, disk = self._conn, self._loop, self._disk
        assert conn is not None and loop is not None and disk is not None
        accepts = [job for job in jobs if type(job) is _Accept]
        calls = [job for job in jobs if type(job) is _Call]
        if len(accepts) >= CROWD:
            self._pressed_at = loop.time()
        results: list[Result] = []
        woke = False
        writes = bool(accepts) or any(c.write for c in calls)
        changes = conn.total_changes
        held = time.perf_counter()  # the statements hold the event loop from here
        try:
            begin = "BEGIN IMMEDIATE" if writes else "BEGIN"
            try:
                conn.execute(begin)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                await loop.run_in_executor(disk, self._begin_waiting, conn, begin)
                held = time.perf_counter()  # that wait was in the disk thread
            try:
                inserted = True
                if accepts:
                    results += self._insert(conn, accepts)
                    woke = any(value == "new" for _, value, _ in results)
                    inserted = results[0][2] is None  # all of them are refused, or none
                results += [self._call_in(conn, call) for call in calls]
                if self.on_cycle is not None:
                    self.on_cycle(time.perf_counter() - held)
                commit = loop.run_in_executor(disk, conn.execute, "COMMIT")
                try:
                    await asyncio.shield(commit)
                except asyncio.CancelledError:
                    # Never touch the connection while the commit still runs in the thread.
                    await asyncio.wait([commit])
                    raise
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            # Cleared only by a commit that changed something: an empty one (nothing due to
            # claim, all duplicates) needs no disk space, so it proves nothing on a full disk.
            if inserted and conn.total_changes != changes:
                self.last_write_error = None
        except Exception as exc:  # noqa: BLE001 - fail this cycle, never the pump (all would hang)
            cause = exc.cause if isinstance(exc, _TransactionLost) else exc
            if not isinstance(cause, sqlite3.Error):
                log.exception("a store cycle failed; its %d jobs are refused", len(jobs))
            if accepts:
                log.error("storage unavailable: %s (%d events refused)", cause, len(accepts))
            error = StorageUnavailableError(f"storage unavailable: {cause}; retry later")
            results = [(job.future, None, error) for job in jobs]
            woke = False
            if writes:
                self.last_write_error = str(cause)
        for future, value, failure in results:
            if future.done():
                continue
            if failure is None:
                future.set_result(value)
            else:
                future.set_exception(failure)
        if woke and self.on_accepted is not None:
            self.on_accepted()

    def _begin_waiting(self, conn: sqlite3.Connection, begin: str) -> None:
        """BEGIN, waiting up to busy_timeout for another process to let go of the lock.

        SQLite's own busy handler waits, inside the statement: Python lets go of the GIL
        for all of it, where a loop of tries here would take the GIL back at each one and
        slow the event loop's thread."""
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        try:
            conn.execute(begin)
        finally:
            conn.execute("PRAGMA busy_timeout=0")

    def _insert(self, conn: sqlite3.Connection, accepts: list[_Accept]) -> list[Result]:
        conn.execute("SAVEPOINT accepts")
        try:
            new = events.insert_batch(conn, [job.params for job in accepts])
        except Exception as exc:  # noqa: BLE001 - refused, the senders retry; calls go on
            _undo(conn, "accepts", exc)
            log.exception("storing %d events failed", len(accepts))
            self.last_write_error = f"storing events failed: {exc}"
            error = StorageUnavailableError(f"storage failed: {exc}; retry later")
            return [(job.future, None, error) for job in accepts]
        conn.execute("RELEASE accepts")
        return [(job.future, result, None) for job, result in zip(accepts, new, strict=True)]

    def _call_in(self, conn: sqlite3.Connection, call: _Call) -> Result:
        conn.execute("SAVEPOINT call")
        try:
            result = call.fn(conn)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            _undo(conn, "call", exc)
            if isinstance(exc, sqlite3.Error):
                return (call.future, None, StorageUnavailableError(f"storage unavailable: {exc}"))
            return (call.future, None, exc)
        conn.execute("RELEASE call")
        return (call.future, result, None)

    async def _call(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        if self._conn is None or self._loop is None or self._closing:
            raise StoreError("store is not open")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue(_Call(future, fn, write))
        return await future

    # -- ingest -----------------------------------------------------------------------------

    async def _accept(self, event: BaseEvent, raw: bytes, trace: str | None) -> Accepted:
        if self._conn is None or self._loop is None or self._closing:
            raise StorageUnavailableError("store is not open")
        future: asyncio.Future[Accepted] = self._loop.create_future()
        params = event_row(event, raw, self.clock(), trace)
        self._queue(_Accept(future, params))
        return await future

    def under_pressure(self) -> bool:
        """Whether senders are crowding in: a cycle took CROWD accepts or more within the
        last PRESSURE_WINDOW seconds."""
        assert self._loop is not None
        return self._loop.time() - self._pressed_at < PRESSURE_WINDOW

    async def _quarantine(
        self, raw: bytes, *, reason: str, client: str | None, event_id: str | None
    ) -> None:
        now = self.clock()
        await self._call(lambda conn: events.quarantine(conn, now, raw, reason, client, event_id))

    async def check_writable(self) -> None:
        """Commit a one-row write (the schema version, rewritten as it is): it needs a page
        of disk, as an event does, where an empty transaction needs none and would pass on
        a full disk. Clears last_write_error when it commits. Then wants DISK_HEADROOM free
        beside the database: the probe's row fits in a WAL page already there, where an
        event may need pages the disk no longer has."""
        await self._call(
            lambda conn: conn.execute(
                "UPDATE schema_version SET version = version"
                " WHERE version = (SELECT max(version) FROM schema_version)"
            ),
            write=True,
        )
        free = await asyncio.to_thread(_free_bytes, self.path)
        if free is not None and free < DISK_HEADROOM:
            raise StorageUnavailableError(
                f"storage unavailable: the database's disk is full ({free} bytes free,"
                f" {DISK_HEADROOM} wanted to take events)"
            )

    async def _prune(self, before: float, *, limit: int) -> dict[str, int]:
        """One batch of retention (receiver.store.sqlite.events.prune)."""
        return await self._call(lambda conn: events.prune(conn, before, limit))

    # -- routing ----------------------------------------------------------------------------

    async def transact(self, fn: Callable[[SQLiteTx], T]) -> T:
        """Run fn in one write transaction (a savepoint of a cycle): all of it commits, or none."""
        return await self._call(lambda conn: fn(SQLiteTx(conn)))

    # -- the roles' statements (receiver.store.statements.Runner) ----------------------------

    async def statements(self, fn: Callable[[Query], T], *, write: bool = True) -> T:
        return await self._call(lambda conn: fn(conn.execute), write=write)

    async def _size(self) -> int:
        """Bytes on disk: the database file and its write-ahead log."""
        wal = self.path.with_name(self.path.name + "-wal")
        return sum(p.stat().st_size for p in (self.path, wal) if p.exists())

    async def read(self, fn: Callable[[Query], T]) -> T:
        """fn(query) in one read transaction (a snapshot) on a reader thread's connection."""
        if self._readers is None or self._loop is None or self._closing:
            raise StorageUnavailableError("store is not open")
        return await self._loop.run_in_executor(self._readers, self._read_in, fn)

    def _read_in(self, fn: Callable[[Query], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro",
                uri=True,
                isolation_level=None,
                timeout=self.busy_timeout,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB // 4}")
            self._reader_local.conn = conn
            self._reader_conns.append(conn)
        try:
            conn.execute("BEGIN")
            try:
                return fn(conn.execute)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageUnavailableError(f"storage unavailable: {exc}") from exc

    async def _replay(
        self, event_id: str, *, now: float, respect_lifecycle: bool = False
    ) -> int | None:
        """A replay request (receiver.store.sqlite.events.request_replay)."""
        return await self._call(
            lambda conn: events.request_replay(conn, event_id, now, respect_lifecycle)
        )


def _free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding path (None
    for an in-memory database or a path that cannot be looked at)."""
    if str(path) == ":memory:":
        return None
    try:
        stat = os.statvfs(path.parent)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
