"""Flap detection on a clock the test drives (the real Router on a real SQLite file): an
alert that opens and resolves `changes` times within `within` sends one flapping message,
its further changes are kept as `flapping` rows with their reason, its escalation pauses,
and once it stays in one state for `quiet` one message says where it settled (settled open:
the rule's notification again, its repeats and escalation start from there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from receiver.events import sample
from receiver.store.records import OutboxRow
from tests.dispatch.key_pairs import T0, at
from tests.dispatch.routed import Routed

RULES = """
notifiers:
  chat: "json://127.0.0.1:9/chat"
  pager: "json://127.0.0.1:9/pager"
escalations:
  page:
    steps:
      - notify: [pager]
      - after: 5m
        notify: [pager]
rules:
  - name: r
    match: {{type: score.drop}}
    notify: [chat]
    resolve: true
{options}
"""
FLAP = "    flap: {changes: 4, within: 10m, quiet: 15m}"


@pytest.fixture
def routed(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    found = Routed(tmp_path, RULES.format(options=getattr(request, "param", FLAP)), T0.timestamp())
    yield found
    found.close()


def oscillate(
    routed: Routed, changes: int, session: str = "s1", every: float = 60, first: int = 0
) -> list[str]:
    """changes alternating drops and recovers of one session, every seconds, from a drop
    (event ids SESSION-N, N from first); their ids."""
    ids = []
    for i in range(first, first + changes):
        kind = "score.drop" if (i - first) % 2 == 0 else "score.recover"
        event_id = f"{session}-{i}"
        stamp = at(routed.now - T0.timestamp())
        routed.send(sample(kind, id=event_id, sessionId=session, timestamp=stamp))
        ids.append(event_id)
        routed.advance(every, step=every)
    return ids


def sent(rows: list[OutboxRow]) -> list[OutboxRow]:
    return [r for r in rows if r.state == "pending"]


def test_an_oscillating_alert_sends_one_flapping_message_then_one_settle_message(
    routed: Routed,
) -> None:
    oscillate(routed, 9)  # drop, recover, ... drop: it ends open
    out = sent(routed.rows())
    # The first drop and its resolved message, the second drop, then the flapping message
    # at the fourth change (a recover: its resolved message is held).
    assert [(r.kind, r.event_id) for r in out] == [
        ("event", "s1-0"), ("resolved", "s1-1"), ("event", "s1-2"), ("flap", "s1-2"),
    ]  # fmt: skip
    assert out[-1].title == "[r] flapping: session:s1"
    assert "flapping: 4 changes in 10m, now recovered." in out[-1].body
    held = [r for r in routed.rows() if r.state == "flapping"]
    assert [(r.kind, r.event_id) for r in held] == [
        ("resolved", "s1-3"), ("event", "s1-4"), ("event", "s1-6"), ("event", "s1-8"),
    ]  # fmt: skip
    assert all(r.reason and "flapping" in r.reason for r in held), held
    assert routed.explain("s1-6")["rules"][0]["decision"] == "flapping"
    routed.advance(13 * 60)  # 14m after the last change: not quiet for 15m yet
    assert len(sent(routed.rows())) == 4
    routed.advance(60)
    settled = sent(routed.rows())[4:]
    assert [(r.kind, r.event_id, r.title) for r in settled] == [
        ("event", "s1-8", "[settled open] [r] score.drop for s1"),
    ]
    assert "settled dropped after flapping since" in settled[0].body
    states = routed.explain("s1-8")["rules"][0]["states"]
    assert [s["decision"] for s in states] == ["flapping", "sent"]
    # Settled open, it is notified about again: its recover sends the resolved message.
    routed.send(sample("score.recover", id="s1-end", sessionId="s1", timestamp=at(3600)))
    assert [r.kind for r in sent(routed.rows("s1-end"))] == ["resolved"]
    routed.advance(3600)
    assert len(sent(routed.rows())) == 6  # and nothing else, ever


@pytest.mark.parametrize("routed", [""], indirect=True)
def test_without_flap_every_change_is_a_message(routed: Routed) -> None:
    oscillate(routed, 9)
    routed.advance(3600)
    assert len(sent(routed.rows())) == 9


def test_an_alert_that_settles_resolved_gets_one_note_and_no_resolved_message(
    routed: Routed,
) -> None:
    oscillate(routed, 6)  # ends with a recover
    routed.advance(20 * 60)
    out = sent(routed.rows())
    assert [r.kind for r in out] == ["event", "resolved", "event", "flap", "flap"]
    assert out[-1].title == "[r] settled recovered: session:s1"
    routed.advance(3600)
    assert len(sent(routed.rows())) == 5


def test_a_change_inside_quiet_puts_the_settle_off(routed: Routed) -> None:
    oscillate(routed, 4, every=60)
    routed.advance(10 * 60)
    oscillate(routed, 1, first=4)  # the 5th change, a drop, 11 minutes after the 4th
    routed.advance(13 * 60)  # 14m after it
    assert [r.kind for r in sent(routed.rows())][-1] == "flap"  # not settled yet
    routed.advance(60)
    assert sent(routed.rows())[-1].title.startswith("[settled open]")


def test_other_alerts_and_slow_changes_do_not_flap(routed: Routed) -> None:
    for session in ("a", "b"):  # two alerts, two changes each: four changes, no flapping
        oscillate(routed, 2, session=session)
    oscillate(routed, 4, session="c", every=4 * 60)  # 4 changes in 12m: not within 10m
    routed.advance(3600)
    assert not [r for r in routed.rows() if r.state == "flapping" or r.kind == "flap"]


@pytest.mark.parametrize("routed", [FLAP + "\n    escalate: page"], indirect=True)
def test_escalation_pauses_while_flapping_and_resumes_when_it_settles_open(
    routed: Routed,
) -> None:
    oscillate(routed, 5, every=60)  # the 4th change flaps; the 5th (a drop) is held
    routed.advance(10 * 60)
    pages = [r for r in routed.rows() if r.kind == "escalation" and r.state == "pending"]
    assert [r.event_id for r in pages] == ["s1-0", "s1-2"]  # each drop's first step, at once
    assert not [c for c in routed.chains("session:s1") if c.next_at is not None]
    routed.advance(5 * 60)  # settles open: its chain starts from its first step
    pages = [r for r in routed.rows() if r.kind == "escalation" and r.state == "pending"]
    assert [r.event_id for r in pages] == ["s1-0", "s1-2", "s1-4"]
    routed.advance(5 * 60)
    pages = [r for r in routed.rows() if r.kind == "escalation" and r.state == "pending"]
    assert len(pages) == 4  # the second step


@pytest.mark.parametrize("routed", [FLAP + "\n    escalate: page"], indirect=True)
def test_another_drop_of_an_alert_that_flaps_is_kept_and_starts_no_chain(
    routed: Routed,
) -> None:
    oscillate(routed, 5)  # flapping, and open
    stamp = at(routed.now - T0.timestamp())
    routed.send(sample("score.drop", id="again", sessionId="s1", timestamp=stamp))
    [row] = [r for r in routed.rows("again") if r.kind == "event"]
    assert row.state == "flapping" and "an update of the alert" in (row.reason or "")
    assert routed.explain("again")["rules"][0]["decision"] == "flapping"
    assert not [c for c in routed.chains("session:s1") if c.next_at is not None]


def test_an_alert_reopened_by_a_drop_the_rule_does_not_match_settles_as_the_rule_saw_it(
    tmp_path: Path,
) -> None:
    """The rule counted s1's changes up to a recover; a shallow drop it does not match opens
    s1 again: for the rule it settled resolved, and nothing is filed under that drop."""
    deep = RULES.format(options=FLAP).replace(
        "match: {type: score.drop}", "match: {type: score.drop, score: {lt: 30}}"
    )
    routed = Routed(tmp_path, deep, T0.timestamp())
    try:
        oscillate(routed, 4)  # deep drops and recovers: flapping, last resolved
        stamp = at(routed.now - T0.timestamp())
        shallow = sample("score.drop", id="shallow", sessionId="s1", score=35, timestamp=stamp)
        routed.send(shallow)
        routed.advance(20 * 60)
        assert not routed.rows("shallow")
        assert sent(routed.rows())[-1].title == "[r] settled recovered: session:s1"
    finally:
        routed.close()
