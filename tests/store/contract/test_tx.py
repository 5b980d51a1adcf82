"""The Store's and Tx's own lifecycle: a transaction writes all or nothing, savepoints roll
back alone, the timers' lock, the writable check."""

from __future__ import annotations

from typing import Any

import pytest

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import event, note, run


def test_check_writable_passes_on_a_healthy_store(store_url: str) -> None:
    run(store_url, lambda s: s.check_writable())


def test_a_failing_transaction_writes_nothing(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.events.accept(*event(1))

        def fail(tx: Tx) -> None:
            tx.events.mark_routed(["evt_1"], 5.0)
            tx.outbox.add("evt_1", note(), state="pending", now=5.0)
            raise ValueError("a bug in the middle of routing")

        with pytest.raises(ValueError, match="a bug"):
            await store.transact(fail)
        return await store.transact(
            lambda tx: tx.events.unrouted(5)
        ), await store.outbox.deliveries()

    unrouted, rows = run(tx_url, go)
    assert [e.id for e in unrouted] == ["evt_1"] and rows == []


def test_a_savepoint_rolls_back_its_own_writes_only(tx_url: str) -> None:
    async def go(store: Store) -> list[str]:
        await store.events.accept(*event(1))

        def work(tx: Tx) -> None:
            tx.outbox.add("evt_1", note("kept"), state="pending", now=5.0)
            with pytest.raises(ValueError), tx.savepoint():
                tx.outbox.add("evt_1", note("undone"), state="pending", now=5.0)
                raise ValueError
            with tx.savepoint():
                tx.outbox.add("evt_1", note("also kept"), state="pending", now=5.0)

        await store.transact(work)
        return [row.rule for row in await store.outbox.deliveries()]

    assert run(tx_url, go) == ["also kept", "kept"]


def test_timers_lock_is_held_with_one_process(tx_url: str) -> None:
    assert run(tx_url, lambda s: s.transact(lambda tx: tx.try_lock("timers"))) is True
