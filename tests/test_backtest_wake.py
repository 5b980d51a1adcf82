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


def _event(kind: str, event_id: str, minute: float, user: str) -> StoredEvent:
    stamp = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body: dict[str, Any] = events.sample(
        kind, id=event_id, sessionId="s1", userId=user, timestamp=stamp
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
