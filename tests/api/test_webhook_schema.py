"""The subscriptions API against its own OpenAPI document, statefully: schemathesis follows
the document's links from POST /v1/webhooks (get, rotate, deliveries, delete the new one)
with a writer key, each subscription pointing at a real local subscriber; every answer must
be documented and the links must hold (a deleted subscription is gone, a new one is there).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

ENV = {
    "RECEIVER_WEBHOOK_ALLOW_PRIVATE": "1",
    "RECEIVER_WEBHOOK_ALLOW_HTTP": "1",
    "RECEIVER_LOG_LEVEL": "warning",
}
STATEFUL = settings(
    max_examples=8,
    stateful_step_count=10,  # one more operation (a delivery with its attempt log) to reach
    derandomize=True,  # the same scenarios every run: a failure here is reproducible
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Receiver]:
    receiver = Receiver(tmp_path, env=ENV).start()
    try:
        yield receiver
    finally:
        receiver.stop()


def test_subscriptions_follow_their_links_as_documented(
    server: Receiver, http_sink: HTTPSink
) -> None:
    key = server.make_key("stateful", role="writer")
    auth = {"Authorization": f"Bearer {key}"}
    schema = schemathesis.openapi.from_url(
        f"{server.url}/v1/openapi.json", config=schemathesis.Config.from_dict({"headers": auth})
    ).include(path_regex="^/v1/webhooks")
    subscriber = f"{http_sink.url}/stateful"
    calls: list[tuple[str, int]] = []

    class Subscriptions(schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: schemathesis.Case) -> None:
            # A generated URL names a host that does not resolve: the subscriber is real. A case
            # made to break the schema keeps a url that breaks it (null, a number, no http
            # URL), or the server rightly takes it and the check says it should not have.
            body, meta = case.body, case.meta
            if case.method != "POST" or not isinstance(body, dict) or "url" not in body:
                return
            positive = meta is None or meta.generation.mode.is_positive
            url = body["url"]
            if positive or (isinstance(url, str) and url.startswith(("http://", "https://"))):
                body["url"] = subscriber

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": auth, "timeout": 10}

        def after_call(self, response: Any, case: schemathesis.Case) -> None:
            super().after_call(response, case)
            calls.append((f"{case.method} {case.path}", response.status_code))

        def teardown(self) -> None:
            # Each scenario starts from none: the key's cap (100) is never reached.
            with httpx.Client(headers=auth, timeout=10) as client:
                for hook in client.get(f"{server.url}/v1/webhooks").json()["webhooks"]:
                    client.delete(f"{server.url}/v1/webhooks/{hook['id']}")

    Subscriptions.run(settings=STATEFUL)
    done = {call for call, status in calls if status < 300}
    # The links were followed: each operation on a new subscription answered 2xx.
    assert {
        "POST /v1/webhooks",
        "GET /v1/webhooks/{id}",
        "DELETE /v1/webhooks/{id}",
        "POST /v1/webhooks/{id}/rotate-secret",
        "GET /v1/webhooks/{id}/deliveries",
    } <= done, sorted(set(calls))
