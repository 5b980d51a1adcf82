"""The real server, its database broken under it while it runs: routing stops, /readyz says
so (503, "failing": ["router"]), /metrics shows the backlog and the restarts, /healthz goes
503 once it lasts longer than RECEIVER_UNHEALTHY_AFTER; once the database is mended,
routing resumes by itself, in the same process, and nothing stored is lost."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from receiver import events
from tests.harness import Receiver
from tests.pg import ThrowawayPostgres
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{url}"
rules:
  - name: drop
    match: {{type: score.drop}}
    notify: [hook]
"""
DEADLINE = 90.0  # generous: the router retries after 1 s, 2 s, 4 s ... 30 s
PASSWORD = "pw-never-in-a-log-0451"


def until(what: str, check: Callable[[], bool], server: Receiver) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            ready = server.get("/readyz").text
            tail = "\n".join(server.logs().splitlines()[-20:])
            raise AssertionError(f"{what}: not within {DEADLINE}s; /readyz {ready}\n{tail}")
        time.sleep(0.1)


@pytest.fixture
def restricted(postgres: ThrowawayPostgres, pg_url: str) -> Iterator[tuple[str, str]]:
    """(the receiver's URL, as a role of its own with a password; the superuser's URL)."""
    if postgres.external:
        pytest.skip("needs a server of the tests' own to make roles on")
    role = f"receiver_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    database = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
        conn.execute(f'ALTER DATABASE "{database}" OWNER TO {role}')
    url = f"postgresql://{role}:{PASSWORD}@127.0.0.1:{postgres.port}/{database}"
    yield url, pg_url
    with psycopg.connect(postgres.admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f"DROP ROLE IF EXISTS {role}")


def _routing_stops_shows_and_resumes(
    server: Receiver, sink: HTTPSink, breaks: Callable[[], None], mends: Callable[[], None]
) -> None:
    pid = server.proc.pid if server.proc else None
    assert server.send(events.sample("score.drop", sessionId="s1")).status_code == 202
    sink.wait_for(1, timeout=DEADLINE)
    assert server.get("/readyz").json()["failing"] == []

    breaks()
    assert server.send(events.sample("score.drop", sessionId="s2")).status_code == 202

    def failing() -> bool:
        answer = server.get("/readyz")
        return answer.status_code == 503 and answer.json()["failing"] == ["router"]

    until("/readyz naming the router", failing, server)
    body = server.get("/readyz").json()
    assert body["status"] == "not_ready" and "router" in body["error"]["message"]
    assert server.metric("receiver_unrouted_events") == 1
    assert server.metric("receiver_routing_lag_seconds") > 0
    until(
        "/healthz 503 after RECEIVER_UNHEALTHY_AFTER",
        lambda: server.get("/healthz").status_code == 503,
        server,
    )
    assert server.get("/healthz").json()["failing"] == ["router"]

    mends()
    until("/readyz ready again", lambda: server.get("/readyz").status_code == 200, server)
    sink.wait_for(2, timeout=DEADLINE)  # the held-up event's notification went out
    assert server.get("/healthz").status_code == 200
    assert server.metric("receiver_unrouted_events") == 0
    assert server.metric("receiver_routing_lag_seconds") == 0
    assert server.proc is not None and server.proc.pid == pid and server.proc.poll() is None
    assert "router recovered after" in server.logs()


def test_a_revoked_privilege_stops_routing_visibly_and_a_grant_resumes_it(
    tmp_path: Path, restricted: tuple[str, str]
) -> None:
    """The issue's model: PostgreSQL refuses the router's SELECT ... FOR UPDATE on events
    (a ProgrammingError: InsufficientPrivilege); the router is restarted with a backoff
    until the grant is back."""
    url, admin = restricted
    role = url.split("://", 1)[1].split(":", 1)[0]

    def run(sql: str) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql)

    with HTTPSink() as sink:
        server = Receiver(
            tmp_path,
            rules=RULES.format(url=sink.json_url("/hook")),
            db=url,
            env={"RECEIVER_UNHEALTHY_AFTER": "3s"},
        ).start()
        try:
            _routing_stops_shows_and_resumes(
                server,
                sink,
                lambda: run(f"REVOKE UPDATE ON events FROM {role}"),
                lambda: run(f"GRANT UPDATE ON events TO {role}"),
            )
            assert server.metric("receiver_task_restarts_total", 'task="router"') >= 1
            logs = server.logs()
            assert "router failed" in logs and "permission denied" in logs
            assert "Traceback" in logs
        finally:
            server.stop()
    logs = server.logs()
    assert PASSWORD not in logs
    assert f"{role}:***@127.0.0.1" in logs  # the startup line, password replaced


def test_a_table_gone_from_sqlite_stops_routing_visibly_and_its_return_resumes_it(
    tmp_path: Path,
) -> None:
    """SQLite: another process renames a table the router writes (alerts); the SQLite store
    reports that as storage unavailable, so the router pauses and retries by itself. It
    is not restarted, but /readyz names it all the same; /healthz stays 200 (restarting
    the process would not bring the table back)."""
    import sqlite3

    def run(sql: str) -> None:
        with sqlite3.connect(tmp_path / "receiver.db", timeout=30) as conn:
            conn.execute(sql)

    with HTTPSink() as sink:
        server = Receiver(
            tmp_path,
            rules=RULES.format(url=sink.json_url("/hook")),
            env={"RECEIVER_UNHEALTHY_AFTER": "3s"},
        ).start()
        try:
            pid = server.proc.pid if server.proc else None
            assert server.send(events.sample("score.drop", sessionId="s1")).status_code == 202
            sink.wait_for(1, timeout=DEADLINE)
            run("ALTER TABLE alerts RENAME TO alerts_away")
            assert server.send(events.sample("score.drop", sessionId="s2")).status_code == 202

            def failing() -> bool:
                answer = server.get("/readyz")
                return answer.status_code == 503 and answer.json()["failing"] == ["router"]

            until("/readyz naming the router", failing, server)
            loops = server.get("/readyz").json()["checks"]["loops"]
            assert loops["router"]["state"] == "paused"
            assert "no such table: alerts" in loops["router"]["error"]
            assert server.metric("receiver_unrouted_events") == 1
            time.sleep(3.5)  # past RECEIVER_UNHEALTHY_AFTER: a pause never makes it unhealthy
            assert server.get("/healthz").status_code == 200
            run("ALTER TABLE alerts_away RENAME TO alerts")
            until("/readyz ready again", lambda: server.get("/readyz").status_code == 200, server)
            sink.wait_for(2, timeout=DEADLINE)
            assert server.metric("receiver_unrouted_events") == 0
            assert server.proc is not None and server.proc.pid == pid
        finally:
            server.stop()
