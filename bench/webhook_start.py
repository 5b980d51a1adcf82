"""/healthz while many webhook subscribers get their first deliveries after a start.

    python -m bench.webhook_start [--subscribers 1000] [--events 1]

Starts the real server (SQLite, private and plain-http subscribers allowed), registers
`--subscribers` subscriptions through the API (a hundred a key, the default cap per
key), all pointing at one local HTTP sink, restarts the server (every
subscriber's client is then new), then sends `--events` events and polls /healthz
every 10 ms, one request at a time, until every subscriber has every event. Prints the
/healthz latencies (p50, p99, max) and how long the deliveries took. Issue 28 item 2:
before one shared TLS context, 300 subscribers stalled /healthz for 20.7 s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx

from receiver import events
from tests.harness import Receiver
from tests.servers import HTTPSink

ROOT = Path(__file__).resolve().parent.parent

# The sink's listen backlog: socketserver's 5 overflowed with hundreds of subscribers
# connecting at once, and each refused SYN came back a second (then 3, 7...) later,
# which timed the sink, not the receiver.
ThreadingHTTPServer.request_queue_size = 4096  # tests.servers' sink is one

PER_KEY = 100  # RECEIVER_WEBHOOKS_PER_KEY's default
ENV = {
    "RECEIVER_WEBHOOK_ALLOW_PRIVATE": "1",
    "RECEIVER_WEBHOOK_ALLOW_HTTP": "1",
    "RECEIVER_WEBHOOK_TIMEOUT": "10",
    "RECEIVER_LOG_LEVEL": "info",
}


def register(server: Receiver, sink: HTTPSink, count: int) -> None:
    with httpx.Client(timeout=30) as client:
        key = ""
        for i in range(count):
            if i % PER_KEY == 0:
                key = server.make_key(f"bench{i // PER_KEY}", role="writer")
            r = client.post(
                f"{server.url}/v1/webhooks",
                json={"url": f"{sink.url}/s{i}", "events": ["score.drop"]},
                headers={"Authorization": f"Bearer {key}"},
            )
            r.raise_for_status()


def poll(
    url: str, stop: threading.Event, latencies: list[float], at: list[float] | None = None
) -> None:
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            started = time.perf_counter()
            client.get(f"{url}/healthz")
            latencies.append(time.perf_counter() - started)
            if at is not None:
                at.append(time.monotonic())
            stop.wait(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--events", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, HTTPSink() as sink:
        server = Receiver(Path(tmp), env=ENV).start()
        try:
            register(server, sink, args.subscribers)
            server.stop()
            server.start()
            latencies: list[float] = []
            at: list[float] = []  # when each probe started
            stop = threading.Event()
            poller = threading.Thread(target=poll, args=(server.url, stop, latencies, at))
            poller.start()
            time.sleep(0.5)  # a baseline before the first event
            baseline = len(latencies)
            started = time.monotonic()
            for n in range(args.events):
                event = events.sample("score.drop", id=f"evt_bench_{n}", sessionId=f"s{n}")
                server.send(event).raise_for_status()
            wanted = args.subscribers * args.events
            sink.wait_for(wanted, timeout=600)
            took = time.monotonic() - started
            stop.set()
            poller.join()
        finally:
            server.stop()
    probes = list(zip(latencies[baseline:], at[baseline:], strict=True))
    worst = sorted(probes, reverse=True)[:5]
    during = sorted(latencies[baseline:])
    p99 = during[min(len(during) - 1, int(len(during) * 0.99))]
    print(
        f"{args.subscribers} subscribers x {args.events} events: all {wanted} delivered in"
        f" {took:.1f}s; /healthz during ({len(during)} requests): p50"
        f" {statistics.median(during) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms,"
        f" max {during[-1] * 1000:.1f} ms"
    )
    print(
        "slowest probes (ms, answered at s after the first event): "
        + ", ".join(f"{lat * 1000:.0f} @ {end - started:.1f}" for lat, end in worst)
    )


if __name__ == "__main__":
    main()
