"""Failing subscribers in the simulation (tests.sim.subscribers): a subscription whose
endpoint fails for a while, answers 410 and comes back, its health events routed through
the seed's rules, and the invariants holding; each of the two subscriber invariants still
sees what it is about."""

from __future__ import annotations

from typing import Any

from tests.sim.__main__ import violation
from tests.sim.generate import scenario
from tests.sim.invariants import Violation, check
from tests.sim.run import Run, run_scenario
from tests.sim.subscribers import HOOK_RULE, health_told_once, subscribers_lose_nothing

SEED = 9  # two subscribers: one fails, is disabled and enabled again; one answers 410


def test_subscribers_fail_are_disabled_come_back_and_the_invariants_hold() -> None:
    s = scenario(SEED)
    assert any(o[2] == "410" for h in s.subscribers for o in h["outages"])
    assert violation(s) is None
    told: list[Any] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        if final:
            told.extend(run.query(
                "SELECT e.type, o.rule FROM outbox o JOIN events e ON e.id = o.event_id"
                " WHERE e.type LIKE 'webhook.%'"
            ))  # fmt: skip
            told.append(run.query("SELECT count(*) FROM outbox WHERE state = 'cancelled'")[0])

    run = run_scenario(s, checker)
    changes = [c for _, c in run.subscribers.changes]
    assert {"webhook.failing", "webhook.disabled", "webhook.recovered"} <= set(changes)
    assert "  enabled" in run.trace
    # Their events went through the rules file's rule for them, like any event.
    assert {t for t, rule in told[:-1] if rule == HOOK_RULE} == set(changes)
    assert told[-1][0] > 0  # a disabled one's waiting deliveries were cancelled


def _caught(mutate: Any, invariant: Any) -> Violation:
    caught: list[Violation] = []

    async def checker(run: Run, final: bool, routed: list[str]) -> None:
        await check(run, final, routed)
        if final:
            mutate(run)
            try:
                invariant(run)
            except Violation as found:
                caught.append(found)

    run_scenario(scenario(SEED), checker)
    assert caught
    return caught[0]


def test_health_told_once_sees_a_change_told_twice_and_one_not_told() -> None:
    def twice(run: Run) -> None:
        run.subscribers.changes.append(run.subscribers.changes[-1])

    found = _caught(twice, health_told_once)
    assert found.invariant == "health is told once" and "its events say" in found.detail

    def untold(run: Run) -> None:
        run.query("DELETE FROM events WHERE type = 'webhook.disabled'")
        run.query("COMMIT")

    found = _caught(untold, health_told_once)
    assert "webhook.disabled" in found.detail


def test_subscribers_lose_nothing_sees_a_lost_delivery_and_one_cancelled_unsaid() -> None:
    def lost(run: Run) -> None:
        run.query("DELETE FROM outbox WHERE kind = 'webhook' AND state = 'delivered'")
        run.query("COMMIT")

    found = _caught(lost, subscribers_lose_nothing)
    assert found.invariant == "subscribers lose nothing" and "no row" in found.detail

    def unsaid(run: Run) -> None:
        run.query("UPDATE outbox SET reason = NULL, last_error = NULL WHERE state = 'cancelled'")
        run.query("COMMIT")

    found = _caught(unsaid, subscribers_lose_nothing)
    assert "says not why" in found.detail
