"""Shutdown is bounded whatever the targets do, and abandons sends without losing them.

The real server under uvicorn, a real HTTP target that fails, refuses or never answers,
and a real SMTP server that stalls mid-conversation; each time, the stop is timed as the
server accounts for it (from the signal to its store closed), and the process must exit
well before a stuck send's timeout.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from receiver import events
from tests.harness import Receiver, eventually
from tests.servers import HTTPSink, SMTPSink

pytestmark = pytest.mark.e2e

GRACE = 3.0
# A stop as the server accounts for it ("stopped in X s", from the signal it noted to its
# store closed): the grace, plus room for closing on a busy machine.
LIMIT = GRACE + 2.0
# The process's exit, timed from the signal, adds the interpreter's teardown and whatever
# CPU a busy machine leaves it (10.7 s once, on 2 cores running two test suites): bounded
# well short of a send's 30 s timeout below, which a stop waiting on a stuck send would take.
EXIT_LIMIT = 20.0
ENV = {
    "RECEIVER_SHUTDOWN_GRACE": f"{GRACE:g}",
    "RECEIVER_NOTIFY_TIMEOUT": "30",  # so a stuck send is still in flight at the deadline
}


def rules(**notifiers: str) -> str:
    lines = "".join(f'  {name}: "{url}"\n' for name, url in notifiers.items())
    return (
        f"notifiers:\n{lines}rules:\n  - name: all\n    match: {{type: score.drop}}\n"
        f"    notify: [{', '.join(notifiers)}]\n"
        '    title: "drop {{ id }}"\n    body: "{{ sessionId }}"\n'
    )


def drop(n: int) -> dict[str, object]:
    return events.sample("score.drop", id=f"evt_{n}", sessionId=f"sess_{n}")


def outbox(server: Receiver) -> list[tuple[str, str, str, int]]:
    return server.query("SELECT event_id, notifier, state, attempts FROM outbox ORDER BY id")


def until(check: Callable[[], object], timeout: float = 10, what: str = "condition") -> None:
    """tests.harness.eventually(), its looks further apart as the wait goes on."""
    eventually(check, what, timeout)


def timed_stop(server: Receiver, sig: int = signal.SIGTERM) -> tuple[int, float]:
    """Stop with sig, the process gone within EXIT_LIMIT (else the test fails): its exit
    status, and the stop's length by the server's own account."""
    code = server.stop(sig, timeout=EXIT_LIMIT)
    stops = re.findall(r"stopped in ([0-9.]+)s; store closed", server.logs())
    assert stops, "the server did not say it stopped"
    return code, float(stops[-1])


@pytest.fixture
def start(tmp_path: Path, receiver_db: str | None) -> Iterator[Callable[..., Receiver]]:
    """Starts the server on SQLite, and again on PostgreSQL (receiver_db)."""

    def _start(text: str, **env: str) -> Receiver:
        return Receiver(tmp_path, rules=text, env={**ENV, **env}, db=receiver_db).start()

    yield _start  # tests/conftest.py stops any server a failing test leaves behind


def test_a_target_that_never_answers_is_abandoned_at_the_grace_and_sent_after_restart(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    http_sink.delay(3600)
    server = start(rules(hook=http_sink.json_url()))
    for n in range(3):
        assert server.send(drop(n)).status_code == 202
    http_sink.wait_for(3)  # all three sends are in flight, none answered

    code, took = timed_stop(server)

    assert code == 0
    assert GRACE - 1.5 < took < LIMIT  # it did wait for the sends, and no longer
    assert "abandoned 3 send(s)" in server.logs()
    # Not failed, not dead, the attempt not counted: pending for the next start.
    assert sorted(outbox(server)) == [(f"evt_{n}", "hook", "pending", 0) for n in range(3)]

    http_sink.ok()
    http_sink.clear()
    server.start()
    until(lambda: {row[2] for row in outbox(server)} == {"delivered"}, what="delivery")
    time.sleep(0.5)  # room for a second send, were there one
    sent = sorted(r.json["title"] for r in http_sink.requests if r.status == 200)
    assert sent == ["drop evt_0", "drop evt_1", "drop evt_2"]  # each exactly once
    assert server.stop() == 0


@pytest.mark.parametrize("failure", ["500", "refused"])
def test_retries_waiting_on_a_failing_target_do_not_delay_exit(
    start: Callable[..., Receiver], http_sink: HTTPSink, failure: str
) -> None:
    if failure == "500":
        http_sink.fail_with(500)
    else:
        http_sink.stop()
    server = start(rules(hook=http_sink.json_url()), RECEIVER_RETRY_INITIAL="0.2")
    for n in range(5):
        assert server.send(drop(n)).status_code == 202
    until(
        lambda: server.metric("receiver_notifications_total", 'outcome="retried"') >= 10,
        what="retries",
    )

    code, took = timed_stop(server)

    assert code == 0
    assert took < LIMIT
    assert "stopped in" in server.logs()
    assert all(state == "pending" for _, _, state, _ in outbox(server))


def test_an_smtp_server_stalling_mid_conversation_does_not_hold_up_exit(
    start: Callable[..., Receiver], smtp_sink: SMTPSink
) -> None:
    smtp_sink.stall()
    server = start(rules(mail=smtp_sink.mailto_url()))
    assert server.send(drop(1)).status_code == 202
    until(lambda: smtp_sink.data_started >= 1, what="the message's DATA")

    code, took = timed_stop(server)

    assert code == 0
    assert GRACE - 1.5 < took < LIMIT
    assert outbox(server) == [("evt_1", "mail", "pending", 0)]

    smtp_sink.stall(False)
    server.start()
    until(lambda: outbox(server) == [("evt_1", "mail", "delivered", 1)], what="delivery")
    assert server.stop() == 0


def test_sigint_stops_the_same_way(start: Callable[..., Receiver], http_sink: HTTPSink) -> None:
    http_sink.delay(3600)
    server = start(rules(hook=http_sink.json_url()))
    assert server.send(drop(1)).status_code == 202
    http_sink.wait_for(1)

    code, took = timed_stop(server, signal.SIGINT)

    assert code == 0
    assert took < LIMIT


def test_one_slow_target_never_delays_another(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    with HTTPSink() as slow:
        slow.delay(3600)
        server = start(rules(slow=slow.json_url(), fast=http_sink.json_url()))
        for n in range(30):  # more than the slow target's lane holds (8 at a time)
            assert server.send(drop(n)).status_code == 202
        fast = http_sink.wait_for(30, timeout=10)  # no wait on the slow target's timeouts
        assert len({r.json["title"] for r in fast}) == 30
        assert 1 <= slow.max_in_flight <= 8
        code, took = timed_stop(server)
    assert code == 0
    assert took < LIMIT
    states = {(notifier, state) for _, notifier, state, _ in outbox(server)}
    assert states == {("fast", "delivered"), ("slow", "pending")}


def test_python_m_receiver_freezes_the_heap_before_the_interpreter_ends() -> None:
    """`python -m receiver` (what the tests, the workers and most deployments run) leaves
    the interpreter with its objects frozen (gc.freeze): its final collections skip the
    whole app, which made each server's exit 0.3 to 0.5 s slower (docs/performance.md).
    Read from an atexit hook, which runs after __main__ has finished."""
    code = (
        "import atexit, gc, runpy, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
        "sys.argv = ['receiver', '--version']\n"
        "runpy.run_module('receiver', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "attention-receiver" in done.stdout
    frozen = int(done.stdout.split("frozen")[1])
    assert frozen > 10_000, done.stdout  # the app's objects, not a handful
