"""Silences that end with their alert (`receiver silence add --until-resolved [--after 5m]`),
on a clock the test drives (the real Router on a real SQLite file): such a silence ends once
every alert it matched when made has stayed resolved for `after` (a flap re-firing inside
that keeps it), or at its limit; what it held that is still open is then woken, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from receiver.events import sample
from receiver.store.silences import add_silence
from tests.dispatch.key_pairs import T0, at
from tests.dispatch.routed import Routed

RULES = """
notifiers:
  chat: "json://127.0.0.1:9/chat"
rules:
  - name: r
    match: {type: score.drop}
    notify: [chat]
    resolve: true
"""


@pytest.fixture
def routed(tmp_path: Path) -> Any:
    found = Routed(tmp_path, RULES, T0.timestamp())
    yield found
    found.close()


def send(routed: Routed, kind: str, event_id: str, session: str) -> None:
    stamp = at(routed.now - T0.timestamp())
    routed.send(sample(kind, id=event_id, sessionId=session, timestamp=stamp))


def add(routed: Routed, seconds: float, after: float) -> tuple[int, tuple[str, ...]]:
    now = routed.now
    made = routed.transact(
        lambda tx: add_silence(tx, {"sessionId": "s*"}, "known", now, now + seconds, after=after)
    )
    return made.id, made.alerts


def active(routed: Routed) -> list[int]:
    return [s.id for s in routed.transact(lambda tx: tx.silences.active(routed.now))]


def woken(routed: Routed) -> list[str]:
    return [r.event_id for r in routed.rows() if r.reason and r.reason.startswith("was silenced")]


def test_a_flap_inside_after_keeps_it_then_it_ends_and_wakes_what_it_held(
    routed: Routed,
) -> None:
    send(routed, "score.drop", "d1", "s1")  # open before the silence: notified
    silence, alerts = add(routed, 24 * 3600, after=300)
    assert alerts == ("session:s1",)
    routed.advance(60)
    send(routed, "score.recover", "r1", "s1")  # resolved ...
    routed.advance(60)
    send(routed, "score.drop", "d2", "s2")  # another alert it matches: silenced, waits
    routed.advance(60)
    send(routed, "score.drop", "d1-again", "s1")  # ... and re-fires inside after
    assert [r.state for r in routed.rows("d1-again")] == ["silenced"]
    routed.advance(60)
    send(routed, "score.recover", "r1-again", "s1")  # resolved again at 4m
    routed.advance(4 * 60)  # 4m later: not yet
    assert active(routed) == [silence] and not woken(routed)
    routed.advance(60)  # resolved for 5m: it ends, and s2, still open, is notified once
    assert active(routed) == [] and woken(routed) == ["d2"]
    routed.advance(3600)
    assert woken(routed) == ["d2"]


def test_it_ends_at_its_limit_with_its_alert_still_open(routed: Routed) -> None:
    send(routed, "score.drop", "d1", "s1")
    add(routed, 10 * 60, after=300)
    send(routed, "score.drop", "d2", "s2")
    routed.advance(9 * 60)
    assert not woken(routed)
    routed.advance(60)
    assert active(routed) == [] and woken(routed) == ["d2"]


def test_one_that_matched_no_open_alert_ends_after_after(routed: Routed) -> None:
    silence, alerts = add(routed, 3600, after=120)
    assert alerts == ()
    routed.advance(60)
    assert active(routed) == [silence]
    routed.advance(60)
    assert active(routed) == []


def test_a_plain_silence_is_not_ended_by_its_alerts(routed: Routed) -> None:
    send(routed, "score.drop", "d1", "s1")
    now = routed.now
    routed.transact(lambda tx: add_silence(tx, {"sessionId": "s1"}, "plain", now, now + 3600))
    send(routed, "score.recover", "r1", "s1")
    routed.advance(30 * 60)
    assert len(active(routed)) == 1
