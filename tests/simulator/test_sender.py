"""The simulator's sender (receiver.simulator.sender) in virtual time, against
httpx.MockTransport: signed deliveries, retries on the schedule, duplicates answered, the
rate cap, and its summary's percentiles."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver import events, signature
from receiver.events import SENDER_RETRIES
from receiver.simulator.sender import Options, Simulation, Summary, percentile
from tests.harness import SECRET

START = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class VirtualTime:
    """A clock and sleep for the engine: sleeping lets every runnable task run, then jumps."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        target = self.now + delay
        for _ in range(50):  # MockTransport answers within a few loop turns
            await asyncio.sleep(0)
        self.now = max(self.now, target)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) == 0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99


# -- the engine in virtual time, against MockTransport --------------------------------------


def _run(handler: Any, options: Options, seed: int = 1) -> tuple[Simulation, Summary]:
    vt = VirtualTime()
    sim = Simulation(
        "http://receiver.test/v1/events",
        SECRET.encode(),
        options,
        seed=seed,
        run="t",
        clock=vt.clock,
        sleep=vt.sleep,
        started_at=START,
        transport=httpx.MockTransport(handler),
    )
    handler.clock = vt.clock
    return sim, asyncio.run(sim.run())


class FakeReceiver:
    """Answers like the receiver (202 new, 200 duplicate); fails the first `failures` tries."""

    def __init__(self, failures: int = 0, status: int = 503) -> None:
        self.failures = failures
        self.status = status
        self.stored: set[str] = set()
        self.tries: dict[str, list[float]] = defaultdict(list)
        self.clock: Any = None

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = request.content
        signature.verify([SECRET.encode()], body, request.headers[signature.SIGNATURE_HEADER])
        event = events.parse(body)
        self.tries[event.id].append(self.clock())
        if len(self.tries[event.id]) <= self.failures:
            return httpx.Response(self.status, json={"error": {"code": "x", "message": "x"}})
        if event.id in self.stored:
            return httpx.Response(200, json={"id": event.id, "status": "duplicate"})
        self.stored.add(event.id)
        return httpx.Response(202, json={"id": event.id, "status": "accepted"})


def test_every_delivery_is_a_signed_valid_event_and_the_summary_adds_up() -> None:
    receiver = FakeReceiver()
    sim, summary = _run(receiver, Options(sessions=10, duration=60, tick=1, duplicates=0.25))
    assert summary.ok and summary.failed == summary.pending == 0
    assert summary.events == len(receiver.stored) == summary.accepted == summary.acknowledged
    assert summary.by_type["session.stopped"] == 10
    assert summary.sent == summary.events + summary.duplicate_deliveries
    assert summary.duplicates == summary.duplicate_deliveries
    assert 0.1 < summary.duplicate_deliveries / summary.events < 0.4
    assert summary.retried == 0
    assert {item.outcome for item in sim.tracked.values()} == {"accepted"}


def test_same_seed_same_events() -> None:
    first, _ = _run(FakeReceiver(), Options(sessions=5, duration=30), seed=9)
    again, _ = _run(FakeReceiver(), Options(sessions=5, duration=30), seed=9)
    assert [t.body for t in first.tracked.values()] == [t.body for t in again.tracked.values()]


def test_failed_deliveries_are_retried_on_the_schedule_divided_by_speed() -> None:
    receiver = FakeReceiver(failures=3)
    sim, summary = _run(receiver, Options(sessions=3, duration=20, speed=60))
    assert summary.ok
    assert summary.retried == 3 * summary.events
    assert summary.errors == {"503": 3 * summary.events}
    for tries in receiver.tries.values():
        gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
        assert gaps == pytest.approx([1, 5, 30])


def test_a_delivery_failing_every_attempt_is_marked_failed_after_five_retries(
    tmp_path: Path,
) -> None:
    receiver = FakeReceiver(failures=99, status=500)
    sim, summary = _run(receiver, Options(sessions=2, duration=10, timeout=5))
    assert not summary.ok
    assert summary.failed == summary.events > 0 and summary.acknowledged == 0
    assert all(len(tries) == 6 for tries in receiver.tries.values())
    # The whole schedule passed, in virtual time: 10h40m after the first try.
    first = min(t[0] for t in receiver.tries.values())
    last = max(t[-1] for t in receiver.tries.values())
    assert last - first >= sum(SENDER_RETRIES)
    sim.write_record(tmp_path / "record.tsv")
    lines = (tmp_path / "record.tsv").read_text().splitlines()
    assert len(lines) == summary.events
    assert {line.split("\t")[1] for line in lines} == {"failed"}


def test_an_ack_lost_to_a_timeout_is_acknowledged_by_the_duplicate_answer() -> None:
    stored: set[str] = set()

    async def handler(request: httpx.Request) -> httpx.Response:
        event_id = json.loads(request.content)["id"]
        if event_id not in stored:
            stored.add(event_id)  # kept, but the answer never arrives
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json={"id": event_id, "status": "duplicate"})

    handler.clock = None  # type: ignore[attr-defined]
    sim, summary = _run(handler, Options(sessions=3, duration=10, speed=600))
    assert summary.ok and summary.accepted == 0
    assert summary.duplicates == summary.acknowledged == summary.events == len(stored)
    assert summary.errors == {"timeout": summary.events}
    assert {item.outcome for item in sim.tracked.values()} == {"duplicate"}


def test_max_wait_cuts_retries_short_and_leaves_them_pending() -> None:
    receiver = FakeReceiver(failures=99)
    _, summary = _run(receiver, Options(sessions=2, duration=10, max_wait=100))
    assert summary.pending == summary.events and not summary.ok
    assert all(len(tries) == 2 for tries in receiver.tries.values())  # 0s and 60s; 360s is late


def test_rate_caps_deliveries_per_second() -> None:
    receiver = FakeReceiver()
    sim, summary = _run(receiver, Options(sessions=50, duration=10, tick=0.1, rate=20))
    times = sorted(t for tries in receiver.tries.values() for t in tries)
    assert summary.ok and len(times) > 100
    span = times[-1] - times[0]
    assert (len(times) - 1) / span == pytest.approx(20, rel=0.01)
