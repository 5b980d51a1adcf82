"""The session projection's fold (receiver.sessions): order-free, as the read API needs."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from receiver.sessions import Aggregate, Fact, Summary, fold_all, merge_remote
from tests.upstream.test_client import REMOTE

KINDS = ("score.drop", "score.recover", "session.stopped", "intervention.fired",
         "intervention.resolved")  # fmt: skip


@st.composite
def facts(draw: Any) -> list[Fact]:
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        kind = draw(st.sampled_from(KINDS))
        scored = kind.startswith("score.") or draw(st.booleans())
        out.append(
            Fact(
                event_id=f"evt_{i}",
                type=kind,
                session_id="s",
                ts=f"2026-01-01T00:00:{draw(st.integers(0, 5)):02d}.000000Z",  # ties happen
                user_id=draw(st.sampled_from([None, "u1", "u2"])),
                score=float(draw(st.integers(0, 100))) if scored else None,
                context=draw(st.sampled_from([None, "/a", "/b"])),
                cohort=draw(st.sampled_from([None, "x"])),
                signals=draw(st.sampled_from([None, 3, 7])),
                started=draw(st.sampled_from([None, "2025-12-31T23:00:00.000000Z"])),
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(facts(), st.randoms())
def test_any_order_and_any_split_give_the_in_order_summary(fs: list[Fact], rnd: Any) -> None:
    in_order = fold_all({}, sorted(fs, key=lambda f: f.mark))["s"]
    shuffled = list(fs)
    rnd.shuffle(shuffled)
    cut = rnd.randint(0, len(shuffled))
    # routed in two batches (stored, then read back and folded on), as router and reads do
    first = fold_all({}, shuffled[:cut])
    second = fold_all(
        {k: Summary(**{f: getattr(v, f) for f in v.__slots__}) for k, v in first.items()},
        shuffled[cut:],
    )
    again = {**first, **second}["s"]
    assert again == in_order
    assert in_order.as_dict() == again.as_dict()


def test_a_stop_is_for_good_and_interventions_leave_the_status() -> None:
    s = Summary(id="s")
    for fact in (
        Fact("e1", "score.drop", "s", "2026-01-01T00:00:01.000000Z", score=10),
        Fact("e2", "session.stopped", "s", "2026-01-01T00:00:02.000000Z"),
        Fact("e3", "score.recover", "s", "2026-01-01T00:00:03.000000Z", score=80),
    ):
        s.fold(fact)
    assert (s.status, s.score) == ("stopped", 80)
    t = Summary(id="t")
    t.fold(Fact("e1", "score.drop", "t", "2026-01-01T00:00:01.000000Z", score=10))
    t.fold(Fact("e2", "intervention.fired", "t", "2026-01-01T00:00:02.000000Z"))
    assert (t.status, t.interventions, t.signals) == ("dropped", 1, 1)


def test_from_payload_reads_the_optional_fields_and_falls_back() -> None:
    fact = Fact.from_payload(
        {"id": "e", "type": "score.drop", "sessionId": "s", "timestamp": "2026-01-01T00:00:00Z",
         "score": 5, "page": "/p", "signals": True, "startedAt": "not a date"}
    )  # fmt: skip
    assert fact is not None
    assert (fact.context, fact.signals, fact.started, fact.score) == ("/p", None, None, 5.0)
    assert Fact.from_payload({"id": "e", "type": "x", "timestamp": "2026-01-01T00:00:00Z"}) is None


def test_nearest_rank_percentiles() -> None:
    group = Aggregate("k", {10.0: 1, 20.0: 1, 30.0: 1, 40.0: 1})
    assert (group.percentile(50), group.percentile(95), group.avg, group.sessions) == (
        20,
        40,
        25.0,
        4,
    )
    assert Aggregate("k", {7.0: 1}).as_dict(p95=True) == {
        "key": "k", "avg": 7.0, "p50": 7, "sessions": 1, "p95": 7,
    }  # fmt: skip


def test_merging_a_remote_session_twice_is_merging_it_once() -> None:
    once, twice = Summary(id="s1"), Summary(id="s1")
    merge_remote(once, REMOTE)
    merge_remote(twice, REMOTE)
    merge_remote(twice, REMOTE)
    assert once == twice
    assert once.as_dict()["status"] == "dropped" and once.signals == 12


def test_an_older_remote_record_does_not_undo_a_newer_event() -> None:
    summary = Summary(id="s1")
    summary.fold(
        Fact("e1", "score.recover", "s1", "2026-01-01T00:20:00.000000Z", score=80.0, context="/x")
    )
    merge_remote(summary, REMOTE)
    assert (summary.score, summary.status, summary.context) == (80.0, "active", "/x")
    assert summary.interventions == 2  # counts take the larger


def test_a_remote_stop_is_for_good() -> None:
    summary = Summary(id="s1")
    merge_remote(summary, {**REMOTE, "status": "stopped"})
    merge_remote(summary, {**REMOTE, "status": "active", "updatedAt": "2026-01-02T00:00:00Z"})
    assert summary.status == "stopped"
