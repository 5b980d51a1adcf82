"""Fault scenarios against the real receiver: kill -9, SIGTERM, notifier outage, slow notifier.

Each scenario starts `receiver serve` (tests.harness.Receiver) on a fresh SQLite
file with two rules sending to a local HTTP sink (tests.servers.HTTPSink): a plain
rule forwarding every event, and a lifecycle rule (resolve: true) paging on drops
and interventions. It drives it with `receiver simulate` in a child process (the
sender, retrying on the service's schedule divided by --speed), does its damage,
and then checks the promise against the database and the sink:

- every id the simulator got a 2xx for is stored, exactly once;
- the plain rule forwarded every stored event exactly once, none of them stale,
  however late its retries brought it;
- every notification to send (the plain rule's, the lifecycle rule's that were
  not stale, its resolved messages) reached the sink at least once;
- how many reached it more than once (the cost of at least once), and, per rule
  kind, how many the lifecycle held back as stale or for another reason.

tests/test_faults.py runs them small (3 kills, seconds of outage); chaos/run.py
runs them big and writes the figures. Sizes are parameters, never hidden.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

from chaos.load import (
    ENV,
    RULES,
    Load,
    finish_simulator,
    simulator,
    until,
    wait_for_load,
)
from chaos.promise import (
    Outcome,
    check,
)
from tests.harness import Receiver
from tests.servers import HTTPSink


def _retried(server: Receiver) -> float:
    """Sends that failed (refused, timed out) and wait for a retry, from /metrics."""
    return server.metric("receiver_notifications_total", 'outcome="retried"')


def _setup(tmp: Path, env: dict[str, str] | None = None) -> tuple[Receiver, HTTPSink]:
    sink = HTTPSink().start()
    server = Receiver(tmp, rules=RULES.format(url=sink.json_url("/n")), env={**ENV, **(env or {})})
    return server, sink


def crash(
    tmp: Path, *, kills: int, load: Load, gap: tuple[float, float] = (0.5, 1.5), settle: float = 30
) -> Outcome:
    """kill -9 the receiver `kills` times at random moments under load, restarting each time."""
    started = time.monotonic()
    server, sink = _setup(tmp)
    outcome = Outcome("crash")
    record = tmp / "record.tsv"
    rng = random.Random(load.seed)
    restarts: list[float] = []
    try:
        server.start()
        with simulator(server.url, load, record) as sim:
            wait_for_load(server, sim)
            for _ in range(kills):
                time.sleep(rng.uniform(*gap))
                server.kill()
                began = time.monotonic()
                server.start()
                restarts.append(time.monotonic() - began)
            summary = finish_simulator(sim, timeout=load.duration + load.max_wait + 60)
        check(outcome, server, sink, summary, record, settle=settle)
    finally:
        if server.proc is not None:
            server.stop()
        sink.stop()
    outcome.figures = {
        "kills": kills,
        "restart_s_max": round(max(restarts, default=0), 2),
        "restart_s_mean": round(sum(restarts) / max(1, len(restarts)), 2),
    }
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome


def sigterm(tmp: Path, *, stops: int, load: Load, settle: float = 30) -> Outcome:
    """SIGTERM under load `stops` times: a graceful stop loses nothing and ends in bounded time."""
    started = time.monotonic()
    server, sink = _setup(tmp)
    outcome = Outcome("sigterm")
    record = tmp / "record.tsv"
    rng = random.Random(load.seed)
    stop_times: list[float] = []
    try:
        server.start()
        with simulator(server.url, load, record) as sim:
            wait_for_load(server, sim)
            for _ in range(stops):
                time.sleep(rng.uniform(1.0, 2.0))
                began = time.monotonic()
                code = server.stop(signal.SIGTERM, timeout=30)
                stop_times.append(time.monotonic() - began)
                if code not in (0, -signal.SIGTERM):
                    outcome.problems.append(f"SIGTERM exit code {code}")
                server.start()
            summary = finish_simulator(sim, timeout=load.duration + load.max_wait + 60)
        check(outcome, server, sink, summary, record, settle=settle)
        closed = server.logs().count("; store closed")  # "stopped [in 0.2s]; store closed"
        if closed < stops:
            outcome.problems.append(f"only {closed} of {stops} stops closed the store cleanly")
    finally:
        if server.proc is not None:
            server.stop()
        sink.stop()
    outcome.figures = {
        "stops": stops,
        "stop_s_max": round(max(stop_times, default=0), 2),
    }
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome


def outage(tmp: Path, *, down: float, load: Load, settle: float = 30) -> Outcome:
    """The notifier's endpoint refuses connections for `down` seconds under load, then returns.

    The outage begins once notifications reach the sink, and lasts until a send has
    failed against it too. Ingest must not notice, and every notification must
    arrive once the sink is back.
    """
    started = time.monotonic()
    server, sink = _setup(tmp)
    outcome = Outcome("outage")
    record = tmp / "record.tsv"
    try:
        server.start()
        with simulator(server.url, load, record) as sim:
            until(lambda: sink.requests or sim.poll() is not None, "the first notification")
            sink.stop()
            down_at = time.monotonic()
            time.sleep(down)
            until(
                lambda: _retried(server) > 0 or sim.poll() is not None,
                "a send to fail while the sink is down",
            )
            sink.start()
            down_s = time.monotonic() - down_at
            summary = finish_simulator(sim, timeout=load.duration + load.max_wait + down + 60)
        check(outcome, server, sink, summary, record, settle=settle)
        failed_tries = _retried(server)
    finally:
        if server.proc is not None:
            server.stop()
        sink.stop()
    if summary.get("errors"):
        outcome.problems.append(f"ingest errors during the outage: {summary['errors']}")
    outcome.figures = {
        "down_s": round(down_s, 1),
        "notification_retries": int(failed_tries),
        "ingest_p50_ms": summary.get("p50_ms"),
        "ingest_p99_ms": summary.get("p99_ms"),
    }
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome


def slow_sink(tmp: Path, *, answer_after: float, slow_for: float, load: Load) -> Outcome:
    """The notifier's endpoint answers only after `answer_after` seconds for `slow_for` seconds,
    and until a send has timed out against it.

    Workers time out (RECEIVER_NOTIFY_TIMEOUT=1) and retry; ingest latency stays
    what it was, since sending never happens on the request path.
    """
    started = time.monotonic()
    server, sink = _setup(tmp)
    outcome = Outcome("slow-sink")
    record = tmp / "record.tsv"
    try:
        server.start()
        sink.delay(answer_after)
        with simulator(server.url, load, record) as sim:
            slow_until = time.monotonic() + slow_for
            until(
                lambda: _retried(server) > 0 or sim.poll() is not None,
                "a send to the slow sink to time out",
            )
            time.sleep(max(0.0, slow_until - time.monotonic()))
            timeouts = _retried(server)
            sink.ok()
            summary = finish_simulator(sim, timeout=load.duration + load.max_wait + 60)
        check(outcome, server, sink, summary, record, settle=30)
    finally:
        if server.proc is not None:
            server.stop()
        sink.stop()
    if timeouts == 0:
        outcome.problems.append("no send timed out while the sink was slow")
    if summary.get("errors"):
        outcome.problems.append(f"ingest errors while the sink was slow: {summary['errors']}")
    outcome.figures = {
        "answer_after_s": answer_after,
        "timed_out_sends": int(timeouts),
        "ingest_p50_ms": summary.get("p50_ms"),
        "ingest_p99_ms": summary.get("p99_ms"),
        "sink_max_in_flight": sink.max_in_flight,
    }
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome


def baseline(tmp: Path, *, load: Load) -> Outcome:
    """No fault: the reference ingest latency for the others."""
    started = time.monotonic()
    server, sink = _setup(tmp)
    outcome = Outcome("baseline")
    record = tmp / "record.tsv"
    try:
        server.start()
        with simulator(server.url, load, record) as sim:
            summary = finish_simulator(sim, timeout=load.duration + load.max_wait + 60)
        check(outcome, server, sink, summary, record, settle=30)
    finally:
        if server.proc is not None:
            server.stop()
        sink.stop()
    outcome.figures = {"ingest_p50_ms": summary.get("p50_ms"), "ingest_p99_ms": summary["p99_ms"]}
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome
