"""What the simulation found where flap detection and until-resolved silences met it
(the merge of both), each as the minimized case `make sim SEED=N` printed, run again
through the whole simulation with every invariant (the seed's number decides which of
stores agree and backtest is the server run): each failed before its fix."""

from __future__ import annotations

from typing import Any

from tests.sim.__main__ import violation
from tests.sim.generate import Op, Scenario

NOTIFIERS = """
notifiers:
  chat: json://127.0.0.1:9/chat
  mail: json://127.0.0.1:9/mail
  pager: ntfys://127.0.0.1:9/pager
"""


def _event(at: float, n: int, kind: str, stamp: str, **fields: Any) -> Op:
    body = {"id": f"evt_{n}", "type": kind, "timestamp": f"2026-12-{stamp}Z", **fields}
    return Op(at, "event", {"body": body})


def _silence(at: float, match: dict[str, Any], for_: float, after: float) -> Op:
    return Op(at, "silence", {"match": match, "for": for_, "after": after})


def test_seed_155_an_until_resolved_silence_of_no_alert_ends_in_memory_too() -> None:
    # The silence matches no open alert: it ends 300 s after it was made, and evt_8 at
    # 371 s is sent. The memory run added it as a plain silence (its after dropped), so
    # there it held evt_8 for its whole 600 s: the stores disagreed.
    rules = NOTIFIERS + "rules:\n- name: r0\n  notify: [chat, pager]\n"
    ops = [
        _silence(6000.0, {"meta.context": "home"}, 600, 300.0),
        _event(
            6371.0,
            8,
            "intervention.resolved",
            "04T05:24:11.000",
            sessionId="s4",
            userId="u1",
            interventionId="iv1",
            meta={"context": "home"},
        ),
    ]
    assert violation(Scenario(155, 1796355480.0, [rules], ops)) is None


def test_seed_281_a_flap_settles_when_due_not_at_the_next_step() -> None:
    # Two changes make s2 flap at 667 s; it settles 268 s later (935 s), before the
    # silence at 967 s. The runner's timers did not look at the flap's settle time, so the
    # settle ran at 967 s, after the silence, and was silenced live; the backtest sent it.
    rules = NOTIFIERS + (
        "rules:\n- name: r0\n  notify: [pager]\n  flap: {changes: 2, within: 1108s, quiet: 268s}\n"
    )
    user = {"sessionId": "s2", "userId": "u2", "threshold": 40}
    ops = [
        _event(
            350.5,
            6,
            "score.drop",
            "05T04:08:50.500",
            score=22,
            meta={"context": "search"},
            **user,
        ),
        _event(667.0, 12, "score.recover", "05T04:14:07.000", score=61, **user),
        _silence(967.0, {"sessionId": "s2"}, 60, 900.0),
    ]
    assert violation(Scenario(281, 1796443380.0, [rules], ops, fails=0.2)) is None


def test_seed_193_a_chain_woken_by_its_silence_ending_pages_at_once() -> None:
    # The until-resolved silence on s1 notes s1's open alert, which never resolves: it
    # ends at its --for limit, and the chain it held starts again with a step due at once.
    # The runner only looked at steps due after now, so that page waited for the next op
    # and, at the end, never came; the backtest paged it.
    rules = NOTIFIERS + (
        "escalations:\n  p0:\n    steps:\n    - notify: [mail]\n"
        "    - notify: [chat]\n      after: 54s\n"
        "rules:\n- name: r0\n  escalate: p0\n  storm: {max: 1, per: 162s}\n"
    )
    ops = [
        _event(
            902.0,
            15,
            "score.recover",
            "06T18:19:02.000",
            sessionId="s2",
            userId="u2",
            score=61,
            threshold=40,
        ),
        _event(
            932.0,
            16,
            "score.drop",
            "06T18:19:32.000",
            sessionId="s1",
            userId="u1",
            score=22,
            threshold=40,
        ),
        _silence(7214.0, {"sessionId": "s1"}, 3600, 60.0),
        _event(
            7906.5,
            26,
            "score.drop",
            "06T20:15:46.500",
            sessionId="s1",
            userId="u1",
            score=35,
            threshold=40,
            meta={"context": "home"},
        ),
        Op(15729.0, "tick", {}),
    ]
    assert violation(Scenario(193, 1796580240.0, [rules], ops, fails=0.4)) is None


def test_seed_201_what_an_inhibition_held_wakes_as_its_source_closes() -> None:
    # evt_36 (s5's drop) is inhibited by the open intervention; evt_38 closes the source
    # and evt_40 resolves the drop, all at one instant. The backtest woke the drop as the
    # source closed (two "was inhibited" messages); the server's timers woke at most once a
    # second, so the drop had resolved first and nothing was sent. The server now wakes at
    # once when a source closes, as when a silence is expired.
    rules = NOTIFIERS + (
        "rules:\n- name: r2\n  notify: [chat, pager]\n  repeat: 738s\n"
        "inhibit:\n- name: iv-covers-drop\n  source: {type: intervention.fired}\n"
        "  target: {type: score.drop}\n  equal: [sessionId]\n"
    )
    ops = [
        _event(
            13651.5,
            31,
            "intervention.fired",
            "05T10:24:31.500",
            sessionId="s5",
            userId="u2",
            interventionId="iv1",
        ),
        _event(
            19486.0,
            36,
            "score.drop",
            "05T12:01:46.000",
            sessionId="s5",
            userId="u2",
            score=22,
            threshold=40,
        ),
        _event(
            19486.0,
            38,
            "intervention.resolved",
            "05T12:01:46.000",
            sessionId="s5",
            interventionId="iv1",
            meta={"context": "search"},
        ),
        _event(
            19486.0,
            40,
            "score.recover",
            "05T12:01:46.000",
            sessionId="s5",
            userId="u2",
            score=61,
            threshold=40,
            meta={"context": "checkout"},
        ),
    ]
    assert violation(Scenario(201, 1796452620.0, [rules], ops)) is None
