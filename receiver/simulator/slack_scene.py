"""`make demo`'s Slack scene: a message updated in place by an ack.

The receiver posts to a Slack Web API stand-in (receiver.simulator.slack_api) through its
Slack app channel. A deep drop of a demo session posts one message with Ack, Resolve and
Snooze 1h; the demo prints it, clicks Ack the way Slack delivers a click (the signed
block_actions payload to POST /slack/interactivity), and prints the same message again:
updated in place, acknowledged, by whom and when, with only Resolve left.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Protocol

import httpx
from rich.markup import escape

from receiver import signature
from receiver.events import sample
from receiver.simulator.slack_api import Message, SlackAPI, click, signed

TOKEN = "xoxb-demo-stand-in"  # exists only in this run, between the receiver and the stand-in
SIGNING = "demo-signing-secret"
NOTIFIER = '  slack-app: "slack-app://#alerts"\n'
RULE = """\
  - name: slack-app
    match:
      type: score.drop
      sessionId: "demo_slack_*"
    notify: [slack-app]
    resolve: true  # an alert: one message per episode, with buttons
    title: "{{ userId }} dropped to {{ score }}"
    body: "{{ sessionId }} needs someone."
"""


class Stage(Protocol):
    secret: str

    def say(self, what: str, text: str, style: str = "") -> None: ...
    @property
    def receiver_url(self) -> str: ...
    @property
    def console(self) -> Any: ...
    @property
    def slack(self) -> SlackAPI: ...


def rules(text: str) -> str:
    """The demo's rules file with the Slack app's notifier and rule put first."""
    text = text.replace("notifiers:\n", "notifiers:\n" + NOTIFIER, 1)
    return text.replace("rules:\n", "rules:\n" + RULE, 1)


def env(api: SlackAPI) -> dict[str, str]:
    """The receiver's Slack settings, pointing at the stand-in."""
    return {
        "RECEIVER_SLACK_BOT_TOKEN": TOKEN,
        "RECEIVER_SLACK_SIGNING_SECRET": SIGNING,
        "RECEIVER_SLACK_API_URL": api.url,
    }


def stand_in() -> SlackAPI:
    return SlackAPI(token=TOKEN).start()


async def play(demo: Stage, timeout: float = 30.0) -> dict[str, str]:
    """Run the scene; what happened, for the summary."""
    api = demo.slack
    session = f"demo_slack_{uuid.uuid4().hex[:6]}"
    event = sample("score.drop", sessionId=session, userId="user_slack", score=7)
    body = json.dumps(event).encode()
    headers = {signature.SIGNATURE_HEADER: signature.sign(demo.secret.encode(), body)}
    async with httpx.AsyncClient(timeout=10) as client:
        await client.post(f"{demo.receiver_url}/v1/events", content=body, headers=headers)
        demo.say("slack", f"a deep drop of {session}: the Slack app posts", "blue")
        message = await _until(lambda: _posted(api, session), timeout)
        _show(demo, api, message, "the message as posted")
        payload = click(message, "ack", user="U0ADA", name="ada")
        body, headers = signed(payload, SIGNING)
        answer = await client.post(
            f"{demo.receiver_url}/slack/interactivity", content=body, headers=headers
        )
        demo.say("slack", f"ada clicks Ack -> HTTP {answer.status_code}", "blue")
        await _until(lambda: "Acknowledged" in api.render(message), timeout)
    _show(demo, api, message, f"the same message (ts {message.ts}), updated in place")
    posted = len([m for m in api.messages() if session in api.render(m)])
    return {session: f"{posted} message, {message.edits} edits, acked"}


def _posted(api: SlackAPI, session: str) -> Message | None:
    found = [m for m in api.messages() if session in api.render(m)]
    return found[0] if found else None


def _show(demo: Stage, api: SlackAPI, message: Message, what: str) -> None:
    demo.say("slack", what, "blue")
    for line in api.render(message).splitlines():
        demo.console.print(f"            [blue]│[/blue] {escape(line)}", highlight=False)


async def _until(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise TimeoutError("the Slack scene's message did not change in time")
