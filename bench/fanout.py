"""Fan-out to webhook subscribers: ingest with and without 50 subscribers, one of them hanging.

    python -m bench.fanout [--rate 1000] [--seconds 10] [--subscribers 50]

The same paced stream (--rate events/s, a tenth of them score.drop) goes into a fresh
receiver twice: with no subscribers, then with --subscribers local ones that each
subscribed to score.drop, one of which never answers (RECEIVER_WEBHOOK_TIMEOUT=2s). It
reports POST latency and accepted/s of both runs, the deliveries a second the receiver
made to the healthy subscribers, and the time from each 202 to a healthy subscriber's
receipt. The receiver is pinned to core 0; the sender and the subscribers share core 1.
Writes the "## Webhook fan-out" section of bench/RESULTS.md (the rest is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench import extra
from bench.admin import write_section
from receiver import signature

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

SECRET = "bench-secret-0123456789abcdef"
SECTION = "## Webhook fan-out"
DROP_SHARE = 0.1
KINDS = ("score.recover", "intervention.fired", "intervention.resolved", "session.stopped")


class Subscribers:
    """Local HTTP servers in a process of their own (so they never hold the sender's GIL),
    recording when each delivery arrived (wall clock); the first one hangs."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.folder = Path(tempfile.mkdtemp(prefix="receiver-bench-subscribers-"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fanout", "--serve-subscribers", str(count), "--folder",
             str(self.folder)],
        )  # fmt: skip
        ports = self.folder / "ports"
        deadline = time.monotonic() + 30
        while not ports.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.ports = [int(p) for p in ports.read_text().split()]
        self.servers = self.ports

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}/hook" for port in self.ports]

    @property
    def seen(self) -> dict[tuple[int, str], float]:
        """(subscriber, event id) -> when it arrived, as the subscribers wrote it."""
        found: dict[tuple[int, str], float] = {}
        for path in self.folder.glob("seen-*"):
            for line in path.read_text().splitlines():
                number, event_id, at = line.split("\t")
                found.setdefault((int(number), event_id), float(at))
        return found

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def serve_subscribers(count: int, folder: Path) -> None:
    """The subscribers' process: count servers; each appends what it got to a file."""
    servers = []
    for index in range(count):
        log = (folder / f"seen-{index}").open("a", buffering=1)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            number, hangs, out = index, index == 0, log

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.hangs:
                    time.sleep(30)
                    return
                event_id = self.headers.get("X-Service-Event-Id", "")
                self.out.write(f"{self.number}\t{event_id}\t{time.time()}\n")
                self.send_response(204)
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


def stream(count: int, rate: float) -> list[tuple[str, bytes, str]]:
    rng = random.Random(3)
    now = time.time()
    out = []
    for i in range(count):
        kind = "score.drop" if rng.random() < DROP_SHARE else rng.choice(KINDS)
        event: dict[str, Any] = {
            "id": f"evt_fan_{i}",
            "type": kind,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 1)),
            "sessionId": f"sess_{i % 500}",
            "userId": f"user_{i % 500}",
        }
        if kind.startswith("score."):
            event |= {"score": 20 if kind == "score.drop" else 70, "threshold": 40}
        body = json.dumps(event).encode()
        out.append((event["id"], body, signature.sign(SECRET.encode(), body)))
    return out


def post(port: int, events: list[tuple[str, bytes, str]], rate: float) -> dict[str, Any]:
    """POST at rate/s over 4 keep-alive connections; 202 times and latencies."""
    done: dict[str, float] = {}
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.2

    def run(part: list[tuple[int, tuple[str, bytes, str]]]) -> None:
        conn = HTTPConnection("127.0.0.1", port, timeout=10)
        for n, (event_id, body, sig) in part:
            delay = start + n / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            began = time.perf_counter()
            conn.request(
                "POST",
                "/v1/events",
                body,
                {"content-type": "application/json", signature.SIGNATURE_HEADER: sig},
            )
            response = conn.getresponse()
            response.read()
            ended = time.perf_counter()
            with lock:
                latencies.append((ended - began) * 1000)
                if response.status == 202:
                    done[event_id] = time.time()  # the subscribers' clock

    numbered = list(enumerate(events))
    threads = [threading.Thread(target=run, args=(numbered[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = time.perf_counter() - start
    latencies.sort()
    return {
        "accepted": len(done),
        "rate": len(done) / span if span > 0 else 0.0,
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[int(len(latencies) * 0.99)],
        "done": done,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_once(
    work: Path, events: list[tuple[str, bytes, str]], rate: float, hooks: Subscribers | None
) -> dict[str, Any]:
    port = _free_port()
    db = work / f"fanout-{time.monotonic_ns()}.db"
    rules = work / "rules.yaml"
    rules.write_text("rules:\n  - name: none\n    match: {type: never}\n    notify: [console]\n")
    env = {
        **os.environ,
        "RECEIVER_DB": str(db),
        "RECEIVER_PORT": str(port),
        "RECEIVER_SECRETS": SECRET,
        "RECEIVER_RULES": str(rules),
        "RECEIVER_LOG_LEVEL": "error",
        "RECEIVER_WEBHOOK_ALLOW_PRIVATE": "1",
        "RECEIVER_WEBHOOK_ALLOW_HTTP": "1",
        "RECEIVER_WEBHOOK_TIMEOUT": "2",
    }
    argv = [sys.executable, "-m", "receiver", "serve"]
    if shutil_which("taskset"):
        argv = ["taskset", "-c", "0", *argv]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        drops = {i for i, body, _ in events if b'"score.drop"' in body}
        if hooks is not None:
            made = subprocess.run(
                [sys.executable, "-m", "receiver", "keys", "create", "--name", "bench",
                 "--plan", "enterprise", "--role", "writer", "--json", "--db", str(db)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            key = json.loads(made.stdout)["key"]
            for url in hooks.urls():
                r = httpx.post(
                    f"{base}/v1/webhooks",
                    json={"url": url, "events": ["score.drop"]},
                    headers={"Authorization": f"Bearer {key}"},
                )
                assert r.status_code == 201, r.text
            time.sleep(2.5)  # the worker reads subscriptions every 2 s
        result = post(port, events, rate)
        if hooks is None:
            return result
        healthy = len(hooks.servers) - 1
        wanted = len([i for i in drops if i in result["done"]]) * healthy
        load_end = time.time()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(hooks.seen) < wanted:
            time.sleep(0.5)
        seen = dict(hooks.seen)
        lat = sorted(
            (at - result["done"][event_id]) * 1000
            for (_, event_id), at in seen.items()
            if event_id in result["done"]
        )
        first = min(result["done"].values())
        last = max(seen.values()) if seen else load_end
        result |= {
            "wanted": wanted,
            "delivered": len(seen),
            "deliveries_rate": len(seen) / (last - first) if last > first else 0.0,
            "d_p50": lat[len(lat) // 2] if lat else float("nan"),
            "d_p99": lat[int(len(lat) * 0.99)] if lat else float("nan"),
        }
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def shutil_which(name: str) -> str | None:
    return shutil.which(name)


def measure(rate: float, seconds: float, subscribers: int) -> list[str]:
    """The section's lines: ingest alone and with the fan-out, and the deliveries."""
    if shutil_which("taskset") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    events = stream(int(rate * seconds), rate)
    hooks = Subscribers(subscribers)
    try:
        with tempfile.TemporaryDirectory(prefix="receiver-bench-fanout-") as tmp:
            alone = run_once(Path(tmp), events, rate, None)
            fanned = run_once(Path(tmp), events, rate, hooks)
    finally:
        hooks.stop()
    load = extra.uptime()
    drops = sum(1 for _, body, _ in events if b'"score.drop"' in body)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        SECTION,
        "",
        f"Written by `python bench/fanout.py` on {when}. {len(events):,} events at"
        f" {rate:g}/s ({drops:,} of them score.drop) into a fresh SQLite receiver"
        f" pinned to core 0, without subscribers and then with {subscribers} local"
        " subscribers to score.drop (one never answers: RECEIVER_WEBHOOK_TIMEOUT=2s);"
        " the sender and the subscribers (a Python process of their own) on core 1. Machine: "
        f"{load}.",
        "",
        "| run | accepted/s | POST p50 ms | POST p99 ms |",
        "|---|---:|---:|---:|",
        f"| no subscribers | {alone['rate']:,.0f} | {alone['p50']:.2f} | {alone['p99']:.2f} |",
        f"| {subscribers} subscribers | {fanned['rate']:,.0f} | {fanned['p50']:.2f} |"
        f" {fanned['p99']:.2f} |",
        "",
        f"Deliveries to the {subscribers - 1} healthy subscribers: {fanned['delivered']:,}"
        f" of {fanned['wanted']:,} within 60 s of the load's end,"
        f" {fanned['deliveries_rate']:,.0f} a second; from the 202 to the subscriber's"
        f" receipt p50 {fanned['d_p50']:.0f} ms, p99 {fanned['d_p99']:.0f} ms. The hanging"
        " subscriber holds its own lane (8 sends) and nobody else's.",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--output", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument("--serve-subscribers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_subscribers:
        serve_subscribers(args.serve_subscribers, args.folder)
        return
    lines = measure(args.rate, args.seconds, args.subscribers)
    print("\n".join(lines))
    write_section(lines, args.output)


if __name__ == "__main__":
    main()
