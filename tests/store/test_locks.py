"""Two replicas through PgBouncer (transaction mode) on alerts they both change: routing
batches, repeats and resolves cross, and no transaction ever deadlocks. Before the locks
took one order a transaction (receiver.store.postgres.locks), each run of this test saw
18 to 23 of them; with the alerts in one order but the repeats' rows locked before their
alerts, 3 to 6."""

from __future__ import annotations

import random
import threading
import uuid
from pathlib import Path

import psycopg
import pytest

from receiver import events
from tests.harness import Receiver, eventually
from tests.servers import HTTPSink
from tests.store.test_pgbouncer import _shown_on_failure

pytestmark = pytest.mark.e2e

RUNS = 10
SESSIONS = 40  # alerts a run opens, all of them changed by both replicas
ROUNDS = 6  # drops (and some recoveries) of every alert, a run

RULES = """\
notifiers:
  hook: "{url}"
rules:
  - name: page
    match: {{type: score.drop}}
    notify: hook
    repeat: 1s
    resolve: true
"""


def _deadlocks(pg_url: str) -> int:
    """The database's deadlocks as PostgreSQL counts them (each backend reports its own
    within a second or so of its transaction)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


def _run(replicas: list[Receiver], run: int) -> None:
    """One run: SESSIONS alerts opened, then ROUNDS rounds of a drop for each (and a
    recovery for some) sent to both replicas at once, in a shuffled order each."""
    sessions = [f"sess_{run}_{uuid.uuid4().hex[:8]}" for _ in range(SESSIONS)]

    def send(replica: Receiver, kinds: list[tuple[str, str]]) -> None:
        for kind, session in kinds:
            body = events.sample(kind, sessionId=session)
            assert replica.send(body).status_code == 202

    for round_ in range(ROUNDS):
        kinds = [("score.drop", s) for s in sessions]
        if round_ % 2:
            kinds += [("score.recover", s) for s in random.sample(sessions, SESSIONS // 3)]
        random.shuffle(kinds)
        half = len(kinds) // 2
        senders = [
            threading.Thread(target=send, args=(replicas[0], kinds[:half])),
            threading.Thread(target=send, args=(replicas[1], kinds[half:])),
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()


@pytest.mark.slow
def test_two_replicas_on_shared_alerts_never_deadlock(
    tmp_path: Path, bouncer_url: str, pg_url: str, http_sink: HTTPSink
) -> None:
    rules = RULES.format(url=http_sink.json_url())
    env = {"RECEIVER_DB_PREPARE_THRESHOLD": "off"}
    replicas: list[Receiver] = []
    with _shown_on_failure(replicas):
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replicas.append(Receiver(tmp_path / name, rules=rules, env=env, db=bouncer_url))
            replicas[-1].start()
        before = _deadlocks(pg_url)
        for run in range(RUNS):
            _run(replicas, run)
            eventually(
                lambda: (
                    replicas[0].query("SELECT count(*) FROM events WHERE routed_at IS NULL")
                    == [(0,)]
                ),
                "every event routed",
            )
        # The repeats ran while batches routed: the timers locked alerts the batches held.
        [(repeats,)] = replicas[0].query(
            "SELECT count(*) FROM outbox WHERE starts_with(title, '[still open]')"
        )
        assert repeats > 0
        logged = sum(replica.logs().count("deadlock detected") for replica in replicas)
        assert logged == 0, f"'deadlock detected' {logged} times in the replicas' logs"
        assert _deadlocks(pg_url) == before
