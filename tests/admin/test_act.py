"""One-click action links end to end: the real server (RECEIVER_PUBLIC_URL set) puts links
in a drop's notification; GET on the ack link shows a page and changes nothing, POST acks
(repeats stop), POST again says already; a tampered token gets a 404 page, and no token
reaches the log."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from receiver.events import sample
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{url}"
rules:
  - name: drop
    match: {{type: score.drop}}
    notify: hook
    title: "dropped {{{{ sessionId }}}}"
    body: |
      score {{{{ score }}}}
      {{% if links.ack %}}
      Ack: {{{{ links.ack }}}}
      Snooze: {{{{ links.snooze }}}}
      Resolve: {{{{ links.resolve }}}}
      Alert: {{{{ links.alert }}}}
      {{% endif %}}
    repeat: 1s
    resolve: true
"""


@pytest.fixture
def server(tmp_path: Path, http_sink: HTTPSink) -> Iterator[Receiver]:
    found = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url()))
    found.env["RECEIVER_PUBLIC_URL"] = found.url + "/"
    found.start()
    try:
        yield found
    finally:
        found.stop()


def link(message: str, name: str) -> str:
    found = re.search(rf"^{name}: (\S+)$", message, re.MULTILINE)
    assert found is not None, message
    return found.group(1)


def acked_by(server: Receiver) -> object:
    out = server.cli("alerts", "--json")
    assert out.returncode == 0, out.stderr
    [alert] = json.loads(out.stdout)
    return None if alert["acked"] is None else alert["acked"]["by"]


def test_the_ack_link_confirms_on_get_and_acks_on_post(
    server: Receiver, http_sink: HTTPSink
) -> None:
    server.send(sample("score.drop", id="e1", sessionId="sess_1", score=12))
    [first] = http_sink.wait_for(1)
    ack = link(first.json["message"], "Ack")
    assert ack.startswith(f"{server.url}/act/")
    assert link(first.json["message"], "Alert") == f"{server.url}/admin/alerts/session:sess_1"
    assert link(first.json["message"], "Snooze") != ack != link(first.json["message"], "Resolve")

    shown = httpx.get(ack)  # a mail scanner or chat unfurler following the link
    assert shown.status_code == 200
    assert "Acknowledge session:sess_1?" in shown.text and 'method="post"' in shown.text
    assert "csrf" not in shown.text
    assert shown.headers["cache-control"] == "no-store"
    assert shown.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in shown.headers["content-security-policy"]
    assert shown.headers["referrer-policy"] == "no-referrer"
    assert acked_by(server) is None  # GET changed nothing
    http_sink.wait_for(2)  # and the repeats go on

    done = httpx.post(ack)
    assert done.status_code == 200 and "Acknowledged" in done.text
    assert "session:sess_1 acknowledged" in done.text
    assert acked_by(server) == "link"
    time.sleep(1.5)  # a repeat already on its way
    settled = len(http_sink.requests)
    time.sleep(3)
    assert len(http_sink.requests) == settled  # repeats stopped

    again = httpx.post(ack)
    assert again.status_code == 409 and "acknowledged already, by link" in again.text
    assert "action_not_applied" in again.text  # not applied: a phone keeps its notification
    rows = server.query("SELECT action, source, actor, outcome FROM alert_actions ORDER BY id")
    assert rows == [("ack", "link", "link", "done"), ("ack", "link", "link", "already")]

    token = ack.rsplit("/", 1)[1]
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for method in (httpx.get, httpx.post):
        refused = method(f"{server.url}/act/{tampered}")
        assert refused.status_code == 404 and "This link is not valid" in refused.text
        assert "invalid_action_link" in refused.text and tampered not in refused.text
    asked = httpx.get(f"{server.url}/act/{tampered}", headers={"Accept": "application/json"})
    assert asked.status_code == 404 and asked.json()["error"]["code"] == "invalid_action_link"
    assert tampered not in asked.text
    assert token not in server.logs() and tampered not in server.logs()


def test_snooze_then_resolve_links_and_old_links_after_a_reopen(
    server: Receiver, http_sink: HTTPSink
) -> None:
    server.send(sample("score.drop", id="e1", sessionId="sess_1", score=12))
    [first] = http_sink.wait_for(1)
    resolve = link(first.json["message"], "Resolve")
    snooze = link(first.json["message"], "Snooze")
    assert "Snooze session:sess_1 for 1 hour?" in httpx.get(snooze).text
    snoozed = httpx.post(snooze)
    assert "Snoozed" in snoozed.text and "session:sess_1 snoozed for 1h" in snoozed.text
    assert "Resolve session:sess_1?" in httpx.get(resolve).text
    assert "Resolved" in httpx.post(resolve).text
    resolved = [r for r in http_sink.wait_for(2) if "resolved" in r.json["title"]]
    for _ in range(50):
        if resolved:
            break
        time.sleep(0.1)
        resolved = [r for r in http_sink.requests if "resolved" in r.json["title"]]
    assert resolved and "ended by link (link)" in resolved[0].json["message"]
    assert "Nothing to do" in httpx.post(resolve).text
    assert "It is resolved already" in httpx.get(resolve).text

    # The alert opens again: the first message's links named episode 1 and do nothing to
    # episode 2; the new message's act on it.
    old_ack = link(first.json["message"], "Ack")
    server.send(sample("score.drop", id="e2", sessionId="sess_1", score=10))
    for _ in range(100):
        second = [r for r in http_sink.requests if r.json["title"] == "dropped sess_1"][1:]
        if second:
            break
        time.sleep(0.1)
    assert "resolved already" in httpx.post(old_ack).text
    assert acked_by(server) is None
    assert "Acknowledged" in httpx.post(link(second[0].json["message"], "Ack")).text
    assert acked_by(server) == "link"


def test_an_expired_link_says_so_with_410(tmp_path: Path, http_sink: HTTPSink) -> None:
    server = Receiver(tmp_path, rules=RULES.format(url=http_sink.json_url()))
    server.env.update(RECEIVER_PUBLIC_URL=server.url, RECEIVER_LINK_TTL="1s")
    server.start()
    try:
        server.send(sample("score.drop", id="e1", sessionId="sess_1", score=12))
        ack = link(http_sink.wait_for(1)[0].json["message"], "Ack")
        time.sleep(2.2)
        for method in (httpx.get, httpx.post):
            expired = method(ack)
            assert expired.status_code == 410 and "This link has expired" in expired.text
            assert "work for 1s" in expired.text and "invalid_action_link" in expired.text
        asked = httpx.get(ack, headers={"Accept": "application/json"})
        assert asked.status_code == 410 and asked.json()["error"]["code"] == "invalid_action_link"
        assert acked_by(server) is None
        assert server.metric("receiver_action_links_total", 'outcome="expired"') == 3
        assert "action link from 127.0.0.1 refused: invalid_action_link (expired)" in server.logs()
    finally:
        server.stop()


def test_every_link_attempt_is_counted_and_a_stale_one_recorded(
    server: Receiver, http_sink: HTTPSink
) -> None:
    server.send(sample("score.drop", id="e1", sessionId="sess_1", score=12))
    message = http_sink.wait_for(1)[0].json["message"]
    ack, resolve = link(message, "Ack"), link(message, "Resolve")
    token = ack.rsplit("/", 1)[1]
    forged = f"{server.url}/act/{token[:-2]}{'AA' if not token.endswith('AA') else 'BB'}"
    for method in ("GET", "POST", "HEAD", "POST") * 2:  # a scanner trying tokens
        assert httpx.request(method, forged).status_code == 404
    assert "Acknowledged" in httpx.post(ack).text
    assert "acknowledged already" in httpx.post(ack).text
    assert "Resolved" in httpx.post(resolve).text
    stale = httpx.post(ack)  # its episode has ended
    assert "Nothing to do" in stale.text and "resolved already" in stale.text
    assert stale.status_code == 409

    counted = {
        outcome: server.metric("receiver_action_links_total", f'outcome="{outcome}"')
        for outcome in ("done", "already", "stale", "invalid", "expired")
    }
    assert counted == {"done": 2, "already": 1, "stale": 1, "invalid": 8, "expired": 0}
    rows = server.query("SELECT action, episode, outcome FROM alert_actions ORDER BY id")
    assert rows == [("ack", 1, "done"), ("ack", 1, "already"), ("resolve", 1, "done"),
                    ("ack", 1, "stale")]  # fmt: skip
    # Each forged token logged with the client's address, a few lines a minute, never
    # the token itself.
    refused = [
        line
        for line in server.logs().splitlines()
        if "action link from 127.0.0.1 refused: invalid_action_link (invalid)" in line
    ]
    assert len(refused) == 5, refused
    assert token not in server.logs() and forged.rsplit("/", 1)[1] not in server.logs()


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-server", "two-replicas"])
def test_acks_at_once_make_one_done_and_the_rest_already(
    tmp_path: Path, http_sink: HTTPSink, receiver_db: str | None, replicas: int
) -> None:
    """The same link pressed at once in two places, and the API beside it, on one server or
    two replicas of one database: one "Acknowledged", the rest "already", and the record
    says so (one done)."""
    rules = RULES.format(url=http_sink.json_url())
    servers = []
    for name in ("a", "b")[:replicas]:
        (tmp_path / name).mkdir()
        db = receiver_db or str(tmp_path / "receiver.db")
        servers.append(Receiver(tmp_path / name, rules=rules, db=db))
    try:
        for found in servers:
            found.env["RECEIVER_PUBLIC_URL"] = servers[0].url
            found.start()
        server = servers[0]
        key = server.make_key("ops", role="writer")
        server.send(sample("score.drop", id="e1", sessionId="sess_1", score=12))
        path = link(http_sink.wait_for(1)[0].json["message"], "Ack").removeprefix(server.url)
        start = threading.Barrier(8)

        def press(i: int) -> str:
            base = servers[i % len(servers)].url
            with httpx.Client(base_url=base, timeout=30) as client:
                start.wait(30)
                if i % 4 == 3:  # the API beside the links
                    answer = client.post(
                        "/v1/alerts/session:sess_1/ack", headers={"Authorization": f"Bearer {key}"}
                    )
                    assert answer.status_code == 200, answer.text
                    return str(answer.json()["result"])
                answer = client.post(path)
                done = "<h1>Acknowledged</h1>" in answer.text
                assert answer.status_code == (200 if done else 409), answer.text
                return "done" if done else "already"

        with ThreadPoolExecutor(8) as pool:
            said = list(pool.map(press, range(8)))
        recorded = [row[0] for row in server.query("SELECT outcome FROM alert_actions")]
    finally:
        for found in servers:
            if found.proc is not None:
                found.stop()
    assert sorted(said) == ["already"] * 7 + ["done"], said
    assert sorted(recorded) == ["already"] * 7 + ["done"], recorded
