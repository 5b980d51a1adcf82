"""Failed sends in the simulation (tests.sim.sends): retried and given up on, each in the
row's attempt log, dead rows retried by an operator, and the invariants holding; "once"
still sees a row sent twice within a lease with no failure between."""

from __future__ import annotations

from typing import Any

from tests.sim.__main__ import violation
from tests.sim.generate import scenario
from tests.sim.invariants import Violation, check, once
from tests.sim.run import Run, run_scenario

SEED = 1  # fails 0.4 of its sends: retries, give-ups and operator retries


def test_failed_sends_are_retried_logged_and_the_invariants_hold() -> None:
    s = scenario(SEED)
    assert s.fails > 0 and any(o.kind == "redeliver" for o in s.ops)
    assert violation(s) is None
    logged: list[Any] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        if final:
            logged.extend(run.query("SELECT DISTINCT status FROM outbox_attempts"))

    run = run_scenario(s, checker)
    assert {(503,), (400,), (200,)} <= set(logged)
    assert any("(retry): retry at" in line for line in run.trace)
    assert any(line.startswith("  retried ") and line != "  retried 0 dead" for line in run.trace)


def test_once_sees_a_send_again_without_a_failure_between() -> None:
    caught: list[Violation] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        await check(run, final, routed)
        if final:
            run.seen.failed.clear()  # as if the runner had sent again with no failure
            try:
                once(run)
            except Violation as found:
                caught.append(found)

    run_scenario(scenario(SEED), checker)
    assert caught and caught[0].invariant == "once"
    assert "sent at" in caught[0].detail
