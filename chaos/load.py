"""What every fault scenario runs: the receiver's rules and settings, and the load, `receiver
simulate` in a child process (the sender, retrying on the service's schedule)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import dbview
from tests.harness import SECRET, Receiver

# Titled with the event id (and what sent it), so the sink can count deliveries of each.
# The plain rule forwards every event, in any order; the lifecycle rule notifies about the
# alert, so a drop older than its alert's newest event is stale for it (docs/alert-lifecycle.md).
PLAIN_RULE, LIFECYCLE_RULE = "every-event", "alerts"
RULES = """
notifiers:
  sink: "{url}"
rules:
  - name: every-event
    notify: [sink]
    title: "{{{{ id }}}}"
    body: "{{{{ type }}}}"
    continue: true
  - name: alerts
    match: {{type: [score.drop, intervention.fired]}}
    notify: [sink]
    title: "alert {{{{ id }}}}"
    body: "{{{{ type }}}}"
    resolve: true
    resolved_title: "resolved {{{{ id }}}}"
"""
# Rows of the report's second table: the plain rule, the lifecycle rule's notifications
# about events, and its resolved messages.
KINDS = {
    "plain": f"plain ({PLAIN_RULE})",
    "lifecycle": f"lifecycle ({LIFECYCLE_RULE})",
    "resolved": f"resolved messages ({LIFECYCLE_RULE})",
}
# The replica scenario (chaos/replicas.py) adds a throttled rule, titled "throttle <id>".
THROTTLE_RULE = "per-user"
KINDS["throttle"] = f"throttled per user ({THROTTLE_RULE})"

# Fast retries so a test sees the whole story in seconds: the notifier retries from 0.2s,
# never waits more than 1s between tries, and never gives up within a test.
ENV = {
    "RECEIVER_RETRY_INITIAL": "0.2",
    "RECEIVER_RETRY_MAX": "1",
    "RECEIVER_RETRY_FOR": "1h",
    # Leases (2 x the longer of the two send timeouts + 10s) expire 12s after a claim.
    "RECEIVER_NOTIFY_TIMEOUT": "1",
    "RECEIVER_WEBHOOK_TIMEOUT": "1",
    "RECEIVER_LOG_LEVEL": "info",
}
# The longest a scenario waits for a condition (the load to arrive, a send to fail): a busy
# machine takes seconds to start the simulator's process. A wait that holds returns at once.
WAIT = 60.0


@dataclass(frozen=True)
class Load:
    """What `receiver simulate` sends: sessions x (duration / tick) score updates."""

    sessions: int = 10
    duration: float = 6.0
    tick: float = 0.1
    speed: float = 300.0  # retries after 0.2s, 1s, 6s, 24s, 96s
    duplicates: float = 0.05
    concurrency: int = 8
    max_wait: float = 40.0
    seed: int = 1
    timeout: float = 3.0  # seconds before the sender counts a delivery as failed


def start_simulator(url: str, load: Load, record: Path) -> subprocess.Popen[bytes]:
    """`receiver simulate` in a child process, with a record file of each id's outcome."""
    args = [
        sys.executable,
        "-m",
        "receiver",
        "simulate",
        "--url",
        f"{url}/v1/events",
        "--sessions",
        str(load.sessions),
        "--duration",
        f"{max(1, round(load.duration))}s",
        "--tick",
        str(load.tick),
        "--speed",
        str(load.speed),
        "--duplicates",
        str(load.duplicates),
        "--concurrency",
        str(load.concurrency),
        "--timeout",
        f"{load.timeout:g}",
        "--max-wait",
        f"{round(load.max_wait)}s",
        "--seed",
        str(load.seed),
        "--record",
        str(record),
        "--json",
        "--no-progress",
    ]
    env = {"RECEIVER_SIGN_SECRET": SECRET, "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@contextlib.contextmanager
def simulator(url: str, load: Load, record: Path) -> Iterator[subprocess.Popen[bytes]]:
    """start_simulator's process for the block: killed if still running at its end (a
    scenario that failed part-way), its pipes closed either way."""
    with start_simulator(url, load, record) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def until(check: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """Poll check() until it is truthy; past the deadline, fail naming what."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def wait_for_load(server: Receiver, sim: subprocess.Popen[bytes]) -> None:
    """Until the receiver has stored an event of the simulator's (or the simulator ended):
    damage done before then would not be done under load."""
    stored = "SELECT 1 FROM events LIMIT 1"
    until(
        lambda: sim.poll() is not None or dbview.query(server.db_url, stored),
        "the simulator's first event",
    )


def finish_simulator(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    try:
        summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise AssertionError(f"simulate gave no summary: {err.decode()[-2000:]}") from None
    return summary
