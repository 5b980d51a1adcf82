"""Every background loop of the real app, on SQLite and PostgreSQL, with a fault injected:
the loop's failure shows on /readyz (and /healthz once it lasts), on /metrics and in the
log, and the loop comes back by itself once the fault is gone, with no restart of the
process. The app runs in-process (its lifespan, real stores, real loops); the model test
against a real server process, with a privilege revoked, is tests/test_supervision_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver import events, signature
from receiver.app import create_app
from receiver.settings import Settings
from tests.harness import SECRET, FakeClock
from tests.servers import HTTPSink

RULES = """
notifiers:
  hook: "{url}"
heartbeat: {{silent_for: 1h, notify: [hook]}}
rules:
  - name: drop
    match: {{type: score.drop}}
    notify: [hook]
"""
DEADLINE = 60.0  # generous: a restart waits 1 s, then 2 s, 4 s... on a busy machine too


def programming_error(url: str) -> Exception:
    """What the store's driver raises for a statement the database refuses to run."""
    if url.startswith("postgresql://"):
        import psycopg.errors

        return psycopg.errors.InsufficientPrivilege("permission denied for table events")
    return sqlite3.ProgrammingError("injected: cannot operate on this table")


class Breaker:
    """A fault, on until the test turns it off."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.on = True
        self.raised = 0

    def check(self) -> None:
        if self.on:
            self.raised += 1
            raise self.error


class TxProxy:
    """A routing transaction whose method `name` raises while the breaker is on
    ("events.unrouted": the method of one of its roles)."""

    def __init__(self, tx: Any, name: str, breaker: Breaker) -> None:
        self._tx, self._name, self._breaker = tx, name, breaker

    def __getattr__(self, attr: str) -> Any:
        role, _, rest = self._name.partition(".")
        if attr == role and rest:
            return TxProxy(getattr(self._tx, attr), rest, self._breaker)
        if attr == self._name:
            self._breaker.check()
        return getattr(self._tx, attr)


class Running:
    def __init__(self, app: Any, client: httpx.AsyncClient, sink: HTTPSink) -> None:
        self.app, self.client, self.sink = app, client, sink
        self.store = app.state.store
        self.sent = 0

    async def send(self, **fields: Any) -> None:
        """A score.drop of a session of its own (so it opens an alert and notifies)."""
        self.sent += 1
        fields.setdefault("sessionId", f"sess_{self.sent}")
        body = json.dumps(events.sample("score.drop", **fields)).encode()
        headers = {signature.SIGNATURE_HEADER: signature.sign(SECRET.encode(), body)}
        answer = await self.client.post("/v1/events", content=body, headers=headers)
        assert answer.status_code == 202, answer.text

    async def until(self, what: str, check: Callable[[], Awaitable[bool]]) -> None:
        try:
            async with asyncio.timeout(DEADLINE):
                while not await check():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            ready = (await self.client.get("/readyz")).text
            raise AssertionError(f"{what} not seen in {DEADLINE}s; /readyz: {ready}") from None

    async def delivered(self, count: int) -> None:
        """Wait for the sink to have count notifications, without blocking the event loop
        the app runs on (HTTPSink.wait_for sleeps: the worker could not send meanwhile)."""

        async def arrived() -> bool:
            return len(self.sink.requests) >= count

        await self.until(f"{count} notifications at the sink", arrived)

    async def failing(self) -> list[str]:
        """The loops /readyz names as failing (a 503 whenever there is one, or the store's
        probe has not answered in time, as on a machine too busy for it)."""
        answer = await self.client.get("/readyz")
        body = answer.json()
        unready = bool(body["failing"]) or body["checks"]["store"] != "ok"
        assert answer.status_code == (503 if unready else 200), body
        return list(body["failing"])

    async def restarts(self, task: str) -> float:
        text = (await self.client.get("/metrics")).text
        line = f'receiver_task_restarts_total{{task="{task}"}} '
        found = [row for row in text.splitlines() if row.startswith(line)]
        assert found, f"no {line.strip()} on /metrics"
        return float(found[0].removeprefix(line))


@asynccontextmanager
async def running(
    tmp: Path,
    store_url: str,
    sink: HTTPSink,
    clock: FakeClock | None = None,
    inject: Callable[[Any], None] = lambda store: None,
    **options: Any,
) -> AsyncIterator[Running]:
    """The app with its loops running; inject(store) is called before they start."""
    rules = tmp / "rules.yaml"
    rules.write_text(RULES.format(url=sink.json_url("/hook")))
    settings = Settings(
        db=store_url,
        rules=rules,
        secrets=SECRET,
        retry_initial=0.2,
        notify_timeout=3,
        max_clock_skew=0,
        max_event_age=0,
        **options,
    )
    app = create_app(settings, **({"clock": clock} if clock else {}))
    if clock is not None:
        clock.apps = [app]
    inject(app.state.store)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://receiver") as client,
    ):
        yield Running(app, client, sink)


async def routed_all(r: Running) -> bool:
    return (await r.store.stats.backlog(r.app.state.store.clock())).unrouted == 0


def break_tx(name: str) -> Callable[[Any, Breaker], None]:
    """Routing transactions whose method `name` raises."""

    def inject(store: Any, breaker: Breaker) -> None:
        transact = store.transact

        async def broken(fn: Callable[[Any], Any]) -> Any:
            return await transact(lambda tx: fn(TxProxy(tx, name, breaker)))

        store.transact = broken

    return inject


def break_method(name: str) -> Callable[[Any, Breaker], None]:
    """The store's method `name` raises ("events.prune": the method of a role)."""

    def inject(store: Any, breaker: Breaker) -> None:
        *roles, last = name.split(".")
        owner = store
        for role in roles:
            owner = getattr(owner, role)
        method = getattr(owner, last)

        async def broken(*args: Any, **kwargs: Any) -> Any:
            breaker.check()
            return await method(*args, **kwargs)

        setattr(owner, last, broken)

    return inject


@pytest.mark.parametrize(
    ("loop", "inject"),
    [
        pytest.param("router", break_tx("events.unrouted"), id="router"),
        pytest.param("timers", break_tx("try_lock"), id="timers"),
        pytest.param("notify", break_method("outbox.claim_due"), id="notify"),
        pytest.param("retention", break_method("events.prune"), id="retention"),
    ],
)
def test_a_loop_whose_store_raises_is_reported_and_comes_back(
    loop: str,
    inject: Callable[[Any, Breaker], None],
    store_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store raises the driver's ProgrammingError (a privilege revoked, a table gone).
    A loop ends on it and the supervisor restarts it until the statement works again;
    except where the SQLite store itself reports a driver error inside a transaction as
    the store being unavailable: the router and the timers then pause and retry by
    themselves. Either way /readyz names the loop from the first failure to the first
    success."""
    breaker = Breaker(programming_error(store_url))
    paused = loop in ("router", "timers") and not store_url.startswith("postgresql://")

    async def main() -> None:
        with HTTPSink() as sink:
            faulty = lambda store: inject(store, breaker)  # noqa: E731
            async with running(tmp_path, store_url, sink, inject=faulty) as r:
                # Each loop fails on its first turn: the router reads what is unrouted,
                # the timers tick after it, the worker claims, retention makes a pass.
                await r.send()

                async def reported() -> bool:
                    return loop in await r.failing()

                await r.until(f"{loop} failing on /readyz", reported)
                body = (await r.client.get("/readyz")).json()
                assert body["status"] == "not_ready"
                assert loop in body["error"]["message"]
                status = body["checks"]["loops"][loop]
                assert status["state"] == ("paused" if paused else "restarting")
                assert str(breaker.error) in status["error"]
                assert (await r.client.get("/healthz")).status_code == 200  # not for 60 s
                assert (await r.restarts(loop) >= 1) is not paused

                breaker.on = False
                r.app.state.wake()

                async def recovered() -> bool:
                    return await r.failing() == []

                await r.until(f"{loop} recovered", recovered)
                await r.until("the event routed", lambda: routed_all(r))
                if loop in ("router", "notify"):
                    await r.delivered(1)  # the notification went out after all

    with caplog.at_level(logging.ERROR, logger="receiver"):
        asyncio.run(main())
    assert breaker.raised >= 1
    said = f"{loop} paused: storage unavailable" if paused else f"{loop} failed"
    if loop == "router" and paused:
        said = "routing paused: storage unavailable"
    failures = [r for r in caplog.records if r.getMessage().startswith(said)]
    assert failures, f"no line saying {said!r}"
    assert all(r.levelno == logging.ERROR for r in failures)
    if not paused:
        assert failures[0].exc_info is not None, "the first failure's traceback was not logged"


def test_a_failing_rules_watcher_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """watchfiles failing (a folder it cannot watch, inotify out of watches) ends the
    watcher; it is reported and restarted, and reloads work again afterwards."""
    import watchfiles

    real = watchfiles.awatch
    calls = []

    def awatch(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= 2:
            raise OSError(28, "inotify watch limit reached")
        return real(*args, **kwargs)

    monkeypatch.setattr(watchfiles, "awatch", awatch)

    async def main() -> None:
        with HTTPSink() as sink:
            async with running(tmp_path, str(tmp_path / "r.db"), sink) as r:

                async def reported() -> bool:
                    return "rules-watch" in await r.failing()

                await r.until("rules-watch failing", reported)

                async def recovered() -> bool:
                    return await r.failing() == []

                await r.until("rules-watch recovered", recovered)
                digest = (await r.client.get("/readyz")).json()["checks"]["rules"]["digest"]
                rules = tmp_path / "rules.yaml"
                rules.write_text(rules.read_text().replace("name: drop", "name: dropped"))

                async def reloaded() -> bool:
                    body = (await r.client.get("/readyz")).json()
                    return bool(body["checks"]["rules"]["digest"] != digest)

                await r.until("the edited rules reloaded", reloaded)

    with caplog.at_level(logging.ERROR, logger="receiver.supervisor"):
        asyncio.run(main())
    assert len(calls) >= 3


def test_a_clock_that_jumps_stops_no_loop(store_url: str, tmp_path: Path) -> None:
    """The wall clock jumping a month ahead (past retention, past every retry and the
    heartbeat) and then back a day: every timer copes, no loop fails, routing goes on."""
    clock = FakeClock()

    async def main() -> None:
        with HTTPSink() as sink:
            async with running(tmp_path, store_url, sink, clock=clock) as r:
                await r.send(
                    timestamp=events.iso_epoch(clock.now),
                    sessionId=f"sess_{len(sink.requests)}_{clock.now:.0f}",
                )
                await r.until("the first event routed", lambda: routed_all(r))
                await r.delivered(1)
                for jump in (40 * 86400.0, -86400.0, 3 * 3600.0):
                    clock.now += jump
                    r.app.state.wake()
                    await r.send(
                        timestamp=events.iso_epoch(clock.now),
                        sessionId=f"sess_{len(sink.requests)}_{clock.now:.0f}",
                    )
                    await r.until("the event routed after the jump", lambda: routed_all(r))
                    assert await r.failing() == []
                    for task in ("router", "timers", "notify", "retention"):
                        assert await r.restarts(task) == 0
                # The heartbeat noticed the silence of the first jump; the events went out.
                await r.delivered(4)

    asyncio.run(main())


def test_the_backlog_gauges_are_left_out_while_the_store_cannot_be_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stale figure would look like the truth: while the store cannot be read, /metrics
    answers without the backlog gauges (an alert on absent() notices), and says why once."""
    breaker = Breaker(sqlite3.OperationalError("disk I/O error"))

    async def main() -> None:
        with HTTPSink() as sink:
            async with running(tmp_path, str(tmp_path / "r.db"), sink) as r:
                text = (await r.client.get("/metrics")).text
                assert "receiver_unrouted_events 0.0" in text
                break_method("stats.backlog")(r.store, breaker)
                answer = await r.client.get("/metrics")
                assert answer.status_code == 200
                assert "receiver_unrouted_events" not in answer.text
                assert "receiver_outbox_pending" not in answer.text
                assert "receiver_events_total" in answer.text
                breaker.on = False
                text = (await r.client.get("/metrics")).text
                assert 'receiver_outbox_oldest_seconds{channel="notify"} 0.0' in text

    with caplog.at_level(logging.WARNING, logger="receiver.metrics"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if r.name == "receiver.metrics"]
    assert said == [
        "backlog gauges left out of /metrics: the store could not be read (disk I/O error)"
    ]
