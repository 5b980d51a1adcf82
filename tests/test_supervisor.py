"""receiver.supervisor: a loop that fails is logged, counted, restarted after a backoff and
reported until it works again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from receiver.metrics import Metrics
from receiver.supervisor import Health, Supervisor


def restarts(metrics: Metrics, task: str) -> float:
    value = metrics.registry.get_sample_value("receiver_task_restarts_total", {"task": task})
    assert value is not None
    return value


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for condition (a generous deadline: the loop is driven by real sleeps)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


class Flaky:
    """A loop that fails `failures` times, then calls ok() and waits to be cancelled."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or RuntimeError("boom")
        self.runs = 0
        self.succeeded = asyncio.Event()

    async def __call__(self, health: Health) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise self.error
        health.ok()
        self.succeeded.set()
        await asyncio.Event().wait()


def test_a_failing_loop_is_logged_counted_restarted_and_reported_until_it_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        metrics = Metrics()
        supervisor = Supervisor(metrics=metrics, initial=0.01, maximum=0.04)
        loop = Flaky(3, ValueError("no such table: alerts"))
        seen_failing: list[list[str]] = []
        supervisor.start("router", loop)
        assert restarts(metrics, "router") == 0  # the series exists before any failure
        await until(lambda: loop.runs >= 1)
        await until(lambda: bool(supervisor.failing()))
        seen_failing.append(supervisor.failing())
        status = supervisor.status()["router"]
        assert status["error"] == "ValueError: no such table: alerts"
        await asyncio.wait_for(loop.succeeded.wait(), 30)
        assert seen_failing == [["router"]]
        assert supervisor.failing() == [] and supervisor.status() == {}
        assert restarts(metrics, "router") == 3
        await supervisor.stop()

    with caplog.at_level(logging.INFO, logger="receiver.supervisor"):
        asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert "router failed (1 in a row" in errors[0].getMessage()
    assert "ValueError: no such table: alerts" in errors[0].getMessage()
    # The traceback once per distinct error (within the window), not at every restart.
    assert errors[0].exc_info is not None
    assert [r.exc_info for r in errors[1:]] == [None, None]
    recovered = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert len(recovered) == 1 and recovered[0].startswith("router recovered after 3 failures")


def test_the_backoff_doubles_from_one_second_to_thirty() -> None:
    supervisor = Supervisor(metrics=Metrics())

    async def never(health: Health) -> None:
        await asyncio.Event().wait()

    async def main() -> list[float]:
        supervisor.start("x", never)
        state = supervisor.loops["x"]
        delays = []
        for failures in range(1, 9):
            state.failures = failures
            delays.append(supervisor._delay(state))
        await supervisor.stop()
        return delays

    assert asyncio.run(main()) == [1, 2, 4, 8, 16, 30, 30, 30]


def test_a_loop_failing_longer_than_unhealthy_after_is_unhealthy() -> None:
    now = [1000.0]
    supervisor = Supervisor(
        metrics=Metrics(), unhealthy_after=60, initial=0.01, clock=lambda: now[0]
    )

    async def main() -> None:
        loop = Flaky(10**6)  # fails for as long as the test lasts
        supervisor.start("notify", loop)
        await until(lambda: loop.runs >= 2)
        assert supervisor.failing() == ["notify"]
        assert supervisor.unhealthy() == []
        now[0] += 60.5
        assert supervisor.unhealthy() == ["notify"]
        assert supervisor.status()["notify"]["failing_for"] == 60.5
        await supervisor.stop()

    asyncio.run(main())


def test_a_loop_that_ends_by_itself_is_restarted_but_not_once_stopping() -> None:
    async def main() -> None:
        supervisor = Supervisor(metrics=Metrics(), initial=0.01)
        runs = []

        async def short(health: Health) -> None:
            runs.append(1)

        supervisor.start("retention", short)
        await until(lambda: len(runs) >= 2)
        assert supervisor.status()["retention"]["error"] == "the loop ended by itself"
        supervisor.stopping = True
        await supervisor.stop()
        count = len(runs)
        await asyncio.sleep(0.05)
        assert len(runs) == count

    asyncio.run(main())


def test_a_loop_name_is_unique() -> None:
    async def main() -> None:
        supervisor = Supervisor(metrics=Metrics())
        supervisor.start("router", Flaky(0))
        with pytest.raises(ValueError, match="running already"):
            supervisor.start("router", Flaky(0))
        await supervisor.stop()

    asyncio.run(main())
