"""The ntfy channel end to end: the real server under uvicorn (RECEIVER_PUBLIC_URL set),
on SQLite and PostgreSQL, publishing to the ntfy stand-in (tests/ntfy_server.py).

A drop posts one notification with its buttons; the escalation's next step replaces it
(the same sequence id: still one notification on the phone); the recover replaces it
with the resolved message and clears it. The phone's buttons are pressed as the ntfy app
does (a POST of the action's URL, empty body, no cookie): Ack acks, Snooze snoozes, each
answering 2xx and dismissing the notification; pressed again, nothing is applied and the
answer is not 2xx. RECEIVER_NTFY_SEQUENCE=off publishes without sequence ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver.events import sample
from receiver.notify.episodes import key_of
from tests.harness import Receiver, eventually
from tests.ntfy_server import NtfyStandIn

pytestmark = pytest.mark.e2e

TOKEN = "tk_e2e0123456789abcdefghijklmn"
RULES = """
notifiers:
  phone: "{phone}"
escalations:
  wake:
    steps:
      - notify: [phone]
      - after: {step}
        notify: [phone]
rules:
  - name: drop
    match: {{type: score.drop}}
    escalate: wake
    title: "drop {{{{ sessionId }}}}"
    body: "score {{{{ score }}}}"
"""


@pytest.fixture
def ntfy() -> Iterator[NtfyStandIn]:
    with NtfyStandIn(token=TOKEN) as server:
        yield server


def start(tmp: Path, ntfy: NtfyStandIn, step: str, db: str | None = None, **env: str) -> Receiver:
    url = ntfy.url("oncall", scheme="ntfy", query=f"token={TOKEN}")
    server = Receiver(tmp, rules=RULES.format(phone=url, step=step), db=db)
    server.env["RECEIVER_PUBLIC_URL"] = server.url
    server.env.update(env)
    return server.start()


def of(ntfy: NtfyStandIn, session: str) -> list[dict[str, Any]]:
    return [p.json for p in ntfy.published if p.json["title"] == f"drop {session}"]


def alert(server: Receiver, alert_id: str) -> dict[str, Any]:
    out = server.cli("alerts", "--json")
    assert out.returncode == 0, out.stderr
    [found] = [a for a in json.loads(out.stdout) if a["id"] == alert_id]
    return dict(found)


def test_one_notification_an_episode_replaced_by_each_step_and_cleared_on_recover(
    tmp_path: Path, ntfy: NtfyStandIn, receiver_db: str | None
) -> None:
    server = start(tmp_path, ntfy, "1s", receiver_db)
    try:
        server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
        [first, second] = eventually(lambda: of(ntfy, "s1")[1:] and of(ntfy, "s1"), "step 2")
        key = key_of("session:s1", 1)
        assert first["topic"] == "oncall" and first["priority"] == 5
        assert first["tags"] == ["rotating_light"]
        assert first["message"] == "score 8\nescalation wake: step 1 of 2"
        assert first["sequence_id"] == second["sequence_id"] == key
        assert first["click"] == f"{server.url}/admin/alerts/session:s1"
        labels = [(a["action"], a["label"]) for a in first["actions"]]
        assert labels == [("http", "Ack"), ("http", "Snooze 1h"), ("view", "Open")]
        for button in first["actions"][:2]:
            assert button["url"].startswith(f"{server.url}/act/")
            assert (button["method"], button["clear"]) == ("POST", True)
        assert all(p.headers["Authorization"] == f"Bearer {TOKEN}" for p in ntfy.published)
        [shown] = ntfy.phone()  # two messages, one notification
        assert (shown.key, len(shown.messages)) == (key, 2)

        server.send(sample("score.recover", id="e2", sessionId="s1", score=70))
        eventually(lambda: ntfy.cleared, "the clear")
        assert ntfy.cleared == [("oncall", key)]
        resolved = ntfy.published[-1].json
        assert resolved["sequence_id"] == key and "actions" not in resolved
        assert resolved["priority"] == 3 and resolved["tags"] == ["white_check_mark"]
        assert resolved["message"].endswith("Resolved.")
        assert ntfy.phone() == []  # dismissed
        # The clear reached ntfy before the worker recorded the send that made it.
        query = "SELECT channel, state FROM outbox WHERE kind != 'webhook'"
        eventually(
            lambda: {state for _, state in server.query(query)} == {"delivered"},
            "every row recorded delivered",
        )
        rows = server.query(query)
        assert rows and set(rows) == {("ntfy", "delivered")}
        assert server.metric("receiver_outbox_pending", 'channel="ntfy"') == 0
        assert TOKEN not in server.logs()
    finally:
        server.stop()


def test_pressing_ack_and_snooze_as_the_phone_does(tmp_path: Path, ntfy: NtfyStandIn) -> None:
    server = start(tmp_path, ntfy, "10m")
    try:
        server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
        server.send(sample("score.drop", id="e2", sessionId="s2", score=9))
        eventually(lambda: of(ntfy, "s1") and of(ntfy, "s2"), "both pages")
        assert len(ntfy.phone()) == 2
        [s1] = [s for s in ntfy.phone() if s.message["title"] == "drop s1"]
        [s2] = [s for s in ntfy.phone() if s.message["title"] == "drop s2"]

        first = s1.message  # the page pressed (s1 shows each later message of its sequence)
        acked = ntfy.press(s1, "Ack")
        assert acked.status_code == 200, acked.text
        assert alert(server, "session:s1")["acked"]["by"] == "link"
        snoozed = ntfy.press(s2, "Snooze 1h")
        assert snoozed.status_code == 200, snoozed.text
        # Each 2xx dismissed its notification; then each action's update replaces it (the
        # same sequence id) for every phone on the topic: it says what was done, and the
        # ack's has no Ack button left.
        shown = eventually(lambda: ntfy.phone()[1:] and ntfy.phone(), "the two updates")
        said = {s.key: s.message for s in shown}
        assert said[s1.key]["title"] == "session:s1 acknowledged by link"
        assert [a["label"] for a in said[s1.key]["actions"]] == ["Open"]
        assert "Acknowledged by link at" in said[s1.key]["message"]
        assert said[s2.key]["title"].startswith("session:s2 snoozed by link until ")
        assert "Snoozed until" in said[s2.key]["message"]
        actions = server.query("SELECT alert, action, source, outcome FROM alert_actions")
        assert sorted(actions) == [
            ("session:s1", "ack", "link", "done"),
            ("session:s2", "snooze", "link", "done"),
        ]

        # Pressed again (a second phone, or a retry): nothing applied, not a 2xx, so the
        # app keeps the notification and shows the error.
        again = ntfy.press(first, "Ack")
        assert again.status_code == 409 and "action_not_applied" in again.text
        assert ntfy.press(first, "Snooze 1h").status_code == 409  # acked already
    finally:
        server.stop()


def test_sequence_off_publishes_every_message_on_its_own(tmp_path: Path, ntfy: NtfyStandIn) -> None:
    server = start(tmp_path, ntfy, "1s", RECEIVER_NTFY_SEQUENCE="off")
    try:
        server.send(sample("score.drop", id="e1", sessionId="s1", score=8))
        eventually(lambda: of(ntfy, "s1")[1:], "step 2")
        server.send(sample("score.recover", id="e2", sessionId="s1", score=70))
        eventually(lambda: len(ntfy.published) >= 3, "the resolved message")
        assert all("sequence_id" not in p.json for p in ntfy.published)
        assert [m for m, _, _ in ntfy.requests] == ["POST"] * len(ntfy.requests)
        assert len(ntfy.phone()) == len(ntfy.published)  # each a notification of its own
        assert "actions" in ntfy.published[0].json  # the buttons work on any version
    finally:
        server.stop()
