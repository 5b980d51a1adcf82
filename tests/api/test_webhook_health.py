"""Endpoint health end to end: a subscriber that answers 500 becomes failing, then disabled;
one that comes back recovers; the owner's rule in rules.yaml is told of each change; the
API shows it. The real server, real local HTTP servers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver import signature
from tests.api.test_webhooks import ALLOW, score, until, writer
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

# The owner is told on its own notifier; every other event goes to the console.
HEALTH_RULES = """
notifiers:
  owner: "{url}"
rules:
  - name: subscriber-health
    match:
      type: "~^webhook\\\\."
    notify: [owner]
    title: "{{{{ type }}}} {{{{ webhookId }}}} of {{{{ owner }}}}"
    body: "{{{{ health }}}} after {{{{ failures }}}} failures: {{{{ lastError }}}}"
  - name: all
    notify: [console]
"""


@pytest.fixture
def start(tmp_path: Path, http_sink: HTTPSink) -> Iterator[Callable[[str], Receiver]]:
    """Starts the receiver with RECEIVER_WEBHOOK_DISABLE_AFTER as given; stops it after."""
    started: list[Receiver] = []

    def _start(disable_after: str) -> Receiver:
        env = {**ALLOW, "RECEIVER_WEBHOOK_DISABLE_AFTER": disable_after}
        rules = HEALTH_RULES.format(url=http_sink.json_url("/owner"))
        started.append(Receiver(tmp_path, rules=rules, env=env).start())
        return started[-1]

    yield _start
    for server in started:
        server.stop()


def _titles(sink: HTTPSink) -> list[str]:
    return [r.json["title"] for r in sink.requests if r.path == "/owner"]


def _send_until(server: Receiver, done: Callable[[], Any], what: str, timeout: float) -> Any:
    """Send an event every 0.3 s until done(): deliveries keep coming, as in production."""
    deadline = time.monotonic() + timeout
    i = 0
    while not (found := done()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        server.send(score(f"evt_h{time.monotonic_ns()}_{i}"))
        i += 1
        time.sleep(0.3)
    return found


def test_a_failing_subscriber_is_failing_then_recovers(
    start: Callable[[str], Receiver], http_sink: HTTPSink
) -> None:
    server = start("1h")
    api = writer(server)
    with HTTPSink() as subscriber, HTTPSink() as healthy:
        subscriber.fail_with(500)
        hook = api.add(f"{subscriber.url}/in", ["score.drop"])
        other = api.add(f"{healthy.url}/in", ["score.drop"])
        assert (hook["health"], hook["failingSince"], hook["lastError"]) == ("healthy", None, None)
        server.send(score("evt_h1"))
        # One delivery, its first attempt and 4 retries: 5 failures in a row.
        until(lambda: api.get(hook["id"])["health"] == "failing", 30, "failing")
        shown = api.get(hook["id"])
        assert shown["lastError"].startswith("HTTP 500") and shown["failingSince"]
        title = f"webhook.failing {hook['id']} of hooks"
        until(lambda: title in _titles(http_sink), 30, "the owner told of failing")
        assert api.get(other["id"])["health"] == "healthy"
        assert [r.path for r in healthy.requests] == ["/in"]

        subscriber.fail_with(200)
        _send_until(server, lambda: api.get(hook["id"])["health"] == "healthy", "recovery", 60)
        recovered = f"webhook.recovered {hook['id']} of hooks"
        until(lambda: recovered in _titles(http_sink), 30, "the owner told of recovery")
        assert api.get(hook["id"])["failingSince"] is None
        titles = _titles(http_sink)
        assert titles.count(title) == 1 and titles.count(recovered) == 1  # each change once


def test_failing_past_the_limit_disables_and_so_does_410(
    start: Callable[[str], Receiver], http_sink: HTTPSink
) -> None:
    server = start("3s")
    api = writer(server)
    with HTTPSink() as subscriber:
        subscriber.fail_with(500)
        hook = api.add(f"{subscriber.url}/in", ["score.drop"])
        _send_until(server, lambda: api.get(hook["id"])["health"] == "disabled", "disabled", 90)
        disabled = api.get(hook["id"])
        assert disabled["status"] == "disabled" and "failing since" in disabled["statusReason"]
        gone = f"webhook.disabled {hook['id']} of hooks"
        until(lambda: gone in _titles(http_sink), 30, "the owner told of disabling")
        told = [r for r in http_sink.requests if r.json["title"] == gone]
        assert len(told) == 1 and "HTTP 500" in told[0].json["message"]
        assert f"webhook.failing {hook['id']} of hooks" in _titles(http_sink)

        subscriber.fail_with(410)
        hook = api.add(f"{subscriber.url}/gone", ["score.drop"])
        server.send(score("evt_g1"))
        until(lambda: api.get(hook["id"])["health"] == "disabled", 30, "disabled by 410")
        assert api.get(hook["id"])["statusReason"] == "the subscriber answered 410 Gone"
        until(
            lambda: f"webhook.disabled {hook['id']} of hooks" in _titles(http_sink),
            30,
            "the owner told",
        )


def test_test_sends_a_signed_delivery_and_enable_needs_one_that_succeeds(
    start: Callable[[str], Receiver], http_sink: HTTPSink
) -> None:
    server = start("1h")
    api = writer(server)
    with HTTPSink() as subscriber:
        subscriber.fail_with(410)
        created = api.add(f"{subscriber.url}/in", ["score.drop"])
        hook_id = created["id"]
        server.send(score("evt_t1"))
        until(lambda: api.get(hook_id)["health"] == "disabled", 30, "disabled by 410")

        refused = api.request("POST", f"/{hook_id}/enable")
        assert refused.status_code == 409, refused.text
        body = refused.json()
        assert body["error"]["code"] == "webhook_test_failed"
        assert body["attempt"]["status"] == 410 and body["attempt"]["delivered"] is False, body
        assert api.get(hook_id)["status"] == "disabled"

        subscriber.fail_with(200)
        subscriber.clear()
        tested = api.request("POST", f"/{hook_id}/test")
        assert tested.status_code == 200, tested.text
        attempt = tested.json()
        assert (attempt["delivered"], attempt["status"], attempt["error"]) == (True, 200, None)
        assert attempt["durationMs"] >= 0
        (sent,) = subscriber.requests
        assert sent.json["type"] == "webhook.test" and sent.json["webhookId"] == hook_id
        assert sent.json["id"] == attempt["eventId"]
        assert sent.headers["X-Service-Signature"] == signature.sign(
            created["secret"].encode(), sent.body
        )
        assert api.get(hook_id)["status"] == "disabled"  # a test alone enables nothing

        enabled = api.request("POST", f"/{hook_id}/enable")
        assert enabled.status_code == 200, enabled.text
        shown = enabled.json()["webhook"]
        assert (shown["status"], shown["health"], shown["failingSince"]) == (
            "active",
            "healthy",
            None,
        )
        assert enabled.json()["attempt"]["delivered"] is True
        again = api.request("POST", f"/{hook_id}/enable")  # active already: nothing to do
        assert again.status_code == 200 and again.json()["attempt"] is None
        recovered = f"webhook.recovered {hook_id} of hooks"
        until(lambda: recovered in _titles(http_sink), 30, "the owner told of the recovery")
        server.send(score("evt_t2"))
        until(
            lambda: any(r.json.get("id") == "evt_t2" for r in subscriber.requests),
            30,
            "a delivery after enabling",
        )
        assert _titles(http_sink).count(recovered) == 1


@pytest.mark.slow
def test_two_postgres_replicas_tell_each_health_change_once(
    tmp_path: Path, http_sink: HTTPSink, pg_url: str
) -> None:
    """Two server processes on one PostgreSQL database, events sent to each in turn, both
    sending to a subscriber that fails, comes back and fails until disabled: each change
    is one stored event and one message to the owner, not one per replica."""
    from tests import dbview

    env = {**ALLOW, "RECEIVER_WEBHOOK_DISABLE_AFTER": "20s"}
    rules = HEALTH_RULES.format(url=http_sink.json_url("/owner"))
    replicas: list[Receiver] = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replicas.append(Receiver(tmp_path / name, rules=rules, env=env, db=pg_url).start())
        api = writer(replicas[0])
        sent = [0]

        def send_until(done: Callable[[], Any], what: str) -> None:
            deadline = time.monotonic() + 90
            while not done():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                replicas[sent[0] % 2].send(score(f"evt_r{sent[0]}"))
                sent[0] += 1
                time.sleep(0.3)

        with HTTPSink() as subscriber:
            subscriber.fail_with(500)
            hook = api.add(f"{subscriber.url}/in", ["score.drop"])
            health = lambda: api.get(hook["id"])["health"]  # noqa: E731
            send_until(lambda: health() == "failing", "failing")
            subscriber.fail_with(200)
            send_until(lambda: health() == "healthy", "recovered")
            subscriber.fail_with(500)
            send_until(lambda: health() == "disabled", "disabled")

        changes = ["webhook.failing", "webhook.recovered", "webhook.failing", "webhook.disabled"]
        stored = (
            "SELECT type FROM events WHERE type IN"
            " ('webhook.failing', 'webhook.recovered', 'webhook.disabled') ORDER BY received_at"
        )
        assert [t for (t,) in dbview.query(pg_url, stored)] == changes
        titles = [f"{change} {hook['id']} of hooks" for change in changes]
        until(lambda: len(_titles(http_sink)) >= 4, 30, "the owner told of each change")
        server_logs = [r.logs() for r in replicas]
        # Each once; the order is the stored events' (above): two replicas' workers send
        # the owner's messages side by side, so they may arrive in either order.
        assert sorted(_titles(http_sink)) == sorted(titles)
        # Both replicas sent to it (and so recorded its outcomes).
        assert all(f"to subscriber {hook['id']} failed" in log for log in server_logs)
    finally:
        for replica in replicas:
            replica.stop()
