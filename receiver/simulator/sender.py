"""The Attention Scoring Service's sender, emulated towards a receiver URL: sessions
(receiver.simulator.walk) whose events are delivered signed as the service signs them; a
delivery answered non-2xx, or not answered in time, is retried on the service's schedule
(1m, 5m, 30m, 2h, 8h) divided by ``speed``; a share of acknowledged events is delivered a
second time.

    engine = Simulation(url, secret, Options(sessions=5, duration=10), seed=1)
    summary = asyncio.run(engine.run())

The engine takes its clock, sleep and HTTP transport as arguments, so tests run it
deterministically in virtual time against ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from receiver import signature
from receiver.simulator.walk import (
    Walk,
    new_walk,
    retry_delays,
    timestamp,
    wants_duplicate,
)


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
