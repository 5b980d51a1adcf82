"""An escalation chain belongs to the event that started it, which need not be its alert's
opener (an update that matches the rule when the opener did not, or after a reload): its
pages are filed under that event (explain of it lists them), rendered from it, and a chain
it started silenced waits while a silence holds that event, not the opener. In process:
the real Router on a real SQLite file (tests/dispatch/routed.py). The tests are the
simulation's seeds 90 and 173, minimized (tests/sim)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from receiver.events import sample
from receiver.rules import load_text
from tests.dispatch.key_pairs import HEAD, T0, at
from tests.dispatch.routed import Routed

BY_CONTEXT = """
rules:
  - name: r1
    match: {meta.context: checkout}
    escalate: page
    title: "drop in {{ meta.context }}"
"""
PLAIN = """
rules:
  - name: r0
    notify: [chat]
"""
ESCALATES = """
rules:
  - name: r3
    escalate: page
"""


@pytest.fixture
def routed(tmp_path: Path) -> Iterator[Routed]:
    found = Routed(tmp_path, HEAD + BY_CONTEXT, T0.timestamp())
    yield found
    found.close()


def event(routed: Routed, kind: str, event_id: str, **fields: Any) -> dict[str, Any]:
    stamp = at(routed.now - T0.timestamp())
    return sample(kind, id=event_id, sessionId="s5", timestamp=stamp, **fields)


def test_the_pages_of_a_chain_an_update_started_are_that_updates(routed: Routed) -> None:
    routed.send(event(routed, "score.drop", "evt_18", userId="u2"))  # opens; r1 not matched
    routed.advance(120)
    routed.send(event(routed, "score.drop", "evt_19", userId="u2", meta={"context": "checkout"}))

    [chain] = routed.chains("session:s5")
    assert chain.log[0]["eventId"] == "evt_19"
    pages = [r for r in routed.rows() if r.kind == "escalation"]
    assert [(r.event_id, r.notifier, r.state) for r in pages] == [("evt_19", "pager", "pending")]
    assert pages[0].title == "drop in checkout"  # rendered from evt_19, not the opener
    assert routed.rows("evt_18") == []
    [entry] = routed.explain("evt_19")["rules"]
    assert entry["decision"] == "sent"
    assert [n["id"] for n in entry["notifications"]] == [str(pages[0].id)]


def test_a_chain_started_silenced_waits_while_its_starter_is_silenced(routed: Routed) -> None:
    routed.ruleset = load_text(HEAD + PLAIN, env={})
    fired = {"userId": "u1", "interventionId": "iv1"}
    routed.send(event(routed, "intervention.fired", "evt_22", **fired))  # opens: r0 only
    routed.ruleset = load_text(HEAD + ESCALATES, env={})  # r3 escalates from now on
    silence = routed.silence({"meta.context": "search"}, 3600)
    routed.advance(60)
    routed.send(event(routed, "intervention.fired", "evt_34", meta={"context": "search"}, **fired))
    routed.advance(1200)  # the silence holds evt_34 (not the opener): nothing is paged

    [chain] = routed.chains("intervention:s5:iv1")
    assert chain.log[0]["eventId"] == "evt_34"
    assert [e["event"] for e in chain.log] == ["started"]
    assert [r.state for r in routed.rows() if r.kind == "escalation"] == ["silenced"]

    routed.expire(silence)
    routed.advance(120)  # woken at one look of the timers, paged at the next
    [chain] = routed.chains("intervention:s5:iv1")
    assert [e["event"] for e in chain.log] == ["started", "resumed", "paged"]
    sent = [r for r in routed.rows("evt_34") if r.kind == "escalation" and r.state == "pending"]
    assert [r.notifier for r in sent] == ["pager"]
    assert "was silenced since" in sent[0].body


def test_a_later_event_not_silenced_starts_a_waiting_chain_again_as_its_own(
    routed: Routed,
) -> None:
    # evt_1 starts the chain silenced (its context); evt_2, of the same alert and not
    # silenced, starts it again: its pages were filed under evt_1 and judged by evt_1's
    # fields, so step one was skipped again while the silence held evt_1.
    routed.ruleset = load_text(HEAD + ESCALATES, env={})
    routed.silence({"meta.context": "search"}, 3600)
    routed.send(event(routed, "score.drop", "evt_1", userId="u1", meta={"context": "search"}))
    routed.advance(60)
    routed.send(event(routed, "score.drop", "evt_2", userId="u1"))
    routed.advance(1200)

    [chain] = routed.chains("session:s5")
    assert [(e["event"], e.get("eventId")) for e in chain.log][:3] == [
        ("started", "evt_1"),
        ("started", "evt_2"),
        ("paged", None),
    ]
    pages = [r for r in routed.rows() if r.kind == "escalation" and r.state == "pending"]
    assert {r.event_id for r in pages} == {"evt_2"}
    [entry] = routed.explain("evt_2")["rules"]
    assert entry["decision"] == "sent"
