"""The read API bench's store: 1,000,000 synthetic sessions in a SQLite file migrated by
the product, each session's events folded by receiver.sessions.Summary.fold; built once
per size and schema version under bench/.cache/, again when a day old."""

from __future__ import annotations

import functools
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any

from receiver.sessions import COLUMNS, Fact, Summary
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


def stamp() -> str:
    """When a part ran, and the machine's load then (others share this machine)."""
    return f"Run {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, {uptime()}."


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
    receiver.store.sessions._values writes it, Summary's columns then status and started_at."""
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
