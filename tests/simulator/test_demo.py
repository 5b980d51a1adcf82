"""`make demo` shortened: the whole chain runs, prints what arrived, was routed and was
delivered, plays its scenes (escalation, Slack app, flapping), ends with the summary, and
leaves no process behind (on SIGINT too)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import _descendants
from tests.servers import free_port

pytestmark = pytest.mark.e2e


def _demo(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "receiver.simulator.demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )


def _kill_if_running(demo: subprocess.Popen[str]) -> None:
    """A demo that did not end by itself (the test fails): kill it and what it started, which
    runs in sessions of its own and would outlive it."""
    if demo.poll() is not None:
        return
    left = _descendants(demo.pid)
    demo.kill()
    demo.wait()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _count(summary: str, what: str) -> int:
    found = re.search(rf"{re.escape(what)}\s*│\s*(\d+)", summary)
    assert found, f"{what!r} not in the summary:\n{summary}"
    return int(found[1])


@pytest.mark.slow
def test_a_short_demo_runs_the_whole_chain(tmp_path: Path) -> None:
    port = free_port()  # the receiver's, as `make demo DEMO_PORT=N` asks for one
    with _demo("--seconds", "12", "--keep", str(tmp_path), "--port", str(port)) as demo:
        try:
            out, _ = demo.communicate(timeout=120)  # closes its pipe
        finally:
            _kill_if_running(demo)
    assert demo.returncode == 0, out
    assert f"listening on http://127.0.0.1:{port}/v1/events" in out
    assert "receiver upstream register -> wh_" in out
    assert "receiver stopped for" in out and "receiver back" in out
    for stage in ("arrived", "routed", "delivered"):
        assert re.search(rf"s  {stage}\s", out), stage
    summary = out[out.index("demo summary") :]
    delivered = _count(summary, "delivered to slack") + _count(summary, "delivered to email")
    assert delivered >= 1
    assert _count(summary, "of them enriched from upstream") >= 1
    assert "API requests refused 429" in summary
    # The last scene: one escalation, and an ack link followed (GET changes nothing).
    assert "GET /act/*** -> 200: a confirmation page" in out
    assert "POST /act/*** -> 200: acknowledged" in out
    assert re.search(r"step 2 after \d+s: email <- Paging: demo_escalation_\w+_1", out)
    assert "acknowledged by its link" in summary and "came anyway" not in summary
    # The Slack scene: one message, as posted and then updated in place by a click on Ack.
    posted = out.index("the message as posted")
    updated = out.index("updated in place")
    assert "[ Ack ] [ Resolve ] [ Snooze 1h ]" in out[posted:updated]
    assert "Acknowledged by <@U0ADA>" in out[updated:]
    assert re.search(r"1 message, \d+ edits, acked", summary)
    # The flapping scene: the same hovering score with and without flap detection.
    assert "without flap: 9 messages, one per change" in out
    assert "with flap: 5 messages: 3 before it flapped, 1 flapping, 1 settled" in out
    shown = out[out.index("with flap: 5 messages") :]
    assert re.search(r"│ \[flap-scene\] flapping: session:demo_flap_\w+", shown)
    assert re.search(r"│ \[settled open\] demo_flap_\w+ dropped to 45", shown)
    # The receiver verified every delivery with the secret registration gave it.
    log = (tmp_path / "receiver.log").read_text()
    assert "invalid_signature" not in log


def test_an_interrupted_demo_stops_everything_it_started(tmp_path: Path) -> None:
    with _demo("--seconds", "60", "--keep", str(tmp_path)) as demo:  # closes its pipe
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (tmp_path / "receiver.log").exists():
                time.sleep(0.1)
            time.sleep(1)
            children = set(_descendants(demo.pid))
            assert children  # the fake upstream at least
            demo.send_signal(signal.SIGINT)
            out, _ = demo.communicate(timeout=60)
        finally:
            _kill_if_running(demo)
    assert demo.returncode == 130, out
    assert "interrupted" in out and "demo summary" in out
    # Orphans would be reparented away from us: look each one up instead.
    assert [pid for pid in children if _alive(pid)] == []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def test_a_demo_on_a_port_that_is_taken_says_so_and_starts_nothing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "receiver.simulator.demo", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2 and done.stdout == ""
    assert f"Invalid value for --port: 127.0.0.1:{port} is taken" in done.stderr
