"""`receiver backtest` runs flap detection as the server does (a settle is a timer on its
virtual clock) and says what it would have saved: "flap: N messages held, M flapping
periods, top sessions ..."; the same stream through the real Router sends the same."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from receiver import events, rules
from receiver.backtest import replay as backtest
from receiver.cli.history import _flap_line
from receiver.store.records import StoredEvent
from tests.dispatch.routed import Routed
from tests.test_backtest import HEADER, START, T0, at

RULES = """
rules:
  - name: r
    match: {{type: score.drop}}
    notify: hook
    resolve: true
{flap}
"""
FLAP = "    flap: {changes: 4, within: 10m, quiet: 15m}"


def stream() -> list[tuple[float, dict[str, Any]]]:
    """s1 hovers (nine crossings a minute apart, ending open), s2 drops once and recovers,
    s3 hovers later for six (ending resolved)."""
    found = []
    for session, start, changes in (("s1", 0, 9), ("s2", 2, 2), ("s3", 120, 6)):
        for i in range(changes):
            kind = "score.drop" if i % 2 == 0 else "score.recover"
            minute = start + i
            stamp = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            body = events.sample(kind, id=f"{session}-{i}", sessionId=session, timestamp=stamp)
            found.append((minute, body))
    return sorted(found, key=lambda item: item[0])


def replay(flap: str) -> backtest.Result:
    run = backtest.Backtest(
        rules.load_text(HEADER + RULES.format(flap=flap)), start=START, end=at(24 * 60)
    )
    for minute, body in stream():
        run.route(StoredEvent(body["id"], body["type"], json.dumps(body), at(minute)))
    return run.finish()


def test_the_backtest_counts_what_flap_holds_and_its_periods() -> None:
    without, held = replay(""), replay(FLAP)
    assert without.sent == 17  # every crossing: 9 + 2 + 6
    # s1: drop, resolved, drop, flapping, settled open; s2: both; s3: drop, resolved,
    # drop, flapping, settled recovered.
    assert held.sent == 12
    assert held.rules["r"].suppressed["flapping"] == 4 + 2
    assert (dict(held.flapping), len(held.flap_periods)) == (
        {"session:s1": 4, "session:s3": 2}, 2
    )  # fmt: skip
    assert (
        _flap_line(held) == "flap: 6 messages held, 2 flapping periods, top sessions: s1 ×4, s3 ×2"
    )
    assert not without.flapping and not without.flap_periods


@pytest.mark.parametrize("flap", ["", FLAP], ids=["without", "with"])
def test_the_router_sends_what_the_backtest_counted(tmp_path: Path, flap: str) -> None:
    routed = Routed(tmp_path, HEADER + RULES.format(flap=flap), START)
    try:
        for minute, body in stream():
            routed.advance(at(minute) - routed.now)
            routed.send(body)
        routed.advance(3600)
        sent = [r for r in routed.rows() if r.state == "pending"]
        assert len(sent) == replay(flap).sent
    finally:
        routed.close()
