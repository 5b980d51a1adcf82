"""The stream shapes `make bench` measures (issue 33): each a pre-signed request file for
bench/events.lua and the rules file the receiver runs with it.

    current      the throughput part's stream: a random walk of 200 sessions, bench/rules.yaml
    many         5,000 sessions and 700 users cycling, the five event types in turn,
                 bench/rules.yaml (ten rules; nine never match)
    simulator    `receiver simulate --sessions 1000 --duration 10m --duplicates 0.1`'s
                 deliveries, run after run, duplicates included, bench/rules.yaml
    backfill     the current stream's walk dated 6 days to 1 day ago, in time order (what
                 `receiver upstream sync` or the sender's late retries deliver)
    shared-type  5,000 sessions, 700 users, 50 pages, score.drop and score.recover in turn,
                 bench/rules-shared-type.yaml (30 rules, 24 of them on score.drop, told apart
                 by page or userId: the index by type leaves all 24 to try)

The generators are pure (a seed in, a list of event dicts out); bench/stream_part.py runs
them against the receiver.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

from receiver import signature
from receiver.events import EVENT_TYPES
from receiver.simulator.walk import Walk, event_stream, new_walk, timestamp, wants_duplicate

BENCH = Path(__file__).resolve().parent
Event = dict[str, Any]

# The simulator shape: what one `receiver simulate` run is made of.
SIM_SESSIONS = 1000
SIM_DURATION = 600.0  # seconds of sending a run
SIM_DUPLICATES = 0.1
SIM_ACK_LAG = 32  # a duplicate goes out after this many other deliveries (its ack's round trip)
# The cycling shapes.
CYCLE_SESSIONS = 5000
CYCLE_USERS = 700
CYCLE_PAGES = 50
CYCLE_SPACING = 0.01  # seconds of event time between two events of the stream
BACKFILL_DAYS = (6.0, 1.0)  # oldest and newest event, days before now


# -- writing --------------------------------------------------------------------------------


def write(path: Path, deliveries: list[Event], secret: str) -> None:
    """One signed delivery a line, "<signature>\\t<body>", as bench/events.lua reads them."""
    key = secret.encode()
    with path.open("w") as out:
        for event in deliveries:
            body = json.dumps(event, separators=(",", ":")).encode()
            out.write(f"{signature.sign(key, body)}\t{body.decode()}\n")


def end_at(events: list[Event], end: datetime) -> None:
    """Shift the events' timestamps (ISO text) so that the last one is at end, in place.

    The receiver refuses events dated further ahead of its clock than
    RECEIVER_MAX_CLOCK_SKEW, and older than RECEIVER_MAX_EVENT_AGE (7 days by default).
    """
    if not events:
        return
    shift = datetime.fromisoformat(events[-1]["timestamp"]) - end
    for event in events:
        event["timestamp"] = timestamp(datetime.fromisoformat(event["timestamp"]) - shift)


def spread(events: list[Event], start: datetime, end: datetime) -> None:
    """Date the events evenly from start to end, in their order, in place."""
    step = (end - start) / max(len(events) - 1, 1)
    for i, event in enumerate(events):
        event["timestamp"] = timestamp(start + step * i)


def _recent() -> datetime:
    return datetime.now(UTC) - timedelta(minutes=1)


# -- the shapes' events ---------------------------------------------------------------------


def walk_events(count: int, seed: int, run: str) -> list[Event]:
    """The throughput part's stream: the random walk of 200 sessions, ending a minute ago."""
    events = list(islice(event_stream(seed=seed, sessions=200, threshold=40, run=run), count))
    end_at(events, _recent())
    return events


def backfill_events(count: int, seed: int, run: str) -> list[Event]:
    """The same walk, dated from BACKFILL_DAYS[0] to BACKFILL_DAYS[1] days ago."""
    events = list(islice(event_stream(seed=seed, sessions=200, threshold=40, run=run), count))
    now = datetime.now(UTC)
    oldest, newest = BACKFILL_DAYS
    spread(events, now - timedelta(days=oldest), now - timedelta(days=newest))
    return events


def cycling_events(
    count: int,
    seed: int,
    run: str,
    *,
    types: tuple[str, ...] = EVENT_TYPES,
    sessions: int = CYCLE_SESSIONS,
    users: int = CYCLE_USERS,
    pages: int = CYCLE_PAGES,
) -> list[Event]:
    """Sessions in turn, each of one user and one page; each session's events go through
    types in turn. Scores are drawn: a drop below the threshold (40), a recovery above it.

    >>> [e["type"].split(".")[1] for e in cycling_events(4, 1, "t", sessions=2)]
    ['drop', 'recover', 'recover', 'stopped']
    """
    rng = random.Random(seed)
    events = []
    for i in range(count):
        session, turn = i % sessions, i // sessions
        kind = types[(session + turn) % len(types)]
        event: Event = {
            "id": f"evt_{run}_{i + 1:07d}",
            "type": kind,
            "sessionId": f"sess_{run}_{session:04d}",
            "userId": f"user_{session % users}",
            "page": f"page_{session // 7 % pages:02d}",
            "timestamp": "",
        }
        cycle = (session + turn) // len(types)  # an intervention fired and resolved in one
        event.update(_fields(kind, rng, f"{run}_{session}_{cycle}"))
        events.append(event)
    end = _recent()
    spread(events, end - timedelta(seconds=CYCLE_SPACING * count), end)
    return events


def _fields(kind: str, rng: random.Random, intervention: str) -> Event:
    if kind == "score.drop":
        return {"score": round(rng.uniform(0, 39.9), 1), "threshold": 40}
    if kind == "score.recover":
        return {"score": round(rng.uniform(40, 100), 1), "threshold": 40}
    if kind == "session.stopped":
        return {"score": round(rng.uniform(0, 100), 1)}
    if kind == "intervention.fired":
        return {"interventionId": f"int_{intervention}", "kind": rng.choice(_KINDS)}
    return {"interventionId": f"int_{intervention}", "outcome": rng.choice(_OUTCOMES)}


_KINDS = ("nudge", "break", "checkin")
_OUTCOMES = ("answered", "dismissed", "expired")


def shared_type_events(count: int, seed: int, run: str) -> list[Event]:
    """The cycling sessions, users and pages with the two score types only."""
    return cycling_events(count, seed, run, types=("score.drop", "score.recover"))


def simulate(
    seed: int,
    run: str,
    *,
    sessions: int = SIM_SESSIONS,
    duration: float = SIM_DURATION,
    tick: float = 1.0,
    duplicates: float = SIM_DUPLICATES,
    threshold: float = 40.0,
) -> tuple[list[tuple[float, Event]], list[Event]]:
    """One `receiver simulate` run without the network: the events the engine
    (receiver.simulator.sender.Simulation, same seed and run id) emits, each with the second
    of the run it is emitted at, and the deliveries in order, each duplicate resent
    SIM_ACK_LAG deliveries after its first (when its 202 is back). Events are dicts shared
    by both lists, their "timestamp" still unset; tests/test_bench_streams.py holds this
    to the engine.
    """
    master = random.Random(seed)
    due: list[tuple[float, int, Walk]] = []
    order = itertools.count()
    for i in range(sessions):  # the engine's order of draws, so the same walks
        rng = random.Random(master.getrandbits(64))
        walk = new_walk(i, run=run, threshold=threshold, rng=rng)
        heapq.heappush(due, (rng.uniform(0, min(tick, duration)), next(order), walk))
    ids = itertools.count(1)
    emitted: list[tuple[float, Event]] = []
    deliveries: list[Event] = []
    resend: deque[tuple[int, Event]] = deque()
    while due:
        at, _, walk = heapq.heappop(due)
        if at >= duration:
            produced = walk.stop()
        else:
            produced = walk.step()
            heapq.heappush(due, (min(at + tick, duration), next(order), walk))
        for fields in produced:
            event = {"id": f"evt_{run}_{next(ids):06d}", **fields, "timestamp": ""}
            emitted.append((at, event))
            deliveries.append(event)
            if wants_duplicate(walk.rng, duplicates):
                resend.append((len(deliveries) + SIM_ACK_LAG, event))
            while resend and resend[0][0] <= len(deliveries):
                deliveries.append(resend.popleft()[1])
    deliveries += [event for _, event in resend]
    return emitted, deliveries


def simulator_deliveries(count: int, seed: int, run: str) -> list[Event]:
    """simulate() runs back to back (run ids run0, run1, ...) until count deliveries, the
    last ending a minute ago; a run's events are dated by the second they are emitted at."""
    runs: list[list[tuple[float, Event]]] = []
    deliveries: list[Event] = []
    for number in itertools.count():
        emitted, sent = simulate(seed + number, f"{run}{number}")
        runs.append(emitted)
        deliveries += sent
        if len(deliveries) >= count:
            break
    start = _recent() - timedelta(seconds=SIM_DURATION * len(runs))
    for number, emitted in enumerate(runs):
        for at, event in emitted:
            event["timestamp"] = timestamp(start + timedelta(seconds=SIM_DURATION * number + at))
    return deliveries[:count]


# -- the shapes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    rules: Path
    deliveries: Callable[[int, int, str], list[Event]]  # count, seed, run id
    about: str  # what the report says of it


SHAPES = (
    Shape(
        "current",
        BENCH / "rules.yaml",
        walk_events,
        "the throughput part's stream: a random walk of 200 sessions (receiver.simulator."
        "walk.event_stream), about 500 users, mostly score.drop and score.recover",
    ),
    Shape(
        "many",
        BENCH / "rules.yaml",
        cycling_events,
        f"{CYCLE_SESSIONS:,} sessions and {CYCLE_USERS} users cycling ({CYCLE_PAGES} pages),"
        f" the {len(EVENT_TYPES)} event types in turn (each session's events go through them),"
        " scores drawn",
    ),
    Shape(
        "simulator",
        BENCH / "rules.yaml",
        simulator_deliveries,
        f"`receiver simulate --sessions {SIM_SESSIONS} --duration {SIM_DURATION / 60:g}m "
        f"--duplicates {SIM_DUPLICATES:g}` run after run: its walks (their own seed each, "
        f"users drawn from 500), each duplicate resent {SIM_ACK_LAG} deliveries after its "
        "first (answered 200 and not stored again: counted in accepted/s, not in "
        "stored+routed/s)",
    ),
    Shape(
        "backfill",
        BENCH / "rules.yaml",
        backfill_events,
        f"the current stream's walk dated {BACKFILL_DAYS[0]:g} to {BACKFILL_DAYS[1]:g} days "
        "ago in time order, as `receiver upstream sync` or the sender's late retries deliver"
        " (inside the default RECEIVER_MAX_EVENT_AGE, 7 days)",
    ),
    Shape(
        "shared-type",
        BENCH / "rules-shared-type.yaml",
        shared_type_events,
        f"{CYCLE_SESSIONS:,} sessions, {CYCLE_USERS} users, {CYCLE_PAGES} pages cycling, "
        "score.drop and score.recover in turn; bench/rules-shared-type.yaml: 30 rules, 24 "
        "on score.drop told apart by page or userId, so the index by type does not help",
    ),
)
NAMES = tuple(shape.name for shape in SHAPES)
