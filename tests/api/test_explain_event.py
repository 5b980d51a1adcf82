"""GET /v1/events/:id/explain and `receiver explain --event` against the real server: each
decision kind (sent, held, digest, throttled, silenced, quiet, inhibited, storm, stale) read
back from what routing recorded, duplicates counted, a rule that did not match with its
reason, and an event routed before a reload explained with the rules it was routed with."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver.events import sample
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e


def _closed_hours() -> str:
    """A one-minute window that does not hold now (nor the next hours): quiet now."""
    hour = (datetime.now(UTC).hour + 6) % 24
    return f"{hour:02d}:00-{hour:02d}:01"


RULES = """
notifiers:
  hook: "{url}"
inhibit:
  - name: covers
    source: {{type: intervention.fired}}
    target: {{type: score.drop, userId: u_inhibited}}
    equal: [sessionId]
rules:
  - name: never
    match: {{type: session.stopped}}
    notify: hook
  - name: held
    match: {{type: score.drop, userId: u_held}}
    notify: hook
    hold: 1h
  - name: digest
    match: {{type: score.drop, userId: u_digest}}
    notify: hook
    group: {{by: [userId], wait: 1h}}
  - name: throttled
    match: {{type: score.drop, userId: u_throttled}}
    notify: hook
    throttle: {{every: 1h}}
  - name: quiet
    match: {{type: score.drop, userId: u_quiet}}
    notify: hook
    active: {{hours: "{hours}", tz: UTC}}
  - name: storm
    match: {{type: score.drop, userId: u_storm}}
    notify: hook
    storm: {{max: 1, per: 1h}}
  - name: stale
    match: {{type: score.drop, userId: u_stale}}
    notify: hook
    resolve: true
  - name: everything
    notify: hook
"""


def at(minutes: float) -> str:
    moment = datetime.now(UTC) - timedelta(minutes=30) + timedelta(minutes=minutes)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def drop(event_id: str, user: str, minute: float = 0, **fields: Any) -> dict[str, Any]:
    return sample(
        "score.drop", id=event_id, userId=user, sessionId=f"s_{event_id}", timestamp=at(minute),
        **fields,
    )  # fmt: skip


@pytest.fixture
def server(tmp_path: Path, http_sink: HTTPSink) -> Receiver:
    text = RULES.format(url=http_sink.json_url(), hours=_closed_hours())
    return Receiver(tmp_path, rules=text).start()


def explain(server: Receiver, key: str, event_id: str) -> dict[str, Any]:
    answer = server.get(f"/v1/events/{event_id}/explain", key)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def matched(found: dict[str, Any]) -> dict[str, Any]:
    [rule] = [r for r in found["rules"] if r["matched"]]
    return rule


def routed(server: Receiver, count: int) -> None:
    deadline = time.monotonic() + 30
    while server.query("SELECT count(*) FROM events WHERE routed_at IS NOT NULL")[0][0] < count:
        assert time.monotonic() < deadline, "routing did not catch up"
        time.sleep(0.05)


def test_every_decision_kind_is_explained_from_what_routing_recorded(
    server: Receiver, http_sink: HTTPSink
) -> None:
    try:
        silenced = server.cli(
            "silence", "add", "--match", "userId=u_silenced", "--for", "1h", "--reason", "deploy"
        )
        assert silenced.returncode == 0, silenced.stderr
        fired = sample(
            "intervention.fired", id="i1", sessionId="s_e_inh", userId="x", timestamp=at(0)
        )
        stream = [
            drop("e_sent", "u_anyone"),
            drop("e_held", "u_held"),
            drop("e_digest", "u_digest"),
            drop("e_thr1", "u_throttled"),
            drop("e_thr2", "u_throttled"),
            drop("e_quiet", "u_quiet"),
            drop("e_silenced", "u_silenced"),
            fired,
            {**drop("e_inh", "u_inhibited"), "sessionId": "s_e_inh"},
            drop("e_storm1", "u_storm"),
            drop("e_storm2", "u_storm"),
            {**drop("e_new", "u_stale", 10), "sessionId": "s_stale"},
            {**drop("e_old", "u_stale", 5), "sessionId": "s_stale"},
        ]
        for event in stream:
            assert server.send(event).status_code == 202
        assert server.send(stream[0]).status_code == 200  # a duplicate delivery
        routed(server, len(stream))
        key = server.make_key("ops", role="writer")

        expected = {
            "e_sent": "sent", "e_held": "held", "e_digest": "digest", "e_thr1": "sent",
            "e_thr2": "throttled", "e_quiet": "quiet", "e_silenced": "silenced",
            "e_inh": "inhibited", "e_storm1": "sent", "e_storm2": "storm", "e_new": "sent",
            "e_old": "stale",
        }  # fmt: skip
        for event_id, decision in expected.items():
            rule = matched(explain(server, key, event_id))
            assert rule["decision"] == decision, (event_id, rule)
        inhibited = matched(explain(server, key, "e_inh"))
        assert inhibited["reason"].startswith("by covers (i1, open since ")
        assert [n["state"] for n in inhibited["notifications"]] == ["inhibited"]
        silence = matched(explain(server, key, "e_silenced"))["reason"]
        assert silence == "silence #1: deploy"

        # The rules file is kept without its notifier urls (a token written into one must
        # not rest in the database); the verdicts above came from that copy.
        [(kept,)] = server.query("SELECT text FROM rulesets")
        assert http_sink.json_url() not in kept and "${RECEIVER_REDACTED_URL}" in kept
        first = explain(server, key, "e_sent")
        assert first["duplicates"] == 1 and first["rulesAsOf"] == "routing"
        assert first["rules"][0] == {
            "rule": "never", "matched": False,
            "reason": 'type: "score.drop" is not "session.stopped"',
        }  # fmt: skip
        assert first["rules"][-1]["rule"] == "everything" and first["rules"][-1]["matched"]
        skipped = [r for r in first["rules"] if r["rule"] == "held"][0]
        assert skipped == {
            "rule": "held", "matched": False,
            "reason": 'userId: "u_anyone" is not "u_held"',
        }  # fmt: skip

        # Reader keys may not; an unknown id is 404 not_found.
        reader = server.make_key("viewer")
        assert server.get("/v1/events/e_sent/explain", reader).status_code == 403
        missing = server.get("/v1/events/nope/explain", key)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

        # After a reload the old event is still explained with the rules it was routed by.
        server.rules.write_text(
            RULES.format(url=http_sink.json_url(), hours=_closed_hours()).replace(
                "userId: u_held", "userId: u_someone_else"
            )
        )
        old = first["rulesFile"]["digest"]
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/readyz").json()["checks"]["rules"]["digest"] == old:
            assert time.monotonic() < deadline, "the reload did not happen"
            time.sleep(0.1)
        again = explain(server, key, "e_held")
        assert matched(again)["rule"] == "held" and again["rulesFile"]["digest"] == old

        printed = server.cli("explain", "--event", "e_inh")
        assert printed.returncode == 0, printed.stderr
        assert "inhibited — by covers (i1, open since" in printed.stdout
    finally:
        server.stop()
