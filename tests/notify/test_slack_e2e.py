"""The Slack app channel end to end: the real server under uvicorn posts through the real
slack_sdk client to a Slack Web API stand-in (receiver.simulator.slack_api), following
Slack's documented answers. A drop posts one message with buttons; an escalation step
updates it in place and replies in its thread; a recover resolves it (its buttons go)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from receiver.events import sample
from receiver.simulator.slack_api import Message, SlackAPI
from tests.harness import Receiver, eventually

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


def slack_receiver(tmp_path: Path, slack: SlackAPI, rules: str = RULES, **env: str) -> Receiver:
    server = Receiver(tmp_path, rules=rules.format(step=STEP))
    server.env.update(
        RECEIVER_SLACK_BOT_TOKEN=TOKEN,
        RECEIVER_SLACK_SIGNING_SECRET=SIGNING,
        RECEIVER_SLACK_API_URL=slack.url,
        RECEIVER_PUBLIC_URL=server.url,
        **env,
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
        eventually(lambda: message.replies, "step 2's reply in the thread")
        assert len(slack.messages()) == 1 and message.edits >= 1
        assert "drop s1" in message.replies[0].text
        assert slack.called("chat.postMessage")[-1].args["thread_ts"] == message.ts

        server.send(sample("score.recover", id="e2", sessionId="s1", score=70))
        eventually(lambda: "Resolved" in slack.render(message), "the resolved message")
        assert buttons(message) == [] and len(slack.messages()) == 1
        assert "resolved" in message.replies[-1].text.lower()
        # Every call carried the bot token; none the signing secret.
        assert {c.token for c in slack.calls} == {TOKEN}
        assert SIGNING not in server.logs() and TOKEN not in server.logs()
    finally:
        server.stop()
