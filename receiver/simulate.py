"""`receiver simulate`: the Attention Scoring Service emulated, towards a receiver URL.

Sessions whose scores wander (a random walk with sudden drops and recoveries)
emit ``score.drop`` / ``score.recover`` when they cross the threshold, open and
close interventions, and end with ``session.stopped``. Each delivery is signed
as the service signs it; a delivery answered non-2xx, or not answered in time,
is retried on the service's schedule (1m, 5m, 30m, 2h, 8h) divided by
``speed``; a share of acknowledged events is delivered a second time.

    engine = Simulation(url, secret, Options(sessions=5, duration=10), seed=1)
    summary = asyncio.run(engine.run())

The engine takes its clock, sleep and HTTP transport as arguments, so tests run
it deterministically in virtual time against ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import math
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import httpx

from receiver import signature
from receiver.events import SENDER_RETRIES, iso
from receiver.settings import signing_secret

DEFAULT_URL = "http://127.0.0.1:4000/v1/events"

# The walk. A tick moves the score by a small gaussian step; now and then it
# drops suddenly; below the threshold it drifts back up (the user re-engages).
DROP_CHANCE = 0.06
DROP_SIZE = (15.0, 40.0)
STEP = 4.0
RECOVERY_DRIFT = 3.0
INTERVENTION_CHANCE = 0.5


def retry_delays(speed: float = 1.0) -> tuple[float, ...]:
    """The service's retry delays in seconds, divided by speed.

    >>> retry_delays(60)
    (1.0, 5.0, 30.0, 120.0, 480.0)
    """
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    return tuple(d / speed for d in SENDER_RETRIES)


def timestamp(when: datetime) -> str:
    """ISO 8601 UTC with milliseconds, as the service writes it: 2024-05-01T12:00:00.123Z."""
    return iso(when, digits=3)


# -- sessions: the pure part ----------------------------------------------------------------


@dataclass
class Walk:
    """One session's score: a random walk that emits events when it crosses the threshold.

    ``move_to(score)`` holds the crossing logic and is deterministic given the rng;
    ``step()`` draws the next score and moves there.
    """

    session_id: str
    user_id: str
    threshold: float
    score: float
    rng: random.Random
    below: bool = False
    intervention: str | None = None
    _interventions: int = 0

    def step(self) -> list[dict[str, Any]]:
        """Advance one tick; the event fields (without id/timestamp) it produced."""
        rng = self.rng
        if self.below:
            delta = rng.gauss(RECOVERY_DRIFT, STEP)
        elif rng.random() < DROP_CHANCE:
            delta = -rng.uniform(*DROP_SIZE)
        else:
            # A gentle pull towards 70 keeps healthy sessions from wandering off forever.
            delta = rng.gauss((70.0 - self.score) * 0.05, STEP)
        return self.move_to(self.score + delta)

    def move_to(self, score: float) -> list[dict[str, Any]]:
        """Set the score; emit drop/recover on a crossing, and open/close an intervention."""
        self.score = round(min(100.0, max(0.0, score)), 1)
        out: list[dict[str, Any]] = []
        if not self.below and self.score < self.threshold:
            self.below = True
            out.append(self._score_event("score.drop"))
            if self.intervention is None and self.rng.random() < INTERVENTION_CHANCE:
                self._interventions += 1
                self.intervention = f"int_{self.session_id[5:]}_{self._interventions}"
                out.append(
                    self._base(
                        "intervention.fired",
                        interventionId=self.intervention,
                        kind=self.rng.choice(["nudge", "break", "checkin"]),
                    )
                )
        elif self.below and self.score >= self.threshold:
            self.below = False
            if self.intervention is not None:
                out.append(self._resolve(self.rng.choice(["answered", "dismissed"])))
            out.append(self._score_event("score.recover"))
        return out

    def stop(self) -> list[dict[str, Any]]:
        """The session ends: close an open intervention, then session.stopped."""
        out = [self._resolve("expired")] if self.intervention is not None else []
        out.append(self._base("session.stopped", score=self.score))
        return out

    def _resolve(self, outcome: str) -> dict[str, Any]:
        event = self._base(
            "intervention.resolved", interventionId=self.intervention, outcome=outcome
        )
        self.intervention = None
        return event

    def _score_event(self, kind: str) -> dict[str, Any]:
        return self._base(kind, score=self.score, threshold=_number(self.threshold))

    def _base(self, event_type: str, **fields: Any) -> dict[str, Any]:
        return {"type": event_type, "sessionId": self.session_id, "userId": self.user_id, **fields}


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def new_walk(index: int, *, run: str, threshold: float, rng: random.Random) -> Walk:
    """Session number index of run, starting comfortably above the threshold."""
    start = rng.uniform(max(threshold + 10, 55.0), 95.0)
    return Walk(
        session_id=f"sess_{run}_{index:03d}",
        user_id=f"user_{rng.randrange(1, 500)}",
        threshold=threshold,
        score=round(min(start, 100.0), 1),
        rng=rng,
    )


def event_stream(
    *,
    seed: int,
    sessions: int,
    threshold: float,
    run: str = "bench",
    start: datetime | None = None,
    tick: float = 1.0,
) -> Iterator[dict[str, Any]]:
    """An endless stream of complete, valid events from `sessions` walks ticking in turn.

    Sessions are stopped and replaced now and then, so every event type appears.
    Used by bench/ to pre-generate a request file; ids are unique within a run.
    """
    rng = random.Random(seed)
    clock = start or datetime.now(UTC)
    count = itertools.count(1)
    walks = [new_walk(i, run=run, threshold=threshold, rng=rng) for i in range(sessions)]
    fresh = itertools.count(sessions)
    while True:
        clock += timedelta(seconds=tick)
        for slot, walk in enumerate(walks):
            produced = walk.step()
            if rng.random() < 0.002:
                produced += walk.stop()
                walks[slot] = new_walk(next(fresh), run=run, threshold=threshold, rng=rng)
            for fields in produced:
                yield {
                    "id": f"evt_{run}_{next(count):07d}",
                    **fields,
                    "timestamp": timestamp(clock),
                }


def wants_duplicate(rng: random.Random, share: float) -> bool:
    """Whether the next event is delivered twice, for a share between 0 and 1."""
    return share > 0 and rng.random() < share


# -- the engine -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    sessions: int = 20
    duration: float = 30.0
    tick: float = 1.0  # seconds between two score updates of one session
    rate: float = 0.0  # deliveries per second at most, 0 = no cap
    duplicates: float = 0.0
    speed: float = 1.0
    concurrency: int = 16
    threshold: float = 40.0
    timeout: float = 10.0
    max_wait: float | None = None  # after the last event; None = the whole retry schedule


@dataclass
class Tracked:
    """One event and what became of its deliveries."""

    id: str
    type: str
    body: bytes
    header: str
    duplicate: bool
    attempts: int = 0
    accepted: bool = False  # some delivery got 202
    acknowledged: bool = False  # some delivery got any 2xx
    failed: bool = False  # a delivery used up the whole schedule
    last: str = ""

    @property
    def outcome(self) -> str:
        if self.accepted:
            return "accepted"
        if self.acknowledged:
            return "duplicate"
        return "failed" if self.failed else "pending"


@dataclass
class Stats:
    events: int = 0
    sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    duplicate_deliveries: int = 0
    retried: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    in_flight: int = 0
    waiting: int = 0  # deliveries scheduled for a retry


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    action: Callable[[], None] = field(compare=False)


class Simulation:
    """The sender: sessions, signed deliveries, retries and duplicates. Run it once."""

    def __init__(
        self,
        url: str,
        secret: bytes,
        options: Options,
        *,
        seed: int | None = None,
        run: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        started_at: datetime | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.secret = secret
        self.options = options
        self.delays = retry_delays(options.speed)
        self.seed = seed if seed is not None else random.randrange(2**32)
        self.run_id = run or uuid.uuid4().hex[:8]
        self.clock = clock
        self.sleep = sleep
        self.started_at = started_at or datetime.now(UTC)
        self.transport = transport
        self.on_warning = on_warning or (lambda message: None)
        self.stats = Stats()
        self.tracked: dict[str, Tracked] = {}
        self.t0 = 0.0
        self.elapsed = 0.0
        self.interrupted = False
        self._heap: list[_Due] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_send = 0.0
        self._warned: set[str] = set()
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None

    # -- scheduling

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._heap, _Due(when, next(self._seq), action))
        self._wake.set()

    def _now(self) -> float:
        return self.clock() - self.t0

    async def run(self) -> Summary:
        """Run the sessions for the duration, then wait for retries; return the summary."""
        opts = self.options
        self.t0 = self.clock()
        max_wait = opts.max_wait if opts.max_wait is not None else sum(self.delays) + opts.timeout
        self._sem = asyncio.Semaphore(opts.concurrency)
        limits = httpx.Limits(
            max_connections=opts.concurrency, max_keepalive_connections=opts.concurrency
        )
        async with httpx.AsyncClient(
            transport=self.transport, limits=limits, timeout=opts.timeout
        ) as self._client:
            master = random.Random(self.seed)
            for i in range(opts.sessions):
                rng = random.Random(master.getrandbits(64))
                walk = new_walk(i, run=self.run_id, threshold=opts.threshold, rng=rng)
                self._at(rng.uniform(0, min(opts.tick, opts.duration)), self._ticker(walk))
            try:
                await self._loop(opts.duration + max_wait)
            except asyncio.CancelledError:  # Ctrl-C: stop sending, report what happened
                self.interrupted = True
            finally:
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
        self.elapsed = self._now()
        return Summary.of(self)

    def _ticker(self, walk: Walk) -> Callable[[], None]:
        def tick() -> None:
            now = self._now()
            if now >= self.options.duration:
                self._emit(walk, walk.stop())
                return
            self._emit(walk, walk.step())
            self._at(min(now + self.options.tick, self.options.duration), tick)

        return tick

    async def _loop(self, deadline: float) -> None:
        while self._heap or self._tasks:
            now = self._now()
            if now >= deadline:
                return
            if self._heap and self._heap[0].at <= now:
                heapq.heappop(self._heap).action()
                await asyncio.sleep(0)
                continue
            until = min(self._heap[0].at if self._heap else deadline, deadline)
            await self._wait(until - now)

    async def _wait(self, delay: float) -> None:
        """Sleep for delay, or less if a delivery finishes or something new is scheduled."""
        self._wake.clear()
        sleeper = asyncio.ensure_future(self.sleep(delay))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, waker):
                t.cancel()
            await asyncio.gather(sleeper, waker, return_exceptions=True)

    # -- events and deliveries

    def _emit(self, walk: Walk, produced: list[dict[str, Any]]) -> None:
        when = self.started_at + timedelta(seconds=self._now())
        for fields in produced:
            event = {
                "id": f"evt_{self.run_id}_{next(self._ids):06d}",
                **fields,
                "timestamp": timestamp(when),
            }
            body = json.dumps(event, separators=(",", ":")).encode()
            item = Tracked(
                event["id"],
                event["type"],
                body,
                signature.sign(self.secret, body),
                duplicate=wants_duplicate(walk.rng, self.options.duplicates),
            )
            self.tracked[item.id] = item
            self.stats.events += 1
            self._send(item, attempt=1)

    def _send(self, item: Tracked, attempt: int) -> None:
        task = asyncio.ensure_future(self._deliver(item, attempt))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()

    async def _throttle(self) -> None:
        if self.options.rate <= 0:
            return
        now = self._now()
        start = max(now, self._next_send)
        self._next_send = start + 1.0 / self.options.rate
        if start > now:
            await self.sleep(start - now)

    async def _deliver(self, item: Tracked, attempt: int) -> None:
        assert self._sem is not None and self._client is not None
        async with self._sem:
            await self._throttle()
            self.stats.sent += 1
            self.stats.in_flight += 1
            item.attempts += 1
            if attempt > 1:
                self.stats.retried += 1
            began = self.clock()
            try:
                response = await self._client.post(
                    self.url,
                    content=item.body,
                    headers={
                        "content-type": "application/json",
                        signature.SIGNATURE_HEADER: item.header,
                    },
                )
                self.stats.latencies.append(self.clock() - began)
                status: int | None = response.status_code
                outcome = str(status)
            except httpx.TimeoutException:
                status, outcome = None, "timeout"
            except httpx.TransportError:
                status, outcome = None, "connection"
            finally:
                self.stats.in_flight -= 1
        item.last = outcome
        if status is not None and 200 <= status < 300:
            first = not item.acknowledged
            item.acknowledged = True
            if status == 202:
                item.accepted = True
                self.stats.accepted += 1
            else:
                self.stats.duplicates += 1
            if first and item.duplicate:
                # The service resends an event whose acknowledgement it believes lost.
                self.stats.duplicate_deliveries += 1
                self._send(item, attempt=1)
            return
        self.stats.errors[outcome] += 1
        if status in (401, 404) and outcome not in self._warned:
            self._warned.add(outcome)
            hint = "check --secret" if status == 401 else "check --url"
            self.on_warning(f"the receiver answered {status}; {hint} (retrying on schedule)")
        if attempt > len(self.delays):
            item.failed = True
            return
        self.stats.waiting += 1

        def retry() -> None:
            self.stats.waiting -= 1
            self._send(item, attempt + 1)

        self._at(self._now() + self.delays[attempt - 1], retry)

    def write_record(self, path: Path) -> None:
        """One line per event: id, outcome (accepted/duplicate/failed/pending), attempts, type."""
        with path.open("w") as out:
            for item in self.tracked.values():
                out.write(f"{item.id}\t{item.outcome}\t{item.attempts}\t{item.type}\n")


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile of values (0 for none): percentile([1, 2, 3, 4], 0.5) == 2."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass(frozen=True)
class Summary:
    events: int
    sent: int
    accepted: int
    duplicates: int
    duplicate_deliveries: int
    retried: int
    acknowledged: int
    failed: int
    pending: int
    errors: dict[str, int]
    by_type: dict[str, int]
    p50_ms: float
    p99_ms: float
    elapsed_s: float
    interrupted: bool

    @classmethod
    def of(cls, sim: Simulation) -> Summary:
        items = sim.tracked.values()
        outcomes = Counter(item.outcome for item in items)
        s = sim.stats
        return cls(
            events=s.events,
            sent=s.sent,
            accepted=s.accepted,
            duplicates=s.duplicates,
            duplicate_deliveries=s.duplicate_deliveries,
            retried=s.retried,
            acknowledged=outcomes["accepted"] + outcomes["duplicate"],
            failed=outcomes["failed"],
            pending=outcomes["pending"],
            errors=dict(sorted(s.errors.items())),
            by_type=dict(sorted(Counter(item.type for item in items).items())),
            p50_ms=round(percentile(s.latencies, 0.50) * 1000, 2),
            p99_ms=round(percentile(s.latencies, 0.99) * 1000, 2),
            elapsed_s=round(sim.elapsed, 2),
            interrupted=sim.interrupted,
        )

    @property
    def ok(self) -> bool:
        """Every event was acknowledged by the receiver in the end."""
        return self.acknowledged == self.events

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


# -- the command ----------------------------------------------------------------------------


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from receiver.rules import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _share(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0 <= value <= 1:
        raise click.BadParameter(f"must be between 0 and 1, got {value}")
    return value


async def _with_progress(sim: Simulation, console: Any) -> Summary:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    duration = sim.options.duration
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("sessions", total=duration, counts="")
        runner = asyncio.ensure_future(sim.run())
        try:
            while not runner.done():
                s = sim.stats
                elapsed = sim._now() if sim.t0 else 0.0
                waiting = "" if elapsed < duration else f" [retry wait {s.waiting}]"
                progress.update(
                    bar,
                    completed=min(elapsed, duration),
                    description="sessions" if elapsed < duration else "draining",
                    counts=f"sent {s.sent}  accepted {s.accepted}  dup {s.duplicates}  "
                    f"retried {s.retried}  errors {sum(s.errors.values())}{waiting}",
                )
                await asyncio.wait({runner}, timeout=0.2)
        except asyncio.CancelledError:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        return runner.result()


def _print_summary(summary: Summary, console: Any) -> None:
    from rich.table import Table

    table = Table("", "", show_header=False, box=None)
    rows = [
        ("events", summary.events),
        ("sent", summary.sent),
        ("accepted", summary.accepted),
        ("duplicates", f"{summary.duplicates} (of {summary.duplicate_deliveries} deliberate)"),
        ("retried", summary.retried),
        ("acknowledged", summary.acknowledged),
        ("failed", summary.failed + summary.pending),
        ("latency p50", f"{summary.p50_ms:.1f} ms"),
        ("latency p99", f"{summary.p99_ms:.1f} ms"),
        ("elapsed", f"{summary.elapsed_s:.1f} s"),
    ]
    if summary.errors:
        rows.append(("errors", ", ".join(f"{k}: {v}" for k, v in summary.errors.items())))
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    if summary.interrupted:
        console.print("interrupted: events still pending count as failed")


_POSITIVE = click.FloatRange(min=0, min_open=True)


@click.command()
@click.option(
    "--url",
    envvar="RECEIVER_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Where to deliver [RECEIVER_URL].",
)
@click.option(
    "--secret",
    envvar="RECEIVER_SIGN_SECRET",
    help="Signing secret [RECEIVER_SIGN_SECRET, else the first of RECEIVER_SECRETS, "
    "else the development secret]. Never printed.",
)
@click.option(
    "--sessions",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Sessions running at once.",
)
@click.option(
    "--duration",
    default="30s",
    show_default=True,
    callback=_duration,
    help="How long the sessions run (90s, 2m, 1h30m).",
)
@click.option(
    "--tick",
    type=_POSITIVE,
    default=1.0,
    show_default=True,
    help="Seconds between two score updates of a session; smaller means more events.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="At most this many deliveries a second (retries included); 0 = no cap.",
)
@click.option(
    "--duplicates",
    type=float,
    default=0.0,
    show_default=True,
    callback=_share,
    help="Share of events (0..1) delivered a second time after they were acknowledged.",
)
@click.option(
    "--speed",
    type=_POSITIVE,
    default=1.0,
    show_default=True,
    help="Divide the retry schedule (1m, 5m, 30m, 2h, 8h) by this.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Deliveries in flight at most.",
)
@click.option(
    "--timeout",
    type=_POSITIVE,
    default=10.0,
    show_default=True,
    help="Seconds before a delivery counts as failed (and is retried).",
)
@click.option(
    "--max-wait",
    default=None,
    callback=_duration,
    help="After the sessions end, wait at most this long for retries "
    "[the whole retry schedule divided by --speed].",
)
@click.option("--seed", type=int, help="Seed of the random walks, for a repeatable run.")
@click.option(
    "--threshold",
    type=float,
    default=40.0,
    show_default=True,
    help="Score threshold the sessions drop below and recover above.",
)
@click.option(
    "--record",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one line per event: id, outcome, attempts, type (tab-separated).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--serve-api",
    is_flag=True,
    help="Be the whole service instead: serve its API (sessions, scores, webhook"
    " registration) on --listen and deliver events to the webhooks registered there.",
)
@click.option(
    "--listen",
    default="127.0.0.1:4100",
    show_default=True,
    metavar="HOST:PORT",
    help="With --serve-api: where to serve.",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="RECEIVER_SIMULATE_KEYS",
    metavar="KEY[:PLAN]",
    help="With --serve-api: a Bearer key it accepts, on --plan unless :free, :pro or"
    " :enterprise follows; repeatable [RECEIVER_SIMULATE_KEYS, space-separated; else one"
    " made up and printed].",
)
@click.option(
    "--plan",
    type=click.Choice(["free", "pro", "enterprise"]),
    default="free",
    show_default=True,
    help="With --serve-api: the plan of keys given without one.",
)
@click.option(
    "--population",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="With --serve-api: sessions in all, --sessions of them live, the rest finished"
    " over the past day.",
)
@click.pass_context
def simulate(
    ctx: click.Context,
    url: str,
    secret: str | None,
    sessions: int,
    duration: float,
    tick: float,
    rate: float,
    duplicates: float,
    speed: float,
    concurrency: int,
    timeout: float,
    max_wait: float | None,
    seed: int | None,
    threshold: float,
    record: Path | None,
    as_json: bool,
    no_progress: bool,
    serve_api: bool,
    listen: str,
    api_keys: tuple[str, ...],
    plan: str,
    population: int,
) -> None:
    """Behave like the Attention Scoring Service towards a receiver: signed events, retries.

    Sessions' scores wander and cross the threshold (score.drop, score.recover),
    interventions fire and resolve, each session ends with session.stopped. A
    delivery answered non-2xx or timed out is retried at 1m, 5m, 30m, 2h, 8h
    divided by --speed. Ends with a summary; exits 1 unless every event was
    acknowledged with a 2xx in the end.

    Example:

    \b
        receiver simulate --sessions 20 --duration 30s
        receiver simulate --duplicates 0.1 --speed 600 --record outcomes.tsv --json
        receiver simulate --serve-api --api-key ar_test:pro --speed 60

    With --serve-api it serves the service's API from a generated population
    until stopped (or for --duration when given): `receiver upstream register`
    points it at a receiver, and the live sessions' events are delivered there.
    """
    from rich.console import Console

    if serve_api:
        from receiver.simulator.serve import serve_fake

        given = ctx.get_parameter_source("duration") is not click.core.ParameterSource.DEFAULT
        serve_fake(
            listen=listen,
            keys=api_keys,
            plan=plan,
            live=sessions,
            population=population,
            tick=tick,
            speed=speed,
            threshold=threshold,
            seed=seed,
            duration=duration if given else None,
        )
        return

    options = Options(
        sessions=sessions,
        duration=duration,
        tick=tick,
        rate=rate,
        duplicates=duplicates,
        speed=speed,
        concurrency=concurrency,
        threshold=threshold,
        timeout=timeout,
        max_wait=max_wait,
    )
    err = Console(stderr=True)
    sim = Simulation(
        url,
        signing_secret(secret),
        options,
        seed=seed,
        on_warning=lambda message: err.print(f"warning: {message}"),
    )
    show = not no_progress and err.is_terminal

    async def main() -> Summary:
        return await (_with_progress(sim, err) if show else sim.run())

    summary = asyncio.run(main())
    if record is not None:
        sim.write_record(record)
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
    else:
        _print_summary(summary, Console())
    sys.exit(0 if summary.ok else 1)
