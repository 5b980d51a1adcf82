"""`receiver replay` and `receiver explain` against a real server: what they say is what the
server sends (a real SQLite file, a real HTTP sink catching the notifications)."""

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

WAIT = "20"  # generous: the server looks for replays every few seconds, on a busy machine


def ago(minutes: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def score(kind: str, event_id: str, minutes_ago: float, value: int) -> dict[str, object]:
    return {
        "id": event_id,
        "type": kind,
        "sessionId": "sess_1",
        "userId": "user_42",
        "score": value,
        "threshold": 40,
        "timestamp": ago(minutes_ago),
    }


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def titles(sink: HTTPSink) -> list[str]:
    return [r.json["title"] for r in sink.requests]


def quiet(sink: HTTPSink, count: int, seconds: float = 0.5) -> None:
    time.sleep(seconds)
    assert len(sink.requests) == count, titles(sink)


@pytest.fixture
def paging(tmp_path: Path, http_sink: HTTPSink) -> Iterator[Receiver]:
    """A server with one lifecycle rule (resolve: true) that has paged about a drop, then
    sent the all-clear for its recover: e1 (drop) is no longer the newest of its session."""
    rules = f"""
notifiers:
  hook: "{http_sink.json_url()}"
rules:
  - name: page
    match: {{type: score.drop}}
    notify: hook
    title: "dropped {{{{ sessionId }}}}"
    resolve: true
"""
    server = Receiver(tmp_path, rules=rules).start()
    try:
        assert server.send(score("score.drop", "e1", 20, 12)).status_code == 202
        http_sink.wait_for(1)
        assert server.send(score("score.recover", "e2", 10, 55)).status_code == 202
        http_sink.wait_for(2)
        assert titles(http_sink) == ["dropped sess_1", "[page] resolved: sess_1"]
        yield server
    finally:
        if server.proc is not None:
            server.stop()


def test_replay_of_an_older_event_sends_it_marked_as_a_replay(
    paging: Receiver, http_sink: HTTPSink
) -> None:
    code, out = invoke("replay", "--db", str(paging.db), "e1", "--wait", WAIT)
    assert code == 0, out
    assert "replay #1 of e1 (sent regardless of the lifecycle): 1 notification" in out
    assert "sent      page -> hook[0]: [replay] dropped sess_1" in out
    assert titles(http_sink)[2] == "[replay] dropped sess_1"
    code, out = invoke("deliveries", "--db", str(paging.db), "--event", "e1", "--json")
    assert '"replay": 1' in out and '"title": "[replay] dropped sess_1"' in out


def test_replay_respecting_the_lifecycle_says_what_was_not_sent_and_why(
    paging: Receiver, http_sink: HTTPSink
) -> None:
    args = ("replay", "--db", str(paging.db), "e1", "--respect-lifecycle", "--wait", WAIT)
    code, out = invoke(*args)
    assert code == 0, out
    assert "(respecting the lifecycle): 1 notification" in out
    assert re.search(r"not sent  page -> hook\[0\]: stale: alert already at \S+", out), out
    quiet(http_sink, 2)


def test_replay_of_the_closing_event_sends_its_resolved_message_again(
    paging: Receiver, http_sink: HTTPSink
) -> None:
    code, out = invoke("replay", "--db", str(paging.db), "e2", "--wait", WAIT)
    assert code == 0, out
    assert "sent      page -> hook[0] (resolved): [replay] [page] resolved: sess_1" in out
    assert titles(http_sink)[2] == "[replay] [page] resolved: sess_1"
    quiet(http_sink, 3)


def test_replay_without_a_running_server_says_so_and_exits_3(paging: Receiver) -> None:
    paging.stop()
    code, out = invoke("replay", "--db", str(paging.db), "e1", "--wait", "0.5")
    assert code == 3
    assert out == (
        "replay #1 of e1 queued; no running server routed it within 0.5s:"
        " it will be routed when one starts\n"
    )
    code, out = invoke("replay", "--db", str(paging.db), "nope")
    assert code == 1 and "no stored event with id 'nope'" in out


def test_explain_counts_what_the_server_sends_for_a_closing_event(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    """Three rules notify about a drop; its recover sends one plain notification and three
    resolved messages (one rule's notifier has two urls): 4, and explain says 4."""
    rules = f"""
notifiers:
  hook: ["{http_sink.json_url("/a")}", "{http_sink.json_url("/b")}"]
  team: "{http_sink.json_url("/c")}"
rules:
  - name: forward-all
    notify: team
    continue: true
  - name: deep
    match: {{type: score.drop, score: {{lt: 20}}}}
    notify: team
    resolve: true
    continue: true
  - name: page
    match: {{type: score.drop}}
    notify: hook
    resolve: true
  - name: never-reached
    match: {{type: score.drop}}
    notify: hook
    resolve: true
"""
    server = Receiver(tmp_path, rules=rules).start()
    try:
        server.send(score("score.drop", "e1", 20, 12))
        http_sink.wait_for(4)
        quiet(http_sink, 4)
        recover = ("--type", "score.recover", "--session", "sess_1", "--id", "e2")
        recover += ("--timestamp", ago(10), "--rules", str(server.rules))
        code, out = invoke("explain", *recover, "--db", str(tmp_path / "none.db"))
        assert code == 0, out
        assert "result: 1 notification: forward-all -> team" in out
        assert "up to 3 resolved messages (4 notifications in all)" in out
        assert "   - deep -> team: [deep] resolved: sess_1" in out
        assert "only if that score.drop matched its conditions on score" in out
        assert "   - page -> hook (2 urls): [page] resolved: sess_1" in out
        assert "never-reached" not in out.split("resolved messages, if")[1]
        code, out = invoke("explain", *recover, "--db", str(server.db))
        assert code == 0, out
        assert "resolves it: 3 resolved messages: deep -> team, page -> hook (2 urls)" in out
        http_sink.clear()
        server.send(score("score.recover", "e2", 10, 55))
        http_sink.wait_for(4)
        quiet(http_sink, 4)
        assert sorted(r.path for r in http_sink.requests) == ["/a", "/b", "/c", "/c"]
    finally:
        server.stop()
