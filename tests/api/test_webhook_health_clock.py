"""Endpoint health over hours of a fake clock: a subscriber that answers 500 for an hour is
failing at its 5th failure in a row and disabled at the limit (or failing after an hour
of fewer failures), the owner's rule told of each change once, and another subscriber's
deliveries never wait for it. The real app under uvicorn on a clock the test moves (the
store, the router, the worker and the webhook channel all read it), real local HTTP
servers; tests/api/test_webhook_health.py runs the same on real time."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from receiver.cli import cli
from tests.api.test_webhook_health import HEALTH_RULES
from tests.api.test_webhooks import Client, score
from tests.harness import FakeClock, InProcessReceiver, eventually
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

HOUR = 3600.0
STEP = 60.0  # the clock moves a minute at a time
EVENT_EVERY = 600.0  # one event every ten minutes of it


def _key(server: InProcessReceiver) -> str:
    """A writer key named "hooks" (the owner), made by `receiver keys create` on the
    server's database, in a thread: the command runs asyncio.run()."""
    args = ["keys", "create", "--name", "hooks", "--plan", "enterprise", "--role", "writer"]
    args.append("--json")
    results: list[Result] = []
    runner = threading.Thread(
        target=lambda: results.append(CliRunner().invoke(cli, [*args, "--db", str(server.db)]))
    )
    runner.start()
    runner.join(60)
    [done] = results
    assert done.exit_code == 0, (done.output, done.exception)
    return str(json.loads(done.stdout)["key"])


@pytest.fixture
def start(
    tmp_path: Path, http_sink: HTTPSink
) -> Iterator[Callable[..., tuple[InProcessReceiver, Client, FakeClock]]]:
    """start(schedule, disable_after): the app on a fake clock, its owner's key's client."""
    running: list[InProcessReceiver] = []

    def _start(schedule: str, disable_after: float) -> tuple[InProcessReceiver, Client, FakeClock]:
        clock = FakeClock()
        server = InProcessReceiver(
            tmp_path,
            HEALTH_RULES.format(url=http_sink.json_url("/owner")),
            clock,
            webhook_allow_private=True,
            webhook_allow_http=True,
            webhook_timeout=5,
            webhook_schedule=schedule,
            webhook_disable_after=disable_after,
        ).start()
        running.append(server)
        return server, Client(server, _key(server)), clock  # type: ignore[arg-type]

    yield _start
    for server in running:
        server.stop()


def _told(sink: HTTPSink) -> list[dict[str, Any]]:
    return [r.json for r in sink.requests if r.path == "/owner"]


def _run(
    server: InProcessReceiver,
    api: Client,
    clock: FakeClock,
    hook: dict[str, Any],
    healthy: HTTPSink,
    until: float,
) -> list[tuple[float, str]]:
    """Move the clock a minute at a time, an event every ten minutes, until the hook is
    disabled or until seconds passed; each change of its health seen and when. Every
    event reaches the healthy subscriber before the clock moves on: at once, dead one or
    not."""
    start, sent = clock.now, 0
    changes: list[tuple[float, str]] = [(0.0, "healthy")]
    while clock.now - start < until:
        if (clock.now - start) % EVENT_EVERY == 0:
            server.send(score(f"evt_c{sent}"))
            sent += 1
            eventually(lambda n=sent: len(healthy.requests) >= n, f"event {sent} delivered")
        clock.advance(STEP)
        server.wait_sent()
        health = api.get(hook["id"])["health"]
        if health != changes[-1][1]:
            changes.append((clock.now - start, health))
        if health == "disabled":
            break
    assert len(healthy.requests) == sent  # each once
    return changes


def test_an_hour_of_500s_is_failing_at_the_5th_then_disabled_at_the_limit(
    start: Callable[..., tuple[InProcessReceiver, Client, FakeClock]], http_sink: HTTPSink
) -> None:
    server, api, clock = start("60,120,300,600,1200,1800", HOUR)
    with HTTPSink() as dead, HTTPSink() as healthy:
        dead.fail_with(500)
        hook = api.add(f"{dead.url}/in", ["score.drop"])
        api.add(f"{healthy.url}/in", ["score.drop"])
        began = clock.now
        changes = _run(server, api, clock, hook, healthy, 3 * HOUR)
        assert [h for _, h in changes] == ["healthy", "failing", "disabled"]
        # Disabled at the first failed probe after an hour of failing (the next probe is
        # at most the schedule's last delay, 1800 s and its jitter, after the hour).
        assert HOUR <= changes[2][0] <= HOUR + 1800 * 1.1 + STEP
        shown = api.get(hook["id"])
        assert shown["status"] == "disabled" and "failing since" in shown["statusReason"]
        assert shown["lastError"].startswith("HTTP 500")
        since = datetime.fromisoformat(shown["failingSince"]).timestamp()
        assert abs(since - began) < 1  # the first failure, the first event's first attempt

        eventually(lambda: len(_told(http_sink)) >= 2, "the owner told twice")
        told = _told(http_sink)
        assert [t["title"] for t in told] == [
            f"webhook.failing {hook['id']} of hooks",
            f"webhook.disabled {hook['id']} of hooks",
        ]  # each change once, in order
        assert told[0]["message"].startswith("failing after 5 failures: HTTP 500")
        assert told[1]["message"].startswith("disabled after ")
        attempts = len(dead.requests)
        clock.advance(HOUR)  # disabled: nothing more is sent to it, its waiting rows cancelled
        server.wait_sent()
        assert len(dead.requests) == attempts


def test_an_hour_of_fewer_than_5_failures_is_failing_too(
    start: Callable[..., tuple[InProcessReceiver, Client, FakeClock]], http_sink: HTTPSink
) -> None:
    # Three attempts of one delivery, 35 minutes apart: the third fails over an hour after
    # the first, with 3 failures in a row.
    server, api, clock = start("2100,2100", 3 * HOUR)
    with HTTPSink() as dead, HTTPSink() as healthy:
        dead.fail_with(500)
        hook = api.add(f"{dead.url}/in", ["score.recover"])
        api.add(f"{healthy.url}/in", ["score.drop"])
        server.send(score("evt_r0", "score.recover"))
        changes = _run(server, api, clock, hook, healthy, 2 * HOUR)
        assert [h for _, h in changes] == ["healthy", "failing"]
        assert HOUR <= changes[1][0] <= 2 * 2100 * 1.1 + STEP
        eventually(lambda: _told(http_sink), "the owner told")
        [told] = _told(http_sink)
        assert told["message"].startswith("failing after 3 failures: HTTP 500")
