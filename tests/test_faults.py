"""Faults, small: kill -9 and SIGTERM under load, a notifier down or slow (`make chaos`: big).

Each asserts the promise, not speed: every acknowledged id stored once, every
stored event notified at least once, nothing dead.
"""

from pathlib import Path

import pytest

from chaos import scenarios
from chaos.scenarios import Load

pytestmark = pytest.mark.e2e

SMALL = Load(sessions=30, duration=4, tick=0.05, max_wait=30)


def _assert_held(outcome: scenarios.Outcome) -> None:
    print(f"\n{outcome.name}: {outcome}")
    assert outcome.ok, outcome.problems
    assert outcome.events > 0 and outcome.stored == outcome.acknowledged == outcome.events
    assert outcome.notified + outcome.not_sent == outcome.stored


def test_kill_9_three_times_under_load_loses_nothing(tmp_path: Path) -> None:
    outcome = scenarios.crash(tmp_path, kills=3, load=SMALL, gap=(0.6, 1.2))
    _assert_held(outcome)


def test_sigterm_under_load_loses_nothing_and_stops_in_bounded_time(tmp_path: Path) -> None:
    outcome = scenarios.sigterm(tmp_path, stops=1, load=SMALL)
    _assert_held(outcome)
    # uvicorn's graceful shutdown (10s) plus the notifier's drain (5s) bound a stop.
    assert outcome.figures["stop_s_max"] < 20


def test_notifier_down_then_back_gets_everything(tmp_path: Path) -> None:
    outcome = scenarios.outage(tmp_path, down=3, load=SMALL)
    _assert_held(outcome)
    assert outcome.figures["notification_retries"] > 0


def test_slow_notifier_times_out_and_retries_without_touching_ingest(tmp_path: Path) -> None:
    outcome = scenarios.slow_sink(tmp_path, answer_after=10, slow_for=3, load=SMALL)
    _assert_held(outcome)
    assert outcome.figures["timed_out_sends"] > 0
