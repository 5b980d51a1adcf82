"""The /v1 API against its own OpenAPI document. schemathesis loads GET /v1/openapi.json
from a live server and generates requests for every one of its operations (valid ones, and
invalid ones where there is a parameter or a body to break), sent with a writer key to a
store with real sessions and alerts; every answer must be documented: no 500, a documented
status and content type, a body and headers that match the schemas, and a request the
document calls valid is not refused (400).

schemathesis drives Hypothesis here through `operation.as_strategy()`, not through its
pytest plugin (`schemathesis.pytest.from_fixture`), which does not run on pytest 9.2.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from receiver import __version__, events
from receiver.api import openapi
from tests.harness import Receiver, eventually

pytestmark = pytest.mark.e2e

EXAMPLES = 50  # generated requests per operation and kind (valid, invalid)
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same requests every run: a failure here is reproducible
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    positive_data_acceptance,  # a valid request is never a 400 (401/403/404/409/429 may be)
]
# Every operation of the document this version serves; the live one is read in the test.
ALL_OPERATIONS = [
    (method.upper(), path)
    for path, item in openapi.document(__version__)["paths"].items()
    for method in item
]
WEBHOOK_OPERATIONS = [(m, p) for m, p in ALL_OPERATIONS if p.startswith("/v1/webhooks")]
# Whether a subscriber's host name resolves is DNS's to say, not the document's: a valid
# subscription generated for POST /v1/webhooks gets an address that does (its delivery
# never goes out: no event comes after it).
SUBSCRIBER = "http://127.0.0.1:9/hook"
SESSIONS = ("s1", "s2", "s3", "s4", "s5")
# Lifecycle rules, so that the store has alerts: open and resolved, of sessions and of
# interventions.
RULES = """
rules:
  - name: drops
    match: {type: score.drop}
    notify: [console]
    resolve: true
  - name: interventions
    match: {type: intervention.fired}
    notify: [console]
    resolve: true
"""


def at(minutes_ago: float) -> str:
    return events.iso(datetime.now(UTC) - timedelta(minutes=minutes_ago), digits=3)


def sent() -> list[dict[str, Any]]:
    """Sessions of every shape the API answers: scored or not, each status, with and
    without a user, page and cohort, whole and fractional scores."""
    kinds = [
        ("score.drop", "s1", 50, {"userId": "u1", "score": 30, "page": "/checkout", "cohort": "a"}),
        ("intervention.fired", "s1", 49, {"userId": "u1"}),
        ("intervention.resolved", "s1", 48.5, {"userId": "u1"}),
        ("score.recover", "s1", 48, {"userId": "u1", "score": 70.5, "page": "/checkout"}),
        ("score.drop", "s2", 40, {"userId": "u2", "score": 10, "page": "/cart", "cohort": "b"}),
        ("score.drop", "s3", 30, {"userId": "u1", "score": 20.25, "page": "/cart"}),
        ("session.stopped", "s3", 29, {"userId": "u1"}),
        ("intervention.fired", "s4", 20, {"userId": "u3"}),  # never scored
        ("session.stopped", "s5", 10, {}),  # no user either
    ]
    out = []
    for i, (kind, session, minutes_ago, fields) in enumerate(kinds):
        event = events.sample(kind, id=f"evt_{i}", sessionId=session, timestamp=at(minutes_ago))
        del event["userId"]  # sample() always sets one
        out.append({**event, **fields})
    return out


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Receiver]:
    """A receiver with the sessions of sent(), on each store (PostgreSQL refuses what
    SQLite takes: a NUL in text)."""
    db = None  # the harness's SQLite file
    if request.param == "postgres":
        db = request.getfixturevalue("postgres").create_database()
    env = {
        "RECEIVER_LOG_LEVEL": "warning",
        "RECEIVER_WEBHOOK_ALLOW_PRIVATE": "1",
        "RECEIVER_WEBHOOK_ALLOW_HTTP": "1",
    }
    receiver = Receiver(tmp_path_factory.mktemp("schema"), db=db, rules=RULES, env=env).start()
    try:
        for event in sent():
            assert receiver.send(event).status_code == 202
        # routed, so that the alerts the rules open are all there before any test reads them
        routed = "SELECT count(*) FROM events WHERE routed_at IS NOT NULL"
        eventually(lambda: receiver.query(routed)[0][0] == len(sent()), "every event routed")
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="module")
def auth(server: Receiver) -> dict[str, str]:
    """A reader key's header. Enterprise: no plan limit to run into while a thousand
    requests go by."""
    key = server.make_key("schema", plan="enterprise", role="reader")
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def writer(server: Receiver) -> dict[str, str]:
    """A writer key's header: every operation, the actions and subscriptions too."""
    key = server.make_key("schema-writer", plan="enterprise", role="writer")
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def api_schema(server: Receiver, auth: dict[str, str]) -> Any:
    """The live server's document; the cases generated from it carry the key."""
    config = schemathesis.Config.from_dict({"headers": auth})
    return schemathesis.openapi.from_url(f"{server.url}/v1/openapi.json", config=config)


def check(case: schemathesis.Case, auth: dict[str, str]) -> int:
    """Send case with the key and hold the answer to the document; its status."""
    response = case.call_and_validate(headers=auth, checks=CHECKS, timeout=10)
    return int(response.status_code)


@pytest.fixture(scope="module")
def cursors(server: Receiver) -> dict[str, list[str]]:
    """The cursors a page of each list can answer: a list's cursor is the id of its page's
    last item, so it names a stored one (a cursor naming none is a 400, tested below)."""
    opened = "SELECT id FROM alerts WHERE episode > 0 ORDER BY id"
    alerts = [str(row[0]) for row in server.query(opened)]
    assert alerts, "the rules opened no alert"
    return {"/v1/sessions": list(SESSIONS), "/v1/alerts": alerts}


def _valid(case: schemathesis.Case, cursor: str) -> schemathesis.Case:
    """case as a client sends it: with a cursor from a previous page (or none, or empty),
    and subscribing an address that resolves."""
    if case.path == "/v1/webhooks" and isinstance(case.body, dict) and "url" in case.body:
        case.body = {**case.body, "url": SUBSCRIBER}
    if case.query and case.query.get("cursor") and case.path in ("/v1/sessions", "/v1/alerts"):
        case.query = {**case.query, "cursor": cursor}
    return case


@pytest.mark.parametrize(
    ("method", "path"), ALL_OPERATIONS, ids=[f"{m} {p}" for m, p in ALL_OPERATIONS]
)
def test_generated_requests_get_documented_answers(
    api_schema: Any, writer: dict[str, str], cursors: dict[str, list[str]], method: str, path: str
) -> None:
    operation = api_schema[path][method]
    statuses: Counter[int] = Counter()
    # A string in the path has no invalid value to generate; a query parameter or a body has.
    breakable = bool(len(operation.query)) or operation.body is not None and len(operation.body)
    modes = [GenerationMode.POSITIVE] + [GenerationMode.NEGATIVE] * bool(breakable)
    for mode in modes:
        strategy = operation.as_strategy(generation_mode=mode)
        if mode is GenerationMode.POSITIVE:
            real = st.sampled_from(cursors.get(path, [""]))
            strategy = st.tuples(strategy, real).map(lambda pair: _valid(*pair))

        @FUZZ
        @given(case=strategy)
        def answers(case: schemathesis.Case) -> None:
            statuses[check(case, writer)] += 1

        answers()
    print(f"\n{method} {path}: {dict(sorted(statuses.items()))}")  # pytest -s shows it
    # The key went with every request: what was checked is the endpoint, not the 401/403.
    # (An operation with nothing to vary, GET /v1/webhooks, is one request.)
    assert sum(statuses.values()) >= (EXAMPLES if operation.query or "{" in path else 1)
    assert 401 not in statuses and 403 not in statuses, statuses


@pytest.mark.parametrize(
    ("method", "path"), WEBHOOK_OPERATIONS, ids=[p for _, p in WEBHOOK_OPERATIONS]
)
def test_subscriptions_refuse_a_reader_as_documented(
    api_schema: Any, auth: dict[str, str], method: str, path: str
) -> None:
    operation = api_schema[path][method]
    given: dict[str, Any] = {}
    if "{id}" in path:
        given["path_parameters"] = {"id": "wh_x", "deliveryId": "1", "job": "1"}
    if method == "POST" and path == "/v1/webhooks":
        given["body"] = {"url": "https://example.com/h", "events": ["score.drop"]}
        given["media_type"] = "application/json"
    case = operation.Case(**given)
    assert check(case, auth) == 403


@pytest.mark.parametrize(
    "path", ["/v1/sessions/{id}", "/v1/sessions/{id}/score", "/v1/sessions/{id}/scores"]
)
def test_existing_sessions_match_the_document(
    api_schema: Any, auth: dict[str, str], path: str
) -> None:
    """Generated ids name no session: here each session of the store is read, so the 200
    answers are held to the document too, not only the 404s."""
    operation = api_schema[path]["GET"]
    for session_id in SESSIONS:
        case = operation.Case(path_parameters={"id": session_id})
        assert check(case, auth) == 200, session_id


@pytest.mark.parametrize(
    ("query", "status"),
    [
        pytest.param({}, 200, id="all"),
        pytest.param({"userId": "u1", "limit": 1}, 200, id="page"),
        pytest.param({"status": "stopped", "limit": 100}, 200, id="status"),
        pytest.param({"from": "2000-01-01", "to": "9999-12-31"}, 200, id="dates"),
        pytest.param({"from": "2000-01-01T00:00:00+14:00"}, 200, id="timestamp"),
        # valid times past datetime's range in UTC (once a 500, then a 400): the calendar's
        # first or last instant
        pytest.param({"from": "0001-01-01T00:00:00+01:00"}, 200, id="before-year-1"),
        pytest.param({"to": "9999-12-31T23:59:59-01:00"}, 200, id="after-year-9999"),
        # what int() refuses (each a 500 once)
        pytest.param({"limit": "\u00b2"}, 400, id="superscript-digit"),
        pytest.param({"limit": "1" * 5000}, 400, id="5000-digits"),
        # a 500 on PostgreSQL, whose text cannot hold a NUL
        pytest.param({"userId": "u\x00"}, 400, id="nul-user"),
        pytest.param({"cursor": "s\x00"}, 400, id="nul-cursor"),
        pytest.param({"cursor": ""}, 200, id="empty-cursor-is-the-first-page"),
        pytest.param({"cursor": "zzz"}, 400, id="cursor-naming-no-session"),
    ],
)
def test_session_lists_match_the_document(
    api_schema: Any, auth: dict[str, str], query: dict[str, Any], status: int
) -> None:
    assert check(api_schema["/v1/sessions"]["GET"].Case(query=query), auth) == status


def test_alert_pages_follow_their_cursors_and_refuse_an_unknown_one(
    server: Receiver, api_schema: Any, auth: dict[str, str], cursors: dict[str, list[str]]
) -> None:
    operation = api_schema["/v1/alerts"]["GET"]
    answer = server.get("/v1/alerts", auth["Authorization"].removeprefix("Bearer "))
    everything = answer.json()["alerts"]
    assert [a["id"] for a in everything] == cursors["/v1/alerts"]
    first = operation.Case(query={"limit": 1, "cursor": ""}).call(headers=auth)
    assert first.status_code == 200  # an empty cursor is the first page
    assert first.json()["alerts"] == everything[:1]
    after = operation.Case(query={"limit": 1, "cursor": first.json()["cursor"]})
    assert after.call(headers=auth).json()["alerts"] == everything[1:2]
    for cursor in ("zzz", "session:nobody"):  # not one a page answered: 400, as sessions do
        refused = operation.Case(query={"cursor": cursor}).call(headers=auth)
        assert refused.status_code == 400, cursor
        assert refused.json()["error"]["code"] == "invalid_parameter"
        assert "names no alert" in refused.json()["error"]["message"]
    assert check(operation.Case(query={"session": "s" * 501}), auth) == 400  # maxLength


def test_an_alert_that_never_opened_is_not_listed_and_resolved_ones_have_a_time(
    server: Receiver, api_schema: Any, auth: dict[str, str]
) -> None:
    """s5 only had session.stopped: its row (kept so that a late drop is stale) is no
    alert; s3's drop was resolved by its session.stopped, at that event's time."""
    answer = server.get("/v1/alerts", auth["Authorization"].removeprefix("Bearer "))
    listed = {a["id"]: a for a in answer.json()["alerts"]}
    assert "session:s5" not in listed and listed["session:s3"]["state"] == "resolved"
    assert all(a["resolvedAt"] for a in listed.values() if a["state"] == "resolved"), listed
    one = api_schema["/v1/alerts/{id}"]["GET"]
    assert check(one.Case(path_parameters={"id": "session:s5"}), auth) == 404
    cursor = api_schema["/v1/alerts"]["GET"].Case(query={"cursor": "session:s5"})
    assert check(cursor, auth) == 400


def test_a_session_id_with_a_nul_is_not_found(api_schema: Any, auth: dict[str, str]) -> None:
    for path in ("/v1/sessions/{id}", "/v1/sessions/{id}/score", "/v1/sessions/{id}/scores"):
        case = api_schema[path]["GET"].Case(path_parameters={"id": "s1\x00"})
        assert check(case, auth) == 404, path


@pytest.mark.parametrize("window", ["1h", "30d"])
@pytest.mark.parametrize("metric", ["avg", "p50", "p95"])
@pytest.mark.parametrize("group_by", ["page", "cohort", "userId"])
def test_aggregates_match_the_document(
    api_schema: Any, auth: dict[str, str], group_by: str, metric: str, window: str
) -> None:
    query = {"groupBy": group_by, "metric": metric, "window": window}
    assert check(api_schema["/v1/scores"]["GET"].Case(query=query), auth) == 200


def test_the_document_needs_no_key(server: Receiver) -> None:
    r = server.get("/v1/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert {(m, p) for p, item in r.json()["paths"].items() for m in item} == {
        (m.lower(), p) for m, p in ALL_OPERATIONS
    }
