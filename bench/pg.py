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
import math
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from bench import extra
from tests.pg import ThrowawayPostgres

UTILISATION = 0.7  # of a core, for the projection: headroom for bursts and catching up
PROJECTED = (10_000, 50_000)  # events/s
SETUPS = ("sqlite", "postgres", "postgres x2")
AIM = 0.5  # postgres / sqlite, stored+routed/s: the aim
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


@dataclass
class Run:
    setup: str
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: dict[str, int]
    load: str
    stored: int = 0
    sustained: float = 0.0
    lag_max: float = 0.0
    lag_p99: float = 0.0
    receiver_cpu: float = 0.0  # seconds over the window
    postgres_cpu: float | None = None
    window: float = 0.0  # seconds, first accept .. last event routed
    sampled: float = 0.0  # seconds between the two CPU samples
    wal: int | None = None  # bytes PostgreSQL wrote to its WAL over the window
    notes: list[str] = field(default_factory=list)

    def per_1k(self, seconds: float | None) -> float | None:
        return None if seconds is None or not self.stored else seconds / self.stored * 1000


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
                print(f"  {_line(run)}", file=sys.stderr, flush=True)
                runs.append(run)
    finally:
        postgres.stop()
    return section(runs, args, version=version, cores=here, pin=pin)


def _version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split()[0] if row else "?"


def _line(r: Run) -> str:
    line = (
        f"{r.rps:,.0f} accepted/s, stored+routed {r.sustained:,.0f}/s, p99 {r.p99_ms:.2f} ms, "
        f"lag max {r.lag_max:.2f} s, receiver {_fmt(r.per_1k(r.receiver_cpu))} CPU s/1k"
    )
    if r.postgres_cpu is not None:
        line += f", PostgreSQL {_fmt(r.per_1k(r.postgres_cpu))} CPU s/1k"
    return line + f"; {'; '.join(r.notes)}"


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _loads(runs: list[Run]) -> str:
    ones = [float(r.load.split()[1]) for r in runs if len(r.load.split()) > 1]
    return f"{min(ones):.1f} to {max(ones):.1f}" if ones else "not read"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def section(
    runs: list[Run], args: argparse.Namespace, *, version: str, cores: list[int], pin: bool
) -> list[str]:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    core = ",".join(map(str, cores))
    placement = (
        f"Every receiver on core 0 (taskset), PostgreSQL (postmaster and every backend) on "
        f"core {core} with wrk and bench/run.py"
        if pin
        else "NOT PINNED (taskset missing or fewer than 2 cores)"
    )
    lines = [
        "## PostgreSQL: one replica vs SQLite, two replicas vs one",
        "",
        f'Run on {when} (`make bench BENCH_ARGS="--parts postgres"`), {args.rounds} round(s) '
        f"of sqlite -> postgres -> postgres x2, {args.duration}s each after a {args.warmup}s "
        f"warm-up, {args.connections} connections, the throughput part's stream (fresh store "
        f"each run, so no duplicates). PostgreSQL {version}, a throwaway server (tests/pg.py, "
        "`durable=True`: fsync, synchronous_commit and full_page_writes on, as a deployment "
        "runs it; otherwise its defaults), on the same machine, over loopback TCP; a new "
        "database for each run. Two replicas: one database, one wrk with two threads, each "
        f"thread's {args.connections // 2} connections on one replica and every other event "
        "of the stream (a layer-4 balancer with keep-alive connections spreads load the "
        "same way; chaos/balancer.py, a Python proxy, would be slower than the receivers).",
        "",
        f"{placement}. So one replica on PostgreSQL has core 0 to itself, as the SQLite "
        "receiver has (whose database work runs in its own process), and the database sits "
        "on the other core (shared with wrk) as it would sit on its own host. Both replicas "
        "of `postgres x2` "
        "share core 0: **on this 2-core machine the two-replica row measures contention "
        "(two routers taking batches FOR UPDATE SKIP LOCKED, two pools, two event loops on "
        "one core), not scale-out.** Scale-out needs more cores than this machine has; the "
        "CPU seconds per 1,000 events are what the projection below uses.",
        "",
        f"Other work shared the machine: the 1-minute load average was {_loads(runs)} as the "
        "runs started (2 cores; the load column), so rates are noisy and lower than on an idle "
        "machine: compare rows of one round. CPU seconds an event do not count the time spent "
        "waiting for a core, so they are steadier than rates, but a busy machine raises them "
        "too (shared caches, the hypervisor's other guests): the sqlite row's figure against "
        "the throughput part's (RESULTS.md, `server CPU ... µs a stored+routed event`) shows "
        "by how much, and the projection below is pessimistic by about that factor.",
        "",
        "| setup | run | accepted/s | stored+routed/s | routing lag max s | lag p99 s | p50 ms "
        "| p99 ms | receiver CPU s / 1k events | PostgreSQL CPU s / 1k events | errors | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in runs:
        errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-"
        lines.append(
            f"| {r.setup} | {r.round} | {r.rps:,.0f} | {r.sustained:,.0f} | {r.lag_max:.2f} | "
            f"{r.lag_p99:.2f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {_fmt(r.per_1k(r.receiver_cpu))}"
            f" | {_fmt(r.per_1k(r.postgres_cpu))} | {errors} | {r.load} |"
        )
    by = {(r.setup, r.round): r for r in runs}
    lines += [
        "",
        "Ratios within a round, stored+routed/s (accepted/s):",
        "",
        "| run | postgres / sqlite | postgres x2 / postgres |",
        "|---|---:|---:|",
    ]
    for round_no in sorted({r.round for r in runs}):
        lite, one, two = (by.get((s, round_no)) for s in SETUPS)
        cells = []
        for a, b in ((one, lite), (two, one)):
            cells.append(
                f"{_ratio(a.sustained, b.sustained)} ({_ratio(a.rps, b.rps)})" if a and b else "-"
            )
        lines.append(f"| {round_no} | {' | '.join(cells)} |")
    pairs = [
        (by[("postgres", n)], by[("sqlite", n)])
        for n in sorted({r.round for r in runs})
        if ("postgres", n) in by and ("sqlite", n) in by
    ]
    met = sum(1 for a, b in pairs if b.sustained and a.sustained / b.sustained >= AIM)
    lines += [
        "",
        f"Aim: one replica on PostgreSQL at least {AIM}x of SQLite (stored+routed/s): met in "
        f"{met} of {len(pairs)} round(s).",
        *_per_core(runs),
        "",
        *_projection(runs),
        "",
        "Per run:",
        "",
    ]
    for r in runs:
        wal = f"; {r.wal / max(r.stored, 1) / 1024:.1f} KiB of WAL an event" if r.wal else ""
        lines.append(f"- {r.setup} run {r.round}: {'; '.join(r.notes)}{wal}")
    return [*lines, ""]


def pooled(runs: list[Run]) -> dict[str, tuple[float, float]]:
    """setup -> (receiver, PostgreSQL) CPU s a 1,000 events, over all its routed runs: CPU
    summed over events summed, so a short (starved) run weighs what it stored."""
    out = {}
    for setup in SETUPS:
        done = [r for r in runs if r.setup == setup and r.stored]
        stored = sum(r.stored for r in done)
        if stored:
            out[setup] = (
                sum(r.receiver_cpu for r in done) / stored * 1000,
                sum(r.postgres_cpu or 0.0 for r in done) / stored * 1000,
            )
    return out


def _per_core(runs: list[Run]) -> list[str]:
    cpu = pooled(runs)
    if "sqlite" not in cpu or "postgres" not in cpu:
        return []
    lite, one = cpu["sqlite"][0], cpu["postgres"][0]
    return [
        "",
        f"The same comparison by CPU, steadier than the rates: a receiver spent {lite:.3f} s "
        f"of CPU a 1,000 events on SQLite (its database work included) and {one:.3f} s on "
        f"PostgreSQL (all rounds pooled). CPU-bound on a core of its own, with PostgreSQL on "
        f"another, one replica on PostgreSQL would reach {lite / one:.2f}x of SQLite's rate "
        f"({1000 / one:,.0f} vs {1000 / lite:,.0f} events/s a core at this run's cost an "
        "event).",
    ]


def _projection(runs: list[Run]) -> list[str]:
    pooled_pg = {k: v for k, v in pooled(runs).items() if k != "sqlite"}
    wal = [r.wal / r.stored for r in runs if r.wal and r.stored]
    if not pooled_pg:
        return ["No projection: no PostgreSQL run was routed in full."]
    c_rec = max(rec for rec, _ in pooled_pg.values())
    c_pg = max(db for _, db in pooled_pg.values())
    per_replica = UTILISATION * 1000 / c_rec
    figures = "; ".join(
        f"{setup}: receiver {rec:.3f} s, PostgreSQL {db:.3f} s"
        for setup, (rec, db) in pooled_pg.items()
    )
    lines = [
        "### Projection: replicas and PostgreSQL cores for 10,000 and 50,000 events/s",
        "",
        f"CPU a 1,000 stored events, all rounds pooled (CPU over events stored): {figures}. "
        f"The projection takes the larger of each: {c_rec:.3f} s of receiver CPU and "
        f"{c_pg:.3f} s of PostgreSQL CPU a 1,000 events. A replica is one process, so at "
        f"most one core (one event loop); at {UTILISATION:.0%} of it one replica takes "
        f"{per_replica:,.0f} events/s. PostgreSQL cores at {UTILISATION:.0%} too.",
        "",
        "| events/s | receiver CPU, cores | replicas (1 core each, "
        f"{UTILISATION:.0%}) | PostgreSQL CPU, cores | PostgreSQL cores ({UTILISATION:.0%}) "
        "| WAL MB/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for rate in PROJECTED:
        rec, db = rate * c_rec / 1000, rate * c_pg / 1000
        mbs = f"{rate * max(wal) / 1e6:,.0f}" if wal else "-"
        lines.append(
            f"| {rate:,} | {rec:.1f} | {math.ceil(rec / UTILISATION)} | {db:.1f} | "
            f"{math.ceil(db / UTILISATION)} | {mbs} |"
        )
    lines += [
        "",
        "Assumptions, plainly: cost per event stays what it was here (linear scaling: no "
        "lock contention between many replicas on the same alert or outbox rows, no slower "
        "index as the table grows, batches as large as under this load); cores like this "
        "machine's (a shared 2-core VM, see Machine); PostgreSQL's disk keeps up with the "
        "WAL above and with its fsyncs (group commit: one a batch), which this bench does not "
        "test beyond one local disk; the bench rules (10 rules, under 0.1% of events "
        "notify), no read API traffic, no subscriber deliveries; loopback here, a network "
        "round trip in a deployment (latency per batch, little CPU). The CPU figures count "
        "everything each side did in the window, the routing drain and PostgreSQL's "
        "background processes (checkpointer, WAL writer, autovacuum) included.",
    ]
    return lines


__all__ = ["SETUPS", "Run", "run_postgres", "section", "tree_cpu"]
