"""tx.flaps, flap detection's record of each (rule, alert), on every store: changes are
counted within a window, the record flaps once `changes` fall inside it and settles, once,
`quiet` after its latest change; records are kept apart by rule and alert, and between
transactions (so replicas and restarts count alike)."""

from __future__ import annotations

from typing import Any

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import run

SPEC = {"changes": 3, "within": 60.0, "quiet": 100.0}


def test_changes_inside_the_window_make_it_flap_until_quiet(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> list[tuple[Any, ...]]:
            found = []
            for at, state in ((0.0, "open"), (70.0, "resolved"), (80.0, "open")):
                found.append(tx.flaps.change("r", "a", state, f"e{at:g}", at, **SPEC)[1].since)
            # The change at 0 fell out of the 60s window: two inside it, not flapping.
            old, new = tx.flaps.change("r", "a", "resolved", "e90", 90.0, **SPEC)
            found += [old.since, new.since, new.settle_at, new.state, new.event]
            old, new = tx.flaps.change("r", "a", "open", "e95", 95.0, **SPEC)
            found += [old.since, new.since, new.settle_at]  # still since 90, settles later
            found += [tx.flaps.next_due(), [f.rule for f in tx.flaps.due(194.0)]]
            found += [[(f.alert, f.state) for f in tx.flaps.due(195.0)]]
            found += [tx.flaps.settle("r", "a", 194.0), tx.flaps.settle("r", "a", 195.0)]
            found += [tx.flaps.settle("r", "a", 196.0), tx.flaps.next_due()]
            [after] = tx.flaps.of("a")
            found += [after.since, after.changes, after.state]
            return found

        return await store.transact(work)

    assert run(tx_url, go) == [
        None, None, None,
        None, 90.0, 190.0, "resolved", "e90",
        90.0, 90.0, 195.0,
        195.0, [], [("a", "open")],
        False, True, False, None,
        None, (), "open",
    ]  # fmt: skip


def test_records_are_kept_by_rule_and_alert_between_transactions(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        for at in (1.0, 2.0):
            await store.transact(
                lambda tx, at=at: tx.flaps.change("r", "a", "open", None, at, **SPEC)
            )
        await store.transact(lambda tx: tx.flaps.change("s", "a", "open", None, 2.5, **SPEC))
        await store.transact(lambda tx: tx.flaps.change("r", "b", "open", None, 2.5, **SPEC))
        third = await store.transact(
            lambda tx: tx.flaps.change("r", "a", "resolved", None, 3.0, **SPEC)
        )

        def rest(tx: Tx) -> Any:
            return [(f.rule, f.since) for f in tx.flaps.of("a")], tx.flaps.of("b")[0].since

        return third[1].since, third[1].changes, await store.transact(rest)

    assert run(tx_url, go) == (3.0, (1.0, 2.0, 3.0), ([("r", 3.0), ("s", None)], None))
