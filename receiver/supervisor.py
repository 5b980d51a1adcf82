"""The supervisor: every background loop runs under it, logged, restarted and reported.

A loop is an async function that runs until cancelled and takes one argument, its
Health: it calls health.ok() whenever a turn of its work succeeded, and
health.paused(reason) when it handled a failure itself (the store unavailable: it waits
and tries again on its own):

    supervisor = Supervisor(metrics=metrics, unhealthy_after=60)
    supervisor.start("router", router.run)      # router.run(health): ok() after each batch
    supervisor.failing()                        # ["router"] while its last turn failed
    await supervisor.stop()

An exception the loop does not handle itself ends that run: it is logged at ERROR (with
its traceback the first time a distinct error is seen in a while, one line after that),
counted in receiver_task_restarts_total{task}, and the loop starts again after a backoff
of 1 s doubling to 30 s. From the failure until the loop calls ok() again, the loop is
failing: /readyz answers 503 naming it, and once it has been failing for longer than
RECEIVER_UNHEALTHY_AFTER, /healthz answers 503 too, so an orchestrator restarts the
process. A loop that returns by itself (without being stopped) is restarted the same way:
nothing here is meant to end.

A loop paused by an outage of the store is failing too (/readyz), but never unhealthy:
restarting the process brings no database back, and a process that cannot open its
store at start would then stay down for the orchestrator's backoff after the database
returned. /readyz already answers 503 for the store itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from receiver.metrics import Metrics

log = logging.getLogger("receiver.supervisor")

INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 30.0
# A distinct error (loop, type, message) gets its traceback at most once a window; the
# failures in between are one line each (at most one every MAX_BACKOFF once it persists).
TRACEBACK_WINDOW = 600.0


class Health:
    """What a loop tells the supervisor about its turns (a loop run alone: no one)."""

    def ok(self) -> None:
        """A turn of the loop's work succeeded."""

    def paused(self, reason: str) -> None:
        """A turn failed and the loop waits to try again by itself (the store is down)."""


Loop = Callable[[Health], Awaitable[None]]


@dataclass
class LoopState:
    """What the supervisor knows about one loop."""

    name: str
    run: Loop
    task: asyncio.Task[None] | None = None
    restarts: int = 0
    failing_since: float | None = None  # time.monotonic() of the first failure in a row
    crashed: bool = False  # whether a failure since the last ok() ended a run
    last_error: str | None = None
    failures: int = 0  # in a row, since the last ok()
    tracebacks: dict[str, float] = field(default_factory=dict)  # error -> when last shown


class Supervisor:
    """Runs named loops; see the module docstring."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        unhealthy_after: float = 60.0,
        initial: float = INITIAL_BACKOFF,
        maximum: float = MAX_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.unhealthy_after = unhealthy_after
        self.initial = initial
        self.maximum = maximum
        self.clock = clock
        self.loops: dict[str, LoopState] = {}
        self.stopping = False

    def start(self, name: str, run: Loop) -> None:
        """Run run(ok) as the loop called name, from now until stop()."""
        if name in self.loops:
            raise ValueError(f"a loop named {name!r} is running already")
        state = self.loops[name] = LoopState(name, run)
        self.metrics.task_restarts.labels(name)  # the series exists from the start, at 0
        state.task = asyncio.create_task(self._keep(state), name=name)

    async def stop(self) -> None:
        """Cancel every loop and wait for them to end."""
        self.stopping = True
        tasks = [s.task for s in self.loops.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def failing(self) -> list[str]:
        """The loops whose last run failed and that have not succeeded since."""
        return sorted(s.name for s in self.loops.values() if s.failing_since is not None)

    def unhealthy(self) -> list[str]:
        """The loops failing for longer than unhealthy_after."""
        now = self.clock()
        return sorted(
            s.name
            for s in self.loops.values()
            if s.crashed
            and s.failing_since is not None
            and now - s.failing_since > self.unhealthy_after
        )

    def status(self) -> dict[str, dict[str, object]]:
        """Each failing loop: since how long, how many failures in a row, the last error."""
        now = self.clock()
        return {
            s.name: {
                "failing_for": round(now - s.failing_since, 1),
                "state": "restarting" if s.crashed else "paused",
                "failures": s.failures,
                "error": s.last_error,
            }
            for s in self.loops.values()
            if s.failing_since is not None
        }

    async def _keep(self, state: LoopState) -> None:
        while not self.stopping:
            try:
                await state.run(_LoopHealth(self, state))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the point: log, count, restart
                self._failed(state, f"{type(exc).__name__}: {_first_line(exc)}", exc)
            else:
                if self.stopping:
                    return
                self._failed(state, "the loop ended by itself", None)
            state.restarts += 1
            self.metrics.task_restarts.labels(state.name).inc()
            await asyncio.sleep(self._delay(state))

    def _delay(self, state: LoopState) -> float:
        """1 s after the first failure in a row, doubling to 30 s (pauses count too)."""
        return float(min(self.maximum, self.initial * 2.0 ** min(state.failures - 1, 30)))

    def _ok(self, state: LoopState) -> None:
        if state.failing_since is None:
            return
        log.info(
            "%s recovered after %d failure%s in %.1fs",
            state.name,
            state.failures,
            "" if state.failures == 1 else "s",
            self.clock() - state.failing_since,
        )
        state.failing_since, state.last_error, state.failures = None, None, 0
        state.crashed = False

    def _paused(self, state: LoopState, reason: str) -> None:
        if state.failing_since is None:
            state.failing_since = self.clock()
        state.failures += 1
        state.last_error = reason

    def _failed(self, state: LoopState, error: str, exc: BaseException | None) -> None:
        now = self.clock()
        if state.failing_since is None:
            state.failing_since = now
        state.failures += 1
        state.last_error = error
        state.crashed = True
        shown = state.tracebacks.get(error)
        fresh = shown is None or now - shown >= TRACEBACK_WINDOW
        if fresh:
            state.tracebacks[error] = now
            if len(state.tracebacks) > 100:  # bounded: forget the oldest
                del state.tracebacks[min(state.tracebacks, key=state.tracebacks.__getitem__)]
        log.error(
            "%s failed (%d in a row, failing for %.0fs): %s; restarting in %gs",
            state.name,
            state.failures,
            now - state.failing_since,
            error,
            self._delay(state),
            exc_info=exc if fresh else None,
            extra={"task": state.name},
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


class _LoopHealth(Health):
    def __init__(self, supervisor: Supervisor, state: LoopState) -> None:
        self._supervisor, self._state = supervisor, state

    def ok(self) -> None:
        self._supervisor._ok(self._state)

    def paused(self, reason: str) -> None:
        self._supervisor._paused(self._state, reason)


IDLE = Health()  # for a loop run without a supervisor (tests, tools)
