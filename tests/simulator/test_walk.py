"""The simulator's walk (receiver.simulator.walk): a session's score crossing the threshold
makes drops and recovers, interventions pair up; the retry schedule and duplicates."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from receiver import events
from receiver.events import SENDER_RETRIES
from receiver.simulator.walk import Walk, event_stream, retry_delays, wants_duplicate

START = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _walk(score: float = 50.0, seed: int = 0) -> Walk:
    return Walk(
        session_id="sess_t_001",
        user_id="user_7",
        threshold=40,
        score=score,
        rng=random.Random(seed),
    )


def _types(produced: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in produced]


# -- the walk -------------------------------------------------------------------------------


def test_crossing_below_the_threshold_emits_one_drop_and_crossing_back_one_recover() -> None:
    walk = _walk(50)
    assert walk.move_to(45) == []
    dropped = walk.move_to(39.5)
    assert dropped[0] == {
        "type": "score.drop",
        "sessionId": "sess_t_001",
        "userId": "user_7",
        "score": 39.5,
        "threshold": 40,
    }
    assert walk.move_to(30) == []  # still below: nothing new
    recovered = walk.move_to(40)
    assert _types(recovered)[-1] == "score.recover"
    assert recovered[-1]["score"] == 40
    assert walk.move_to(70) == []


def test_an_intervention_fired_on_a_drop_is_resolved_before_the_recover() -> None:
    for seed in range(20):
        walk = _walk(seed=seed)
        dropped = walk.move_to(10)
        recovered = walk.move_to(60)
        if "intervention.fired" in _types(dropped):
            assert _types(recovered) == ["intervention.resolved", "score.recover"]
            assert recovered[0]["interventionId"] == dropped[1]["interventionId"]
        else:
            assert _types(recovered) == ["score.recover"]


def test_stopping_a_session_closes_its_open_intervention_first() -> None:
    walk = _walk()
    while "intervention.fired" not in _types(walk.move_to(10)):
        walk.move_to(60)
    assert _types(walk.stop()) == ["intervention.resolved", "session.stopped"]
    assert walk.stop()[-1] == {
        "type": "session.stopped",
        "sessionId": "sess_t_001",
        "userId": "user_7",
        "score": 10,
    }


def test_a_long_random_walk_alternates_drops_and_recovers_and_interventions_pair_up() -> None:
    walk = _walk(seed=3)
    produced = [e for _ in range(5000) for e in walk.step()] + walk.stop()
    scores = [e for e in produced if e["type"].startswith("score.")]
    assert len(scores) > 100  # it does wander across the threshold, often
    for i, event in enumerate(scores):
        assert event["type"] == ("score.drop" if i % 2 == 0 else "score.recover")
        assert (event["score"] < 40) == (event["type"] == "score.drop")
        assert 0 <= event["score"] <= 100
    kinds = Counter(_types(produced))
    assert 0 < kinds["intervention.fired"] == kinds["intervention.resolved"]
    assert _types(produced)[-1] == "session.stopped"


def test_the_bench_stream_is_valid_events_with_unique_ids() -> None:
    stream = event_stream(seed=1, sessions=50, threshold=40, start=START)
    sample = [next(stream) for _ in range(3000)]
    assert len({e["id"] for e in sample}) == len(sample)
    assert set(_types(sample)) == set(events.EVENT_TYPES)
    for event in sample:
        events.validate(event)


# -- schedule, duplicates ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("speed", "expected"),
    [
        pytest.param(1, (60, 300, 1800, 7200, 28800), id="service"),
        pytest.param(60, (1, 5, 30, 120, 480), id="minutes-as-seconds"),
        pytest.param(3600, (60 / 3600, 300 / 3600, 0.5, 2, 8), id="hours-as-seconds"),
    ],
)
def test_retry_schedule_is_the_services_divided_by_speed(
    speed: float, expected: tuple[float, ...]
) -> None:
    assert retry_delays(speed) == pytest.approx(expected)
    assert SENDER_RETRIES == (60, 300, 1800, 7200, 28800)


def test_retry_speed_must_be_positive() -> None:
    with pytest.raises(ValueError, match="speed must be > 0"):
        retry_delays(0)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 1.0])
def test_duplicate_share_is_honoured(share: float) -> None:
    rng = random.Random(5)
    n = 20000
    got = sum(wants_duplicate(rng, share) for _ in range(n)) / n
    assert got == pytest.approx(share, abs=0.015)
