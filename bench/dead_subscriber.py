"""The other subscribers' delivery latency while one subscriber fails (endpoint health).

    python -m bench.dead_subscriber [--rate 200] [--seconds 10] [--subscribers 20]

The same paced stream (bench/fanout.py's: a tenth of it score.drop) goes into a fresh
receiver twice, with --subscribers local subscribers to score.drop: first all of them
answer 204 ("before"); then one of them answers 500 to everything ("during": it turns
failing after 5 failed attempts, its circuit opens, one probe at a time). Reports the time
from each 202 to a healthy subscriber's receipt, p50 and p99, of both runs. Writes the
"## A failing subscriber" section of bench/RESULTS.md (the rest is kept).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import extra, fanout
from bench.admin import write_section

BENCH = Path(__file__).resolve().parent

SECTION = "## A failing subscriber"
# Fast retries, so the failing one reaches its 5 failures (and its circuit opens) early.
SCHEDULE = "0.2,0.5,1,2,4"


class Subscribers(fanout.Subscribers):
    """fanout's subscribers, in a process of their own; with dead, the first answers 500."""

    def __init__(self, count: int, dead: bool) -> None:
        self.count = count
        self.folder = Path(tempfile.mkdtemp(prefix="receiver-bench-dead-"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.dead_subscriber", "--serve-subscribers", str(count),
             "--folder", str(self.folder), *(["--dead"] if dead else [])],
        )  # fmt: skip
        ports = self.folder / "ports"
        deadline = time.monotonic() + 30
        while not ports.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.ports = [int(p) for p in ports.read_text().split()]
        self.servers = self.ports


def serve(count: int, folder: Path, dead: bool) -> None:
    """The subscribers' process; each appends what it took to a file (not the dead one)."""
    servers = []
    for index in range(count):
        log = (folder / f"seen-{index}").open("a", buffering=1)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            number, fails, out = index, dead and index == 0, log

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if not self.fails:
                    event_id = self.headers.get("X-Service-Event-Id", "")
                    self.out.write(f"{self.number}\t{event_id}\t{time.time()}\n")
                self.send_response(500 if self.fails else 204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    ports = " ".join(str(s.server_address[1]) for s in servers)
    (folder / "ports.tmp").write_text(ports)
    (folder / "ports.tmp").rename(folder / "ports")
    threading.Event().wait()


def run(rate: float, seconds: float, subscribers: int, dead: bool) -> dict[str, Any]:
    events = fanout.stream(int(rate * seconds), rate)
    hooks = Subscribers(subscribers, dead)
    os.environ["RECEIVER_WEBHOOK_SCHEDULE"] = SCHEDULE  # run_once passes the environment on
    try:
        with tempfile.TemporaryDirectory(prefix="receiver-bench-dead-") as tmp:
            result = fanout.run_once(Path(tmp), events, rate, hooks)
    finally:
        hooks.stop()
    # run_once counts the first subscriber as the one that never answers: here it is the
    # failing one (during), or a healthy one whose deliveries are counted too (before).
    return result


def measure(rate: float, seconds: float, subscribers: int) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    before = run(rate, seconds, subscribers, dead=False)
    during = run(rate, seconds, subscribers, dead=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [
        SECTION,
        "",
        f"Written by `python bench/dead_subscriber.py` on {when}. {int(rate * seconds):,}"
        f" events at {rate:g}/s into a fresh SQLite receiver pinned to core 0, with"
        f" {subscribers} local subscribers to score.drop; during, one of them answers 500 to"
        f" everything (RECEIVER_WEBHOOK_SCHEDULE={SCHEDULE}: failing after 5 attempts, then one"
        f" probe at a time). Machine: {extra.uptime()}.",
        "",
        "| run | deliveries to healthy subscribers | 202 to receipt p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
        f"| before (all healthy) | {before['delivered']:,} | {before['d_p50']:.0f} |"
        f" {before['d_p99']:.0f} |",
        f"| during (one answers 500) | {during['delivered']:,} | {during['d_p50']:.0f} |"
        f" {during['d_p99']:.0f} |",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument("--serve-subscribers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dead", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_subscribers:
        serve(args.serve_subscribers, args.folder, args.dead)
        return
    lines = measure(args.rate, args.seconds, args.subscribers)
    print("\n".join(lines))
    write_section(lines, args.output)


if __name__ == "__main__":
    main()
