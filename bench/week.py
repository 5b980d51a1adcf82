"""The week `make bench`'s backtest part replays: a SQLite store of rate x days events,
built once by direct bulk insert and cached in bench/.cache (bench/backtest.py and
bench/backtest_budget.py both read it)."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import extra
from receiver.store.sqlite.schema import migrate

TARGET = 60.0  # seconds for a week at 10 events/s, the whole command, on two cores
CONCURRENT = 2000  # sessions interleaved at any time
PER_SESSION = 100  # events each
START = 1_795_000_000.0  # 2026-11-18 (a Wednesday), whole hours: the period's start


def kind(position: int) -> str:
    """A session's event at this position: its attention drops and recovers, now and then
    an intervention, and it ends."""
    if position == PER_SESSION - 1:
        return "session.stopped"
    step = position % 25
    if step in (2, 14):
        return "score.drop"
    if step in (6, 20):
        return "score.recover"
    if step == 9:
        return "intervention.fired"
    if step == 11:
        return "intervention.resolved"
    return "score.drop" if step % 3 == 0 else "score.recover"


def row(i: int, received: float) -> tuple[Any, ...]:
    wave, slot = divmod(i, CONCURRENT)
    session = (wave // PER_SESSION) * CONCURRENT + slot
    position = wave % PER_SESSION
    what = kind(position)
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(received)) + f".{i % 1000:03d}Z"
    event: dict[str, Any] = {
        "id": f"evt_bt_{i:09d}",
        "type": what,
        "timestamp": ts,
        "sessionId": f"sess_{session:07d}",
        "userId": f"user_{session % 5000}",
    }
    if what.startswith("score."):
        event["score"] = (5 + (i * 7) % 35) if what == "score.drop" else 60 + i % 30
        event["threshold"] = 40
        event["context"] = ("checkout", "browse", "search")[session % 3]
    if what.startswith("intervention."):
        event["interventionId"] = f"int_{session}_{position // 25}"
    score = event.get("score")
    return (
        event["id"], what, event["sessionId"], event["userId"], score,
        event.get("threshold"), ts, received, json.dumps(event, separators=(",", ":")),
        received + 0.01,
    )  # fmt: skip


def build(path: Path, count: int, rate: float) -> None:
    tmp = path.with_suffix(".building")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    migrate(conn)
    conn.execute("PRAGMA synchronous=OFF")
    chunk = 200_000

    def rows(start: int) -> Iterator[tuple[Any, ...]]:
        for i in range(start, min(start + chunk, count)):
            yield row(i, START + i / rate)

    for start in range(0, count, chunk):
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO events (id, type, session_id, user_id, score, threshold, event_ts,"
            " received_at, body, routed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows(start),
        )
        conn.execute("COMMIT")
        if start and start % 1_000_000 == 0:
            print(f"  {start:,} rows", file=sys.stderr, flush=True)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    tmp.rename(path)


def store(count: int, rate: float) -> Path:
    path = extra.CACHE / f"backtest-{count}-{rate:g}.db"
    if not path.exists():
        extra.CACHE.mkdir(exist_ok=True)
        started = time.monotonic()
        print(f"building {path} ({count:,} events; once) ...", file=sys.stderr, flush=True)
        build(path, count, rate)
        print(f"  built in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return path
