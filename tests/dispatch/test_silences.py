"""Silences and quiet hours that end well, end to end (the real app under uvicorn, a real
SQLite file, an HTTP sink, a clock the test drives): an alert still open that was silenced
or muted when it opened is notified once when that ends ("was silenced since ..."), and its
escalation starts then; an alert resolved while silenced sends nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from tests.dispatch.test_lifecycle import event, quiet
from tests.harness import FakeClock, InProcessReceiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{url}"
escalations:
  page:
    steps:
      - notify: [hook]
rules:
  - name: drop
    match: {{type: score.drop, sessionId: "s*"}}
    notify: hook
    resolve: true
{extra}
  - name: deep
    match: {{type: score.drop, sessionId: "deep*"}}
    escalate: page
    title: "paged {{{{ sessionId }}}}"
{extra}
"""
QUIET = '    active: {days: [mon, tue, wed, thu, fri, sat, sun], hours: "09:00-17:00", tz: UTC}'


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time())  # silences are written with the wall clock by the CLI


@pytest.fixture
def server(tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest) -> Iterator[Any]:
    extra = getattr(request, "param", "")
    found = InProcessReceiver(
        tmp_path, RULES.format(url=request.getfixturevalue("http_sink").json_url(), extra=extra),
        clock,
    ).start()  # fmt: skip
    try:
        yield found
    finally:
        found.stop()


def silence(server: InProcessReceiver, match: str) -> int:
    out = CliRunner().invoke(
        cli,
        ["silence", "add", "--db", str(server.db), "--match", match, "--for", "1h",
         "--reason", "deploy"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    return int(out.output.split()[1].lstrip("#"))


TITLE = "[drop] score.drop for s1"


def titles(sink: HTTPSink) -> list[str]:
    return [r.json["title"] for r in sink.requests]


def test_a_silenced_alert_still_open_is_notified_once_when_the_silence_expires(
    server: InProcessReceiver, clock: FakeClock, http_sink: HTTPSink
) -> None:
    silence(server, "userId=user_42")
    clock.now = time.time() + 1  # the events come after the silence began
    server.send(event("score.drop", "e1", 0, session="s1"))  # stays open
    server.send(event("score.drop", "e2", 0, session="s2"))  # resolves while silenced
    server.send(event("score.drop", "e3", 0, session="deep1"))  # escalates
    server.wait_routed(3)
    server.send(event("score.recover", "e4", 1, session="s2"))
    server.wait_routed(4)
    clock.advance(30 * 60)
    quiet(http_sink, 0)  # still silenced: nothing

    clock.advance(31 * 60)  # the silence expired
    http_sink.wait_for(2)
    got = quiet(http_sink, 2)
    by_title = {r.json["title"]: r.json["message"] for r in got}
    assert set(by_title) == {TITLE, "paged deep1"}
    for message in by_title.values():
        assert "was silenced since" in message
    assert not any("s2" in t for t in titles(http_sink))  # resolved while silenced: nothing
    clock.advance(3600)
    quiet(http_sink, 2)  # once, not again


def test_removing_a_silence_wakes_what_it_held(
    server: InProcessReceiver, clock: FakeClock, http_sink: HTTPSink
) -> None:
    number = silence(server, "sessionId=s1")
    clock.now = time.time() + 1
    server.send(event("score.drop", "e1", 0, session="s1"))
    server.wait_routed(1)
    quiet(http_sink, 0)
    out = CliRunner().invoke(cli, ["silence", "expire", "--db", str(server.db), str(number)])
    assert out.exit_code == 0, out.output
    clock.advance(1)
    [sent] = http_sink.wait_for(1)
    assert "was silenced since" in sent.json["message"]
    quiet(http_sink, 1)


@pytest.mark.parametrize("server", [QUIET], indirect=True)
def test_quiet_hours_ending_notify_once_and_start_the_escalation(
    server: InProcessReceiver, clock: FakeClock, http_sink: HTTPSink
) -> None:
    day = datetime.fromtimestamp(clock.now, UTC).replace(hour=8, minute=0, second=0)
    clock.now = day.timestamp() + 86400  # 08:00 tomorrow: quiet until 09:00
    clock.advance(0)
    server.send(event("score.drop", "e1", 0, session="s1"))
    server.send(event("score.drop", "e2", 0, session="deep1"))
    server.wait_routed(2)
    quiet(http_sink, 0)
    clock.advance(3600)  # 09:00
    got = http_sink.wait_for(2)
    assert all("was muted since" in r.json["message"] for r in got), [r.json for r in got]
    quiet(http_sink, 2)
