"""`make demo`'s last scene: one escalation, and an ack link followed.

Two deep drops of demo sessions page Slack at once (step 1 of the demo's `wake-someone`
policy). The second one's message carries a signed ack link (RECEIVER_PUBLIC_URL is set):
the demo opens it as a mail scanner would (GET: a confirmation page, nothing changes), then
presses its button (POST: acknowledged, no sign-in). A few seconds later step 2 mails the
first drop's alert to the lead; the acknowledged one's never comes.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from receiver import signature
from receiver.events import sample

STEP = 4  # seconds between the policy's two steps in the demo

# Put first in the demo's rules: the demo's own sessions escalate, live traffic does not.
RULES = """\
escalations:
  wake-someone:
    steps:
      - notify: [slack]
      - after: {step}s
        notify: [email]
rules:
  - name: escalate
    match:
      type: score.drop
      sessionId: "demo_escalation_*"
    escalate: wake-someone
    title: "Paging: {{{{ sessionId }}}} dropped to {{{{ score }}}}"
    body: |
      {{{{ userId }}}} needs someone.
      {{% if links.ack %}}Acknowledge: {{{{ links.ack }}}}{{% endif %}}
"""


class Stage(Protocol):
    """What the scene needs of the demo: its say(), the sink's messages, the receiver."""

    secret: str

    def say(self, what: str, text: str, style: str = "") -> None: ...
    def messages(self) -> list[tuple[str, dict[str, Any]]]: ...
    @property
    def receiver_url(self) -> str: ...


async def play(demo: Stage, timeout: float = 30.0) -> dict[str, str]:
    """Run the scene; what happened to each of the two alerts, for the summary."""
    run = uuid.uuid4().hex[:6]
    first, second = f"demo_escalation_{run}_1", f"demo_escalation_{run}_2"
    async with httpx.AsyncClient(timeout=10) as client:
        for session in (first, second):
            event = sample("score.drop", sessionId=session, userId="user_on_call", score=9)
            body = json.dumps(event).encode()
            headers = {signature.SIGNATURE_HEADER: signature.sign(demo.secret.encode(), body)}
            await client.post(f"{demo.receiver_url}/v1/events", content=body, headers=headers)
        demo.say("escalate", f"two deep drops: {first}, {second}", "magenta")
        paged = await _wait(demo, lambda c, t: c == "slack" and second in t, timeout)
        demo.say("escalate", "step 1 paged slack for both", "magenta")
        found = re.search(r"Acknowledge: (\S+)", str(paged.get("message", "")))
        if found is None:
            return {"escalation": "no ack link in the message (is RECEIVER_PUBLIC_URL set?)"}
        link = found.group(1)
        shown = await client.get(link)
        demo.say("ack link", f"GET /act/*** -> {shown.status_code}: a confirmation page", "magenta")
        done = await client.post(link)
        said = "acknowledged" if "cknowledged" in done.text else f"HTTP {done.status_code}"
        demo.say("ack link", f"POST /act/*** -> {done.status_code}: {said}", "magenta")
        mailed = await _wait(demo, lambda c, t: c == "email" and first in t, timeout + STEP)
        demo.say("escalate", f"step 2 after {STEP}s: email <- {mailed.get('title')}", "magenta")
    await asyncio.sleep(1.0)  # the acked one's step 2 would have come with the first's
    late = [t for c, m in demo.messages() if c == "email" and second in (t := str(m.get("title")))]
    return {
        first: f"not acknowledged: slack, then email after {STEP}s",
        second: "acknowledged by its link: slack only"
        if not late
        else "acknowledged, but step 2 came anyway",
    }


async def _wait(demo: Stage, match: Callable[[str, str], bool], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for channel, message in demo.messages():
            if match(channel, str(message.get("title", ""))):
                return message
        await asyncio.sleep(0.1)
    raise TimeoutError("the escalation scene's message did not arrive")
