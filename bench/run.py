"""`make bench`: the receiver's ingest path against a ceiling and adnanh/webhook, side by side.

One invocation, one machine: each server is pinned to core 0 (taskset -c 0),
wrk and this script to core 1, and every target gets the same pre-signed
request stream (bench/events.lua). Targets run in rounds, ceiling -> receiver ->
webhook, twice, so drift on a shared machine shows as a difference between
rounds instead of hiding in one target's figure. Writes bench/RESULTS.md.

For the receiver, "accepted/s" (202s a second while wrk runs) is only half the
story: an event accepted is not yet routed, and the router can fall behind. So
each receiver run also reports the sustained figure, events stored and routed a
second from the first accept to the moment the last stored event is routed, and
the routing lag (routed_at - received_at, read from the SQLite file afterwards).
And each round runs the receiver once more, paced at --paced (default 80%) of the
flat-out rate it just measured, for the lag below saturation.

    .venv/bin/python bench/run.py                 # what `make bench` runs
    .venv/bin/python bench/run.py --duration 5 --rounds 1 --events 20000   # a quick look
    .venv/bin/python bench/run.py --parts postgres   # one part (bench/pg.py); RESULTS.md
                                                     # keeps the sections of the others
    .venv/bin/python bench/run.py --parts streams    # every stream shape (bench/streams.py)
                                                     # against the ceiling of its round
    .venv/bin/python bench/run.py --parts scaling    # serve --workers 1 and 2, shared-type

The stream: --events distinct signed events (default 400000) from the same
random walk `receiver simulate` uses. The receiver gets a fresh database each
run and the warm-up replays a separate file, so as long as a run sends fewer
requests than --events the receiver sees no duplicate; the measured share of
duplicates is reported either way (requests answered minus rows stored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import admin  # noqa: E402  (bench/admin.py: the admin page on a big store)
import api  # noqa: E402  (bench/api.py: the /v1 read API on 1,000,000 sessions)
import backtest  # noqa: E402  (bench/backtest.py: `receiver backtest` over a week)
import extra  # noqa: E402  (bench/extra.py, beside this file)
import fanout  # noqa: E402  (bench/fanout.py: webhook subscribers)
import instructions  # noqa: E402  (bench/instructions.py: valgrind instruction counts, issue 33)
import pg  # noqa: E402  (bench/pg.py: the postgres part)
import scaling_part  # noqa: E402  (bench/scaling_part.py: serve --workers 1 vs 2, issue 33)
import statements  # noqa: E402  (bench/statements.py: SQL statements per event)
import stream_part  # noqa: E402  (bench/stream_part.py: every stream shape, issue 33)
import streams  # noqa: E402  (bench/streams.py: the shapes' request files)
import tracing_part  # noqa: E402  (bench/tracing_part.py: what tracing costs, issue 32)

from receiver import rules  # noqa: E402

SECRET = "bench-secret-0123456789abcdef"
SERVER_CPU = "0"
LOAD_CPU = "1"
TARGETS = ("ceiling", "receiver", "webhook")


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


# -- the notification sink ------------------------------------------------------------------


class Sink:
    """A local HTTP server the bench rules' json:// notifier posts to; it only counts."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: dict[str, float] = {}  # e2e event id -> when its notification arrived
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                now = time.perf_counter()
                for event_id in extra.find_event_ids(body.decode(errors="replace")):
                    sink.seen.setdefault(event_id, now)
                sink.count += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    path: str
    ready: str  # a GET path answering 200 when up, or "" to wait for the port
    log: Path
    db: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self, pin: bool) -> None:
        argv = ["taskset", "-c", SERVER_CPU, *self.argv] if pin else self.argv
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"{self.name} exited {self.proc.returncode}; see {self.log}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            if _answers(self.port, self.ready):
                return
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"{self.name} did not start within 30s; see {self.log}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def _answers(port: int, path: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            if not path:
                return True
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def make_server(
    name: str,
    work: Path,
    sink_port: int,
    *,
    db: Path | None = None,
    env_extra: dict[str, str] | None = None,
    workers: int = 0,
) -> Server:
    port = free_port()
    env = {
        **os.environ,
        "RECEIVER_SECRETS": SECRET,
        "BENCH_SECRET": SECRET,
        "BENCH_SINK_PORT": str(sink_port),
        "PYTHONPATH": str(ROOT),
    }
    log = work / f"{name}.log"
    if name == "ceiling":
        return Server(
            name,
            [sys.executable, str(BENCH / "ceiling.py"), "--port", str(port)],
            env,
            port,
            "/v1/events",
            "/healthz",
            log,
        )
    if name == "receiver":
        db = db or work / f"receiver-{time.monotonic_ns()}.db"
        env |= {
            "RECEIVER_PORT": str(port),
            "RECEIVER_DB": str(db),
            "RECEIVER_RULES": str(BENCH / "rules.yaml"),
            "RECEIVER_LOG_LEVEL": "warning",
            **(env_extra or {}),
        }
        argv = [sys.executable, "-m", "receiver", "serve"]
        if workers:
            # What `--workers` means for uvicorn; receiver serve runs one process.
            argv = [sys.executable, "-m", "uvicorn", "--factory", "receiver.app:from_env"]
            argv += ["--port", str(port), "--workers", str(workers), "--no-access-log"]
            argv += ["--log-level", "warning", "--no-server-header"]
        return Server(
            name,
            argv,
            env,
            port,
            "/v1/events",
            "/healthz",
            log,
            db=db,
        )
    webhook = shutil.which("webhook")
    assert webhook is not None
    return Server(
        name,
        [
            webhook,
            "-ip",
            "127.0.0.1",
            "-port",
            str(port),
            "-template",
            "-hooks",
            str(BENCH / "webhook-hooks.json"),
        ],
        env,
        port,
        "/hooks/events",
        "",
        log,
    )


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
        if server.db is not None and _drain(server.db) is None:
            raise SystemExit(f"{server.name}: the warm-up was not routed within 120s")
        before = _rows(server.db)
        first = _last_rowid(server.db)
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
            stored = _rows(server.db) - before
            dupes = max(0, got["requests"] - stored)
            notes.append(
                f"{stored} stored, {dupes} duplicates ({dupes / max(got['requests'], 1):.1%})"
            )
            unrouted = _unrouted(server.db)
            notes.append(f"{unrouted} not yet routed when wrk stopped")
            took = _drain(server.db) if unrouted else 0.0
            if unrouted:
                notes.append(
                    f"routed them in {took:.1f}s ({unrouted / took:,.0f} events/s)"
                    if took is not None
                    else "NOT all routed within 120s"
                )
            if took is not None:
                routing = _routing(server.db, first)
                cpu = extra.cpu_seconds(server.proc.pid) - cpu
                if cycles:
                    hold = hold_ms(cycles, cycle_buckets(server.port))
                per_event = cpu / max(stored, 1) * 1e6
                notes.append(f"server CPU {per_event:.0f} µs a stored+routed event")
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


def _rows(db: Path | None) -> int:
    if db is None or not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        count: int = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        return count


def _unrouted(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        count: int = conn.execute("SELECT count(*) FROM events WHERE routed_at IS NULL").fetchone()[
            0
        ]
        return count


def _last_rowid(db: Path | None) -> int:
    if db is None or not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        rowid: int = conn.execute("SELECT coalesce(max(rowid), 0) FROM events").fetchone()[0]
        return rowid


def _routing(db: Path, after: int) -> Routing | None:
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


def _drain(db: Path, limit: float = 120.0) -> float | None:
    """Seconds until the router has routed everything stored, or None after limit."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if _unrouted(db) == 0:
            return time.monotonic() - started
        time.sleep(0.05)
    return None


# -- the other parts (bench/extra.py) ---------------------------------------------------------

PARTS = (
    "throughput",
    "e2e",
    "growth",
    "prune",
    "memory",
    "workers",
    "postgres",
    "admin",
    "fanout",
    "api",
    "backtest",
    "statements",
    "recording",
    "streams",
    "tracing",
    "scaling",
    "instructions",
)


def _line(r: Result) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-"
    line = f"{r.rps:,.0f} events/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, errors {errors}"
    if r.routing is not None:
        line += (
            f"; stored+routed {r.routing.sustained:,.0f}/s, routing lag max "
            f"{r.routing.lag_max:.2f} s, p99 {r.routing.lag_p99:.2f} s"
        )
    return line


def run_e2e(args: argparse.Namespace, work: Path, sink: Sink, pin: bool) -> list[str]:
    server = make_server("receiver", work, sink.port)
    stream = extra.e2e_stream(int(args.e2e_rate * args.e2e_seconds), SECRET)
    load = extra.uptime()
    server.start(pin)
    try:
        sent = extra.steady_post(server.port, stream, args.e2e_rate)
        deadline = time.monotonic() + 15
        wanted = [i for i in sent if i.startswith("evt_e2e_")]
        while time.monotonic() < deadline and not all(i in sink.seen for i in wanted):
            time.sleep(0.1)
    finally:
        server.stop()
    got = extra.e2e_latencies(sent, sink.seen)
    if not got.get("received"):
        return ["## End to end", "", f"no notification reached the sink ({load})", ""]
    return [
        "## End to end: POST -> json:// sink",
        "",
        f"{args.e2e_rate:g} events/s for {args.e2e_seconds}s, one in {extra.NOTIFY_EVERY} "
        f"matching `checkout-drops` ({got['sent']:.0f} notifications); time from sending the "
        f"POST to the sink receiving the notification ({load}):",
        "",
        "| received | p50 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|",
        f"| {got['received']:.0f}/{got['sent']:.0f} | {got['p50_ms']:.1f} | "
        f"{got['p99_ms']:.1f} | {got['max_ms']:.1f} |",
        "",
    ]


def run_growth(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    big = extra.growth_db(args.growth_events)
    assert extra.git_ignored(big), f"{big} must be git-ignored"
    per_event = extra.db_bytes(big) / args.growth_events
    keep = {"RECEIVER_RETENTION": "3650d"}
    lines = [
        "## Growth",
        "",
        f"Ingest with {args.growth_events:,} events already stored (cached "
        f"bench/.cache/{big.name}, built by direct bulk insert) vs an empty store; "
        f"{per_event:,.0f} bytes on disk per stored event (database file, all indexes).",
        "",
        "| store | run | events/s | p50 ms | p99 ms | load |",
        "|---|---|---:|---:|---:|---|",
    ]
    ratios = []
    for round_no in range(1, args.rounds + 1):
        figures = {}
        for label in ("empty", "10M"):
            restore = extra.Restore(big) if label == "10M" else None
            db = big if label == "10M" else None
            server = make_server("receiver", work, sink.port, db=db, env_extra=keep)
            load = extra.uptime()
            print(f"growth {round_no}: {label} store ...", file=sys.stderr, flush=True)
            try:
                r = measure(server, round_no, args, stream, warmup, pin)
            finally:
                if restore is not None:
                    restore()
            print(f"  {_line(r)}", file=sys.stderr, flush=True)
            figures[label] = r
            lines.append(
                f"| {label} | {round_no} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} "
                f"| {load} |"
            )
        ratios.append(figures["10M"].rps / figures["empty"].rps)
    lines += ["", "10M / empty: " + ", ".join(f"{x:.2f}" for x in ratios) + " (target >= 0.9)", ""]
    return lines


def run_prune(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    lines = [
        "## Retention pruning under load",
        "",
        f"A store holding {args.prune_events:,} routed events 40-60 days old, with the default "
        "RECEIVER_RETENTION=30d, so the pruner (500 rows a transaction, 50 ms pause) deletes "
        "them while wrk runs; vs a fresh store.",
        "",
        "| store | run | events/s | p50 ms | p99 ms | pruned during the run | load |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    ratios = []
    for round_no in range(1, args.rounds + 1):
        p99 = {}
        for label in ("steady", "pruning"):
            db = None
            if label == "pruning":
                db = work / f"prune-{round_no}.db"
                now = time.time()
                extra.build_db(
                    db, args.prune_events, oldest=now - 60 * 86400, newest=now - 40 * 86400
                )
            server = make_server("receiver", work, sink.port, db=db)
            load = extra.uptime()
            print(f"prune {round_no}: {label} ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            print(f"  {_line(r)}", file=sys.stderr, flush=True)
            pruned = "-"
            if db is not None:
                with sqlite3.connect(db) as conn:
                    left = conn.execute(
                        "SELECT count(*) FROM events WHERE id LIKE 'evt_old_%'"
                    ).fetchone()[0]
                pruned = f"{args.prune_events - left:,}"
            p99[label] = r.p99_ms
            lines.append(
                f"| {label} | {round_no} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                f"{pruned} | {load} |"
            )
        ratios.append(p99["pruning"] / p99["steady"])
    lines += [
        "",
        "p99 pruning / steady: " + ", ".join(f"{x:.2f}" for x in ratios) + " (target <= 2)",
        "",
    ]
    return lines


def run_memory(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    server = make_server("receiver", work, sink.port)
    load = extra.uptime()
    print(f"memory: {args.soak}s of load ...", file=sys.stderr, flush=True)
    server.start(pin)
    try:
        assert server.proc is not None
        conns = args.connections
        wrk(server.port, server.path, warmup, seconds=args.warmup, connections=conns, pin=pin)
        start_rss = extra.rss_kib(server.proc.pid)
        sampler = extra.RssSampler(server.proc.pid, every=max(1.0, args.soak / 60))
        got = wrk(server.port, server.path, stream, seconds=args.soak, connections=conns, pin=pin)
        samples = sampler.stop()
    finally:
        server.stop()
    if not samples:
        return []
    rss = [kib for _, kib in samples]
    first, last, peak = rss[0], rss[-1], max(rss)
    rate = got["requests"] / (got["duration_us"] / 1e6)
    note = (
        f"{got['requests']:,} requests; the {args.events:,}-event stream repeats, so later "
        "passes are duplicates"
        if got["requests"] > args.events
        else f"{got['requests']:,} requests"
    )
    return [
        "## Memory under sustained load",
        "",
        f"{args.soak}s of wrk at 32 connections ({rate:,.0f} events/s; {note}; {load}); VmRSS "
        f"sampled every {max(1.0, args.soak / 60):g}s. After warm-up {start_rss / 1024:.1f} MiB.",
        "",
        "| first sample MiB | last MiB | peak MiB | last vs first |",
        "|---:|---:|---:|---:|",
        f"| {first / 1024:.1f} | {last / 1024:.1f} | {peak / 1024:.1f} | "
        f"{(last - first) / first:+.1%} |",
        "",
        f"From the 10% mark ({samples[len(samples) // 10][0]:.0f}s, once SQLite's 64 MiB page"
        f" cache has filled) to the end: {rss[len(rss) // 10] / 1024:.1f} -> {last / 1024:.1f} MiB"
        f" ({(last - rss[len(rss) // 10]) / rss[len(rss) // 10]:+.1%}).",
        "",
        "Samples (s, MiB): " + ", ".join(f"{t:.0f}: {kib / 1024:.1f}" for t, kib in samples),
        "",
    ]


def run_workers(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    lines = [
        "## Worker processes on one SQLite file",
        "",
        "`uvicorn --factory receiver.app:from_env --workers N`, all processes on core 0.",
        "",
        "| workers | run | events/s | p50 ms | p99 ms | errors | load |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for round_no in range(1, args.rounds + 1):
        for n in (1, 2):
            # Created first: workers migrating a fresh file at once fail ("database is locked").
            db = work / f"workers-{round_no}-{n}.db"
            extra.build_db(db, 0, oldest=0, newest=0)
            server = make_server("receiver", work, sink.port, workers=n, db=db)
            load = extra.uptime()
            print(f"workers {round_no}: {n} ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            print(f"  {_line(r)}", file=sys.stderr, flush=True)
            errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-"
            lines.append(
                f"| {n} | {round_no} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                f"{errors} | {load} |"
            )
    return [*lines, ""]


def run_recording(
    args: argparse.Namespace, work: Path, sink: Sink, stream: Path, warmup: Path, pin: bool
) -> list[str]:
    """The receiver as shipped against itself with routing's record for explain switched off
    (bench/no_recording.py), alternately, each round: what the record costs the router."""
    lines = [
        "## What recording the routing decisions costs",
        "",
        "The receiver as shipped (routing records each batch's rules file for `GET",
        "/v1/events/:id/explain`) and the same with that record switched off",
        "(bench/no_recording.py), alternately, flat out.",
        "",
        "| run | receiver | stored+routed/s | p99 ms | record's cost | load |",
        "|---|---|---:|---:|---:|---|",
    ]
    costs: list[float] = []
    for round_no in range(1, args.rounds + 1):
        figures: dict[str, float] = {}
        for variant in ("not recorded", "recorded"):
            server = make_server("receiver", work, sink.port)
            if variant == "not recorded":
                server.argv = [sys.executable, str(BENCH / "no_recording.py")]
            print(f"recording {round_no}: {variant} ...", file=sys.stderr, flush=True)
            r = measure(server, round_no, args, stream, warmup, pin)
            rate = r.routing.sustained if r.routing is not None else 0.0
            figures[variant] = rate
            base = figures.get("not recorded") or 0.0
            cost = f"{1 - rate / base:+.1%}" if variant == "recorded" and base else "-"
            if variant == "recorded" and base:
                costs.append(1 - rate / base)
            lines.append(
                f"| {round_no} | {variant} | {rate:,.0f} | {r.p99_ms:.2f} | {cost} | {r.load} |"
            )
    if costs:
        lines += [
            "",
            f"The record's cost over the {len(costs)} rounds: {sum(costs) / len(costs):+.1%} on"
            f" average (each round {', '.join(f'{c:+.1%}' for c in costs)}; + is slower). The"
            " rounds' spread is this machine's noise as much as the record: the budget is 10%.",
        ]
    return [*lines, ""]


# -- the report -----------------------------------------------------------------------------


def machine() -> list[str]:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    import starlette
    import uvicorn

    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    webhook = shutil.which("webhook")
    hook_version = (
        subprocess.run([webhook, "-version"], capture_output=True, text=True).stdout.strip()
        if webhook
        else "not installed"
    )
    loops = [m for m in ("uvloop", "httptools") if _importable(m)]
    return [
        f"CPU: {model.group(1) if model else platform.processor() or 'unknown'}, "
        f"{os.cpu_count()} cores visible",
        f"OS: {platform.platform()}",
        f"Python {platform.python_version()}, uvicorn {uvicorn.__version__} "
        f"({' + '.join(loops) or 'asyncio + h11'}), starlette {starlette.__version__}",
        f"wrk {wrk_version.split()[1] if wrk_version else 'unknown'}; {hook_version}",
    ]


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def table(results: list[Result]) -> list[str]:
    by = {(r.target, r.round): r for r in results}
    lines = [
        "| target | run | accepted/s | stored+routed/s | max routing lag s | p50 ms | p99 ms "
        "| vs ceiling | vs webhook | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(results, key=lambda r: (TARGETS.index(r.target), r.round)):
        ceiling, hook = by.get(("ceiling", r.round)), by.get(("webhook", r.round))
        errors = ", ".join(f"{k} {v}" for k, v in r.errors.items()) or "-"
        sustained = f"{r.routing.sustained:,.0f}" if r.routing else "-"
        lag = f"{r.routing.lag_max:.2f}" if r.routing else "-"
        lines.append(
            f"| {r.target} | {r.round} | {r.rps:,.0f} | {sustained} | {lag} | {r.p50_ms:.2f} | "
            f"{r.p99_ms:.2f} | {_ratio(r, ceiling)} | {_ratio(r, hook)} | {errors} |"
        )
    return lines


def lag_table(results: list[Result], paced: list[Result]) -> list[str]:
    """The receiver flat out and paced, round by round: what it accepted vs what it routed."""
    burst = {r.round: r for r in results if r.target == "receiver"}
    lines = [
        "| run | sender | offered/s | accepted/s | stored+routed/s | routing lag max s | p99 s "
        "| p50 ms | p99 ms | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in paced:
        for r in (burst.get(p.round), p):
            if r is None:
                continue
            if r.offered is None:
                sender, offered = "flat out", "-"
            else:
                base = burst.get(r.round)
                share = f" ({r.offered / base.rps:.0%} of burst)" if base and base.rps else ""
                sender, offered = f"paced{share}", f"{r.offered:,.0f}"
            route = r.routing
            figures = (
                f"{route.sustained:,.0f} | {route.lag_max:.2f} | {route.lag_p99:.2f}"
                if route
                else "- | - | -"
            )
            lines.append(
                f"| {r.round} | {sender} | {offered} | {r.rps:,.0f} | {figures} | "
                f"{r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.load} |"
            )
    return lines


def _ratio(r: Result, base: Result | None) -> str:
    return f"{r.rps / base.rps:.2f}x" if base and base.rps else "-"


def report(
    results: list[Result], paced: list[Result], args: argparse.Namespace, extra: list[str]
) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    notes = [f"- {r.target} run {r.round}: {'; '.join(r.notes)}" for r in results if r.notes]
    notes += [
        f"- receiver paced run {r.round} ({r.offered:,.0f}/s offered): {'; '.join(r.notes)}"
        for r in paced
        if r.notes and r.offered is not None
    ]
    lag = [
        "## Routing lag: flat out and paced",
        "",
        f"The receiver flat out (wrk keeps {args.connections} connections busy) and paced: the "
        f"same {args.connections} connections, wrk's delay() hook spacing the requests to the "
        "offered rate, "
        + (
            f"{args.paced_rate:,.0f}/s (--paced-rate). "
            if args.paced_rate
            else f"{args.paced:.0%} of the flat-out (burst) rate measured just before in the "
            "same round. "
        )
        + "stored+routed/s counts the events stored from the first accept to the "
        "routing of the last one (the drain after wrk stops included); the routing lag of an "
        "event is routed_at - received_at, read from the SQLite file: from its accept (just "
        "before the 202) to the router taking it.",
        "",
        *lag_table(results, paced),
        "",
    ]
    return "\n".join(
        [
            "# bench/RESULTS.md",
            "",
            f"Written by `make bench` (bench/run.py) on {when}. Each target ran {args.rounds} "
            f"time(s), in rounds (ceiling, receiver, webhook), {args.duration}s each after a "
            f"{args.warmup}s warm-up, wrk -t1 -c{args.connections} on core {LOAD_CPU}, the server "
            f"on core {SERVER_CPU}. Ratios compare runs of the same round. Numbers from a shared "
            "machine are noisy: compare rounds before trusting a difference.",
            "",
            *table(results),
            "",
            "accepted/s: 202s a second while wrk ran (the ratios compare it). stored+routed/s: "
            "the events the run stored, over the time from the first accept to the routing of "
            "the last one, the drain after wrk stopped included: the rate the receiver can "
            "sustain. max routing lag: the longest an event of the run waited between its 202 "
            "and its routing.",
            "",
            *(lag if paced else []),
            "## Machine",
            "",
            *[f"- {line}" for line in machine()],
            "",
            "## What ran",
            "",
            "- ceiling: bench/ceiling.py, Starlette endpoint on the receiver's uvicorn settings: "
            "read body, verify HMAC, json.loads, 202.",
            "- receiver: `python -m receiver serve`, fresh SQLite file per run (default "
            "RECEIVER_SYNCHRONOUS=full), bench/rules.yaml (10 rules), RECEIVER_LOG_LEVEL=warning; "
            "verify, validate, durable dedupe, routed.",
            "- webhook: adnanh/webhook with bench/webhook-hooks.json: payload-hmac-sha256 on "
            "X-Service-Signature, then forks and runs /bin/true for every delivery (its model: "
            "one command per hook call), answering without waiting for it.",
            "- latency is wrk's, with 32 connections kept busy: mostly queueing, so p50 is about "
            "connections / throughput; p99 shows stalls.",
            *[f"- {line}" for line in extra],
            *notes,
            "",
        ]
    )


def merge(old: str, new: str, *, head: bool) -> str:
    """old with each `## ` section of new in place of old's of the same heading (up to a
    colon), sections old lacks appended; old's text before its first section stays unless
    head (new has one: the throughput part ran). A run of some parts keeps the others'."""

    def split(text: str) -> tuple[str, dict[str, str]]:
        first, *rest = re.split(r"(?m)^(?=## )", text)
        return first, {part.split("\n", 1)[0].split(":")[0]: part for part in rest}

    old_head, old_parts = split(old)
    new_head, new_parts = split(new)
    merged = [new_head if head else old_head]
    merged += [new_parts.get(key, part) for key, part in old_parts.items()]
    merged += [part for key, part in new_parts.items() if key not in old_parts]
    return "\n\n".join(part.strip("\n") for part in merged if part.strip()) + "\n"


# -- main -----------------------------------------------------------------------------------


def write_figures(path: Path, results: list[Result], args: argparse.Namespace) -> None:
    """The throughput part's figures as JSON, per round: the ceiling's and the receiver's
    requests/s, the receiver's stored+routed/s and its ratio to the ceiling of the same
    round (what `make bench-check` compares)."""
    by_round: dict[int, dict[str, Result]] = {}
    for r in results:
        by_round.setdefault(r.round, {})[r.target] = r
    rounds = []
    for number, targets in sorted(by_round.items()):
        ceiling, receiver = targets.get("ceiling"), targets.get("receiver")
        if ceiling is None or receiver is None or receiver.routing is None or not ceiling.rps:
            continue
        rounds.append(
            {
                "round": number,
                "ceiling_rps": round(ceiling.rps),
                "accepted_rps": round(receiver.rps),
                "sustained_rps": round(receiver.routing.sustained),
                "ratio": round(receiver.routing.sustained / ceiling.rps, 3),
                "p99_ms": round(receiver.p99_ms, 2),
                "lag_max_s": round(receiver.routing.lag_max, 2),
                "load": receiver.load,
            }
        )
    ratios = [r["ratio"] for r in rounds]
    old = json.loads(path.read_text()) if path.exists() else {}
    figures = {
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "duration_s": args.duration,
        "events": args.events,
        "connections": args.connections,
        "ratio": round(sum(ratios) / len(ratios), 3) if ratios else None,
        "rounds": rounds,
    }
    if "streams" in old:  # the streams part's entry (bench/stream_part.py) stays
        figures["streams"] = old["streams"]
    path.write_text(json.dumps(figures, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=15, help="seconds per measured run")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of warm-up per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--events", type=int, default=400_000, help="distinct signed events in the measured stream"
    )
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument(
        "--figures",
        type=Path,
        default=BENCH / "figures.json",
        help="where the throughput part writes its figures for `make bench-check`",
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}"
    )
    parser.add_argument(
        "--paced",
        type=float,
        default=0.8,
        help="share of the receiver's burst rate for the paced run each round (0: none)",
    )
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=0,
        help="events/s for the paced run instead (to compare builds at one offered rate)",
    )
    parser.add_argument("--e2e-rate", type=float, default=1000, help="events/s for e2e")
    parser.add_argument("--e2e-seconds", type=int, default=10)
    parser.add_argument(
        "--growth-events", type=int, default=10_000_000, help="events in the cached big store"
    )
    parser.add_argument(
        "--prune-events", type=int, default=300_000, help="old events for the pruning run"
    )
    parser.add_argument(
        "--soak", type=int, default=120, help="seconds of sustained load for memory (600: issue)"
    )
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")

    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk webhook")
    targets = [t for t in args.targets.split(",") if t]
    notes: list[str] = []
    if "webhook" in targets and shutil.which("webhook") is None:
        targets.remove("webhook")
        notes.append("webhook skipped: not installed (apt-get install -y webhook)")
        print("note: webhook is not installed; skipping it", file=sys.stderr)
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {int(LOAD_CPU)})  # this script and its sink stay off core 0
    else:
        notes.append("NOT PINNED: taskset missing or fewer than 2 cores")

    with tempfile.TemporaryDirectory(prefix="receiver-bench-") as tmp:
        work = Path(tmp)
        sink = Sink()
        os.environ["BENCH_SINK_PORT"] = str(sink.port)
        started = time.monotonic()
        stream, warmup = work / "stream.tsv", work / "warmup.tsv"
        sent = write_stream(stream, count=args.events, seed=1, run="bench")
        write_stream(warmup, count=20_000, seed=2, run="warmup")
        ruleset = rules.load_file(BENCH / "rules.yaml")
        matching = sum(1 for event in sent if ruleset.route(event))
        notes.append(
            f"stream: {args.events} distinct events (random walk of 200 sessions), "
            f"{matching} ({matching / len(sent):.2%}) match a rule and notify the "
            f"json:// sink; warm-up replays a separate 20000-event file"
        )
        print(
            f"{len(sent)} signed events written in {time.monotonic() - started:.1f}s; "
            f"{matching} match a rule",
            file=sys.stderr,
        )
        results: list[Result] = []
        paced: list[Result] = []  # the receiver at --paced of its burst rate, each round
        sections: list[str] = []
        try:
            for round_no in range(1, args.rounds + 1 if "throughput" in parts else 1):
                for name in targets:
                    server = make_server(name, work, sink.port)
                    print(f"round {round_no}: {name} ...", file=sys.stderr, flush=True)
                    result = measure(server, round_no, args, stream, warmup, pin)
                    print(f"  {_line(result)}; {'; '.join(result.notes)}", file=sys.stderr)
                    results.append(result)
                    if name == "receiver" and (args.paced or args.paced_rate):
                        rate = args.paced_rate or args.paced * result.rps
                        server = make_server(name, work, sink.port)
                        print(
                            f"round {round_no}: receiver paced to {rate:,.0f}/s ...",
                            file=sys.stderr,
                            flush=True,
                        )
                        result = measure(server, round_no, args, stream, warmup, pin, rate=rate)
                        print(f"  {_line(result)}; {'; '.join(result.notes)}", file=sys.stderr)
                        paced.append(result)
            for part, fn in (
                ("e2e", lambda: run_e2e(args, work, sink, pin)),
                ("growth", lambda: run_growth(args, work, sink, stream, warmup, pin)),
                ("prune", lambda: run_prune(args, work, sink, stream, warmup, pin)),
                ("memory", lambda: run_memory(args, work, sink, stream, warmup, pin)),
                ("workers", lambda: run_workers(args, work, sink, stream, warmup, pin)),
                (
                    "postgres",
                    lambda: pg.run_postgres(
                        args, work, sink.port, stream, warmup, pin, make_server=make_server, wrk=wrk
                    ),
                ),
                ("admin", lambda: admin.measure(1_000_000, 20)),
                ("fanout", lambda: fanout.measure(1000, 10, 50)),
                ("statements", lambda: statements.measure(20_000, BENCH / "rules.yaml")),
                ("api", lambda: api.run_part(args, work, pin)),
                ("backtest", lambda: backtest.measure()),
                ("recording", lambda: run_recording(args, work, sink, stream, warmup, pin)),
                (
                    "streams",
                    lambda: stream_part.run_part(
                        args,
                        work,
                        sink.port,
                        pin,
                        current=(stream, warmup, sent),
                        secret=SECRET,
                        make_server=make_server,
                        measure=measure,
                    ),
                ),
                (
                    "tracing",
                    lambda: tracing_part.run(
                        args, work, sink.port, stream, warmup, pin, make_server, measure
                    ),
                ),
                ("instructions", lambda: instructions.section()),
                (
                    "scaling",
                    lambda: scaling_part.run_part(
                        args,
                        work,
                        sink.port,
                        pin,
                        current=(stream, warmup),
                        secret=SECRET,
                        make_server=make_server,
                        measure=measure,
                    ),
                ),
            ):
                if part in parts:
                    sections += fn()
        finally:
            sink.stop()
        notes.append(f"json:// sink received {sink.count} notifications over all receiver runs")
    text = "\n".join(sections)
    if "throughput" in parts:
        text = report(results, paced, args, notes) + "\n" + text
    if set(parts) != set(PARTS) and args.output.exists():
        text = merge(args.output.read_text(), text, head="throughput" in parts)
    args.output.write_text(text)
    if results:
        write_figures(args.figures, results, args)
        print("\n".join(table(results)))
    if paced:
        print("\n" + "\n".join(lag_table(results, paced)))
    print(f"\nwritten to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
