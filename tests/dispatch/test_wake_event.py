"""A notification silenced when an update of an open alert came, and sent when the silence
ends, belongs to that update: its row is filed under it (explain shows "silenced, then
sent"), rendered from its fields, and the silence is judged by them, not by the fields of
the event that opened the alert. In process: the real Router on a real SQLite file, on a
clock the test drives (tests/dispatch/routed.py). The first test is the simulation's seed
60, minimized (tests/sim)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver.events import sample
from receiver.rules import load_text
from tests.dispatch.key_pairs import HEAD, T0, at
from tests.dispatch.routed import Routed

BEFORE = """
rules:
  - name: r0
    match: {type: score.drop}
    notify: [chat]
"""
AFTER = """
rules:
  - name: r2
    match: {type: score.drop}
    notify: [chat]
    repeat: 3037s
    title: "drop of {{ userId }}"
"""


@pytest.fixture
def routed(tmp_path: Path) -> Iterator[Routed]:
    found = Routed(tmp_path, HEAD + BEFORE, T0.timestamp())
    yield found
    found.close()


def drop(routed: Routed, event_id: str, user: str) -> dict[str, Any]:
    stamp = at(routed.now - T0.timestamp())
    return sample("score.drop", id=event_id, sessionId="s1", userId=user, timestamp=stamp)


def states(routed: Routed, event_id: str, rule: str) -> list[str]:
    [entry] = [r for r in routed.explain(event_id)["rules"] if r["rule"] == rule]
    return [s["decision"] for s in entry["states"]]


def test_a_woken_notification_is_the_suppressed_events_and_explained_so(
    routed: Routed,
) -> None:
    routed.send(drop(routed, "evt_23", "u1"))  # r0 sends; the alert opens
    routed.advance(30)
    routed.ruleset = load_text(HEAD + AFTER, env={})  # r2 replaces r0
    routed.silence({"userId": "u1"}, 3600)
    routed.advance(2020)
    routed.send(drop(routed, "evt_28", "u1"))  # an update: r2's notification is silenced
    assert states(routed, "evt_28", "r2") == ["silenced"]
    routed.advance(1600)  # the silence has ended: r2's notification is sent once

    woken = [r for r in routed.rows("evt_28") if r.rule == "r2" and r.kind == "event"]
    assert [r.state for r in woken] == ["silenced", "pending"]
    assert woken[1].reason is not None and woken[1].reason.startswith("was silenced since ")
    assert [r.rule for r in routed.rows("evt_23") if r.kind == "event"] == ["r0"]
    assert states(routed, "evt_28", "r2") == ["silenced", "sent"]


def test_the_wake_judges_and_renders_the_suppressed_event_not_the_opener(
    routed: Routed,
) -> None:
    routed.send(drop(routed, "d1", "u1"))  # opens the alert: r0 sends
    routed.ruleset = load_text(HEAD + AFTER, env={})
    routed.silence({"userId": "u2"}, 3600)
    routed.advance(60)
    routed.send(drop(routed, "d2", "u2"))  # an update from another user: silenced
    routed.advance(1200)  # the silence still holds d2's fields (not d1's)
    assert [r.state for r in routed.rows("d2")] == ["silenced"]
    assert [r for r in routed.rows() if r.rule == "r2" and r.state != "silenced"] == []

    routed.advance(2400)
    sent = [r for r in routed.rows("d2") if r.state == "pending"]
    assert [r.title for r in sent] == ["drop of u2"]
    assert states(routed, "d2", "r2") == ["silenced", "sent"]
