"""What Prometheus reads: /metrics of a real server that has routed, notified and delivered
to a subscriber passes `promtool check metrics`, and deploy/prometheus-rules.yaml passes
`promtool check rules` and its unit tests (tests/testdata/prometheus-rules.test.yaml),
naming only series the receiver exposes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from receiver import events
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus-rules.yaml"
RULE_TESTS = ROOT / "tests" / "testdata" / "prometheus-rules.test.yaml"
BACKLOG = (
    "receiver_routing_lag_seconds",
    "receiver_unrouted_events",
    "receiver_outbox_pending",
    "receiver_outbox_oldest_seconds",
    "receiver_task_restarts_total",
    "receiver_webhook_deliveries_total",
)


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "promtool not found (Debian's prometheus package; `make test` installs it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(f"SKIPPED: {why}")
    return found


def run(promtool: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_alert_rules_parse_and_fire_when_they_should(promtool: str) -> None:
    checked = run(promtool, "check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 4 rules found" in checked.stdout
    tested = run(promtool, "test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """/metrics of a real server after a routed event, a chat notification and a delivery
    to a webhook subscriber."""
    tmp = tmp_path_factory.mktemp("prometheus")
    with HTTPSink() as sink:
        rules = f'notifiers:\n  hook: "{sink.json_url("/hook")}"\nrules:\n  - name: all\n'
        rules += "    notify: [hook]\n"
        server = Receiver(
            tmp,
            rules=rules,
            env={"RECEIVER_WEBHOOK_ALLOW_PRIVATE": "true", "RECEIVER_WEBHOOK_ALLOW_HTTP": "true"},
        ).start()
        try:
            made = server.cli("webhooks", "add", "--url", f"{sink.url}/sub", "--json")
            assert made.returncode == 0, made.stderr
            assert server.send(events.sample("score.drop")).status_code == 202
            sink.wait_for(2, timeout=60)
            delivered = 'outcome="delivered"'
            wait_for(lambda: server.metric("receiver_webhook_deliveries_total", delivered) == 1)
            # The sink has the notification before the worker marks its row delivered: the
            # backlog gauges read the store at the scrape, so wait for them to show it.
            wait_for(
                lambda: server.metric("receiver_notifications_total", delivered) == 1
                and server.metric("receiver_outbox_pending", 'channel="notify"') == 0
            )
            return server.get("/metrics").text
        finally:
            server.stop()


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.05)


def test_metrics_pass_promtool_and_carry_the_backlog(promtool: str, metrics_text: str) -> None:
    checked = run(promtool, "check", "metrics", stdin=metrics_text)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr
    for name in BACKLOG:
        assert re.search(rf"^{name}(\{{| )", metrics_text, re.M), f"{name} is not on /metrics"
    assert 'receiver_outbox_pending{channel="notify"} 0.0' in metrics_text
    assert 'receiver_task_restarts_total{task="router"} 0.0' in metrics_text
    # A subscriber's delivery is not a chat notification.
    assert 'receiver_notifications_total{outcome="delivered"} 1.0' in metrics_text
    # SQLite's store cycles (the accept's, the routing's...) and how long they held the loop.
    cycles = re.search(r"^receiver_store_cycle_seconds_count (\S+)$", metrics_text, re.M)
    assert cycles is not None and float(cycles[1]) >= 2, "no store cycle counted"


def test_the_alert_rules_name_only_series_the_receiver_exposes(metrics_text: str) -> None:
    exposed = set(re.findall(r"^(receiver_\w+)", metrics_text, re.M))
    named = set(re.findall(r"\b(receiver_\w+)", RULES.read_text()))
    assert named and named <= exposed, named - exposed
