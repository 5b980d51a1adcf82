"""/v1/silences against the real server: a writer key adds, lists and ends silences (a
reader key is refused), an until-resolved one names the open alerts it ends with and ends
once they have stayed resolved for its "after", and bad bodies are refused naming the
field, in the JSON error shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from receiver.events import sample
from tests.harness import Receiver, eventually, http_client

pytestmark = pytest.mark.e2e

RULES = """
rules:
  - name: drop
    match: {type: score.drop}
    notify: [console]
    resolve: true
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    found = Receiver(tmp_path_factory.mktemp("silences"), rules=RULES).start()
    found.send(sample("score.drop", id="d1", sessionId="s1", score=12))
    routed = "SELECT count(*) FROM events WHERE routed_at IS NOT NULL"
    eventually(lambda: found.query(routed)[0][0] == 1, "the drop routed")
    yield found
    found.stop()


@pytest.fixture(scope="module")
def writer(server: Receiver) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.make_key('oncall', role='writer')}"}


def call(
    server: Receiver, method: str, path: str, auth: dict[str, str], **kw: Any
) -> httpx.Response:
    return http_client.request(method, server.url + path, headers=auth, timeout=10, **kw)


def test_a_writer_adds_lists_and_ends_a_silence(server: Receiver, writer: dict[str, str]) -> None:
    body = {"match": ["userId=user_42", "page=/checkout*"], "for": "2h", "reason": "load test"}
    made = call(server, "POST", "/v1/silences", writer, json=body)
    assert made.status_code == 201, made.text
    silence = made.json()
    assert (silence["match"], silence["state"], silence["untilResolved"]) == (
        {"userId": "user_42", "page": "/checkout*"}, "active", False
    )  # fmt: skip
    listed = call(server, "GET", "/v1/silences", writer).json()["silences"]
    assert silence["id"] in [s["id"] for s in listed]
    ended = call(server, "DELETE", f"/v1/silences/{silence['id']}", writer)
    assert ended.json()["result"] == "done" and ended.json()["silence"]["state"] == "expired"
    again = call(server, "DELETE", f"/v1/silences/{silence['id']}", writer)
    assert again.status_code == 200 and again.json()["result"] == "already"
    assert silence["id"] not in [
        s["id"] for s in call(server, "GET", "/v1/silences", writer).json()["silences"]
    ]
    every = call(server, "GET", "/v1/silences", writer, params={"all": "true"}).json()
    assert silence["id"] in [s["id"] for s in every["silences"]]
    missing = call(server, "DELETE", "/v1/silences/999999", writer)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_an_until_resolved_silence_ends_once_its_alert_stays_resolved(
    server: Receiver, writer: dict[str, str]
) -> None:
    body = {"match": ["sessionId=s1"], "reason": "known", "untilResolved": True, "after": "1s"}
    made = call(server, "POST", "/v1/silences", writer, json=body).json()
    assert (made["untilResolved"], made["after"], made["alerts"]) == (True, "1s", ["session:s1"])
    server.send(sample("score.recover", id="r1", sessionId="s1", score=70))

    def state() -> str:
        listed = call(server, "GET", "/v1/silences", writer, params={"all": "true"}).json()
        return next(s["state"] for s in listed["silences"] if s["id"] == made["id"])

    eventually(lambda: state() == "expired", "the silence to end with its alert")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param({"match": ["a=1"], "reason": "r"}, '"for" is required', id="no-for"),
        pytest.param({"match": [], "for": "1h", "reason": "r"}, '"match" must be a list',
                     id="empty"),
        pytest.param({"match": ["a=~("], "for": "1h", "reason": "r"}, "invalid regex", id="regex"),
        pytest.param({"match": ["a=1"], "for": "1h"}, '"reason" must be text', id="no-reason"),
        pytest.param({"match": ["a=1"], "for": "1h", "reason": "r", "after": "5m"},
                     '"after" only goes with', id="after-alone"),
        pytest.param({"match": ["a=1"], "for": "400d", "reason": "r"}, "limit of 365d", id="long"),
        pytest.param({"match": ["a=1"], "for": "1h", "reason": "r", "x": 1}, "unknown field",
                     id="x"),
    ],
)  # fmt: skip
def test_bad_bodies_are_refused_naming_the_field(
    server: Receiver, writer: dict[str, str], body: dict[str, Any], message: str
) -> None:
    refused = call(server, "POST", "/v1/silences", writer, json=body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_parameter" and message in error["message"]


def test_a_reader_key_may_not_touch_silences(server: Receiver) -> None:
    reader = {"Authorization": f"Bearer {server.make_key('dashboard', role='reader')}"}
    for method, path in (("GET", "/v1/silences"), ("POST", "/v1/silences"),
                         ("DELETE", "/v1/silences/1")):  # fmt: skip
        assert call(server, method, path, reader).status_code == 403
