"""Operators' actions on an alert (receiver.dispatch.actions) against the real app: ack stops
the repeats, resolve sends the resolved message to everyone notified, snooze puts repeats off
and notifies again when it ends; each is idempotent and recorded with its source."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver.dispatch import actions
from receiver.rules import load_file
from receiver.store import open_store
from receiver.store.records import Action
from tests.dispatch.test_lifecycle import T0, event, quiet, rules
from tests.harness import FakeClock, InProcessReceiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e
Start = Callable[[str], InProcessReceiver]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0.timestamp())


@pytest.fixture
def start(tmp_path: Path, clock: FakeClock) -> Iterator[Start]:
    running: list[InProcessReceiver] = []

    def _start(rules: str) -> InProcessReceiver:
        running.append(InProcessReceiver(tmp_path, rules, clock).start())
        return running[-1]

    yield _start
    for server in running:
        server.stop()


def act(
    server: InProcessReceiver, action: str, *, seconds: float | None = None, source: str = "api"
) -> actions.Outcome:
    async def go() -> actions.Outcome:
        store = open_store(str(server.db), clock=server.clock)
        await store.open()
        try:
            return await actions.perform(
                store,
                load_file(server.rules),
                "session:sess_1",
                action,
                source=source,
                by="ops",
                now=server.clock(),
                seconds=seconds,
            )
        finally:
            await store.close()

    return asyncio.run(go())


def recorded(server: InProcessReceiver) -> list[Action]:
    async def go() -> list[Action]:
        store = open_store(str(server.db))
        await store.open()
        try:
            return await store.alerts.actions(["session:sess_1"])
        finally:
            await store.close()

    return asyncio.run(go())


def test_ack_stops_the_repeats_and_a_second_ack_says_already(
    start: Start, clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    repeat: 1h\n"))
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(1)
    first = act(server, "ack")
    assert (first.result, first.message) == ("done", "session:sess_1 acknowledged")
    again = act(server, "ack", source="cli")
    assert again.result == "already" and "acknowledged already, by ops" in again.message
    clock.advance(3 * 3600)
    quiet(http_sink, 1)
    assert [(a.action, a.source, a.actor, a.outcome) for a in recorded(server)] == [
        ("ack", "api", "ops", "done"),
        ("ack", "cli", "ops", "already"),
    ]


def test_resolve_sends_the_resolved_message_once(
    start: Start, clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    resolve: true\n    repeat: 1h\n"))
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(1)
    clock.advance(300)
    done = act(server, "resolve")
    assert (done.result, done.message) == ("done", "session:sess_1 resolved")
    resolved = http_sink.wait_for(2)[1]
    assert resolved.json["title"] == "[drop] resolved: sess_1"
    assert "ended by ops (api)" in resolved.json["message"]
    assert "after 5m" in resolved.json["message"]
    again = act(server, "resolve")
    assert (again.result, again.message) == ("already", "session:sess_1 is resolved already")
    assert act(server, "ack").result == "already"
    clock.advance(2 * 3600)  # no repeat of a resolved alert
    quiet(http_sink, 2)
    # a recover arriving after the hand resolve sends nothing more
    server.send(event("score.recover", "e2", 10))
    server.wait_routed(2)
    quiet(http_sink, 2)


def test_a_snooze_puts_repeats_off_and_notifies_again_when_it_ends(
    start: Start, clock: FakeClock, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    resolve: true\n"))  # no repeat: only the snooze's end
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(1)
    snoozed = act(server, "snooze", seconds=1800)
    assert (snoozed.result, snoozed.message) == ("done", "session:sess_1 snoozed for 30m")
    clock.advance(1700)
    quiet(http_sink, 1)
    clock.advance(101)
    again = http_sink.wait_for(2)[1]
    assert again.json["title"] == "[still open] dropped sess_1"
    clock.advance(3600)
    quiet(http_sink, 2)  # once
    [action] = recorded(server)
    assert (action.action, action.until) == ("snooze", action.at + 1800)


def test_an_acked_alert_is_not_snoozed_and_an_unknown_one_is_missing(
    start: Start, http_sink: HTTPSink
) -> None:
    server = start(rules(http_sink, "    resolve: true\n"))
    server.send(event("score.drop", "e1", 0))
    http_sink.wait_for(1)
    act(server, "ack")
    assert act(server, "snooze").result == "already"

    async def unknown() -> Any:
        store = open_store(str(server.db))
        await store.open()
        try:
            return await actions.perform(
                store, None, "session:nope", "ack", source="api", by="ops", now=1.0
            )
        finally:
            await store.close()

    assert asyncio.run(unknown()).result == "missing"
