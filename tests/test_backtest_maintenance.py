"""`receiver backtest` holds notifications in maintenance windows as the server does, wakes
what is still open when a window ends (a boundary on its virtual clock, as a silence's end),
and previews it: "deploy would have held 3 notifications in the last 28 days" and the list;
the same stream through the real Router sends the same."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from receiver import events, rules
from receiver.backtest import replay as backtest
from receiver.cli.history import _maintenance_lines, _result_json
from receiver.store.records import StoredEvent
from tests.dispatch.routed import Routed
from tests.test_backtest import HEADER, START, T0, at

RULES = """
rules:
  - name: r
    match: {{type: score.drop}}
    notify: hook
    resolve: true
{maintenance}
"""
# T0 is a Monday 10:00 UTC: the window is 10:30-11:00 every Monday.
WINDOW = """
maintenance:
  - name: deploy
    timezone: UTC
    every: ["Mon 10:30-11:00"]
"""
WEEK = 7 * 24 * 60


def stream() -> list[tuple[float, dict[str, Any]]]:
    """s1 drops inside the window and stays open; s2 drops and recovers inside it; s3
    drops after it; a week later s4 drops inside it again."""
    found = []
    for session, minute, kind in (
        ("s1", 40, "score.drop"), ("s2", 45, "score.drop"), ("s2", 50, "score.recover"),
        ("s3", 120, "score.drop"), ("s4", WEEK + 35, "score.drop"),
    ):  # fmt: skip
        stamp = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        found.append((minute, events.sample(kind, id=f"{session}-{minute}", sessionId=session,
                                            timestamp=stamp)))  # fmt: skip
    return found


def replay(maintenance: str) -> backtest.Result:
    text = HEADER + RULES.format(maintenance=maintenance)
    run = backtest.Backtest(rules.load_text(text), start=START, end=at(28 * 24 * 60))
    for minute, body in stream():
        run.route(StoredEvent(body["id"], body["type"], json.dumps(body), at(minute)))
    return run.finish()


def test_the_backtest_previews_what_a_window_holds_and_wakes_what_stays_open() -> None:
    without, held = replay(""), replay(WINDOW)
    assert without.sent == 5  # four drops and s2's resolved message
    # s1 and s4 woken when the window ends, s3 after it; s2 resolved inside: nothing.
    assert held.sent == 3
    assert held.rules["r"].suppressed["maintenance"] == 3
    assert dict(held.maintenance) == {"deploy": 3}
    lines = _maintenance_lines(held)
    assert lines[0] == "deploy would have held 3 notifications in the last 28 days"
    assert [line.split()[2:] for line in lines[-3:]] == [
        ["deploy", "r", "session:s1"], ["deploy", "r", "session:s2"], ["deploy", "r", "session:s4"]
    ]  # fmt: skip
    assert _result_json(held)["maintenance"]["held"] == {"deploy": 3}
    assert not without.maintenance


@pytest.mark.parametrize("maintenance", ["", WINDOW], ids=["without", "with"])
def test_the_router_sends_what_the_backtest_counted(tmp_path: Path, maintenance: str) -> None:
    routed = Routed(tmp_path, HEADER + RULES.format(maintenance=maintenance), START)
    try:
        for minute, body in stream():
            routed.advance(at(minute) - routed.now)
            routed.send(body)
        routed.advance(3600)
        sent = [r for r in routed.rows() if r.state == "pending"]
        assert len(sent) == replay(maintenance).sent
    finally:
        routed.close()
