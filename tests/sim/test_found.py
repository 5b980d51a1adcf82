"""What the simulation found, each as the minimized case it printed (`make sim SEED=N`), run
again through the whole simulation with every invariant: each failed before its fix.
The same cases as plain routing tests are in tests/dispatch/."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from tests.sim.__main__ import violation
from tests.sim.generate import T0, Op, Scenario
from tests.sim.invariants import check
from tests.sim.run import Run, run_scenario

NOTIFIERS = """
notifiers:
  chat: json://127.0.0.1:9/chat
  pager: json://127.0.0.1:9/pager
"""


def _event(at: float, n: int, kind: str, stamp: str, **fields: Any) -> Op:
    body = {"id": f"evt_{n}", "type": kind, "timestamp": f"2026-12-{stamp}Z", **fields}
    return Op(at, "event", {"body": body})


def test_seed_90_a_chain_an_update_started_files_its_pages_under_it() -> None:
    # evt_18 opens the alert and does not match r1; evt_19 does and starts the chain: its
    # pages were filed under evt_18 (explain of evt_19 listed none).
    rules = (
        NOTIFIERS
        + """
escalations:
  p0:
    steps:
    - notify: [pager]
rules:
- name: r1
  match: {meta.context: checkout}
  escalate: p0
"""
    )
    drop = {"sessionId": "s5", "userId": "u2", "threshold": 40}
    ops = [
        _event(4575.0, 18, "score.drop", "01T01:46:15.000", score=22, **drop),
        _event(
            4695.0,
            19,
            "score.drop",
            "01T01:48:15.000",
            score=5,
            meta={"context": "checkout"},
            **drop,
        ),  # fmt: skip
    ]
    assert violation(Scenario(90, 1796085000.0, [rules], ops)) is None


def test_seed_173_a_chain_waits_while_a_silence_holds_the_event_that_started_it() -> None:
    # evt_22 opens the alert under r0; a reload brings r3 (escalates); evt_34, silenced by
    # its context, starts r3's chain suppressed. The chain started again a second later,
    # judged by evt_22's fields, while the silence still held evt_34.
    first = NOTIFIERS + "rules:\n- name: r0\n  notify: [chat]\n"
    second = (
        NOTIFIERS
        + """
escalations:
  p1:
    steps:
    - notify: [pager]
rules:
- name: r3
  escalate: p1
"""
    )
    fired = {"sessionId": "s1", "userId": "u1", "interventionId": "iv1"}
    ops = [
        _event(9791.5, 22, "intervention.fired", "05T01:17:11.500", **fired),
        Op(9793.5, "reload", {"file": 1}),
        Op(10307.5, "silence", {"match": {"meta.context": "search"}, "for": 3600}),
        _event(
            12127.5,
            34,
            "intervention.fired",
            "05T01:56:07.500",
            meta={"context": "search"},
            **fired,
        ),  # fmt: skip
    ]
    assert violation(Scenario(173, 1796423940.0, [first, second], ops)) is None


@pytest.mark.parametrize("via", ["engine", "link", "api", "cli"])
def test_an_action_comes_through_its_front_end(via: str) -> None:
    # A drop opens the alert; a snooze, an ack, a resolve and an ack again, all through one
    # front end: the alert's actions record its source, and the invariants hold.
    rules = NOTIFIERS + "rules:\n- name: r0\n  notify: [chat]\n  resolve: true\n"
    drop = {"sessionId": "s1", "userId": "u1", "score": 5, "threshold": 40}
    ops = [
        _event(0.0, 1, "score.drop", "01T00:00:00.000", **drop),
        Op(30.0, "snooze", {"alert": "session:s1", "via": via, "seconds": 600}),
        Op(60.0, "ack", {"alert": "session:s1", "via": via}),
        Op(90.0, "resolve", {"alert": "session:s1", "via": via}),
        Op(120.0, "ack", {"alert": "session:s1", "via": via}),
    ]
    done: list[list[tuple[Any, ...]]] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        await check(run, final, routed)
        if final:
            done.append(run.query("SELECT action, source, outcome FROM alert_actions ORDER BY at"))
            done.append(run.query("SELECT notifier FROM outbox WHERE kind = 'resolved'"))

    run = run_scenario(Scenario(7, T0, [rules], ops), checker)
    source = {"engine": "sim"}.get(via, via)
    assert done[0] == [
        ("snooze", source, "done"),
        ("ack", source, "done"),
        ("resolve", source, "done"),
        # A link names the episode its message was about: over once resolved.
        ("ack", source, "stale" if via == "link" else "already"),
    ]
    assert done[1] == [("chat",)]  # the resolve's message, to whom the rule notified
    assert [line.split(": ")[0].strip() for line in run.trace if " via " in line] == [
        f"{kind} via {via}" for kind in ("snooze", "ack", "resolve", "ack")
    ]


def test_seed_800_a_chain_that_ran_out_pages_again_when_a_snooze_ends() -> None:
    # The chain pages its one step, is acked, pages again at reack, and is snoozed: at the
    # snooze's end it pages its last step again (as documented), and its log now says why
    # (once read two pages of step 1, round 1 with nothing between).
    rules = (
        NOTIFIERS
        + """
escalations:
  p0:
    steps:
    - notify: [pager]
      after: 247s
    reack: 414s
rules:
- name: r0
  escalate: p0
"""
    )
    drop = {"sessionId": "s2", "userId": "u2", "score": 15, "threshold": 40}
    ops = [
        _event(734.5, 10, "score.drop", "01T09:25:14.500", **drop),
        Op(10527.5, "ack", {"alert": "session:s2", "via": "cli"}),
        Op(16227.5, "snooze", {"alert": "session:s2", "seconds": 600, "via": "engine"}),
        _event(18418.5, 29, "score.drop", "01T14:24:58.500", **{**drop, "sessionId": "s3"}),
    ]
    logs: list[list[tuple[Any, ...]]] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        await check(run, final, routed)
        if final:
            logs.append(run.query("SELECT log FROM escalations WHERE alert = 'session:s2'"))

    run_scenario(Scenario(800, 1796116380.0, [rules], ops), checker)
    events = [e["event"] for e in json.loads(logs[0][0][0])]
    assert events[-3:] == ["snooze ended", "paged", "done"]


def test_seed_711_the_timers_look_when_quiet_hours_end() -> None:
    # A drop muted before 08:00, an update of its alert long after: the server's timers
    # (every IDLE_POLL) wake the muted alert at 08:00, before the update comes; the runner
    # looked only at what the file said falls due, so the update woke it instead and the
    # backtest (which wakes at 08:00) counted one send more ("backtest is the server").
    rules = NOTIFIERS + (
        "rules:\n- name: r1\n  notify: [chat]\n  resolve: true\n  active: {hours: '08:00-14:00'}\n"
    )
    drop = {"sessionId": "s3", "userId": "u3", "threshold": 40}
    ops = [
        _event(12904.5, 14, "score.drop", "07T06:19:04.500", score=22, **drop),
        _event(19137.5, 34, "score.drop", "07T07:52:57.500", score=15, **drop),
    ]
    assert violation(Scenario(711, 1796611440.0, [rules], ops)) is None


def test_seed_196_a_backtest_keeps_the_event_that_started_a_chain_again() -> None:
    # evt_10 starts r0's chain silenced (its context); evt_27, not silenced, starts it again
    # and is paged. The backtest kept only openers and updates a silence held, so it read
    # evt_27 as its opener evt_10 and skipped the page as silenced.
    rules = NOTIFIERS + "escalations:\n  p1:\n    steps:\n    - notify: [pager]\n"
    rules += "rules:\n- name: r0\n  escalate: p1\n"
    fired = {"sessionId": "s5", "interventionId": "iv2"}
    ops = [
        Op(5762.5, "silence", {"match": {"meta.context": "home"}, "for": 3600}),
        _event(
            6118.5, 10, "intervention.fired", "02T07:33:58.500", meta={"context": "home"}, **fired
        ),
        _event(
            7115.0,
            27,
            "intervention.fired",
            "02T07:40:35.000",
            userId="u2",
            meta={"context": "checkout"},
            **fired,
        ),  # fmt: skip
    ]
    assert violation(Scenario(196, 1796190720.0, [rules], ops)) is None


def test_seed_734_a_chain_started_again_by_a_later_event_pages_from_step_one() -> None:
    # The chain pages steps 1 and 2 for evt_4; a silence on its context skips step 3; evt_16,
    # not silenced, starts the chain again from step one (as a chain woken from a silence
    # does): step 1 pages again, which "once" allows after a restart as after "resumed".
    rules = NOTIFIERS + (
        "escalations:\n  p1:\n    steps:\n    - notify: [chat]\n"
        "    - notify: [chat]\n      after: 130s\n    - notify: [pager]\n      after: 562s\n"
        "rules:\n- name: r2\n  escalate: p1\n"
    )
    drop = {"sessionId": "s3", "userId": "u3", "threshold": 40}
    ops = [
        _event(
            3620.0,
            4,
            "score.drop",
            "03T16:33:20.000",
            score=22,
            meta={"context": "checkout"},
            **drop,
        ),
        Op(4091.0, "silence", {"match": {"meta.context": "checkout"}, "for": 600}),
        _event(4391.0, 16, "score.drop", "03T16:46:11.000", score=35, **drop),
    ]
    assert violation(Scenario(734, 1796312580.0, [rules], ops)) is None


def _start(stamp: str, at: float) -> float:
    """The scenario's start for an event stamped stamp that arrives at at."""
    return datetime.fromisoformat(stamp).timestamp() - at


def test_seed_331_a_windows_notices_are_not_what_the_backtest_previews() -> None:
    # A window with notify: the live run sends its start and end notices; the backtest
    # previews what a window holds, not its notices: "backtest is the server" counted them.
    rules = (
        "notifiers:\n  chat: json://127.0.0.1:9/chat\n  pager: ntfys://127.0.0.1:9/pager\n"
        "rules:\n- name: r2\n  notify: [chat]\n"
        "maintenance:\n- name: m0\n  timezone: UTC\n  every: ['Tue 23:00-Wed 00:00']\n"
        "  match: {sessionId: [s1, s4]}\n  notify: [pager]\n"
    )
    ops = [
        _event(
            4836.5,
            22,
            "score.drop",
            "01T20:40:36.500",
            sessionId="s5",
            userId="u2",
            score=5,
            threshold=40,
        ),  # fmt: skip
        Op(10796.5, "silence", {"match": {"sessionId": "s5"}, "for": 3600, "after": 60.0}),
        Op(18117.0, "tick", {}),
    ]
    assert (
        violation(Scenario(331, _start("2026-12-01T20:40:36.500Z", 4836.5), [rules], ops)) is None
    )


def test_seed_761_the_timers_look_when_a_maintenance_window_ends() -> None:
    # Step 3 of the chain falls in a window and is held; the window ends at 22:00 UTC, long
    # before the next operation: the runner looked only then (restarting the chain late),
    # while the server's timers wake at the window's end, as the backtest does.
    rules = (
        "notifiers:\n  chat: json://127.0.0.1:9/chat\n  mail: json://127.0.0.1:9/mail\n"
        "  pager: ntfys://127.0.0.1:9/pager\n"
        "escalations:\n  p1:\n    steps:\n    - notify: [mail]\n"
        "    - notify: [chat]\n      after: 433s\n    - notify: [pager]\n      after: 229s\n"
        "rules:\n- name: r0\n  escalate: p1\n"
        "maintenance:\n- name: m0\n  timezone: America/New_York\n"
        "  every: ['Thu 16:00-Thu 17:00']\n  notify: [pager]\n"
    )
    ops = [
        _event(
            5896.5,
            10,
            "intervention.fired",
            "03T20:50:16.500",
            sessionId="s5",
            userId="u2",
            interventionId="iv2",
        ),  # fmt: skip
        Op(13436.5, "tick", {}),
    ]
    assert (
        violation(Scenario(761, _start("2026-12-03T20:50:16.500Z", 5896.5), [rules], ops)) is None
    )
