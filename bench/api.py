"""`make bench`, part api: the /v1 read API on a SQLite store of 1,000,000 sessions.

    .venv/bin/python bench/api.py                       # all of it; writes "## Read API"
    .venv/bin/python bench/api.py --sessions 100000 --duration 5 --rounds 1   # a quick look
    .venv/bin/python bench/run.py --parts api           # the same, as a part of `make bench`

The store: a file migrated by the product (`receiver db migrate`), then filled with
synthetic sessions by direct inserts into `sessions` and `session_scores`: each session's
events (score drops and recoveries, interventions, a stop now and then) are folded by the
product's own receiver.sessions.Summary.fold, so every mark and derived column is what
the router would have written. About 20,000 users, 50 pages, 10 cohorts, integer scores,
started over the last 30 days. Built once per size and schema version, and again when it
is a day old (the windows of /v1/scores are relative to now), under bench/.cache/.

What it measures, the server pinned to core 0 and every load generator to core 1:

- one: GET /v1/sessions/:id vs a bare Starlette endpoint returning the same JSON on the
  same uvicorn settings (this file, --serve-bare), in the same run; req/s, p50, p99.
- list: GET /v1/sessions with filters, under 32 connections and with 1 (p99 under 32
  connections is mostly queueing; 1 connection is the latency of one request).
- scores: GET /v1/scores?window=30d, per groupBy, one request at a time.
- ingest: the pre-signed stream of bench/run.py (bench/events.lua) flat out against a copy
  of the store, alone; with 200 reads/s beside it (bench/reads.lua, paced), of point reads
  (a session, its score, its history, a user's list) or of the filtered lists; and with
  /v1/scores?window=30d back to back.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice
from pathlib import Path
from typing import Any

from receiver import signature
from receiver.sessions import COLUMNS, Fact, Summary
from receiver.simulator.walk import event_stream, timestamp
from receiver.store.sqlite.schema import MIGRATIONS

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
CACHE = BENCH / ".cache"

SECRET = "bench-secret-0123456789abcdef"
SERVER_CPU = "0"
LOAD_CPU = "1"
SESSIONS = 1_000_000
USERS = 20_000
PAGES = [f"/{area}/{n}" for area in ("app", "docs", "shop", "learn", "account") for n in range(10)]
COHORTS = [f"cohort_{c}" for c in "abcdefghij"]
DAY = 86_400.0
THRESHOLD = 40
MAX_CACHE_AGE = DAY  # the /v1/scores windows are relative to now: rebuild a day-old store
SECTION = "## Read API"

# What each target allows (the part 7).
TARGET_LIST_P99_MS = 20.0
TARGET_SCORES_MS = 500.0
TARGET_INGEST_RATIO = 0.9
TARGET_P99_RATIO = 2.0


def uptime() -> str:
    """The load average now, to print beside each figure (others share this machine)."""
    return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the store ------------------------------------------------------------------------------


def _iso(t: float) -> str:
    """receiver.events.iso() of epoch seconds, without building a datetime (millions of them)."""
    whole = int(t)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((t - whole) * 1e6):06d}Z"
    )


def _session_facts(i: int, rng: random.Random, now: float) -> list[Fact]:
    """The events of synthetic session i, as facts: 1 to 4 score events, drops and recoveries
    in turn (the last says the status: 75% active, 17% dropped), an intervention after a
    drop now and then, a stop for 8%; all on one page, cohort and user."""
    session_id = f"sess_{i:07d}"
    user = f"user_{rng.randrange(USERS)}"
    # Pages and cohorts are not equally popular: a few pages get most of the sessions.
    page = PAGES[min(len(PAGES) - 1, int(rng.expovariate(1 / 10)))]
    cohort = COHORTS[rng.randrange(len(COHORTS))]
    start = now - rng.uniform(120, 30 * DAY - 120)
    started = _iso(start) if rng.random() < 0.5 else None  # half the payloads send startedAt
    scores = 1 + (rng.random() < 0.6) + (rng.random() < 0.4) + (rng.random() < 0.2)
    last_drop = rng.random() < 0.2
    # What every event of the session says alike.
    fact = functools.partial(
        Fact, session_id=session_id, user_id=user, context=page, cohort=cohort, started=started
    )
    facts = []
    t = start
    for n in range(scores):
        drop = last_drop if (scores - 1 - n) % 2 == 0 else not last_drop
        score = rng.randrange(0, THRESHOLD) if drop else rng.randrange(THRESHOLD, 101)
        kind = "score.drop" if drop else "score.recover"
        facts.append(fact(event_id=f"evt_s{i:07d}_{n}", type=kind, ts=_iso(t), score=float(score)))
        if drop and rng.random() < 0.3:
            t += rng.uniform(1, 30)
            facts.append(fact(event_id=f"evt_s{i:07d}_{n}i", type="intervention.fired", ts=_iso(t)))
        t = min(t + rng.expovariate(1 / 300), now - 60)
    if rng.random() < 0.08:
        facts.append(fact(event_id=f"evt_s{i:07d}_stop", type="session.stopped", ts=_iso(t)))
    return facts


def _rows(count: int, now: float, seed: int) -> Iterator[tuple[tuple[Any, ...], list[Any]]]:
    """(sessions row, session_scores rows) of each synthetic session: the row as
    receiver.store.views._values writes it, Summary's columns then status and started_at."""
    rng = random.Random(seed)
    for i in range(count):
        facts = _session_facts(i, rng, now)
        summary = Summary(id=facts[0].session_id)
        for fact in facts:
            summary.fold(fact)
        row = (
            *(getattr(summary, c) if c != "stopped" else int(summary.stopped) for c in COLUMNS),
            summary.status,
            summary.started_at,
        )
        points = [(f.session_id, f.ts, f.event_id, f.score) for f in facts if f.score is not None]
        yield row, points


def build_store(path: Path, count: int, *, now: float, seed: int = 7) -> None:
    """A store migrated by the product, then count synthetic sessions inserted directly.

    The secondary indexes of `sessions` are dropped while the rows go in and made again
    from their own CREATE statements afterwards (a sorted build, much faster)."""
    tmp = path.with_suffix(".building")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    receiver_cli("db", "migrate", "--db", str(tmp))
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-262144")
    indexes = [
        (name, sql)
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sessions'"
            " AND sql IS NOT NULL"
        )
    ]
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    columns = (*COLUMNS, "status", "started_at")
    insert = f"INSERT INTO sessions ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    rows = _rows(count, now, seed)
    chunk = 100_000
    for start in range(0, count, chunk):
        batch = list(islice(rows, chunk))
        conn.execute("BEGIN")
        conn.executemany(insert, (row for row, _ in batch))
        conn.executemany(
            "INSERT INTO session_scores (session_id, ts, event_id, score) VALUES (?, ?, ?, ?)",
            (point for _, points in batch for point in points),
        )
        conn.execute("COMMIT")
        if start and start % 200_000 == 0:
            log(f"  {start:,} sessions")
    for _, sql in indexes:
        conn.execute(sql)
    # What project() keeps as sessions are routed, made here at once (as the migration).
    conn.execute("DELETE FROM session_hours")
    conn.execute(
        "INSERT INTO session_hours (status, hour, n) SELECT status, substr(started_at, 1, 13),"
        " count(*) FROM sessions WHERE started_at IS NOT NULL"
        " GROUP BY status, substr(started_at, 1, 13)"
    )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    tmp.rename(path)


@dataclass
class Store:
    path: Path
    key: str  # an enterprise API key (no plan limit) made for the store
    sessions: int
    built_at: float
    build_seconds: float  # what building took, when it was built


def cached_store(count: int) -> Store:
    """The store of count sessions under bench/.cache/, built when missing or a day old."""
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"api-{count}-v{len(MIGRATIONS)}.db"
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        info = json.loads(meta.read_text())
        if time.time() - info["built_at"] < MAX_CACHE_AGE:
            return Store(path, info["key"], count, info["built_at"], info["build_seconds"])
        log(f"{path.name} is {(time.time() - info['built_at']) / 3600:.0f} h old: rebuilding")
    started = time.monotonic()
    now = time.time()
    log(f"building {path} ({count:,} sessions) ...")
    build_store(path, count, now=now)
    made = json.loads(
        receiver_cli(
            "keys", "create", "--name", "bench", "--plan", "enterprise", "--json", "--db", str(path)
        )
    )
    took = time.monotonic() - started
    meta.write_text(json.dumps({"key": made["key"], "built_at": now, "build_seconds": took}))
    log(f"  built in {took:.0f}s")
    return Store(path, made["key"], count, now, took)


def receiver_cli(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "receiver", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"receiver {' '.join(argv[:2])} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


# -- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A server process on core 0 (when pinning), stopped by stop() whatever happened."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log_path
        self.port = free_port()
        self.env["RECEIVER_PORT"] = str(self.port)
        self.argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, pin: bool) -> Server:
        argv = ["taskset", "-c", SERVER_CPU, *self.argv] if pin else self.argv
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"{self.name} exited {self.proc.returncode}; see {self.log}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            if _answers(self.port, "/healthz"):
                return self
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"{self.name} did not start within 60s; see {self.log}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def _answers(port: int, path: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def receiver_server(db: Path, work: Path, sink_port: int) -> Server:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RECEIVER_SECRETS": SECRET,
        "RECEIVER_DB": str(db),
        "RECEIVER_RULES": str(BENCH / "rules.yaml"),
        "RECEIVER_LOG_LEVEL": "warning",
        "BENCH_SINK_PORT": str(sink_port),
    }
    argv = [sys.executable, "-m", "receiver", "serve"]
    return Server("receiver", argv, env, work / "receiver.log")


def bare_server(body: Path, work: Path) -> Server:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "bench.api", "--serve-bare", "--port", "{port}"]
    return Server("bare", [*argv, "--body", str(body)], env, work / "bare.log")


def serve_bare(port: int, body: Path) -> None:
    """A bare Starlette endpoint answering GET /v1/sessions/{id} with body's JSON, on the
    uvicorn settings of `receiver serve`: what the receiver's GET costs beyond the stack."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from receiver.cli import server_config
    from receiver.settings import Settings

    data = json.loads(body.read_text())

    async def one(request: Request) -> Response:
        return JSONResponse(data)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [Route("/v1/sessions/{id}", one), Route("/healthz", healthz)]
    app = Starlette(routes=routes)
    uvicorn.Server(server_config(app, Settings(port=port))).run()


class Sink:
    """Where the bench rules' json:// notifier posts (under 0.1% of the ingest stream)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length") or 0))
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


# -- load -----------------------------------------------------------------------------------


@dataclass
class Run:
    """One wrk run: requests a second and latency, in ms."""

    rps: float
    p50: float
    p99: float
    requests: int
    errors: str  # "-" for none
    load: str
    max: float = 0.0


def wrk_argv(
    port: int,
    script: str,
    script_args: Sequence[str],
    *,
    seconds: float,
    connections: int,
    pin: bool,
) -> list[str]:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "5s", "--latency"]
    argv += ["-s", str(BENCH / script), f"http://127.0.0.1:{port}", "--", *script_args]
    return ["taskset", "-c", LOAD_CPU, *argv] if pin else argv


def wrk_result(stdout: str, stderr: str, returncode: int, load: str) -> Run:
    match = re.search(r"^BENCH (\{.*\})$", stdout, re.MULTILINE)
    if returncode != 0 or match is None:
        raise SystemExit(f"wrk failed ({returncode}):\n{stdout}\n{stderr}")
    got = json.loads(match.group(1))
    kinds = ("connect", "read", "write", "status", "timeout")
    errors = ", ".join(f"{k} {got[k]}" for k in kinds if got[k]) or "-"
    return Run(
        got["requests"] / (got["duration_us"] / 1e6),
        got["p50_us"] / 1000,
        got["p99_us"] / 1000,
        got["requests"],
        errors,
        load,
        got["max_us"] / 1000,
    )


def wrk(
    port: int,
    script: str,
    script_args: Sequence[str],
    *,
    seconds: float,
    connections: int,
    pin: bool,
) -> Run:
    load = uptime()
    argv = wrk_argv(port, script, script_args, seconds=seconds, connections=connections, pin=pin)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    return wrk_result(done.stdout, done.stderr, done.returncode, load)


def reads(port: int, paths: Path, key: str, *, seconds: float, connections: int, pin: bool) -> Run:
    return wrk(
        port, "reads.lua", [str(paths), key], seconds=seconds, connections=connections, pin=pin
    )


def get(port: int, path: str, key: str) -> tuple[int, bytes, float]:
    """One GET on a new connection: status, body and seconds to the last byte."""
    conn = HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        started = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        body = response.read()
        return response.status, body, time.perf_counter() - started
    finally:
        conn.close()


def get_json(port: int, path: str, key: str) -> Any:
    status, body, _ = get(port, path, key)
    if status != 200:
        raise SystemExit(f"GET {path}: {status} {body[:300]!r}")
    return json.loads(body)


def write_paths(path: Path, paths: Sequence[str]) -> Path:
    path.write_text("".join(f"{p}\n" for p in paths))
    return path


def write_stream(path: Path, *, count: int, seed: int, run: str) -> None:
    """count signed deliveries for bench/events.lua, "<signature>\\t<body>" a line, from the
    random walk bench/run.py sends, dated to end a minute ago (as run.py's stream)."""
    written = list(islice(event_stream(seed=seed, sessions=200, threshold=40, run=run), count))
    shift = (
        datetime.fromisoformat(written[-1]["timestamp"]) - datetime.now(UTC) + timedelta(minutes=1)
    )
    with path.open("w") as out:
        for event in written:
            event["timestamp"] = timestamp(datetime.fromisoformat(event["timestamp"]) - shift)
            body = json.dumps(event, separators=(",", ":"))
            out.write(f"{signature.sign(SECRET.encode(), body.encode())}\t{body}\n")


# -- the parts ------------------------------------------------------------------------------


@dataclass
class Bench:
    store: Store
    work: Path
    pin: bool
    seconds: float  # per measured wrk run
    warmup: float
    rounds: int
    connections: int
    read_rate: float  # reads/s beside ingest
    ingest_events: int
    now: float  # when the measurement started: the list filters' dates are relative to it

    @property
    def key(self) -> str:
        return self.store.key

    def day(self, days_ago: int) -> str:
        return datetime.fromtimestamp(self.now - days_ago * DAY, UTC).date().isoformat()

    def one_id(self) -> str:
        return f"sess_{self.store.sessions // 2:07d}"

    def user(self) -> str:
        return "user_4242"

    def queries(self, port: int) -> list[tuple[str, list[str]]]:
        """The list queries of part (b): a label and the paths wrk sends in turn."""
        walk = ["/v1/sessions?limit=20"]
        for _ in range(2):
            cursor = get_json(port, walk[-1], self.key)["cursor"]
            walk.append(f"/v1/sessions?limit=20&cursor={cursor}")
        return [
            (f"userId={self.user()}", [f"/v1/sessions?userId={self.user()}"]),
            ("status=dropped", ["/v1/sessions?status=dropped"]),
            (
                f"status=active, from 10 to 5 days ago ({self.day(10)} to {self.day(5)})",
                [f"/v1/sessions?status=active&from={self.day(10)}&to={self.day(5)}"],
            ),
            ("no filter, pages 1-3 via cursor", walk),
        ]

    def reads(self, server: Server, name: str, paths: Sequence[str], connections: int) -> Run:
        file = write_paths(self.work / f"{name}.paths", paths)
        if self.warmup:
            reads(
                server.port,
                file,
                self.key,
                seconds=self.warmup,
                connections=connections,
                pin=self.pin,
            )
        return reads(
            server.port, file, self.key, seconds=self.seconds, connections=connections, pin=self.pin
        )

    def one_conn(self, server: Server, paths: Sequence[str]) -> Run:
        """paths in turn, one request at a time on one keep-alive connection, for a third
        of b.seconds (3 s at least), each timed to its last byte by this script.

        Not wrk -c1: wrk corrects its histogram for coordinated omission, and with one
        connection that turns a single 300 ms pause of the machine into 300 samples of 1 to
        300 ms, the 99th percentile of thousands of 1 ms requests."""
        load = uptime()
        conn = HTTPConnection("127.0.0.1", server.port, timeout=60)
        headers = {"Authorization": f"Bearer {self.key}"}
        took: list[float] = []
        errors = 0
        try:
            started = time.perf_counter()
            while time.perf_counter() - started < max(3.0, self.seconds / 3):
                sent = time.perf_counter()
                conn.request("GET", paths[len(took) % len(paths)], headers=headers)
                response = conn.getresponse()
                response.read()
                took.append((time.perf_counter() - sent) * 1000)
                errors += response.status != 200
            elapsed = time.perf_counter() - started
        finally:
            conn.close()
        took.sort()
        return Run(
            len(took) / elapsed,
            took[len(took) // 2],
            took[min(len(took) - 1, int(len(took) * 0.99))],
            len(took),
            f"status {errors}" if errors else "-",
            load,
            took[-1],
        )


def part_one(b: Bench, server: Server) -> list[str]:
    """(a) GET /v1/sessions/:id vs a bare endpoint answering the same JSON."""
    path = f"/v1/sessions/{b.one_id()}"
    body = b.work / "one.json"
    body.write_text(json.dumps(get_json(server.port, path, b.key)))
    bare = bare_server(body, b.work)
    lines = [
        "### GET one session",
        "",
        f"{stamp()} GET {path} (the same session every time), wrk -c{b.connections}, "
        f"{b.seconds:g}s after {b.warmup:g}s of warm-up; bare: a Starlette endpoint answering the "
        "same JSON from memory on the same uvicorn settings (bench/api.py --serve-bare), "
        "measured in turn with the receiver in each round.",
        "",
        "| target | round | req/s | p50 ms | p99 ms | vs bare | errors | load |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    try:
        bare.start(b.pin)
        for round_no in range(1, b.rounds + 1):
            runs = {}
            for name, target in (("bare", bare), ("receiver", server)):
                log(f"one session {round_no}: {name} ...")
                runs[name] = run = b.reads(target, f"one-{name}", [path], b.connections)
                log(f"  {run.rps:,.0f}/s, p50 {run.p50:.2f} ms, p99 {run.p99:.2f} ms")
                ratio = run.rps / runs["bare"].rps
                lines.append(
                    f"| {name} | {round_no} | {run.rps:,.0f} | {run.p50:.2f} | {run.p99:.2f} | "
                    f"{ratio:.2f}x | {run.errors} | {run.load} |"
                )
    finally:
        bare.stop()
    single = b.one_conn(server, [path])
    lines += [
        "",
        f"One connection, one request at a time ({single.requests:,} requests, timed by "
        f"bench/api.py): p50 {single.p50:.2f} ms, p99 {single.p99:.2f} ms, max "
        f"{single.max:.1f} ms ({single.load}).",
        "",
    ]
    return lines


def part_list(b: Bench, server: Server) -> list[str]:
    """(b) GET /v1/sessions with filters: under load and one at a time."""
    lines = [
        "### GET /v1/sessions with filters",
        "",
        f"{stamp()} {b.store.sessions:,} sessions stored. Each query under wrk -c{b.connections} "
        f"for {b.seconds:g}s (after {b.warmup:g}s of warm-up), then one request at a time on 1 "
        f"connection for {max(3.0, b.seconds / 3):g}s, timed by bench/api.py. With 32 connections "
        "p50 is mostly queueing (about connections / throughput) and p99 shows stalls; 1 "
        f"connection is the latency of one request. Target: p99 <= {TARGET_LIST_P99_MS:g} ms. "
        "`total` is the count the answer reports (every match, not just the page); the walk "
        "sends its three pages in turn.",
        "",
        "| query | total | req/s (32 conn) | p50 ms | p99 ms | 1 conn: requests | p50 ms "
        "| p99 ms | max ms | p99 <= 20 ms | errors | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for n, (label, paths) in enumerate(b.queries(server.port)):
        total = get_json(server.port, paths[0], b.key)["total"]
        log(f"list: {label} ({total:,} match) ...")
        many = b.reads(server, f"list-{n}", paths, b.connections)
        one = b.one_conn(server, paths)
        log(
            f"  32 conn: {many.rps:,.0f}/s p50 {many.p50:.2f} p99 {many.p99:.2f} ms; "
            f"1 conn: p50 {one.p50:.2f} p99 {one.p99:.2f} max {one.max:.1f} ms"
        )
        verdict = "; ".join(
            f"{name}: {'met' if run.p99 <= TARGET_LIST_P99_MS else 'missed'}"
            for name, run in (("1 conn", one), ("32 conn", many))
        )
        lines.append(
            f"| {label} | {total:,} | {many.rps:,.0f} | {many.p50:.2f} | {many.p99:.2f} | "
            f"{one.requests:,} | {one.p50:.2f} | {one.p99:.2f} | {one.max:.1f} | {verdict} | "
            f"{many.errors} | {many.load} |"
        )
    return [*lines, ""]


def part_scores(b: Bench, server: Server, requests: int = 20, budget: float = 30.0) -> list[str]:
    """(c) GET /v1/scores?window=30d, one request at a time: requests of each query, or as
    many as budget seconds allow (3 at least)."""
    lines = [
        "### GET /v1/scores?window=30d",
        "",
        f"{stamp()} {requests} requests one after the other per query (after one not "
        f"counted; fewer, 3 at least, where they take more than {budget:g}s in all), each "
        "on a connection of its own, timed to the last byte by this script. Target: <= "
        f"{TARGET_SCORES_MS:g} ms.",
        "",
        "| query | groups | sessions counted | answer KiB | requests | p50 ms | max ms "
        "| <= 500 ms | load |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for query in ("groupBy=page", "groupBy=cohort", "groupBy=userId", "groupBy=page&metric=p95"):
        path = f"/v1/scores?window=30d&{query}"
        load = uptime()
        log(f"scores: {query} ...")
        status, body, _ = get(server.port, path, b.key)
        if status != 200:
            raise SystemExit(f"GET {path}: {status} {body[:300]!r}")
        groups = json.loads(body)["groups"]
        took: list[float] = []
        started = time.monotonic()
        while len(took) < requests and (len(took) < 3 or time.monotonic() - started < budget):
            took.append(get(server.port, path, b.key)[2] * 1000)
        took.sort()
        p50, worst = took[len(took) // 2], took[-1]
        log(f"  p50 {p50:.0f} ms, max {worst:.0f} ms")
        verdict = (
            "met"
            if worst <= TARGET_SCORES_MS
            else ("p50 met" if p50 <= TARGET_SCORES_MS else "missed")
        )
        lines.append(
            f"| {query} | {len(groups):,} | {sum(g['sessions'] for g in groups):,} | "
            f"{len(body) / 1024:,.0f} | {len(took)} | {p50:.0f} | {worst:.0f} | {verdict} | "
            f"{load} |"
        )
    return [*lines, ""]


def read_mixes(b: Bench, port: int, count: int = 600) -> dict[str, list[str]]:
    """The reads beside ingest, each mix in turn. "point": what one session or one user
    costs, by random id (GET a session, its score, its score history, a user's list);
    "lists": the filtered lists of part (b), whose `total` counts every match."""
    rng = random.Random(3)
    point = []
    for n in range(count):
        session = f"/v1/sessions/sess_{rng.randrange(b.store.sessions):07d}"
        point.append(
            [session, f"{session}/score", f"{session}/scores"][n % 4]
            if n % 4 < 3
            else f"/v1/sessions?userId=user_{rng.randrange(USERS)}"
        )
    lists = [path for _, paths in b.queries(port) for path in paths]
    return {"point": point, "lists": lists}


MODES = {  # what runs beside ingest: the table's label
    "alone": "nothing",
    "point": "point reads",
    "lists": "filtered lists",
    "aggregates": "30d aggregates",
}


@dataclass
class Ingest:
    mode: str
    round: int
    run: Run
    backlog: int  # events not routed yet when wrk stopped
    drain: float | None  # seconds to route them, None if not within 120 s
    beside: str  # what the reads beside did


def _unrouted(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        count: int = conn.execute("SELECT count(*) FROM events WHERE routed_at IS NULL").fetchone()[
            0
        ]
        return count


def _drain(db: Path, limit: float = 120.0) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if _unrouted(db) == 0:
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def _copy_store(b: Bench) -> Path:
    db = b.work / "ingest.db"
    for suffix in ("", "-wal"):
        source = Path(f"{b.store.path}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{db}{suffix}")
    return db


def _remove_store(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def ingest_run(
    b: Bench, mode: str, round_no: int, stream: Path, warmup: Path, sink: Sink, mixes: Path
) -> Ingest:
    """Ingest flat out on a fresh copy of the store: alone, with reads paced to b.read_rate
    beside it ("point" or "lists": the paths in mixes / f"{mode}.paths"), or with
    /v1/scores?window=30d back to back on one connection ("aggregates")."""
    db = _copy_store(b)
    server = receiver_server(db, b.work, sink.port)
    beside: subprocess.Popen[str] | None = None
    stop = threading.Event()
    took: list[float] = []
    looper: threading.Thread | None = None
    events = ["/v1/events"]
    try:
        server.start(b.pin)
        if b.warmup:
            wrk(
                server.port,
                "events.lua",
                [str(warmup), *events],
                seconds=b.warmup,
                connections=b.connections,
                pin=b.pin,
            )
        if _drain(db) is None:
            raise SystemExit("ingest: the warm-up was not routed within 120s")
        if mode in ("point", "lists"):
            argv = wrk_argv(
                server.port,
                "reads.lua",
                [str(mixes / f"{mode}.paths"), b.key, f"{b.read_rate:g}"],
                seconds=b.seconds + 2,
                connections=8,
                pin=b.pin,
            )
            beside = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            time.sleep(1)  # the reads run before ingest starts and after it stops
        elif mode == "aggregates":
            path = "/v1/scores?window=30d&groupBy=page"

            def loop() -> None:
                while not stop.is_set():
                    took.append(get(server.port, path, b.key)[2])

            looper = threading.Thread(target=loop, daemon=True)
            looper.start()
            time.sleep(1)
        run = wrk(
            server.port,
            "events.lua",
            [str(stream), *events],
            seconds=b.seconds,
            connections=b.connections,
            pin=b.pin,
        )
        backlog = _unrouted(db)
        note = "-"
        if beside is not None:
            out, err = beside.communicate(timeout=b.seconds + 60)
            r = wrk_result(out, err, beside.returncode, run.load)
            note = (
                f"{r.rps:,.0f} reads/s, p50 {r.p50:.1f} ms, p99 {r.p99:.1f} ms, errors {r.errors}"
            )
        if looper is not None:
            stop.set()
            looper.join(60)
            if took:
                ms = sorted(t * 1000 for t in took)
                note = f"{len(ms)} aggregates, p50 {ms[len(ms) // 2]:.0f} ms, max {ms[-1]:.0f} ms"
        drain = _drain(db) if backlog else 0.0
    finally:
        stop.set()
        if beside is not None and beside.poll() is None:
            beside.kill()
            beside.wait(5)
        server.stop()
        if looper is not None:
            looper.join(60)
        _remove_store(db)
    return Ingest(mode, round_no, run, backlog, drain, note)


def part_ingest(b: Bench, mixes: dict[str, list[str]], sink: Sink) -> list[str]:
    """(d) ingest alone vs with reads beside it, and with aggregates beside it."""
    started = stamp()
    stream, warmup = b.work / "stream.tsv", b.work / "warmup.tsv"
    write_stream(stream, count=b.ingest_events, seed=1, run="bench")
    write_stream(warmup, count=20_000, seed=2, run="warmup")
    for name, paths in mixes.items():
        write_paths(b.work / f"{name}.paths", paths)
    results: list[Ingest] = []
    for round_no in range(1, b.rounds + 1):
        for mode in MODES:
            log(f"ingest {round_no}: {mode} ...")
            got = ingest_run(b, mode, round_no, stream, warmup, sink, b.work)
            log(
                f"  {got.run.rps:,.0f} accepted/s, p50 {got.run.p50:.2f} ms, p99 "
                f"{got.run.p99:.2f} ms; backlog {got.backlog}; beside: {got.beside}"
            )
            results.append(got)
    lines = [
        "### Ingest with reads beside it",
        "",
        f"{started} bench/run.py's kind of stream (bench/events.lua, pre-signed, wrk "
        f"-c{b.connections} flat out for {b.seconds:g}s after {b.warmup:g}s of warm-up) into a "
        f"fresh copy of the {b.store.sessions:,}-session store, each run: alone; with "
        f"{b.read_rate:g} reads/s beside it (bench/reads.lua paced, 8 connections, from 1 s "
        "before ingest starts to 1 s after it stops), of two mixes: point reads (in turn, by "
        "random id: a session, its score, its score history, and a random user's list) and "
        "filtered lists (the queries of the table above, in turn); and with GET "
        "/v1/scores?window=30d&groupBy=page back to back on one connection. The server has core "
        "0 to itself, so the CPU the reads take is CPU ingest loses; but a read must not stall "
        f"it beyond that. Targets: accepted/s >= {TARGET_INGEST_RATIO:g}x of alone, p99 <= "
        f"{TARGET_P99_RATIO:g}x.",
        "",
        "| beside | round | accepted/s | p50 ms | p99 ms | vs alone | p99 vs alone | targets "
        "| not routed at the end (drained in) | what ran beside | load |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    alone = {r.round: r for r in results if r.mode == "alone"}
    for r in results:
        base = alone[r.round].run
        rate, p99 = r.run.rps / base.rps, r.run.p99 / base.p99
        verdict = "-"
        if r.mode != "alone":
            verdict = ", ".join(
                [
                    "rate " + ("met" if rate >= TARGET_INGEST_RATIO else "missed"),
                    "p99 " + ("met" if p99 <= TARGET_P99_RATIO else "missed"),
                ]
            )
        drained = f"{r.drain:.1f}s" if r.drain is not None else "not within 120s"
        label = MODES[r.mode] + (f", {b.read_rate:g}/s" if r.mode in ("point", "lists") else "")
        lines.append(
            f"| {label} | {r.round} | {r.run.rps:,.0f} | {r.run.p50:.2f} | {r.run.p99:.2f} | "
            f"{rate:.2f}x | {p99:.2f}x | {verdict} | {r.backlog:,} ({drained}) | {r.beside} | "
            f"{r.run.load} |"
        )
    return [*lines, ""]


# -- running it -----------------------------------------------------------------------------

PARTS = ("one", "list", "scores", "ingest")


def run_part(args: argparse.Namespace, work: Path, pin: bool) -> list[str]:
    """The "## Read API" section of bench/RESULTS.md: what bench/run.py --parts api calls.

    Takes the options of bench/run.py it shares (duration, warmup, rounds, connections) and
    this file's own (api_sessions, read_rate, ingest_events, api_parts) when present."""
    store = cached_store(getattr(args, "api_sessions", SESSIONS))
    b = Bench(
        store=store,
        work=work,
        pin=pin,
        seconds=args.duration,
        warmup=args.warmup,
        rounds=args.rounds,
        connections=args.connections,
        read_rate=getattr(args, "read_rate", 200.0),
        ingest_events=getattr(args, "ingest_events", 200_000),
        now=time.time(),
    )
    parts = getattr(args, "api_parts", ",".join(PARTS)).split(",")
    age = (time.time() - store.built_at) / 3600
    lines = [
        SECTION,
        "",
        "Written by bench/api.py; each part says when it ran (a run of some parts, `bench/api.py "
        f"--parts`, keeps the others'). The store: {store.sessions:,} sessions of about {USERS:,} "
        f"users over the last 30 days, {len(PAGES)} pages, {len(COHORTS)} cohorts, scores 0-100, "
        "75% active, 17% dropped, 8% stopped; migrated by `receiver db migrate`, then filled by "
        "direct inserts of summaries folded by receiver.sessions (bench/.cache/"
        f"{store.path.name}, built in {store.build_seconds:.0f}s, {age:.1f} h ago; "
        f"{store.path.stat().st_size / 2**20:,.0f} MiB). `receiver serve` on core "
        f"{SERVER_CPU}{'' if pin else ' (NOT PINNED)'}, wrk and this script on core {LOAD_CPU}, "
        "an enterprise key (no plan limit).",
        "",
    ]
    sink = Sink()
    server = receiver_server(store.path, work, sink.port)
    try:
        server.start(pin)
        if "one" in parts:
            lines += part_one(b, server)
        if "list" in parts:
            lines += part_list(b, server)
        if "scores" in parts:
            lines += part_scores(b, server)
        mixes = read_mixes(b, server.port) if "ingest" in parts else {}
        server.stop()  # ingest runs on copies of the store, the reads' server stopped
        if "ingest" in parts:
            lines += part_ingest(b, mixes, sink)
    finally:
        server.stop()
        sink.stop()
    return lines


def write_section(path: Path, lines: list[str]) -> None:
    """Put the section into path: in place of the one there, else at the end. Of the one
    there, the `### ` parts this run did not measure (--parts) are kept."""
    old = path.read_text().splitlines() if path.exists() else []
    if SECTION in old:
        start = old.index(SECTION)
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
        _, kept = _parts(old[start:end])
        head, fresh = _parts(lines)
        merged = [*head]
        for key, part in {**kept, **fresh}.items():
            merged += fresh.get(key, part)
        new = [*old[:start], *merged, *old[end:]]
    else:
        new = [*old, *([""] if old and old[-1] else []), *lines]
    path.write_text("\n".join(new).rstrip("\n") + "\n")


def _parts(lines: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The lines before the first `### ` heading, and each `### ` part by its heading."""
    head: list[str] = []
    parts: dict[str, list[str]] = {}
    current = head
    for line in lines:
        if line.startswith("### "):
            current = parts[line] = []
        current.append(line)
    if head and head[-1]:
        head.append("")
    for part in parts.values():
        if part[-1]:
            part.append("")
    return head, parts


def stamp() -> str:
    """When a part ran, and the machine's load then (others share this machine)."""
    return f"Run {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, {uptime()}."


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    parser.add_argument(
        "--sessions",
        dest="api_sessions",
        type=int,
        default=SESSIONS,
        help="sessions in the store (built once per size, cached)",
    )
    parser.add_argument("--duration", type=int, default=15, help="seconds per measured wrk run")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of warm-up per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--read-rate", type=float, default=200.0, help="reads/s beside ingest")
    parser.add_argument(
        "--ingest-events",
        type=int,
        default=200_000,
        help="distinct signed events in the ingest stream",
    )
    parser.add_argument(
        "--parts",
        dest="api_parts",
        default=",".join(PARTS),
        help=f"comma-separated, of: {', '.join(PARTS)}",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=BENCH / "RESULTS.md",
        help="the file whose Read API section is written (the rest is kept)",
    )
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--body", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        assert args.body is not None
        serve_bare(args.port, args.body)
        return
    if unknown := set(args.api_parts.split(",")) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {int(LOAD_CPU)})  # this script stays off the server's core
    with tempfile.TemporaryDirectory(prefix="receiver-bench-api-") as tmp:
        lines = run_part(args, Path(tmp), pin)
    write_section(args.output, lines)
    print("\n".join(lines))
    log(f"written to {args.output} ({SECTION})")


if __name__ == "__main__":
    main()
