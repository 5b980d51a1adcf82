"""A subscription's rateLimit end to end: deliveries over it wait (none dropped or failed),
and registration refuses a rate outside 1 to RECEIVER_WEBHOOK_MAX_RATE."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_webhooks import ALLOW, Client, score, until, writer
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Client]:
    server = Receiver(tmp_path, env={**ALLOW, "RECEIVER_WEBHOOK_MAX_RATE": "50"}).start()
    try:
        yield writer(server)
    finally:
        server.stop()


def test_deliveries_over_the_rate_wait_and_none_fails(api: Client) -> None:
    with HTTPSink() as limited, HTTPSink() as free:
        hook = api.add(f"{limited.url}/in", ["score.drop"], rateLimit=5)
        assert hook["rateLimit"] == 5
        api.add(f"{free.url}/in", ["score.drop"])
        posted = time.monotonic()  # no slot is taken before the first event is posted
        for i in range(15):
            api.server.send(score(f"evt_rate{i}"))
        got = limited.wait_for(15, timeout=60)
        free.wait_for(15, timeout=60)
        times = sorted(r.received_at for r in got)
        # 5 a second: the k-th slot is at least k slots of 0.2 s after the first, which is
        # not before the first post, and a delivery arrives after its slot. So each arrives
        # on that schedule or later, however late a busy machine sends it, and never 6
        # within a second of the schedule (an arrival measured against the one before it
        # would count a late first send as a burst after it).
        for k, at in enumerate(times):
            assert at - posted >= k * 0.2, (k, [round(t - posted, 3) for t in times])
        deliveries = until(
            lambda: (
                (d := api.deliveries(hook["id"]))
                and all(x["state"] == "delivered" for x in d)
                and d
            ),
            30,
            "all delivered",
        )
        assert len(deliveries) == 15 and {d["attempts"] for d in deliveries} == {1}


@pytest.mark.parametrize("rate", [0, 0.5, 51, "5", True])
def test_a_rate_outside_the_limits_is_refused(api: Client, rate: object) -> None:
    r = api.request("POST", "", {"url": "http://127.0.0.1:9/in", "events": ["score.drop"],
                                 "rateLimit": rate})  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_webhook"
    assert "rateLimit" in r.json()["error"]["message"]
