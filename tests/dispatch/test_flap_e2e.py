"""Flap detection end to end (the real app under uvicorn, a real SQLite file, an HTTP sink, a
clock the test drives): a simulated session whose score hovers around its threshold crosses
it nine times in nine minutes. Without `flap` each crossing is a message; with it, the
first changes go out, then one flapping message, then one message when it has settled."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.cli import cli
from receiver.events import iso_epoch, sample
from receiver.simulator.walk import Walk, timestamp
from tests.dispatch.test_lifecycle import T0
from tests.harness import FakeClock, InProcessReceiver, eventually, http_client
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{url}"
rules:
  - name: drops
    match: {{type: score.drop}}
    notify: hook
    title: "drop {{{{ sessionId }}}}"
    resolve: true
{flap}
"""
FLAP = "    flap: {changes: 4, within: 10m, quiet: 15m}"
# A score hovering around its threshold of 50: nine crossings, ending below it.
SERIES = [45.0, 55.0, 44.0, 56.0, 47.0, 53.0, 46.0, 54.0, 45.0]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0.timestamp())


def start(tmp_path: Path, clock: FakeClock, sink: HTTPSink, flap: str) -> InProcessReceiver:
    return InProcessReceiver(tmp_path, RULES.format(url=sink.json_url(), flap=flap), clock).start()


def hover(server: InProcessReceiver, clock: FakeClock) -> list[str]:
    """The simulated session's score series, a minute a step; the ids of its events."""
    walk = Walk("sess_hover", "user_1", 50.0, 60.0, random.Random(7))
    ids: list[str] = []
    for score in SERIES:
        for fields in walk.move_to(score):
            if not fields["type"].startswith("score."):
                continue  # its interventions are alerts of their own, matched by no rule
            ids.append(f"evt_{len(ids)}")
            when = T0 + timedelta(seconds=clock.now - T0.timestamp())
            answer = server.send({**fields, "id": ids[-1], "timestamp": timestamp(when)})
            assert answer.status_code == 202, answer.text
        server.wait_routed(len(ids))
        clock.advance(60)
    return ids


@pytest.fixture
def server(tmp_path: Path, clock: FakeClock, http_sink: HTTPSink, request: pytest.FixtureRequest
           ) -> Iterator[InProcessReceiver]:  # fmt: skip
    found = start(tmp_path, clock, http_sink, request.param)
    try:
        yield found
    finally:
        found.stop()


def titles(sink: HTTPSink) -> list[str]:
    return [str(r.json.get("title")) for r in sink.requests]


@pytest.mark.parametrize("server", [""], indirect=True)
def test_without_flap_each_crossing_is_a_message(
    server: InProcessReceiver, clock: FakeClock, http_sink: HTTPSink
) -> None:
    ids = hover(server, clock)
    assert len(ids) == 9
    clock.advance(20 * 60)
    eventually(lambda: len(http_sink.requests) >= 9, "nine messages")
    server.wait_sent()
    assert len(http_sink.requests) == 9, titles(http_sink)


@pytest.mark.parametrize("server", [FLAP], indirect=True)
def test_with_flap_one_flapping_message_and_one_when_it_settles(
    server: InProcessReceiver, clock: FakeClock, http_sink: HTTPSink
) -> None:
    ids = hover(server, clock)
    eventually(lambda: len(http_sink.requests) >= 4, "the messages before it flapped")
    server.wait_sent()
    assert titles(http_sink) == [
        "drop sess_hover", "[drops] resolved: sess_hover", "drop sess_hover",
        "[drops] flapping: session:sess_hover",
    ]  # fmt: skip
    assert _decision(server, ids[6]) == "flapping"
    clock.advance(16 * 60)  # quiet for 15m since its last crossing
    eventually(lambda: len(http_sink.requests) >= 5, "the settle message")
    server.wait_sent()
    assert titles(http_sink)[4:] == ["[settled open] drop sess_hover"]
    kept = [row for row in server.outbox() if row[3] == "flapping"]
    assert len(kept) == 4  # the recover's resolved message and three drops: kept, not sent


def _decision(server: InProcessReceiver, event_id: str) -> str:
    made = CliRunner().invoke(
        cli, ["keys", "create", "--name", "ops", "--plan", "enterprise", "--role", "writer",
              "--json", "--db", str(server.db)],
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    found = http_client.get(
        f"{server.url}/v1/events/{event_id}/explain",
        headers={"Authorization": f"Bearer {json.loads(made.output)['key']}"},
        timeout=10,
    ).json()
    [rule] = [r for r in found["rules"] if r["matched"]]
    return str(rule["decision"])


def test_two_postgres_replicas_count_one_alert_s_changes_together(
    tmp_path: Path, http_sink: HTTPSink, pg_url: str
) -> None:
    """Eight changes of one alert sent to two replicas alternately: the count lives in the
    store, so it flaps once (one flapping message) and settles once."""
    from tests import dbview
    from tests.harness import Receiver

    flap = "    flap: {changes: 4, within: 10m, quiet: 2s}"
    text = RULES.format(url=http_sink.json_url(), flap=flap)
    replicas = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        replicas.append(Receiver(tmp_path / name, rules=text, db=pg_url).start())
    try:
        start = time.time() - 60
        routed = "SELECT count(*) FROM events WHERE routed_at IS NOT NULL"
        for i in range(8):
            kind = "score.drop" if i % 2 == 0 else "score.recover"
            body = sample(kind, id=f"e{i}", sessionId="s1", timestamp=iso_epoch(start + i))
            assert replicas[i % 2].send(body).status_code == 202
            eventually(lambda i=i: dbview.query(pg_url, routed)[0][0] == i + 1, "routed in turn")
        flaps = "SELECT reason FROM outbox WHERE kind = 'flap' ORDER BY id"
        eventually(lambda: len(dbview.query(pg_url, flaps)) == 2, "flapping, then settled")
        reasons = [str(r[0]) for r in dbview.query(pg_url, flaps)]
        assert reasons[0].startswith("started flapping: 4 changes in 10m")
        assert reasons[1] == "settled recovered"
        held = "SELECT count(*) FROM outbox WHERE state = 'flapping'"
        assert dbview.query(pg_url, held) == [(3,)]  # the 4th's resolved message, drops 5 and 7
    finally:
        for replica in replicas:
            replica.stop()
