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

import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import dbview
from tests.harness import SECRET, Receiver
from tests.servers import HTTPSink

# Titled with the event id (and what sent it), so the sink can count deliveries of each.
# The plain rule forwards every event, in any order; the lifecycle rule notifies about the
# alert, so a drop older than its alert's newest event is stale for it (docs/alert-lifecycle.md).
PLAIN_RULE, LIFECYCLE_RULE = "every-event", "alerts"
RULES = """
notifiers:
  sink: "{url}"
rules:
  - name: every-event
    notify: [sink]
    title: "{{{{ id }}}}"
    body: "{{{{ type }}}}"
    continue: true
  - name: alerts
    match: {{type: [score.drop, intervention.fired]}}
    notify: [sink]
    title: "alert {{{{ id }}}}"
    body: "{{{{ type }}}}"
    resolve: true
    resolved_title: "resolved {{{{ id }}}}"
"""
# Rows of the report's second table: the plain rule, the lifecycle rule's notifications
# about events, and its resolved messages.
KINDS = {
    "plain": f"plain ({PLAIN_RULE})",
    "lifecycle": f"lifecycle ({LIFECYCLE_RULE})",
    "resolved": f"resolved messages ({LIFECYCLE_RULE})",
}
# The replica scenario (chaos/replicas.py) adds a throttled rule, titled "throttle <id>".
THROTTLE_RULE = "per-user"
KINDS["throttle"] = f"throttled per user ({THROTTLE_RULE})"

# Fast retries so a test sees the whole story in seconds: the notifier retries from 0.2s,
# never waits more than 1s between tries, and never gives up within a test.
ENV = {
    "RECEIVER_RETRY_INITIAL": "0.2",
    "RECEIVER_RETRY_MAX": "1",
    "RECEIVER_RETRY_FOR": "1h",
    # Leases (2 x the longer of the two send timeouts + 10s) expire 12s after a claim.
    "RECEIVER_NOTIFY_TIMEOUT": "1",
    "RECEIVER_WEBHOOK_TIMEOUT": "1",
    "RECEIVER_LOG_LEVEL": "info",
}
# The longest a scenario waits for a condition (the load to arrive, a send to fail): a busy
# machine takes seconds to start the simulator's process. A wait that holds returns at once.
WAIT = 60.0


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
    timeout: float = 3.0  # seconds before the sender counts a delivery as failed


@dataclass
class RuleCounts:
    """One kind of notification in a scenario: how many were recorded, sent, or why not."""

    notifications: int = 0  # outbox rows
    sent: int = 0  # to send, and delivered to the sink at least once
    stale: int = 0  # older than their alert's newest event (lifecycle rules only)
    other: int = 0  # held back for another reason: cancelled, throttled, muted, ...
    twice: int = 0  # delivered more than once (at least once, after a kill or a timeout)
    unsent: int = 0  # to send but never delivered: a broken promise


@dataclass
class Outcome:
    """What a scenario found. `problems` is empty when the promise held.

    notified, notified_twice and not_sent count events (an event is notified when
    every notification it had to send arrived); `kinds` counts notifications.
    """

    name: str
    events: int = 0
    acknowledged: int = 0
    stored: int = 0
    notified: int = 0
    notified_twice: int = 0
    not_sent: int = 0  # events with no notification to send (every rule held it back)
    lost: int = 0  # acknowledged ids not stored
    kinds: dict[str, RuleCounts] = field(default_factory=dict)
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
        f"{load.timeout:g}",
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


@contextlib.contextmanager
def simulator(url: str, load: Load, record: Path) -> Iterator[subprocess.Popen[bytes]]:
    """start_simulator's process for the block: killed if still running at its end (a
    scenario that failed part-way), its pipes closed either way."""
    with start_simulator(url, load, record) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def until(check: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """Poll check() until it is truthy; past the deadline, fail naming what."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def wait_for_load(server: Receiver, sim: subprocess.Popen[bytes]) -> None:
    """Until the receiver has stored an event of the simulator's (or the simulator ended):
    damage done before then would not be done under load."""
    stored = "SELECT 1 FROM events LIMIT 1"
    until(
        lambda: sim.poll() is not None or dbview.query(server.db_url, stored),
        "the simulator's first event",
    )


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


def stored_ids(db: str) -> Counter[str]:
    """id -> times stored, in the SQLite file or PostgreSQL database db (RECEIVER_DB)."""
    return Counter(row[0] for row in dbview.query(db, "SELECT id FROM events"))


# Outbox states in which the rules (and the alert lifecycle) decided not to send: a late
# event older than its alert's newest is "stale" for a lifecycle rule by design, which a
# crash makes common; a plain rule never has one.
NOT_SENT = {"throttled", "cancelled", "muted", "silenced", "grouped", "stale", "deferred"}


def outbox_rows(db: str) -> list[tuple[str, str, str, str]]:
    """(event id, rule, kind, state) of every outbox row."""
    rows = dbview.query(db, "SELECT event_id, rule, kind, state FROM outbox")
    return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]


def outbox_states(db: str) -> Counter[str]:
    return Counter(row[0] for row in dbview.query(db, "SELECT state FROM outbox"))


class _Tally:
    """The outbox read against the sink: per kind of notification, and per event."""

    def __init__(self, rows: list[tuple[str, str, str, str]], delivered: Counter[str]) -> None:
        self.delivered = delivered
        self.kinds = {key: RuleCounts() for key in ("plain", "lifecycle", "resolved")}
        self.routed: set[str] = set()
        self.plain: Counter[str] = Counter()  # event id -> notifications of the plain rule
        self.due: dict[str, list[str]] = {}  # event id -> titles it had to send
        for event_id, rule, kind, state in rows:
            self.routed.add(event_id)
            if kind == "resolved":
                key, title = "resolved", f"resolved {event_id}"
            elif rule == PLAIN_RULE:
                key, title = "plain", event_id
                self.plain[event_id] += 1
            elif rule == THROTTLE_RULE:
                key, title = "throttle", f"throttle {event_id}"
                self.kinds.setdefault(key, RuleCounts())
            else:
                key, title = "lifecycle", f"alert {event_id}"
            counts = self.kinds[key]
            counts.notifications += 1
            if state == "stale":
                counts.stale += 1
            elif state in NOT_SENT:
                counts.other += 1
            else:
                self.due.setdefault(event_id, []).append(title)
                got = delivered[title]
                counts.sent += got > 0
                counts.twice += got > 1
                counts.unsent += got == 0

    def undelivered(self, event_id: str) -> bool:
        return any(self.delivered[title] == 0 for title in self.due.get(event_id, ()))

    def twice(self, event_id: str) -> bool:
        return any(self.delivered[title] > 1 for title in self.due.get(event_id, ()))


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
    extra: dict[str, str] | None = None,
) -> Outcome:
    """Fill outcome from the simulator's record, the database and the sink; list problems.

    extra: outcomes (id -> accepted, duplicate, failed) of events the scenario sent itself.
    """
    outcome.sim = summary
    outcomes = {**read_record(record), **(extra or {})}
    acked = {i for i, o in outcomes.items() if o in ("accepted", "duplicate")}
    outcome.events, outcome.acknowledged = len(outcomes), len(acked)
    unacked = len(outcomes) - len(acked)
    if unacked:
        outcome.problems.append(f"{unacked} events never acknowledged by the end of the run")
    # Every stored event is routed, and each notification to send is delivered at least
    # once, within `settle`.
    deadline = time.monotonic() + settle
    while True:
        stored = stored_ids(server.db_url)
        tally = _Tally(outbox_rows(server.db_url), delivered_titles(sink))
        unrouted = [i for i in stored if i not in tally.routed]
        undelivered = [i for i in stored if tally.undelivered(i)]
        if not (undelivered or unrouted) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    outcome.stored = len(stored)
    outcome.kinds = tally.kinds
    due = [i for i in stored if tally.due.get(i)]
    outcome.not_sent = len(stored) - len(due) - len(unrouted)
    outcome.notified = len(due) - len(undelivered)
    outcome.notified_twice = sum(1 for i in due if tally.twice(i))
    if unrouted:
        outcome.problems.append(f"{len(unrouted)} stored events never routed, e.g. {unrouted[:3]}")
    forwarded = [i for i in stored if i in tally.routed and tally.plain[i] != 1]
    if forwarded:
        outcome.problems.append(
            f"{len(forwarded)} routed events with other than one notification of the plain"
            f" rule, e.g. {forwarded[:3]}"
        )
    plain = tally.kinds["plain"]
    if plain.stale or plain.other:
        outcome.problems.append(
            f"the plain rule held back {plain.stale} notifications as stale and {plain.other}"
            " for another reason: it must forward every event"
        )
    outcome.sink_requests = len(sink.requests)
    lost = sorted(acked - set(stored))
    outcome.lost = len(lost)
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
            f"e.g. {undelivered[:3]}; outbox {dict(outbox_states(server.db_url))}"
        )
    dead = outbox_states(server.db_url)["dead"]
    if dead:
        outcome.problems.append(f"{dead} notifications dead")
    return outcome


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
