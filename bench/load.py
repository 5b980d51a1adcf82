"""The load: the signed request stream, wrk flat out or paced against one server, and what
the run's SQLite file says afterwards (stored, routed, the routing lag)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import extra, streams
from bench.servers import (
    BENCH,
    LOAD_CPU,
    SECRET,
    Server,
)

# -- the request stream ---------------------------------------------------------------------


def write_stream(path: Path, *, count: int, seed: int, run: str) -> list[dict[str, Any]]:
    """count signed deliveries, one "<signature>\\t<body>" a line; returns the events.

    The walk ticks one second per round of its 200 sessions, so 400,000 events span hours
    of event time. They are dated to end a minute ago: the receiver refuses events dated
    further ahead of its clock than RECEIVER_MAX_CLOCK_SKEW (5 minutes by default).
    """
    written = streams.walk_events(count, seed, run)
    streams.write(path, written, SECRET)
    return written


# -- wrk ------------------------------------------------------------------------------------


@dataclass
class Routing:
    """What the SQLite file says about a run's events once all of them were routed."""

    stored: int
    sustained: float  # stored / (last routed_at - first received_at): events stored+routed/s
    lag_max: float  # seconds, routed_at - received_at
    lag_p99: float


@dataclass
class Result:
    target: str
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: dict[str, int]
    notes: list[str] = field(default_factory=list)
    routing: Routing | None = None  # the receiver only, when everything got routed
    offered: float | None = None  # requests/s wrk was paced to, or None for flat out
    load: str = ""  # the load average as the run started (others share this machine)
    cpu_us: float | None = None  # the server's CPU µs a stored+routed event (a store only)
    # How long the run's store cycles held the event loop, ms (receiver_store_cycle_seconds):
    # the bucket that holds the 99th percentile, and the one that holds the longest.
    hold_ms: tuple[float, float] | None = None


def cycle_buckets(port: int) -> dict[float, float]:
    """receiver_store_cycle_seconds's cumulative buckets, {upper bound s: cycles}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    buckets = {}
    for found in re.finditer(r'receiver_store_cycle_seconds_bucket\{le="([^"]+)"\} (\S+)', text):
        buckets[float(found[1])] = float(found[2])
    return buckets


def hold_ms(before: dict[float, float], after: dict[float, float]) -> tuple[float, float] | None:
    """The run's store cycles (after less before): the upper bounds, ms, of the buckets that
    hold their 99th percentile and their longest; None if the run had no cycle."""
    counts = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    total = counts[-1][1] if counts else 0.0
    if total <= 0 or any(n < 0 for _, n in counts):  # none, or another process's figures
        return None
    p99 = next(bound for bound, n in counts if n >= 0.99 * total)
    longest = next(bound for bound, n in counts if n >= total)
    return p99 * 1000, longest * 1000


def wrk(
    port: int,
    path: str,
    stream: Path,
    *,
    seconds: int,
    connections: int,
    pin: bool,
    rate: float | None = None,
    ports: list[int] | None = None,
) -> dict[str, Any]:
    """wrk's figures; with ports, one thread a port, each sending its share of the stream."""
    argv = [
        "wrk",
        f"-t{len(ports) if ports else 1}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "5s",
        "--latency",
        "-s",
        str(BENCH / "events.lua"),
        f"http://127.0.0.1:{port}",
        "--",
        str(stream),
        path,
    ]
    if rate is not None:
        argv.append(f"{rate:.0f}")
    if pin:
        argv = ["taskset", "-c", LOAD_CPU, *argv]
    env = {**os.environ, "BENCH_PORTS": ",".join(map(str, ports))} if ports else None
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, env=env)
    match = re.search(r"^BENCH (\{.*\})$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    figures: dict[str, Any] = json.loads(match.group(1))
    return figures


def measure(
    server: Server,
    round_no: int,
    args: argparse.Namespace,
    stream: Path,
    warmup: Path,
    pin: bool,
    *,
    rate: float | None = None,
) -> Result:
    """One run: warm-up, then args.duration s of wrk, flat out or paced to rate requests/s.

    With a store, the warm-up's backlog is routed before the measured run starts, and
    after it the figures wait until the router has routed everything the run stored.
    """
    routing = None
    per_event = None
    hold = None
    load = extra.uptime()
    server.start(pin)
    try:
        wrk(
            server.port,
            server.path,
            warmup,
            seconds=args.warmup,
            connections=args.connections,
            pin=pin,
        )
        if server.db is not None and drain(server.db) is None:
            raise SystemExit(f"{server.name}: the warm-up was not routed within 120s")
        before = rows(server.db)
        first = last_rowid(server.db)
        cycles = cycle_buckets(server.port) if server.name == "receiver" else {}
        assert server.proc is not None
        cpu = extra.cpu_seconds(server.proc.pid)
        got = wrk(
            server.port,
            server.path,
            stream,
            seconds=args.duration,
            connections=args.connections,
            pin=pin,
            rate=rate,
        )
        notes = []
        if got["requests"] > args.events * 0.95 and server.name == "receiver":
            notes.append(
                f"stream nearly exhausted ({got['requests']} requests of "
                f"{args.events}): raise --events"
            )
        if server.db is not None:
            routing, per_event, hold = _afterwards(
                server, got["requests"], (before, first), (cpu, cycles), notes
            )
    finally:
        server.stop()
    errors = {k: got[k] for k in ("connect", "read", "write", "status", "timeout") if got[k]}
    return Result(
        server.name,
        round_no,
        got["requests"] / (got["duration_us"] / 1e6),
        got["p50_us"] / 1000,
        got["p99_us"] / 1000,
        got["requests"],
        errors,
        notes,
        routing,
        rate,
        load,
        per_event,
        hold,
    )


def _afterwards(
    server: Server,
    requests: int,
    start: tuple[int, int],
    counters: tuple[float, dict[float, float]],
    notes: list[str],
) -> tuple[Routing | None, float | None, tuple[float, float] | None]:
    """What the run's store says once wrk stopped: stored, duplicates, how long the router
    took to catch up; then the routing lag, CPU a stored+routed event and the loop hold."""
    assert server.db is not None and server.proc is not None
    (before, first), (cpu, cycles) = start, counters
    stored = rows(server.db) - before
    dupes = max(0, requests - stored)
    notes.append(f"{stored} stored, {dupes} duplicates ({dupes / max(requests, 1):.1%})")
    left = unrouted(server.db)
    notes.append(f"{left} not yet routed when wrk stopped")
    took = drain(server.db) if left else 0.0
    if left:
        notes.append(
            f"routed them in {took:.1f}s ({left / took:,.0f} events/s)"
            if took is not None
            else "NOT all routed within 120s"
        )
    if took is None:
        return None, None, None
    routing = read_routing(server.db, first)
    cpu = extra.cpu_seconds(server.proc.pid) - cpu
    hold = hold_ms(cycles, cycle_buckets(server.port)) if cycles else None
    per_event = cpu / max(stored, 1) * 1e6
    notes.append(f"server CPU {per_event:.0f} µs a stored+routed event")
    return routing, per_event, hold


def rows(db: Path | None) -> int:
    if db is None or not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        count: int = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        return count


def unrouted(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        count: int = conn.execute("SELECT count(*) FROM events WHERE routed_at IS NULL").fetchone()[
            0
        ]
        return count


def last_rowid(db: Path | None) -> int:
    if db is None or not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        rowid: int = conn.execute("SELECT coalesce(max(rowid), 0) FROM events").fetchone()[0]
        return rowid


def read_routing(db: Path, after: int) -> Routing | None:
    """Sustained rate and routing lag of the events stored after rowid `after`, all routed.

    received_at is the accept time (just before the 202), routed_at when the router took
    the event's batch; both are the server's time.time().
    """
    with sqlite3.connect(db, timeout=30) as conn:
        rows = conn.execute(
            "SELECT received_at, routed_at FROM events WHERE rowid > ? AND routed_at IS NOT NULL",
            (after,),
        ).fetchall()
    if not rows:
        return None
    lags = sorted(routed - received for received, routed in rows)
    span = max(routed for _, routed in rows) - min(received for received, _ in rows)
    return Routing(
        stored=len(rows),
        sustained=len(rows) / span if span > 0 else 0.0,
        lag_max=max(0.0, lags[-1]),
        lag_p99=max(0.0, lags[int(0.99 * (len(lags) - 1))]),
    )


def drain(db: Path, limit: float = 120.0) -> float | None:
    """Seconds until the router has routed everything stored, or None after limit."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if unrouted(db) == 0:
            return time.monotonic() - started
        time.sleep(0.05)
    return None
