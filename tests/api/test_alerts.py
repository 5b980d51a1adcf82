"""/v1/alerts against the real server: list with filters and cursor pages, one alert with
who was paged and what was done, and ack / resolve / snooze with a writer key (idempotent,
recorded with source api and the key's name); errors in the JSON error shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver.events import sample
from tests.harness import Receiver, http_client
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
    resolve: true
    repeat: 1h
"""


@pytest.fixture(scope="module")
def sink() -> Iterator[HTTPSink]:
    found = HTTPSink().start()
    yield found
    found.stop()


def four_alerts(tmp: Path, sink: HTTPSink) -> Receiver:
    """A server with alerts of sessions s1-s4, s4's resolved."""
    found = Receiver(tmp, rules=RULES.format(url=sink.json_url()))
    found.start()
    for i, session in enumerate(("s1", "s2", "s3", "s4")):
        found.send(sample("score.drop", id=f"e{i}", sessionId=session, score=12))
    found.send(sample("score.recover", id="e9", sessionId="s4", score=70))
    sink.wait_for(5)  # four drops and s4's resolved message
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sink: HTTPSink) -> Iterator[Receiver]:
    found = four_alerts(tmp_path_factory.mktemp("alerts"), sink)
    yield found
    found.stop()


@pytest.fixture
def untouched(tmp_path: Path) -> Iterator[Receiver]:
    """Alerts no other test acts on (the module's server's are acked and resolved by the
    tests that act, in whatever order pytest-randomly runs them)."""
    with HTTPSink() as sink:
        found = four_alerts(tmp_path, sink)
        yield found
        found.stop()


@pytest.fixture(scope="module")
def writer(server: Receiver) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.make_key('oncall-bot', role='writer')}"}


@pytest.fixture(scope="module")
def reader(server: Receiver) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.make_key('dashboard', role='reader')}"}


def get(server: Receiver, path: str, auth: dict[str, str], **params: Any) -> httpx.Response:
    return http_client.get(server.url + path, headers=auth, params=params, timeout=10)


def post(server: Receiver, path: str, auth: dict[str, str], **body: Any) -> httpx.Response:
    return http_client.post(server.url + path, headers=auth, json=body or None, timeout=10)


def test_alerts_are_listed_with_filters_and_pages(untouched: Receiver) -> None:
    server = untouched
    reader = {"Authorization": f"Bearer {server.make_key('dashboard', role='reader')}"}
    every = get(server, "/v1/alerts", reader).json()
    assert [a["id"] for a in every["alerts"]] == [f"session:s{i}" for i in (1, 2, 3, 4)]
    assert every["cursor"] is None
    first = every["alerts"][0]
    assert first["state"] == "open" and first["episode"] == 1 and first["openedEvent"] == "e0"
    assert first["acked"] is None
    resolved = get(server, "/v1/alerts", reader, state="resolved").json()["alerts"]
    assert [a["id"] for a in resolved] == ["session:s4"]
    assert [a["id"] for a in get(server, "/v1/alerts", reader, session="s2").json()["alerts"]] == [
        "session:s2"
    ]
    assert get(server, "/v1/alerts", reader, rule="nope").json()["alerts"] == []
    assert len(get(server, "/v1/alerts", reader, rule="drop").json()["alerts"]) == 4
    one = get(server, "/v1/alerts", reader, limit=3).json()
    assert len(one["alerts"]) == 3 and one["cursor"] == "session:s3"
    two = get(server, "/v1/alerts", reader, limit=3, cursor=one["cursor"]).json()
    assert [a["id"] for a in two["alerts"]] == ["session:s4"] and two["cursor"] is None
    bad = get(server, "/v1/alerts", reader, state="closed")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_parameter"


def test_ack_resolve_and_snooze_through_the_api(
    server: Receiver, writer: dict[str, str], reader: dict[str, str], sink: HTTPSink
) -> None:
    acked = post(server, "/v1/alerts/session:s1/ack", writer)
    assert acked.status_code == 200
    assert acked.json() == {
        "alert": "session:s1", "action": "ack", "result": "done",
        "message": "session:s1 acknowledged", "until": None,
    }  # fmt: skip
    again = post(server, "/v1/alerts/session:s1/ack", writer).json()
    assert again["result"] == "already" and "by oncall-bot" in again["message"]

    snoozed = post(server, "/v1/alerts/session:s2/snooze", writer, **{"for": "2h"}).json()
    assert snoozed["result"] == "done" and snoozed["message"] == "session:s2 snoozed for 2h"
    assert snoozed["until"] is not None

    before = len(sink.requests)
    resolved = post(server, "/v1/alerts/session:s3/resolve", writer).json()
    assert resolved["result"] == "done"
    message = sink.wait_for(before + 1)[-1].json
    assert message["title"] == "[drop] resolved: s3"
    assert "ended by oncall-bot (api)" in message["message"]
    assert post(server, "/v1/alerts/session:s3/resolve", writer).json()["result"] == "already"

    detail = get(server, "/v1/alerts/session:s3", reader).json()
    assert detail["state"] == "resolved"
    assert [(n["rule"], n["notifier"], n["kind"]) for n in detail["notifications"]] == [
        ("drop", "hook", "event"),
        ("drop", "hook", "resolved"),
    ]
    assert [(a["action"], a["source"], a["by"], a["outcome"]) for a in detail["actions"]] == [
        ("resolve", "api", "oncall-bot", "done"),
        ("resolve", "api", "oncall-bot", "already"),
    ]
    listed = get(server, "/v1/alerts", reader, session="s1").json()["alerts"][0]
    assert listed["acked"]["by"] == "oncall-bot"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        pytest.param("GET", "/v1/alerts/session:nope", None, 404, "alert_not_found", id="get"),
        pytest.param("POST", "/v1/alerts/session:nope/ack", None, 404, "alert_not_found", id="ack"),
        pytest.param(
            "POST", "/v1/alerts/session:s2/snooze", {"for": "soon"}, 400, "invalid_parameter",
            id="bad-duration",
        ),
        pytest.param(
            "POST", "/v1/alerts/session:s2/snooze", {"until": "1h"}, 400, "invalid_parameter",
            id="no-for",
        ),
    ],
)  # fmt: skip
def test_refusals_use_the_error_shape(
    server: Receiver,
    writer: dict[str, str],
    method: str,
    path: str,
    body: Any,
    status: int,
    code: str,
) -> None:
    answer = httpx.request(method, server.url + path, headers=writer, json=body, timeout=10)
    assert answer.status_code == status and answer.json()["error"]["code"] == code


def test_a_reader_may_look_but_not_act(server: Receiver, reader: dict[str, str]) -> None:
    refused = post(server, "/v1/alerts/session:s2/ack", reader)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert httpx.get(server.url + "/v1/alerts").status_code == 401
