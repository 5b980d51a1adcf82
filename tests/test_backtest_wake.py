"""`receiver backtest` wakes a notification a silence held as the server does: judged by the
fields of the event whose notification was silenced (here a later drop of the alert, from
another user than the one who opened it), not by the opening event's, so it waits for that
silence to end even when another silence's start or end makes the backtest look earlier."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from receiver import events, rules
from receiver.backtest import replay as backtest
from receiver.store.records import Silence, StoredEvent
from tests.test_backtest import HEADER, START, T0, at

RULES = """
rules:
  - name: second
    match: {type: score.drop, userId: u2}
    notify: hook
    resolve: true
"""


def _event(kind: str, event_id: str, minute: float, user: str, session: str = "s1") -> StoredEvent:
    stamp = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body: dict[str, Any] = events.sample(
        kind, id=event_id, sessionId=session, userId=user, timestamp=stamp
    )
    return StoredEvent(event_id, kind, json.dumps(body), at(minute))


def test_a_silenced_update_waits_for_its_own_silence_not_the_openers() -> None:
    silences = [
        Silence(1, {"userId": "u2"}, "u2 away", at(0.5), at(60)),
        Silence(2, {"sessionId": "other"}, "unrelated", at(10), at(11)),  # looks meanwhile
    ]
    replay = backtest.Backtest(
        rules.load_text(HEADER + RULES), start=START, end=at(24 * 60), silences=silences
    )
    replay.route(_event("score.drop", "d1", 0, "u1"))  # opens the alert: not this rule's
    replay.route(_event("score.drop", "d2", 1, "u2"))  # an update: silenced
    replay.route(_event("score.recover", "r1", 30, "u2"))  # resolved, still silenced
    result = replay.finish()
    tally = result.rules["second"]
    assert (tally.sent, dict(tally.suppressed)) == (0, {"silenced": 1})


QUIET = """
rules:
  - name: daytime
    match: {type: score.drop}
    notify: hook
    resolve: true
    active: {hours: "11:00-20:00"}
"""


def test_quiet_hours_ending_wakes_what_they_muted() -> None:
    """Seed 318 of `make sim SEEDS=1000`: when a rule's active window opens, the server
    notifies its muted alerts that are still open ("was muted since ..."); the backtest
    replays that too, and sends nothing for an alert that resolved while muted."""
    replay = backtest.Backtest(rules.load_text(HEADER + QUIET), start=START, end=at(24 * 60))
    replay.route(_event("score.drop", "d1", 0, "u1"))  # 10:00, muted; still open at 11:00
    replay.route(_event("score.drop", "d2", 1, "u2", "s2"))  # muted, resolved before 11:00
    replay.route(_event("score.recover", "r2", 30, "u2", "s2"))
    tally = replay.finish().rules["daytime"]
    assert (tally.sent, dict(tally.suppressed)) == (1, {"muted": 2})


def test_a_silence_that_ends_in_quiet_hours_wakes_when_the_window_opens() -> None:
    """Seed 666 of `make sim SEEDS=1000`: the silence ends at 10:30, before the rule's
    window opens at 11:00, so nothing wakes then; the server's timers notify the alert at
    11:00, and so does the backtest now."""
    deferred = QUIET.replace('"11:00-20:00"}', '"11:00-20:00", defer: true}')
    silences = [Silence(1, {"sessionId": "s1"}, "s1 away", at(0), at(30))]
    replay = backtest.Backtest(
        rules.load_text(HEADER + deferred), start=START, end=at(24 * 60), silences=silences
    )
    replay.route(_event("score.drop", "d1", 1, "u1"))  # 10:01, silenced
    tally = replay.finish().rules["daytime"]
    assert (tally.sent, dict(tally.suppressed)) == (1, {"silenced": 1})
