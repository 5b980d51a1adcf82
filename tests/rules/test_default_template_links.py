"""The built-in templates carry the one-click action links: a rule with no title or body on
the real server (RECEIVER_PUBLIC_URL set) sends a message whose Ack, Snooze and Resolve
links work; every resolved message, of an event that closes the alert or of an operator's
resolve (a link, the CLI), names its page."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from receiver.events import sample
from tests.harness import Receiver, eventually
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{url}"
rules:
  - name: drop
    match: {{type: score.drop}}
    notify: hook
    resolve: true
"""


@pytest.fixture
def server(tmp_path: Path, http_sink: HTTPSink) -> Iterator[Receiver]:
    found = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url()))
    found.env["RECEIVER_PUBLIC_URL"] = found.url
    found.start()
    try:
        yield found
    finally:
        found.stop()


def link(message: str, name: str) -> str:
    found = re.search(rf"^{name}: (\S+)$", message, re.MULTILINE)
    assert found is not None, f"no {name} link in:\n{message}"
    return found.group(1)


def test_a_default_template_message_carries_working_action_links(
    server: Receiver, http_sink: HTTPSink
) -> None:
    server.send(sample("score.drop", id="e1", sessionId="sess_1", score=12))
    [first] = http_sink.wait_for(1)
    message = first.json["message"]
    assert message.startswith("user user_42, session sess_1\nscore 12")  # the default body
    ack, snooze, resolve = (link(message, n) for n in ("Ack", "Snooze 1h", "Resolve"))
    assert all(u.startswith(f"{server.url}/act/") for u in (ack, snooze, resolve))
    assert link(message, "Alert") == f"{server.url}/admin/alerts/session:sess_1"

    assert "Acknowledge session:sess_1?" in httpx.get(ack).text
    assert "session:sess_1 snoozed for 1h" in httpx.post(snooze).text
    assert "session:sess_1 acknowledged" in httpx.post(ack).text
    assert "Resolved" in httpx.post(resolve).text
    rows = server.query("SELECT action, outcome FROM alert_actions ORDER BY id")
    assert rows == [("snooze", "done"), ("ack", "done"), ("resolve", "done")]

    def resolved() -> list[str]:
        return [r.json["message"] for r in http_sink.requests if "resolved" in r.json["title"]]

    [by_link] = eventually(resolved, "the resolved message of the resolve link")
    assert "ended by link (link)" in by_link and "/act/" not in by_link
    assert link(by_link, "Alert") == f"{server.url}/admin/alerts/session:sess_1"

    # An episode closed by its event: the resolved message names the alert's page, and
    # has nothing left to act on.
    server.send(sample("score.drop", id="e2", sessionId="sess_1", score=10))
    eventually(lambda: len(http_sink.requests) >= 3, "the second episode's message")
    server.send(sample("score.recover", id="e3", sessionId="sess_1", score=60))
    closing = eventually(lambda: resolved()[1:], "the resolved message of score.recover")[0]
    assert "ended by score.recover" in closing
    assert link(closing, "Alert") == f"{server.url}/admin/alerts/session:sess_1"
    assert "/act/" not in closing

    # Resolved from the CLI (RECEIVER_PUBLIC_URL in its environment): the page too.
    server.send(sample("score.drop", id="e4", sessionId="sess_1", score=10))
    eventually(lambda: len(http_sink.requests) >= 5, "the third episode's message")
    out = server.cli("alerts", "resolve", "session:sess_1")
    assert out.returncode == 0, out.stderr
    by_cli = eventually(lambda: resolved()[2:], "the resolved message of the CLI's resolve")[0]
    assert "(cli)" in by_cli
    assert link(by_cli, "Alert") == f"{server.url}/admin/alerts/session:sess_1"


def test_without_a_public_url_the_default_message_has_no_links(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    event = sample("score.drop", id="e1", sessionId="sess_1", score=12)
    found = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url())).start()
    try:
        found.send(event)
        [first] = http_sink.wait_for(1)
    finally:
        found.stop()
    message = first.json["message"]
    assert message.endswith(f"event e1 at {event['timestamp']}")
    assert "Ack" not in message and "/act/" not in message


def test_deliveries_json_shows_the_stored_message_without_its_tokens(
    server: Receiver, http_sink: HTTPSink
) -> None:
    """The outbox keeps the body as sent, live tokens included (docs/SECURITY.md says
    so); `receiver deliveries --json` prints it with each token as /act/***."""
    server.send(sample("score.drop", id="e1", sessionId="sess_1", score=12))
    [sent] = http_sink.wait_for(1)
    token = link(sent.json["message"], "Ack").rsplit("/", 1)[1]
    [(stored,)] = server.query("SELECT body FROM outbox WHERE rule = 'drop'")
    assert token in stored
    out = server.cli("deliveries", "--json")
    assert out.returncode == 0, out.stderr
    [row] = [json.loads(line) for line in out.stdout.splitlines()]
    assert f"Ack: {server.url}/act/***\n" in row["body"]
    assert "/act/***" not in row["title"] and token not in out.stdout
