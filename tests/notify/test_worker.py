"""The outbox worker through a database outage longer than its send lease: every send in
flight when the database went away is recorded by the replica that sent it once the
database is back, and none is sent again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from receiver import events
from tests.harness import Receiver, eventually
from tests.pg import ThrowawayPgBouncer
from tests.servers import HTTPSink
from tests.store.test_pgbouncer import _shown_on_failure

pytestmark = pytest.mark.e2e

SEND_TIMEOUT = 2  # RECEIVER_NOTIFY_TIMEOUT and RECEIVER_WEBHOOK_TIMEOUT
LEASE = 2 * SEND_TIMEOUT + 10  # receiver.app: twice the longer send timeout, plus 10 s
SENDS = 6


@pytest.mark.slow
def test_sends_in_flight_through_an_outage_longer_than_the_lease_go_once(
    tmp_path: Path, pg_url: str, own_bouncer: ThrowawayPgBouncer, http_sink: HTTPSink
) -> None:
    rules = f'notifiers:\n  hook: "{http_sink.json_url()}"\n'
    rules += "rules:\n  - name: all\n    notify: [hook]\n"
    env = {
        "RECEIVER_DB_PREPARE_THRESHOLD": "off",
        "RECEIVER_NOTIFY_TIMEOUT": str(SEND_TIMEOUT),
        "RECEIVER_WEBHOOK_TIMEOUT": str(SEND_TIMEOUT),
    }
    url = own_bouncer.url(pg_url)
    replicas: list[Receiver] = []
    with _shown_on_failure(replicas):
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replicas.append(Receiver(tmp_path / name, rules=rules, env=env, db=url).start())
        # The target answers a second after each request arrives: the database goes away
        # while every send is in flight, so no outcome can be recorded.
        http_sink.delay(1.0)
        for i in range(SENDS):
            body = events.sample("score.drop", id=f"evt_{i}", sessionId=f"sess_{i}")
            assert replicas[i % 2].send(body).status_code == 202
        arrived = http_sink.wait_for(SENDS, timeout=30)
        own_bouncer.stop()
        claimed = time.monotonic()  # each claim came before its request arrived
        assert all(r.received_at <= claimed for r in arrived)
        # Down until every lease has run out (each ran from its claim), and 2 s more.
        eventually(lambda: time.monotonic() > claimed + LEASE + 2, "the leases run out")
        own_bouncer.start()
        http_sink.ok()
        eventually(
            lambda: (
                replicas[0].query("SELECT count(*) FROM outbox WHERE state <> 'delivered'")
                == [(0,)]
            ),
            "every send recorded",
        )
        # Once each: recorded by the replica that made it, never claimed (sent) again.
        rows = replicas[0].query("SELECT attempts, count(*) FROM outbox GROUP BY 1")
        assert rows == [(1, SENDS)], f"rows claimed again after the outage: {rows}"
        assert len(http_sink.requests) == SENDS
        assert any("after the store came back" in replica.logs() for replica in replicas)
