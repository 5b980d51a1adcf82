"""Slack and ntfy together, end to end: the real server under uvicorn posts to the Slack
Web API stand-in (receiver.simulator.slack_api, through the real slack_sdk client) and
publishes to the ntfy stand-in (tests/ntfy_server.py). One alert episode has one Slack
message and one phone notification; an escalation step updates both; an action in one
place (a signed Slack click, a phone's POST to /act) updates the other place's message in
place, once; a recover resolves both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver.events import sample
from receiver.notify.episodes import key_of
from receiver.simulator.slack_api import Message, SlackAPI
from tests.harness import Receiver, eventually
from tests.notify.test_slack_e2e import SIGNING, TOKEN, buttons, click
from tests.ntfy_server import NtfyStandIn

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  chat: "slack-app://#alerts"
  phone: "{phone}"
escalations:
  wake:
    steps:
      - notify: [chat, phone]
      - after: 2s
        notify: [chat, phone]
      - after: 10m
        notify: [chat, phone]
rules:
  - name: drop
    match: {{type: score.drop}}
    escalate: wake
    title: "drop {{{{ sessionId }}}}"
    body: "score {{{{ score }}}}"
"""


@pytest.fixture
def both(
    tmp_path: Path, receiver_db: str | None
) -> Iterator[tuple[Receiver, SlackAPI, NtfyStandIn]]:
    """The server (on SQLite and PostgreSQL) with both stand-ins."""
    slack = SlackAPI(token=TOKEN).start()
    try:
        with NtfyStandIn() as ntfy:
            phone = ntfy.url("oncall", scheme="ntfy")
            server = Receiver(tmp_path, rules=RULES.format(phone=phone), db=receiver_db)
            server.env.update(
                RECEIVER_SLACK_BOT_TOKEN=TOKEN,
                RECEIVER_SLACK_SIGNING_SECRET=SIGNING,
                RECEIVER_SLACK_API_URL=slack.url,
                RECEIVER_PUBLIC_URL=server.url,
            )
            server.start()
            try:
                yield server, slack, ntfy
            finally:
                server.stop()
    finally:
        slack.stop()


def sent(ntfy: NtfyStandIn, session: str) -> list[dict[str, Any]]:
    key = key_of(f"session:{session}", 1)
    return [p.json for p in ntfy.published if p.json.get("sequence_id") == key]


def message_of(slack: SlackAPI, session: str) -> Message | None:
    """The session's Slack message, once posted (one at most)."""
    found = [m for m in slack.messages() if f"drop {session}" in slack.render(m)]
    assert len(found) <= 1, found
    return found[0] if found else None


def labels(published: dict[str, Any]) -> list[str]:
    return [a["label"] for a in published.get("actions", [])]


def test_an_action_in_one_place_updates_the_other_once_and_recover_resolves_both(
    both: tuple[Receiver, SlackAPI, NtfyStandIn],
) -> None:
    server, slack, ntfy = both
    server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
    # One Slack message, one phone notification; step 2 updates both.
    eventually(lambda: len(sent(ntfy, "s1")) >= 2, "step 2 on the phone")
    message = eventually(lambda: message_of(slack, "s1"), "the Slack message")
    eventually(lambda: message.replies, "step 2's reply in the Slack thread")
    assert len(slack.messages()) == 1 and message.edits >= 1
    assert len(ntfy.phone()) == 1 and labels(sent(ntfy, "s1")[-1]) == ["Ack", "Snooze 1h", "Open"]

    # Ack in Slack, signed as Slack signs: the chain stops, the phone's notification is
    # replaced (same sequence id) without Ack and says who.
    assert click(server, message, "ack") == 200
    eventually(lambda: "Acknowledged by <@U123>" in slack.render(message), "the Slack ack")
    chain = "SELECT next_at FROM escalations WHERE alert = 'session:s1'"
    eventually(lambda: server.query(chain) == [(None,)], "the chain to stop")
    acked = eventually(
        lambda: [p for p in sent(ntfy, "s1") if "Acknowledged by" in p["message"]], "the phone"
    )
    assert len(acked) == 1 and "Ack" not in labels(acked[0])
    assert "Acknowledged by <@U123> (ada) at" in acked[0]["message"]
    [shown] = ntfy.phone()
    assert shown.key == key_of("session:s1", 1) and shown.message is acked[0]
    updates = "SELECT channel, state FROM outbox WHERE kind = 'update' ORDER BY channel"
    eventually(lambda: {s for _, s in server.query(updates)} == {"delivered"}, "updates sent")
    assert server.query(updates) == [("ntfy", "delivered"), ("slack-app", "delivered")]

    # A phone's Ack (the POST to /act) on another alert updates its Slack message.
    server.send(sample("score.drop", id="e3", sessionId="s2", score=9))
    first = eventually(lambda: sent(ntfy, "s2"), "s2 on the phone")[0]
    other = eventually(lambda: message_of(slack, "s2"), "s2's Slack message")
    assert ntfy.press(first, "Ack").status_code == 200
    eventually(lambda: "Acknowledged by link" in slack.render(other), "the Slack update")
    assert buttons(other) == ["resolve", "open"]
    eventually(lambda: other.replies, "the ack's reply in the thread")
    assert other.replies[-1].text == "*session:s2 acknowledged by link*"

    # A recover resolves both: the Slack message says so with no buttons, ntfy cleared.
    server.send(sample("score.recover", id="e2", sessionId="s1", score=70))
    eventually(lambda: "Resolved" in slack.render(message), "the resolved Slack message")
    assert buttons(message) == []
    eventually(lambda: ("oncall", key_of("session:s1", 1)) in ntfy.cleared, "the ntfy clear")
    # Each action updated each message once.
    assert len(server.query("SELECT 1 FROM outbox WHERE kind = 'update'")) == 4
    assert len(slack.messages()) == 2
