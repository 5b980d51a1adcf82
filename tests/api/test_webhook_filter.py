"""A subscription's filter end to end: registered, shown, applied to what is delivered,
and refused with the rules' own words when the rules would refuse it as a match."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_webhooks import ALLOW, Client, score, writer
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Client]:
    server = Receiver(tmp_path, env=ALLOW).start()
    try:
        yield writer(server)
    finally:
        server.stop()


def test_only_the_events_the_filter_matches_are_delivered(api: Client) -> None:
    wanted = {"userId": "u1", "cohort": {"in": ["beta"]}}
    with HTTPSink() as subscriber, HTTPSink() as everyone:
        hook = api.add(f"{subscriber.url}/in", ["score.drop"], filter=wanted)
        assert hook["filter"] == wanted and api.get(hook["id"])["filter"] == wanted
        api.add(f"{everyone.url}/in", ["score.drop"])
        api.server.send(score("evt_f1", userId="u2", cohort="beta"))
        api.server.send(score("evt_f2", userId="u1", cohort="alpha"))
        api.server.send(score("evt_f3", userId="u1", cohort="beta"))
        everyone.wait_for(3, timeout=30)
        (only,) = subscriber.wait_for(1, timeout=30)
        assert only.json["id"] == "evt_f3"
        assert [r.json["id"] for r in subscriber.requests] == ["evt_f3"]


@pytest.mark.parametrize(
    ("wanted", "says"),
    [
        ({"score": {"less": 30}}, 'filter.score: unknown operator "less"'),
        ({"userId": "~("}, "filter.userId: invalid regex"),
        ({"cohort": {"in": "beta"}}, "filter.cohort: in must be a list"),
        (["userId"], "filter must be a JSON object"),
    ],
)
def test_a_filter_the_rules_would_refuse_is_refused(api: Client, wanted: object, says: str) -> None:
    r = api.request(
        "POST", "", {"url": "http://127.0.0.1:9/in", "events": ["score.drop"], "filter": wanted}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_webhook"
    assert r.json()["error"]["message"].startswith(says), r.json()
