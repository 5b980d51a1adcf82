"""The parts of `make bench` beyond the side-by-side throughput table (bench/run.py calls these).

- e2e: a steady rate of events that match a notifying rule; POST -> the json:// sink, p50/p99.
- growth: ingest on a store already holding --growth-events events vs an empty one, and bytes on
  disk per stored event. The big database is built once with direct bulk inserts and cached
  under bench/.cache/ (git-ignored); what a run adds is deleted again afterwards.
- prune: p99 while retention prunes a backlog of old events vs steady p99.
- memory: resident size (VmRSS) sampled over --soak seconds of sustained load.
- workers: `uvicorn --factory receiver.app:from_env --workers 2` vs 1 on the same core.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

from receiver import signature
from receiver.store.sqlite.schema import migrate

BENCH = Path(__file__).resolve().parent
CACHE = BENCH / ".cache"
DAY = 86400.0
_EVENT_ID = re.compile(r"evt_e2e_\d+")


def uptime() -> str:
    """The load average now, to print beside each figure (others share this machine)."""
    return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- databases --------------------------------------------------------------------------------


def _body(i: int, received: float) -> tuple[Any, ...]:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(received)) + ".000Z"
    event = {
        "id": f"evt_old_{i:09d}",
        "type": "score.drop",
        "timestamp": ts,
        "sessionId": f"sess_{i // 40:07d}",
        "userId": f"user_{i % 5000}",
        "score": 20 + i % 19,
        "threshold": 40,
    }
    return (
        event["id"],
        "score.drop",
        event["sessionId"],
        event["userId"],
        event["score"],
        40,
        ts,
        received,
        json.dumps(event, separators=(",", ":")),
        received + 0.01,
    )


def build_db(path: Path, count: int, *, oldest: float, newest: float) -> None:
    """count routed events received evenly between oldest and newest, by direct bulk insert."""
    tmp = path.with_suffix(".building")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    migrate(conn)
    conn.execute("PRAGMA synchronous=OFF")
    step = (newest - oldest) / max(count, 1)
    chunk = 200_000
    for start in range(0, count, chunk):
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO events (id, type, session_id, user_id, score, threshold, event_ts,"
            " received_at, body, routed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (_body(i, oldest + i * step) for i in range(start, min(start + chunk, count))),
        )
        conn.execute("COMMIT")
        if start and start % 2_000_000 == 0:
            print(f"  {start:,} rows", file=sys.stderr, flush=True)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    tmp.rename(path)


def growth_db(count: int) -> Path:
    """The cached big database, built on first use."""
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"growth-{count}.db"
    if not path.exists():
        started = time.monotonic()
        print(f"building {path} ({count:,} events; once) ...", file=sys.stderr, flush=True)
        now = time.time()
        build_db(path, count, oldest=now - 10 * DAY, newest=now - DAY)
        print(f"  built in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return path


class Restore:
    """Remembers a cached database's extent; afterwards deletes whatever a run added."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as conn:
            self.events = conn.execute("SELECT max(rowid) FROM events").fetchone()[0] or 0
            self.tables = [
                name
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                    " AND name NOT IN ('events', 'schema_version') AND name NOT LIKE 'sqlite_%'"
                )
                if conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] == 0
            ]

    def __call__(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("BEGIN")
        conn.execute("DELETE FROM events WHERE rowid > ?", (self.events,))
        for name in self.tables:
            conn.execute(f'DELETE FROM "{name}"')
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()


# -- end to end -------------------------------------------------------------------------------


NOTIFY_EVERY = 20  # one event in this many matches a notifying rule in the e2e stream


def e2e_stream(count: int, secret: str) -> list[tuple[str, str, bytes]]:
    """Score drops, one session each; every NOTIFY_EVERY-th is a checkout drop, which the bench
    rules notify about (`checkout-drops`); the rest notify nobody, as in real traffic."""
    out = []
    now = time.time()
    for i in range(count):
        notify = i % NOTIFY_EVERY == 0
        event = {
            "id": f"evt_e2e_{i}" if notify else f"evt_quiet_{i}",
            "type": "score.drop",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "sessionId": f"sess_e2e_{i}",
            "userId": f"user_e2e_{i}",
            "score": 21,
            "threshold": 40,
            "context": "checkout" if notify else "home",
        }
        body = json.dumps(event, separators=(",", ":")).encode()
        out.append((str(event["id"]), signature.sign(secret.encode(), body), body))
    return out


def steady_post(
    port: int, stream: list[tuple[str, str, bytes]], rate: float, threads: int = 4
) -> dict[str, float]:
    """POST stream at rate/s over keep-alive connections; event id -> when it was sent."""
    sent: dict[str, float] = {}
    start = time.perf_counter() + 0.2

    def run(part: list[tuple[int, tuple[str, str, bytes]]]) -> None:
        conn = HTTPConnection("127.0.0.1", port, timeout=10)
        for n, (event_id, sig, body) in part:
            due = start + n / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent[event_id] = time.perf_counter()
            conn.request(
                "POST",
                "/v1/events",
                body,
                {"Content-Type": "application/json", signature.SIGNATURE_HEADER: sig},
            )
            conn.getresponse().read()
        conn.close()

    indexed = list(enumerate(stream))
    workers = [
        threading.Thread(target=run, args=(indexed[k::threads],), daemon=True)
        for k in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sent


def e2e_latencies(sent: dict[str, float], seen: dict[str, float]) -> dict[str, float]:
    sent = {i: t for i, t in sent.items() if i.startswith("evt_e2e_")}
    lat = sorted((seen[i] - t) * 1000 for i, t in sent.items() if i in seen)
    if not lat:
        return {"received": 0, "sent": len(sent)}
    return {
        "sent": len(sent),
        "received": len(lat),
        "p50_ms": lat[len(lat) // 2],
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "max_ms": lat[-1],
    }


def find_event_ids(text: str) -> list[str]:
    return _EVENT_ID.findall(text)


# -- memory -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) pid and its children (uvicorn workers) have used so far:
    unlike a rate, it hardly moves when other work shares the machine."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    ticks = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """VmRSS of pid and its children (uvicorn workers), in KiB."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        total += int(match.group(1)) if match else 0
    return total


class RssSampler:
    def __init__(self, pid: int, every: float = 5.0) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        started = time.monotonic()

        def loop() -> None:
            while not self._stop.wait(every):
                self.samples.append((time.monotonic() - started, rss_kib(pid)))

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def db_bytes(path: Path) -> int:
    return sum(
        p.stat().st_size for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()
    )


def git_ignored(path: Path) -> bool:
    done = subprocess.run(
        ["git", "-C", str(BENCH.parent), "check-ignore", "-q", str(path)], capture_output=True
    )
    return done.returncode == 0


__all__ = [
    "CACHE",
    "Restore",
    "RssSampler",
    "build_db",
    "db_bytes",
    "e2e_latencies",
    "e2e_stream",
    "find_event_ids",
    "git_ignored",
    "growth_db",
    "steady_post",
    "uptime",
]
