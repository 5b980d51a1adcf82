"""The replica scenario's sizes (Faults) and what it checks once the faults are over: the
throttle held across replicas, and no notification sent again beyond what a crash can
explain (what was in flight when a replica or PostgreSQL died)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from chaos.load import (
    THROTTLE_RULE,
)
from chaos.promise import Outcome, delivered_titles
from tests.harness import Receiver
from tests.servers import HTTPSink

SLACK = 0.5  # seconds: a send the target took just after a kill was on its way before it
IN_FLIGHT = 8  # RECEIVER_NOTIFY_CONCURRENCY: sends in flight per target per replica


@dataclass(frozen=True)
class Faults:
    """What the replica scenario does, and how long it waits for the end of the story."""

    replicas: int = 3
    kills: int = 10
    gap: tuple[float, float] = (0.5, 2.0)  # seconds between a restart and the next kill
    pg_down: float = 8.0  # seconds PostgreSQL stays down; 0: not killed
    pg_after: int | None = None  # kills before the PostgreSQL crash; None: half of them
    # The sink shares this process with the balancer, so it is slower to answer than in
    # the other scenarios: with their 1s send timeout, sends timed out and went twice (the
    # sink had them), which would hide what the crashes cost. Leases run 2 x this + 10s.
    notify_timeout: float = 5.0
    throttle_every: float = 10.0
    burst_users: int = 8
    burst_drops: int = 6  # drops of one user, sent at once over the replicas
    recover_within: float = 60.0
    settle: float = 60.0
    # A bound on deliveries beyond the first: this many a crash (a kill, or the PostgreSQL
    # crash). None (the default) checks what the design bounds (see duplicates): a crash
    # sends again at most what was in flight. The issue asked for at most one a kill;
    # a delivery the target had whose "delivered" had not committed when the process
    # died goes again, and with IN_FLIGHT sends at once that can be several a kill, so
    # that bound cannot hold for at-least-once delivery over HTTP (--duplicates-per-crash
    # 1 checks it anyway).
    duplicates_per_crash: int | None = None


@dataclass(frozen=True)
class Crash:
    began: float  # time.monotonic(), as the sink's receipts
    ended: float
    what: str


def throttle_check(
    server: Receiver,
    sink: HTTPSink,
    faults: Faults,
    burst: dict[str, list[str]],
    outcome: Outcome,
) -> dict[str, Any]:
    """One notification per user and window, across replicas (see the module docstring)."""
    rows = server.query(
        "SELECT e.user_id, o.event_id, o.state, o.created_at, e.routed_at FROM outbox o"
        " JOIN events e ON e.id = o.event_id WHERE o.rule = ? AND o.kind = 'event'"
        " ORDER BY o.created_at",
        (THROTTLE_RULE,),
    )
    every, slack = faults.throttle_every, 0.001
    sent: dict[str, list[float]] = defaultdict(list)
    held: dict[str, list[float]] = defaultdict(list)
    routed: dict[str, float] = {}
    for user, event_id, state, created, routed_at in rows:
        (held if state == "throttled" else sent)[user].append(float(created))
        routed[event_id] = float(routed_at or 0)
    close = [
        user
        for user, times in sent.items()
        if any(later - earlier < every - slack for earlier, later in itertools.pairwise(times))
    ]
    if close:
        outcome.problems.append(
            f"{len(close)} users notified twice within {every:g}s by the throttled rule,"
            f" e.g. {close[:3]}"
        )
    # A throttled drop may have been routed a little before the one that opened its window
    # (that transaction committed first), but never a window away from every sent one.
    loose = [
        user
        for user, times in held.items()
        if any(all(abs(t - s) >= every + slack for s in sent.get(user, ())) for t in times)
    ]
    if loose:
        outcome.problems.append(
            f"{len(loose)} users throttled outside any window of a sent notification,"
            f" e.g. {loose[:3]}"
        )
    titles = delivered_titles(sink)
    burst_once, burst_slow = 0, 0
    for user, ids in burst.items():
        times = [routed[i] for i in ids if i in routed]
        if len(times) == len(ids) and max(times) - min(times) >= every:
            burst_slow += 1  # routed over more than one window: one a window is the rule
            continue
        got = len(sent.get(user, ()))
        notified = sum(titles[f"throttle {i}"] > 0 for i in ids)
        if got == 1 and notified == 1:
            burst_once += 1
        else:
            outcome.problems.append(
                f"burst user {user}: {got} notifications sent, {notified} delivered; want 1"
            )
    return {
        "throttle_users": len(set(sent) | set(held)),
        "throttle_sent": sum(len(t) for t in sent.values()),
        "throttle_held": sum(len(t) for t in held.values()),
        "throttle_users_twice_in_a_window": len(close),
        "throttle_users_held_outside_a_window": len(loose),
        "burst_users_notified_once": f"{burst_once}/{len(burst)}"
        + (f" ({burst_slow} routed over more than a window)" if burst_slow else ""),
    }


def duplicates(
    sink: HTTPSink, crashes: list[Crash], retried: int, faults: Faults, outcome: Outcome
) -> dict[str, Any]:
    """Deliveries of one notification beyond the first, each explained or a problem.

    A crash explains one when it came between that delivery and the one before, and the
    two are a lease apart: the target had the first, its outcome was not recorded, and
    the row went out again when its lease ran out. A send that failed (timed out) and was
    retried explains one too. One with neither is a problem: two replicas sending one
    row. A crash can send again at most what was in flight: IN_FLIGHT per replica (one
    target here).
    """
    # The lease runs from the claim; the first delivery came at most a send timeout later.
    lease_apart = faults.notify_timeout + 10 - SLACK
    deliveries: dict[str, list[float]] = defaultdict(list)
    for r in sink.requests:
        if r.status < 300 and isinstance(r.json, dict) and "title" in r.json:
            deliveries[r.json["title"]].append(r.received_at)
    per_crash: Counter[Crash] = Counter()
    unexplained: list[str] = []
    for title, times in deliveries.items():
        for before, after in itertools.pairwise(sorted(times)):
            crash = next(
                (
                    c
                    for c in crashes
                    if before <= c.ended + SLACK
                    and c.began <= after
                    and after - before >= lease_apart
                ),
                None,
            )
            if crash is None:
                unexplained.append(title)
            else:
                per_crash[crash] += 1
    if len(unexplained) > retried:
        outcome.problems.append(
            f"{len(unexplained)} deliveries beyond the first with no crash since the one"
            f" before and only {retried} sends retried after a failure, e.g. {unexplained[:3]}"
        )
    for crash, n in per_crash.items():
        bound = IN_FLIGHT * (faults.replicas if crash.what == "postgresql" else 1)
        if n > bound:
            outcome.problems.append(
                f"the crash of {crash.what} sent {n} notifications again, more than the"
                f" {bound} that can be in flight"
            )
    extra = sum(per_crash.values()) + len(unexplained)
    if faults.duplicates_per_crash is not None and extra > faults.duplicates_per_crash * len(
        crashes
    ):
        outcome.problems.append(
            f"{extra} deliveries beyond the first, more than {faults.duplicates_per_crash} for"
            f" each of the {len(crashes)} crashes (the issue's bound)"
        )
    kills = [n for c, n in per_crash.items() if c.what != "postgresql"]
    return {
        "extra_deliveries": extra,
        "extra_after_kills": sum(kills),
        "extra_per_kill_max": max(kills, default=0),
        "extra_after_pg_crash": sum(n for c, n in per_crash.items() if c.what == "postgresql"),
        "extra_after_retried_sends": len(unexplained),
    }
