"""The fake upstream's population (receiver.simulator.population): repeatable from its seed,
its live sessions making events; and the API keys it takes, each with a plan."""

from __future__ import annotations

from datetime import UTC, datetime

from receiver.simulator.population import Population
from receiver.simulator.serve import parse_keys


def test_the_population_is_repeatable_and_its_live_sessions_make_events() -> None:
    now = datetime(2026, 5, 1, tzinfo=UTC)
    one = Population.generate(seed=3, sessions=20, live=5, threshold=40, now=now)
    two = Population.generate(seed=3, sessions=20, live=5, threshold=40, now=now)
    assert [s.as_dict() for s in one.newest_first()] == [s.as_dict() for s in two.newest_first()]
    finished = [s for s in one.sessions.values() if s.id not in one.live]
    assert len(finished) == 15 and all(s.status == "stopped" for s in finished)
    assert all(len(s.history) >= 5 for s in finished)
    kinds: set[str] = set()
    for n in range(1, 400):
        for event in one.tick(datetime.fromtimestamp(now.timestamp() + n, UTC)):
            kinds.add(event["type"])
            assert event["sessionId"] in one.sessions
    assert {"score.drop", "score.recover"} <= kinds
    assert len(one.live) == 5  # a stopped session is replaced


def test_keys_take_a_plan_after_a_colon() -> None:
    assert parse_keys(("a b:pro", "c:enterprise"), "free") == {
        "a": "free",
        "b": "pro",
        "c": "enterprise",
    }
