"""The read API bench's read parts: one session, the filtered lists, /v1/scores."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http.client import HTTPConnection
from pathlib import Path

from bench.api_load import (
    Run,
    get,
    get_json,
    reads,
    write_paths,
)
from bench.api_servers import bare_server
from bench.api_store import (
    DAY,
    TARGET_LIST_P99_MS,
    TARGET_SCORES_MS,
    USERS,
    Store,
    log,
    stamp,
    uptime,
)
from bench.servers import Server

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
