"""POST /v1/webhooks/:id/rotate-secret with an overlap, end to end: the real server, a real
local subscriber checking each delivery with the standardwebhooks package, secret by secret."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from tests.api.test_webhooks import ALLOW, Client, score, until, writer
from tests.harness import Receiver
from tests.servers import HTTPSink, Request

pytestmark = pytest.mark.e2e


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Client]:
    server = Receiver(tmp_path, env=ALLOW).start()
    try:
        yield writer(server)
    finally:
        server.stop()


def _verifies(secret: str, request: Request) -> bool:
    try:
        Verifier(secret).verify(request.body, request.headers)
    except WebhookVerificationError:
        return False
    return True


def _delivery(api: Client, subscriber: HTTPSink, event_id: str) -> Request:
    api.server.send(score(event_id))
    return until(
        lambda: next((r for r in subscriber.requests if r.json.get("id") == event_id), None),
        30,
        f"the delivery of {event_id}",
    )


def test_rotation_with_an_overlap_signs_with_both_then_the_new_one(api: Client) -> None:
    with HTTPSink() as subscriber:
        created = api.add(f"{subscriber.url}/in", ["score.drop"], format="standard")
        old = created["secret"]
        first = _delivery(api, subscriber, "evt_r1")
        assert _verifies(old, first)

        r = api.request("POST", f"/{created['id']}/rotate-secret", {"overlap": "1h"})
        assert r.status_code == 200, r.text
        new = r.json()["secret"]
        assert new != old and new.startswith("whsec_")
        assert r.json()["previousSecretUntil"].endswith("Z")
        shown = api.get(created["id"])
        assert "secret" not in shown and new not in str(shown) and old not in str(shown)

        during = _delivery(api, subscriber, "evt_r2")
        assert len(during.headers["webhook-signature"].split(" ")) == 2
        assert _verifies(new, during) and _verifies(old, during)

        r = api.request("POST", f"/{created['id']}/rotate-secret")  # no overlap: a cut-over
        assert r.status_code == 200, r.text
        newest = r.json()["secret"]
        after = _delivery(api, subscriber, "evt_r3")
        assert " " not in after.headers["webhook-signature"]
        assert _verifies(newest, after)
        assert not _verifies(new, after) and not _verifies(old, after)


@pytest.mark.parametrize(
    "body",
    [b'{"overlap": "8d"}', b'{"overlap": "soon"}', b'{"overlap": -1}', b"[1]", b'{"x": 1}'],
)
def test_a_bad_overlap_is_refused_and_changes_nothing(api: Client, body: bytes) -> None:
    created = api.add("http://127.0.0.1:9/in", ["score.drop"], format="standard")
    r = api.request("POST", f"/{created['id']}/rotate-secret", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_webhook"
    assert "overlap" in r.json()["error"]["message"] or "body" in r.json()["error"]["message"]
