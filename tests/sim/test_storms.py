"""The storm window's part of "wake exactly what was held" (tests.sim.storms) on a clean
storm, and on the same run with a fault planted in its rows: each is seen."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.sim.generate import T0, Op, Scenario
from tests.sim.invariants import check
from tests.sim.run import Run, run_scenario
from tests.sim.storms import storm_windows_told_once
from tests.sim.violation import Violation

RULES = """
notifiers:
  chat: json://127.0.0.1:9/chat
rules:
  - name: loud
    match: {type: score.drop}
    notify: [chat]
    storm: {max: 1, per: 60s}
"""


def _drop(n: int, session: str) -> Op:
    body = {
        "id": f"evt_{n}", "type": "score.drop", "sessionId": session, "userId": "u1",
        "score": 5, "threshold": 40, "timestamp": f"2026-12-01T00:00:0{n}.000Z",
    }  # fmt: skip
    return Op(float(n), "event", {"body": body})


def _write(run: Run, statement: str) -> None:
    run.query("SELECT 1")
    assert run._reader is not None
    run._reader.execute(statement)
    run._reader.commit()


def _storm(fault: Callable[[Run], None] | None) -> list[Violation]:
    caught: list[Violation] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        await check(run, final, routed)  # clean so far
        if final and fault is not None:
            fault(run)
            try:
                storm_windows_told_once(run, final=True)
            except Violation as found:
                caught.append(found)

    ops = [_drop(1, "s1"), _drop(2, "s2"), _drop(3, "s3"), Op(600.0, "tick")]
    run_scenario(Scenario(4, T0, [RULES], ops), checker)
    return caught


def test_a_storm_window_is_told_once_when_it_ends() -> None:
    assert _storm(None) == []


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("UPDATE groups SET count = count + 1", "storm: miscounted"),
        ("UPDATE outbox SET state = 'held' WHERE kind = 'storm'", "storm: never told"),
        ("UPDATE outbox SET group_id = 999 WHERE state = 'storm'", "storm: no window"),
        ("INSERT INTO outbox (event_id, rule, notifier, target, title, body, state, created_at,"
         " updated_at, next_at, kind, group_id) SELECT event_id, rule, notifier, target, title,"
         " body, state, created_at, updated_at, next_at, kind, group_id FROM outbox"
         " WHERE kind = 'storm'", "storm: twice"),
    ],
)  # fmt: skip
def test_a_storm_window_told_wrong_is_seen(fault: str, kind: str) -> None:
    [found] = _storm(lambda run: _write(run, fault))
    assert found.invariant == "wake exactly what was held"
    assert found.kind == kind
