"""The promise each fault scenario checks against the database and the sink afterwards
(chaos/scenarios.py's docstring lists it), and the outcome it reports."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.load import (
    PLAIN_RULE,
    THROTTLE_RULE,
)
from tests import dbview
from tests.harness import Receiver
from tests.servers import HTTPSink


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
