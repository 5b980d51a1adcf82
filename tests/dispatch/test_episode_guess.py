"""EpisodeGuess: the episode an action link names, guessed before routing from the alert as
stored and the batch's events in order."""

from __future__ import annotations

from receiver.dispatch.alerts import EpisodeGuess
from receiver.store.records import Alert


def test_an_opening_event_names_the_next_episode_and_a_close_the_current() -> None:
    guess = EpisodeGuess(
        {
            "session:open": Alert("session:open", "open", 3, "t"),
            "session:closed": Alert("session:closed", "resolved", 2, "t"),
            "session:new": None,
        }
    )
    assert guess.of("session:open", {"type": "score.drop"}) == 3  # still open: the same one
    assert guess.of("session:closed", {"type": "score.drop"}) == 3  # reopens
    assert guess.of("session:new", {"type": "score.drop"}) == 1
    assert guess.of("session:new", {"type": "score.recover"}) == 1
    assert guess.of("session:new", {"type": "score.drop"}) == 2  # a batch applies in order
