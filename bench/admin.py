"""The admin page with a big store: each page's time to answer with 1,000,000 events stored.

    python -m bench.admin [--events 1000000] [--requests 20]

Builds (once, cached in bench/.cache) a SQLite store of routed events with the bench's
direct bulk insert, adds some dead notifications, starts the real server on it, signs in
with an admin key and fetches each page `--requests` times, one request at a time, so
the time is the server's (plus a loopback round trip), not queueing. Writes the
"## Admin page" section of bench/RESULTS.md (the rest of the file is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench import extra

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

TARGET_MS = 100.0
SECTION = "## Admin page"


def big_store(events: int) -> Path:
    """The cached store of `events` routed events, with 2,000 dead notifications."""
    path = extra.CACHE / f"admin-{events}.db"
    if path.exists():
        return path
    extra.CACHE.mkdir(exist_ok=True)
    started = time.monotonic()
    print(f"building {path} ({events:,} events; once) ...", file=sys.stderr, flush=True)
    now = time.time()
    extra.build_db(path, events, oldest=now - 10 * extra.DAY, newest=now - 60)
    with sqlite3.connect(path) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM events ORDER BY rowid DESC LIMIT 2000")]
        conn.executemany(
            "INSERT INTO outbox (event_id, rule, notifier, target, title, body, state, attempts,"
            " next_at, created_at, updated_at, last_error) VALUES"
            " (?, 'page', 'mail', 0, 'title', 'body', 'dead', 8, ?, ?, ?, 'HTTP 500')",
            [(i, now, now, now) for i in ids],
        )
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the copy takes the main file only
    print(f"  built in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return path


def measure(events: int, requests: int) -> list[str]:
    source = big_store(events)
    with tempfile.TemporaryDirectory(prefix="receiver-bench-admin-") as tmp:
        db = Path(tmp) / "admin.db"
        shutil.copy(source, db)
        port = _free_port()
        env = {
            **os.environ,
            "RECEIVER_DB": str(db),
            "RECEIVER_PORT": str(port),
            "RECEIVER_LOG_LEVEL": "warning",
            "RECEIVER_MAX_EVENT_AGE": "0",
        }
        key = json.loads(
            subprocess.run(
                [sys.executable, "-m", "receiver", "keys", "create", "--name", "bench", "--plan",
                 "enterprise", "--role", "admin", "--json", "--db", str(db)],
                env=env, capture_output=True, text=True, check=True,
            ).stdout
        )["key"]  # fmt: skip
        with sqlite3.connect(db) as conn:
            sample = conn.execute(
                "SELECT id, session_id, user_id FROM events ORDER BY rowid DESC LIMIT 1 OFFSET 500"
            ).fetchone()
            dead = conn.execute("SELECT max(id) FROM outbox").fetchone()[0]
        proc = subprocess.Popen(
            [sys.executable, "-m", "receiver", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            _wait(base)
            with httpx.Client(base_url=base, timeout=30) as client:
                client.post("/admin/login", data={"key": key})
                rows = _time_pages(client, _pages(client, sample, dead), requests)
        finally:
            proc.terminate()
            proc.wait(30)
    return _section(rows, events, requests)


def _pages(client: httpx.Client, sample: tuple[str, str, str], dead: int) -> dict[str, str]:
    """Every admin page, by name: filtered on a real event's user and session."""
    event_id, session_id, user_id = sample
    pages = {
        "events": "/admin/events",
        "events, type filter": "/admin/events?type=session.stopped",
        "events, user filter": f"/admin/events?user={user_id}",
        "events, session filter": f"/admin/events?session={session_id}",
        "events, duplicates": "/admin/events?state=duplicates",
        "events, 5th page": _deep(client, "/admin/events", 5),
        "one event": f"/admin/events/{event_id}",
        "notifications": "/admin/notifications",
        "notifications, dead": "/admin/notifications?state=dead",
        "bulk retry (count)": "/admin/bulk-retry?notifier=mail",
        "retry (confirm)": f"/admin/notifications/{dead}/retry",
        "sessions": "/admin/sessions",
        "alerts": "/admin/alerts",
        "silences": "/admin/silences",
        "rules": "/admin/rules",
        "webhooks": "/admin/webhooks",
        "keys": "/admin/keys",
    }
    return pages


def _time_pages(
    client: httpx.Client, pages: dict[str, str], requests: int
) -> list[tuple[str, str, float, float]]:
    """Each page fetched `requests` times one at a time: name, path, p50 ms, max ms."""
    rows = []
    for name, path in pages.items():
        times = []
        for _ in range(requests):
            began = time.perf_counter()
            r = client.get(path)
            times.append((time.perf_counter() - began) * 1000)
            if r.status_code != 200:
                raise SystemExit(f"{path}: {r.status_code} {r.text[:200]}")
        times.sort()
        rows.append((name, path, statistics.median(times), times[-1]))
    return rows


def _section(rows: list[tuple[str, str, float, float]], events: int, requests: int) -> list[str]:
    load = extra.uptime()
    worst = max(r[3] for r in rows)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        SECTION,
        "",
        f"Written by `python bench/admin.py` on {when}:"
        f" the real server on a SQLite store of {events:,} routed events and 2,000 dead"
        f" notifications, signed in with an admin key, each page fetched {requests} times one"
        f" at a time (time to the whole answer on loopback). Target: every page under"
        f" {TARGET_MS:.0f} ms. Worst page: {worst:.1f} ms"
        f" ({'met' if worst < TARGET_MS else 'NOT met'}). Machine: {load}.",
        "",
        "| page | p50 ms | max ms |",
        "|---|---:|---:|",
        *[f"| {name} | {p50:.1f} | {mx:.1f} |" for name, _, p50, mx in rows],
        "",
    ]
    return lines


def _deep(client: httpx.Client, path: str, pages: int) -> str:
    """The URL of the pages-th page of a list, following its "older" links."""
    url = path
    for _ in range(pages - 1):
        found = re.search(r'href="\?([^"]+)" rel="next"', client.get(url).text)
        if not found:
            break
        url = f"{path}?{found.group(1).replace('&amp;', '&')}"
    return url


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("the receiver did not start")


def write_section(lines: list[str], output: Path) -> None:
    """Replace the section that lines[0] heads in the results file (or append it), keeping
    the rest."""
    text = output.read_text() if output.exists() else ""
    pattern = re.compile(rf"^{re.escape(lines[0])}\n.*?(?=^## |\Z)", re.S | re.M)
    block = "\n".join(lines) + "\n"
    text = pattern.sub(block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block
    output.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    args = parser.parse_args()
    lines = measure(args.events, args.requests)
    print("\n".join(lines))
    write_section(lines, args.output)


if __name__ == "__main__":
    main()
