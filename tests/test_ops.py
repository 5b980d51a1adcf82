"""/readyz and /metrics answer within their deadline whatever the database does: here it
hangs (PgBouncer paused: every query waits), and both answer while it still hangs."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from receiver.edge.ops import STORE_DEADLINE
from tests.harness import Receiver, eventually, http_client
from tests.pg import ThrowawayPgBouncer

pytestmark = pytest.mark.e2e

# What a Kubernetes probe waits by default (timeoutSeconds: 1); deploy/k8s says so too.
PROBE_TIMEOUT = 1.0


def _timed(url: str) -> tuple[int, str, float]:
    started = time.monotonic()
    answer = http_client.get(url, timeout=10)
    return answer.status_code, answer.text, time.monotonic() - started


def test_probes_answer_while_the_database_hangs(
    tmp_path: Path, pg_url: str, own_bouncer: ThrowawayPgBouncer
) -> None:
    bouncer = own_bouncer
    env = {"RECEIVER_DB_PREPARE_THRESHOLD": "off"}
    server = Receiver(tmp_path, db=bouncer.url(pg_url), env=env).start()
    try:
        assert server.get("/readyz").status_code == 200
        assert "receiver_unrouted_events 0.0" in server.get("/metrics").text
        bouncer.admin("PAUSE")
        try:
            # Twice: a second probe finds the first one's store call still waiting, and
            # waits for it no longer than its own deadline.
            for _ in range(2):
                status, text, took = _timed(f"{server.url}/readyz")
                assert status == 503, text
                assert f"store is not writable: no answer within {STORE_DEADLINE:g}s" in text
                assert took < PROBE_TIMEOUT
                status, text, took = _timed(f"{server.url}/metrics")
                assert status == 200
                assert took < PROBE_TIMEOUT
                # Left out rather than stale, with how old the last figures are.
                assert "receiver_unrouted_events" not in text
                age = re.search(r"^receiver_backlog_age_seconds (\S+)$", text, re.MULTILINE)
                assert age is not None and float(age.group(1)) > 0, text
                assert "receiver_events_total" in text
        finally:
            bouncer.admin("RESUME")
        eventually(lambda: server.get("/readyz").status_code == 200, "ready once resumed")
        metrics = server.get("/metrics").text
        assert "receiver_unrouted_events 0.0" in metrics
        assert "receiver_backlog_age_seconds 0.0" in metrics
    finally:
        server.stop()
