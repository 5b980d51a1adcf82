"""The Slack app channel end to end: the real server under uvicorn posts through the real
slack_sdk client to a Slack Web API stand-in (receiver.simulator.slack_api), following
Slack's documented answers. A drop posts one message with buttons; an escalation step
updates it in place and replies in its thread; a recover resolves it (its buttons go)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver.events import sample
from receiver.simulator.slack_api import Message, SlackAPI, signed
from receiver.simulator.slack_api import click as slack_click
from tests.harness import Receiver, eventually, http_client

pytestmark = pytest.mark.e2e

TOKEN = "xoxb-test-token-0123"
SIGNING = "slack-signing-secret-0123"
STEP = 2

RULES = """
notifiers:
  oncall: "slack-app://#alerts"
escalations:
  page-twice:
    steps:
      - notify: [oncall]
      - after: {step}s
        notify: [oncall]
rules:
  - name: deep-drop
    match: {{type: score.drop}}
    escalate: page-twice
    title: "drop {{{{ sessionId }}}}"
    body: "score {{{{ score }}}}"
"""


@pytest.fixture
def slack() -> Iterator[SlackAPI]:
    api = SlackAPI(token=TOKEN).start()
    try:
        yield api
    finally:
        api.stop()


def slack_receiver(
    tmp_path: Path, slack: SlackAPI, rules: str = RULES, db: str | None = None
) -> Receiver:
    server = Receiver(tmp_path, rules=rules.format(step=STEP), db=db)
    server.env.update(
        RECEIVER_SLACK_BOT_TOKEN=TOKEN,
        RECEIVER_SLACK_SIGNING_SECRET=SIGNING,
        RECEIVER_SLACK_API_URL=slack.url,
        RECEIVER_PUBLIC_URL=server.url,
    )
    return server


def buttons(message: Message) -> list[str]:
    return [
        str(e["action_id"]) for b in message.blocks if b["type"] == "actions" for e in b["elements"]
    ]


def test_one_message_per_episode_updated_in_place_and_resolved(
    tmp_path: Path, slack: SlackAPI
) -> None:
    server = slack_receiver(tmp_path, slack).start()
    try:
        server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
        [message] = eventually(slack.messages, "the first message")
        assert slack.render(message).startswith("*drop s1*")
        assert buttons(message) == ["ack", "resolve", "snooze", "open"]
        assert message.channel == "C0123ABCD"  # #alerts, as Slack answered
        # Step 2 of the chain: the same message, updated, and a reply in its thread.
        eventually(lambda: message.replies and message.edits >= 1, "step 2's edit and reply")
        assert len(slack.messages()) == 1
        assert "drop s1" in message.replies[0].text
        assert slack.called("chat.postMessage")[-1].args["thread_ts"] == message.ts

        server.send(sample("score.recover", id="e2", sessionId="s1", score=70))
        # The edit and the thread's reply are two calls: wait for both.
        eventually(
            lambda: (
                "Resolved" in slack.render(message)
                and "resolved" in message.replies[-1].text.lower()
            ),
            "the resolved message and its reply",
        )
        assert buttons(message) == [] and len(slack.messages()) == 1
        # Every call carried the bot token; none the signing secret.
        assert {c.token for c in slack.calls} == {TOKEN}
        assert SIGNING not in server.logs() and TOKEN not in server.logs()
    finally:
        server.stop()


PATIENT = RULES.replace("after: {step}s", "after: 10m")


def click(
    server: Receiver, message: Message | dict[str, Any], action: str = "", **headers: str
) -> int:
    """Post a click on message's button action (or the click payload given), signed."""
    payload = message if isinstance(message, dict) else slack_click(message, action)
    body, signed_headers = signed(payload, SIGNING)
    answer = http_client.post(
        f"{server.url}/slack/interactivity",
        content=body,
        headers={**signed_headers, **headers},
        timeout=10,
    )
    return answer.status_code


def test_a_click_on_ack_acks_stops_the_chain_and_shows_who(
    tmp_path: Path, slack: SlackAPI, receiver_db: str | None
) -> None:
    """On SQLite and PostgreSQL."""
    server = slack_receiver(tmp_path, slack, rules=PATIENT, db=receiver_db).start()
    try:
        server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
        [message] = eventually(slack.messages, "the first message")
        ack = slack_click(message, "ack")
        assert click(server, ack) == 200
        eventually(lambda: "Acknowledged by <@U123> at" in slack.render(message), "who acked")
        assert buttons(message) == ["resolve", "open"]
        eventually(lambda: message.replies, "the ack's reply in the thread")
        assert message.replies[0].text == "*session:s1 acknowledged by <@U123> (ada)*"
        acted = server.query("SELECT action, source, actor, outcome FROM alert_actions")
        assert acted == [("ack", "slack", "<@U123> (ada)", "done")]
        # The chain stops (the timers see the ack): step 2 can no longer fire.
        chain = "SELECT next_at FROM escalations WHERE alert = 'session:s1'"
        eventually(lambda: server.query(chain) == [(None,)], "the chain to stop")

        # Slack retries a delivery it thinks was lost: it acts once.
        assert click(server, ack, **{"X-Slack-Retry-Num": "1"}) == 200
        eventually(
            lambda: server.metric("receiver_slack_interactions_total", 'outcome="retried"'),
            "the retry counted",
        )
        assert len(server.query("SELECT 1 FROM alert_actions")) == 1

        # Resolved meanwhile: a click on the old buttons says so in the message.
        stale = Message(message.channel, message.ts, message.text, list(message.blocks))
        server.send(sample("score.recover", id="e2", sessionId="s1", score=70))
        eventually(lambda: "Resolved" in slack.render(message), "the resolved message")
        assert buttons(message) == []
        assert click(server, stale, "resolve") == 200
        eventually(lambda: "resolved already" in slack.render(message), "the note")
        assert buttons(message) == []
        assert server.metric("receiver_slack_interactions_total", 'outcome="done"') == 1
    finally:
        server.stop()


def test_snooze_then_resolve_from_slack_say_until_when_and_by_whom(
    tmp_path: Path, slack: SlackAPI
) -> None:
    server = slack_receiver(tmp_path, slack, rules=PATIENT).start()
    try:
        server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
        [message] = eventually(slack.messages, "the first message")
        assert click(server, message, "snooze") == 200
        eventually(lambda: "Snoozed until" in slack.render(message), "the snooze")
        [(action, until)] = server.query("SELECT action, until FROM alert_actions")
        assert action == "snooze" and until is not None
        eventually(lambda: message.replies, "the snooze's reply")
        assert message.replies[0].text.startswith("*session:s1 snoozed by <@U123> (ada) until ")
        assert buttons(message) == ["ack", "resolve", "snooze", "open"]

        assert click(server, message, "resolve") == 200
        eventually(lambda: "Resolved by <@U123>" in slack.render(message), "resolved by")
        [(state,)] = server.query("SELECT state FROM alerts WHERE id = 'session:s1'")
        assert state == "resolved" and buttons(message) == []
        # The resolved notification the action made goes to the thread, not a new message.
        eventually(lambda: len(message.replies) == 2, "the resolved reply")
        assert "resolved" in message.replies[1].text and len(slack.messages()) == 1
    finally:
        server.stop()
