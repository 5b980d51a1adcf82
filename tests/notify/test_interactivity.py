"""POST /slack/interactivity refuses what Slack did not sign, before parsing it: the real
server, and clicks signed as Slack signs them (receiver.simulator.slack_api.signed), each
checked first with slack_sdk's own SignatureVerifier as the independent oracle: a tampered
body, an old timestamp, a wrong secret, no signature. Not configured, it says so."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slack_sdk.signature import SignatureVerifier

from receiver.simulator.slack_api import signature, signed
from tests.harness import Receiver, http_client

pytestmark = pytest.mark.e2e

SIGNING = "slack-signing-secret-0123"
PAYLOAD = {"type": "block_actions", "user": {"id": "U1"}, "actions": []}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Receiver]:
    found = Receiver(tmp_path)
    found.env["RECEIVER_SLACK_SIGNING_SECRET"] = SIGNING
    found.start()
    try:
        yield found
    finally:
        found.stop()


def post(server: Receiver, body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
    answer = http_client.post(
        f"{server.url}/slack/interactivity", content=body, headers=headers, timeout=10
    )
    code = answer.json()["error"]["code"] if answer.status_code != 200 else None
    return answer.status_code, code


def oracle(body: bytes, headers: dict[str, str]) -> bool:
    return SignatureVerifier(SIGNING).is_valid_request(body, headers)


def test_only_what_slack_signed_within_5_minutes_is_taken(server: Receiver) -> None:
    body, headers = signed(PAYLOAD, SIGNING)
    assert oracle(body, headers)
    assert post(server, body, headers) == (200, None)

    tampered = body.replace(b"U1", b"U2")
    assert not oracle(tampered, headers)
    assert post(server, tampered, headers) == (401, "invalid_signature")

    old_body, old = signed(PAYLOAD, SIGNING, timestamp=time.time() - 400)
    assert not oracle(old_body, old)
    assert post(server, old_body, old) == (401, "invalid_signature")

    other_body, other = signed(PAYLOAD, "another-signing-secret")
    assert not oracle(other_body, other)
    assert post(server, other_body, other) == (401, "invalid_signature")

    assert post(server, body, {"Content-Type": headers["Content-Type"]}) == (
        401,
        "missing_signature",
    )
    # Signed but not a form with a payload: refused after the signature, as invalid.
    stamp = str(int(time.time()))
    junk = b"not a form"
    junk_headers = {"X-Slack-Request-Timestamp": stamp}
    junk_headers["X-Slack-Signature"] = signature(SIGNING, stamp, junk)
    assert oracle(junk, junk_headers)
    assert post(server, junk, junk_headers) == (400, "invalid_request")

    counted = {
        outcome: server.metric("receiver_slack_interactions_total", f'outcome="{outcome}"')
        for outcome in ("invalid_signature", "expired_timestamp", "invalid_request", "ignored")
    }
    assert counted == {
        "invalid_signature": 3,
        "expired_timestamp": 1,
        "invalid_request": 1,
        "ignored": 1,  # signed, but no button of ours
    }
    assert SIGNING not in server.logs()
    assert "slack click from 127.0.0.1 refused: invalid_signature" in server.logs()


def test_a_body_over_the_cap_is_refused_unread(server: Receiver) -> None:
    payload = {**PAYLOAD, "pad": "x" * 70_000}
    body, headers = signed(payload, SIGNING)
    assert post(server, body, headers) == (413, "payload_too_large")


def test_without_a_signing_secret_every_click_says_not_configured(tmp_path: Path) -> None:
    server = Receiver(tmp_path).start()
    try:
        body, headers = signed(PAYLOAD, SIGNING)
        assert post(server, body, headers) == (404, "slack_not_configured")
        looked = http_client.get(f"{server.url}/slack/interactivity", timeout=10)
        assert looked.status_code == 405
        assert json.loads(looked.text)["error"]["code"] == "method_not_allowed"
        assert server.metric("receiver_slack_interactions_total", 'outcome="not_configured"') == 1
    finally:
        server.stop()
