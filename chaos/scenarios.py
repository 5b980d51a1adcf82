"""Fault scenarios against the real receiver: kill -9, SIGTERM, notifier outage, slow notifier.

Each scenario starts `receiver serve` (tests.harness.Receiver) on a fresh SQLite
file with one rule sending every event to a local HTTP sink (tests.servers.HTTPSink),
drives it with `receiver simulate` in a child process (the sender, retrying on
the service's schedule divided by --speed), does its damage, and then checks the
promise against the database and the sink:

- every id the simulator got a 2xx for is stored, exactly once;
- every stored event's notification reached the sink at least once;
- how many reached it more than once (the cost of at least once).

tests/test_faults.py runs them small (3 kills, seconds of outage); chaos/run.py
runs them big and writes the figures. Sizes are parameters, never hidden.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness import SECRET, Receiver
from tests.servers import HTTPSink

# One notification per event, titled with its id, so the sink can count deliveries per id.
RULES = """
notifiers:
  sink: "{url}"
rules:
  - name: every-event
    notify: [sink]
    title: "{{{{ id }}}}"
    body: "{{{{ type }}}}"
"""

# Fast retries so a test sees the whole story in seconds: the notifier retries from 0.2s,
# never waits more than 1s between tries, and never gives up within a test.
ENV = {
    "RECEIVER_RETRY_INITIAL": "0.2",
    "RECEIVER_RETRY_MAX": "1",
    "RECEIVER_RETRY_FOR": "1h",
    "RECEIVER_NOTIFY_TIMEOUT": "1",  # leases (2 x timeout + 10s) expire 12s after a claim
    "RECEIVER_LOG_LEVEL": "info",
}


@dataclass(frozen=True)
class Load:
    """What `receiver simulate` sends: sessions x (duration / tick) score updates."""

    sessions: int = 10
    duration: float = 6.0
    tick: float = 0.1
    speed: float = 300.0  # retries after 0.2s, 1s, 6s, 24s, 96s
    duplicates: float = 0.05
    concurrency: int = 8
    max_wait: float = 40.0
    seed: int = 1


@dataclass
class Outcome:
    """What a scenario found. `problems` is empty when the promise held."""

    name: str
    events: int = 0
    acknowledged: int = 0
    stored: int = 0
    notified: int = 0
    notified_twice: int = 0
    not_sent: int = 0  # events whose every notification the lifecycle held back (stale, ...)
    sink_requests: int = 0
    sim: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def start_simulator(url: str, load: Load, record: Path) -> subprocess.Popen[bytes]:
    """`receiver simulate` in a child process, with a record file of each id's outcome."""
    args = [
        sys.executable,
        "-m",
        "receiver",
        "simulate",
        "--url",
        f"{url}/v1/events",
        "--sessions",
        str(load.sessions),
        "--duration",
        f"{max(1, round(load.duration))}s",
        "--tick",
        str(load.tick),
        "--speed",
        str(load.speed),
        "--duplicates",
        str(load.duplicates),
        "--concurrency",
        str(load.concurrency),
        "--timeout",
        "3",
        "--max-wait",
        f"{round(load.max_wait)}s",
        "--seed",
        str(load.seed),
        "--record",
        str(record),
        "--json",
        "--no-progress",
    ]
    env = {"RECEIVER_SIGN_SECRET": SECRET, "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish_simulator(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    try:
        summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise AssertionError(f"simulate gave no summary: {err.decode()[-2000:]}") from None
    return summary


def read_record(path: Path) -> dict[str, str]:
    """id -> outcome (accepted, duplicate, failed, pending) from `simulate --record`."""
    outcomes = {}
    for line in path.read_text().splitlines():
        event_id, outcome, *_ = line.split("\t")
        outcomes[event_id] = outcome
    return outcomes


def stored_ids(db: Path) -> Counter[str]:
    with sqlite3.connect(db) as conn:
        return Counter(row[0] for row in conn.execute("SELECT id FROM events"))


# Outbox states in which the rules (and the alert lifecycle) decided not to send: a late
# event older than its alert's newest is "stale" by design, which a crash makes common.
NOT_SENT = {"throttled", "cancelled", "muted", "silenced", "grouped", "stale", "deferred"}


def outbox_by_event(db: Path) -> dict[str, set[str]]:
    states: dict[str, set[str]] = {}
    with sqlite3.connect(db) as conn:
        for event_id, state in conn.execute("SELECT event_id, state FROM outbox"):
            states.setdefault(event_id, set()).add(state)
    return states


def outbox_states(db: Path) -> Counter[str]:
    with sqlite3.connect(db) as conn:
        return Counter(row[0] for row in conn.execute("SELECT state FROM outbox"))


def delivered_titles(sink: HTTPSink) -> Counter[str]:
    """How many times each title (event id) was answered 2xx by the sink."""
    return Counter(
        r.json["title"]
        for r in sink.requests
        if r.status < 300 and isinstance(r.json, dict) and "title" in r.json
    )


def check(
    outcome: Outcome,
    server: Receiver,
    sink: HTTPSink,
    summary: dict[str, Any],
    record: Path,
    *,
    settle: float,
) -> Outcome:
    """Fill outcome from the simulator's record, the database and the sink; list problems."""
    outcome.sim = summary
    outcomes = read_record(record)
    acked = {i for i, o in outcomes.items() if o in ("accepted", "duplicate")}
    outcome.events, outcome.acknowledged = len(outcomes), len(acked)
    unacked = len(outcomes) - len(acked)
    if unacked:
        outcome.problems.append(f"{unacked} events never acknowledged by the end of the run")
    # Every stored event is routed, and each notification to send is delivered at least
    # once, within `settle`.
    deadline = time.monotonic() + settle
    while True:
        stored = stored_ids(server.db)
        states = outbox_by_event(server.db)
        delivered = delivered_titles(sink)
        unrouted = [i for i in stored if i not in states]
        due = [i for i in stored if states.get(i, set()) - NOT_SENT]
        undelivered = [i for i in due if delivered[i] == 0]
        if not (undelivered or unrouted) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    outcome.stored = len(stored)
    outcome.not_sent = len(stored) - len(due) - len(unrouted)
    outcome.notified = sum(1 for i in due if delivered[i] > 0)
    outcome.notified_twice = sum(1 for i in stored if delivered[i] > 1)
    if unrouted:
        outcome.problems.append(f"{len(unrouted)} stored events never routed, e.g. {unrouted[:3]}")
    outcome.sink_requests = len(sink.requests)
    lost = sorted(acked - set(stored))
    if lost:
        outcome.problems.append(f"{len(lost)} acknowledged ids not stored, e.g. {lost[:3]}")
    twice = [i for i, n in stored.items() if n != 1]
    if twice:
        outcome.problems.append(f"{len(twice)} ids stored more than once")
    strangers = set(stored) - set(outcomes)
    if strangers:
        outcome.problems.append(f"{len(strangers)} stored ids the simulator never sent")
    if undelivered:
        outcome.problems.append(
            f"{len(undelivered)} stored events never notified within {settle:g}s, "
            f"e.g. {undelivered[:3]}; outbox {dict(outbox_states(server.db))}"
        )
    dead = outbox_states(server.db)["dead"]
    if dead:
        outcome.problems.append(f"{dead} notifications dead")
    return outcome


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
        sim = start_simulator(server.url, load, record)
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
        sim = start_simulator(server.url, load, record)
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
        closed = server.logs().count("stopped; store closed")
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

    Ingest must not notice: the simulator's latency is compared with a quiet
    first phase, and every notification must arrive once the sink is back.
    """
    started = time.monotonic()
    server, sink = _setup(tmp)
    outcome = Outcome("outage")
    record = tmp / "record.tsv"
    try:
        server.start()
        sim = start_simulator(server.url, load, record)
        time.sleep(min(1.0, load.duration / 4))
        sink.stop()
        time.sleep(down)
        sink.start()
        summary = finish_simulator(sim, timeout=load.duration + load.max_wait + down + 60)
        check(outcome, server, sink, summary, record, settle=settle)
        failed_tries = server.metric("receiver_notifications_total", 'outcome="retried"')
    finally:
        if server.proc is not None:
            server.stop()
        sink.stop()
    if summary.get("errors"):
        outcome.problems.append(f"ingest errors during the outage: {summary['errors']}")
    outcome.figures = {
        "down_s": down,
        "notification_retries": int(failed_tries),
        "ingest_p50_ms": summary.get("p50_ms"),
        "ingest_p99_ms": summary.get("p99_ms"),
    }
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome


def slow_sink(tmp: Path, *, answer_after: float, slow_for: float, load: Load) -> Outcome:
    """The notifier's endpoint answers only after `answer_after` seconds for `slow_for` seconds.

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
        sim = start_simulator(server.url, load, record)
        time.sleep(slow_for)
        timeouts = server.metric("receiver_notifications_total", 'outcome="retried"')
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
        summary = finish_simulator(
            start_simulator(server.url, load, record), timeout=load.duration + load.max_wait + 60
        )
        check(outcome, server, sink, summary, record, settle=30)
    finally:
        if server.proc is not None:
            server.stop()
        sink.stop()
    outcome.figures = {"ingest_p50_ms": summary.get("p50_ms"), "ingest_p99_ms": summary["p99_ms"]}
    outcome.elapsed_s = round(time.monotonic() - started, 1)
    return outcome
