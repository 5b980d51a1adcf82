"""Backtest is the server: `receiver backtest` of a seed's stream (receiver.backtest, its
virtual clock and scratch store) counts, rule by rule, what the live pipeline did.

A backtest knows no acknowledgements and replays one rules file, so the scenario compared
is the seed's without actions, reloads and crashes: its events, silences and timers, run
live (tests.sim.run) and replayed by the backtest's own code from what the live run
stored (its events in order of arrival, its silences). Compared: each rule's sent notifications and
its not-sent ones by state (silenced, muted, storm, ...), as the backtest's report has
them (Result.rules).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from receiver.backtest.replay import Backtest
from receiver.events import load_stored
from receiver.store.records import Silence, StoredEvent
from tests.sim.generate import Op, Scenario, check
from tests.sim.invariants import Violation
from tests.sim.run import Run, run_scenario

EVERY = 5  # two seeds in EVERY: seed % EVERY is 1 or 3 (the stores' is 0)
ON = (1, 3)
CUT = ("ack", "resolve", "snooze", "reload", "crash", "redeliver", "enable")


def comparable(s: Scenario) -> Scenario:
    """The seed's scenario less what a backtest cannot know; a silence added or expired at
    the instant an event arrives comes a tenth of a second later (a backtest cannot tell
    which came first within one instant: it starts silences first)."""
    ops = []
    for o in s.ops:
        if o.kind in CUT:
            continue
        if o.kind in ("silence", "unsilence"):
            o = Op(o.at + 0.1, o.kind, o.data)
        ops.append(o)
    return Scenario(s.seed, s.start, s.rules[:1], ops)


def _live(run: Run) -> dict[str, tuple[int, Counter[str]]]:
    """The live run's rows by rule; a maintenance window's start and end notices left out:
    the backtest previews what a window holds, not its notices (docs/alert-lifecycle.md)."""
    tallies: dict[str, tuple[int, Counter[str]]] = {}
    for rule, state, n in run.query(
        "SELECT rule, state, count(*) FROM outbox WHERE kind NOT IN ('webhook', 'maintenance')"
        " GROUP BY rule, state"
    ):
        sent, other = tallies.setdefault(rule, (0, Counter()))
        if state == "delivered":
            tallies[rule] = (sent + n, other)
        elif state not in ("held", "pending"):
            other[state] += n
    return tallies


def backtest_is_the_server(s: Scenario) -> None:
    """Backtest of the stream counts, rule by rule, what the live pipeline did."""
    same = comparable(s)
    found: list[Any] = []

    async def capture(run: Run, final: bool, routed: list[str]) -> None:
        if final:
            found.append(_live(run))
            found.append(
                run.query("SELECT id, body, received_at FROM events ORDER BY received_at, rowid")
            )
            found.append(
                run.query(
                    "SELECT id, matchers, reason, starts_at, ends_at, expired_at, created_at"
                    " FROM silences"
                )
            )
            found.append(run.now)

    run_scenario(same, capture)
    live, events, silences, end = found
    kept = [
        Silence(int(i), json.loads(m), r, a, b, e, created_at=c) for i, m, r, a, b, e, c in silences
    ]
    replay = Backtest(check(same.rules[0]), start=same.start, end=end, silences=kept)
    for eid, body, received in events:
        payload = load_stored(body)
        replay.route(StoredEvent(eid, str(payload.get("type")), body, received), payload)
    result = replay.finish()
    backtested = {
        name: (t.sent, Counter({k: v for k, v in t.suppressed.items() if v}))
        for name, t in result.rules.items()
    }
    live = {k: v for k, v in live.items() if v[0] or v[1]}
    backtested = {k: v for k, v in backtested.items() if v[0] or v[1]}
    if live != backtested:
        raise Violation(
            "backtest is the server",
            f"live {sorted((k, v[0], dict(v[1])) for k, v in live.items())};"
            f" backtest {sorted((k, v[0], dict(v[1])) for k, v in backtested.items())}",
        )
