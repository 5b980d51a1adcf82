"""tx.scratch (base.Scratch): what `receiver backtest` needs of its store in memory besides
the Tx. Only the in-memory store has it (receiver.store.scratch())."""

from __future__ import annotations

from receiver.store import scratch
from receiver.store.records import Alert, StoredEvent
from tests.store.contract.common import note


def stored(i: int, at: float) -> StoredEvent:
    return StoredEvent(f"evt_{i}", "score.drop", "{}", at)


def test_events_put_by_hand_are_routed_once_and_forgotten_once_routed() -> None:
    tx = scratch()
    assert tx.scratch.put(stored(1, 10.0)) and not tx.scratch.put(stored(1, 11.0))
    assert [e.id for e in tx.events.unrouted(5)] == ["evt_1"]
    tx.scratch.forget_event("evt_1")  # not routed yet: kept
    assert tx.events.body("evt_1") == "{}"
    tx.events.mark_routed(["evt_1"], 12.0)
    tx.scratch.forget_event("evt_1")
    assert tx.events.body("evt_1") is None and tx.events.unrouted(5) == []


def test_the_journal_tells_each_row_written_or_changed_once() -> None:
    tx = scratch()
    tx.outbox.add("e1", note("now"), state="pending", now=1.0)
    tx.outbox.add("e1", note("later"), state="held", now=1.0, next_at=50.0, alert="a", episode=1)
    tx.outbox.add("e1", note("quiet"), state="throttled", now=1.0)
    first = [(row.rule, state) for row, state in tx.scratch.changes()]
    assert first == [("now", "pending"), ("later", "held"), ("quiet", "throttled")]
    assert tx.scratch.changes() == []
    assert tx.scratch.next_due() == 1.0
    assert tx.scratch.deliver_due(10.0) == 1  # the held row is due at 50
    assert tx.scratch.next_due() == 50.0
    assert [(row.rule, state) for row, state in tx.scratch.changes()] == [("now", "delivered")]
    assert [row.rule for row in tx.scratch.rows()] == ["later"]  # lean: sent rows leave
    assert tx.scratch.deliver_due(50.0) == 1 and tx.scratch.next_due() is None
    assert tx.scratch.rows() == []


def test_the_next_repeat_is_the_earliest_still_due() -> None:
    tx = scratch()
    assert tx.scratch.next_repeat() is None
    tx.notices.add("a", 1, "r", 100.0, 60.0)
    tx.notices.add("b", 1, "r", 100.0, 30.0)
    assert tx.scratch.next_repeat() == 130.0
    tx.notices.end_repeats("b", 1)
    assert tx.scratch.next_repeat() == 160.0


def test_a_follower_shares_the_leaders_events_and_alerts_not_its_rows() -> None:
    leader, follower = scratch(), scratch()
    follower.scratch.follow(leader.scratch)
    leader.scratch.put(stored(1, 10.0))
    leader.alerts.save(Alert("a", "open", 1, "t", "t", "evt_1"), 10.0)
    leader.outbox.add("evt_1", note(), state="pending", now=10.0)
    assert [e.id for e in follower.events.unrouted(5)] == ["evt_1"]
    assert follower.alerts.get("a") == leader.alerts.get("a")
    assert follower.scratch.rows() == [] and len(leader.scratch.rows()) == 1


def test_a_new_episode_forgets_what_was_kept_of_the_one_before() -> None:
    tx = scratch()
    tx.outbox.add("e1", note("r"), state="pending", now=1.0, alert="a", episode=1)
    tx.notices.add("a", 1, "r", 1.0, None)
    assert tx.outbox.sent("a", 1, "r") and tx.notices.of("a", 1)
    tx.scratch.episode_over(Alert("a", "open", 2, "t", "t", "e2"))
    assert not tx.outbox.sent("a", 1, "r") and tx.notices.of("a", 1) == []
