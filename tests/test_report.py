"""The noise report (receiver.report) as `receiver report` prints it: a period's events, per
rule and per day, the event-to-delivery percentiles, and the same as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from receiver.cli import cli
from tests.test_backtest import ev, stored


def test_receiver_report_prints_the_noise_of_a_period(tmp_path: Path) -> None:
    db = stored(tmp_path, [ev("score.drop", "e1", 0, "s1"), ev("score.drop", "e2", 5, "s2")])
    args = ["report", "--db", db, "--from", "2026-11-23T10:00Z", "--to", "2026-11-24T10:00Z"]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    assert "2 events" in done.output.splitlines()[0]
    assert [line.split() for line in done.output.splitlines() if line.startswith("drop ")] == [
        ["drop", "1", "0", "0", "-"]
    ]
    assert "event to delivery: p50 3.0 s, p99 3.0 s (1 delivered)" in done.output
    report = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert report["rules"]["drop"] == {"sent": 1, "held": 0, "dead": 0, "suppressed": {}}
    assert report["per_day"] == {"2026-11-23": 1, "2026-11-24": 0}
    assert report["top_sessions"] == {"s1": 1}
