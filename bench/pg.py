"""The `postgres` part of `make bench`: one replica on PostgreSQL vs SQLite, two vs one, and
what an event costs in CPU on each side, projected to 10,000 and 50,000 events/s.

Each round runs, one after the other, with the same stream as the throughput part:

- `sqlite`: one receiver on a fresh SQLite file (core 0);
- `postgres`: one receiver on a fresh database of one throwaway PostgreSQL server
  (tests.pg, durable=True: fsync, synchronous_commit and full_page_writes on);
- `postgres x2`: two receivers on one fresh database of the same server, both on core 0.
  One wrk with two threads, one a replica (bench/events.lua's BENCH_PORTS), each
  sending every other event of the stream: a layer-4 balancer with keep-alive connections
  does the same, and wrk keeps one latency histogram over both.

PostgreSQL runs on core 1 with wrk and this script: the receiver keeps core 0 to itself
as it does on SQLite, where the database work is in its own process.

CPU: utime + stime from /proc/<pid>/stat, from just before the measured wrk run to the
moment the last stored event is routed. PostgreSQL's is the postmaster's and all its
children's, cutime + cstime included (backends and autovacuum workers that exit meanwhile
are reaped by the postmaster, so their time lands there).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bench import extra
from bench.pg_report import SETUPS, Run, line, section
from tests.pg import ThrowawayPostgres

DRAIN_LIMIT = 120.0  # seconds


class Server(Protocol):
    port: int
    path: str
    proc: subprocess.Popen[bytes] | None

    def start(self, pin: bool) -> None: ...
    def stop(self) -> None: ...


MakeServer = Callable[..., Server]
Wrk = Callable[..., dict[str, Any]]


# -- reading a store ----------------------------------------------------------------------------


class _Store(Protocol):
    def unrouted(self) -> int: ...
    def rows(self, since: float) -> list[tuple[float, float]]: ...
    def wal_bytes(self) -> int | None: ...
    def close(self) -> None: ...


class _SQLite:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _one(self, sql: str, *params: Any) -> Any:
        with sqlite3.connect(self.path, timeout=30) as conn:
            return conn.execute(sql, params).fetchall()

    def unrouted(self) -> int:
        count: int = self._one("SELECT count(*) FROM events WHERE routed_at IS NULL")[0][0]
        return count

    def rows(self, since: float) -> list[tuple[float, float]]:
        return list(
            self._one(
                "SELECT received_at, routed_at FROM events"
                " WHERE received_at >= ? AND routed_at IS NOT NULL",
                since,
            )
        )

    def wal_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class _Postgres:
    """One connection for the whole run, opened before the measured window: a connection a
    poll would fork a backend each time, and its CPU would count as the receiver's load."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def unrouted(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM events WHERE routed_at IS NULL").fetchone()
        return int(row[0]) if row else 0

    def rows(self, since: float) -> list[tuple[float, float]]:
        return list(
            self.conn.execute(
                "SELECT received_at, routed_at FROM events"
                " WHERE received_at >= %s AND routed_at IS NOT NULL",
                (since,),
            ).fetchall()
        )

    def wal_bytes(self) -> int | None:
        row = self.conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()
        return int(row[0]) if row else None

    def close(self) -> None:
        self.conn.close()


def _drain(store: _Store) -> float | None:
    """Seconds until everything stored is routed, or None after DRAIN_LIMIT."""
    started = time.monotonic()
    while time.monotonic() - started < DRAIN_LIMIT:
        if store.unrouted() == 0:
            return time.monotonic() - started
        time.sleep(0.05)
    return None


# -- CPU ----------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu(pid: int) -> float:
    """CPU seconds of pid and its live children, with what its exited children used."""
    ticks = 0
    try:
        fields = _stat(pid)
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    for child in children:
        try:
            ticks += sum(int(x) for x in _stat(int(child))[11:15])
        except OSError:
            continue  # exited just now: reaped into the parent's cutime, or about to be
    return ticks / os.sysconf("SC_CLK_TCK")


def _pin_tree(pid: int, cpus: set[int]) -> None:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for p in (pid, *map(int, children)):
        try:
            os.sched_setaffinity(p, cpus)  # forked backends inherit the postmaster's
        except OSError:
            pass


# -- one run ------------------------------------------------------------------------------------


def _measure(
    setup: str,
    round_no: int,
    servers: list[Server],
    store: _Store,
    postmaster: int | None,
    args: argparse.Namespace,
    stream: Path,
    warmup: Path,
    pin: bool,
    wrk: Wrk,
) -> Run:
    load = extra.uptime()
    try:
        for server in servers:
            server.start(pin)
        ports = [s.port for s in servers]
        spread = {"ports": ports} if len(ports) > 1 else {}
        common = {"connections": args.connections, "pin": pin, **spread}
        wrk(ports[0], "/v1/events", warmup, seconds=args.warmup, **common)
        if _drain(store) is None:
            raise SystemExit(f"{setup}: the warm-up was not routed within {DRAIN_LIMIT:.0f}s")
        pids = [s.proc.pid for s in servers if s.proc is not None]
        since = time.time()  # the receivers' clock: received_at is their time.time()
        cpu = sum(extra.cpu_seconds(p) for p in pids)
        pg_cpu = tree_cpu(postmaster) if postmaster else None
        sampled = time.monotonic()
        wal = store.wal_bytes()
        got = wrk(ports[0], "/v1/events", stream, seconds=args.duration, **common)
        unrouted = store.unrouted()
        took = _drain(store)
        cpu = sum(extra.cpu_seconds(p) for p in pids) - cpu
        if pg_cpu is not None and postmaster:
            pg_cpu = tree_cpu(postmaster) - pg_cpu
        sampled = time.monotonic() - sampled
        wal_after = store.wal_bytes()
        rows = store.rows(since)
    finally:
        for server in servers:
            server.stop()
        store.close()
    errors = {k: got[k] for k in ("connect", "read", "write", "status", "timeout") if got[k]}
    run = Run(
        setup,
        round_no,
        got["requests"] / (got["duration_us"] / 1e6),
        got["p50_us"] / 1000,
        got["p99_us"] / 1000,
        got["requests"],
        errors,
        load,
        receiver_cpu=cpu,
        postgres_cpu=pg_cpu,
        wal=None if wal is None or wal_after is None else wal_after - wal,
        sampled=sampled,
    )
    dupes = max(0, got["requests"] - len(rows))
    run.notes.append(f"{len(rows)} stored, {dupes} duplicates; {unrouted} unrouted as wrk stopped")
    if took is None:
        run.notes.append(f"NOT all routed within {DRAIN_LIMIT:.0f}s: no CPU or routing figures")
        return run
    if unrouted:
        run.notes.append(f"routed in {took:.1f}s after wrk stopped")
    if rows:
        lags = sorted(routed - received for received, routed in rows)
        run.window = max(r for _, r in rows) - min(r for r, _ in rows)
        run.stored = len(rows)
        run.sustained = len(rows) / run.window if run.window > 0 else 0.0
        run.lag_max = max(0.0, lags[-1])
        run.lag_p99 = max(0.0, lags[int(0.99 * (len(lags) - 1))])
        share = f"receiver{'s' if len(servers) > 1 else ''} {cpu / sampled:.0%} of a core"
        if pg_cpu is not None:
            share += f", PostgreSQL {pg_cpu / sampled:.0%}"
        run.notes.append(f"CPU over the {sampled:.1f}s sampled: {share}")
    return run


# -- the part -----------------------------------------------------------------------------------


def run_postgres(
    args: argparse.Namespace,
    work: Path,
    sink_port: int,
    stream: Path,
    warmup: Path,
    pin: bool,
    *,
    make_server: MakeServer,
    wrk: Wrk,
) -> list[str]:
    """The `## PostgreSQL` section of bench/RESULTS.md (see the module's docstring)."""
    postgres = ThrowawayPostgres(durable=True, own=True)
    runs: list[Run] = []
    try:
        postgres.start()
        assert postgres.dir is not None
        pid_file = postgres.dir / "data" / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        here = sorted(os.sched_getaffinity(0))  # wrk's core when pinned (run.py pins us)
        if pin:
            _pin_tree(postmaster, set(here))
        version = _version(postgres.admin_url)
        for round_no in range(1, args.rounds + 1):
            for setup in SETUPS:
                print(f"postgres {round_no}: {setup} ...", file=sys.stderr, flush=True)
                store: _Store
                if setup == "sqlite":
                    db = work / f"pg-part-sqlite-{round_no}.db"
                    servers = [make_server("receiver", work, sink_port, db=db)]
                    store, pg_pid = _SQLite(db), None
                else:
                    url = postgres.create_database()
                    count = 2 if setup.endswith("x2") else 1
                    servers = [
                        make_server("receiver", work, sink_port, env_extra={"RECEIVER_DB": url})
                        for _ in range(count)
                    ]
                    store, pg_pid = _Postgres(url), postmaster
                run = _measure(
                    setup, round_no, servers, store, pg_pid, args, stream, warmup, pin, wrk
                )
                print(f"  {line(run)}", file=sys.stderr, flush=True)
                runs.append(run)
    finally:
        postgres.stop()
    return section(runs, args, version=version, cores=here, pin=pin)


def _version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split()[0] if row else "?"


__all__ = ["SETUPS", "Run", "run_postgres", "section", "tree_cpu"]
