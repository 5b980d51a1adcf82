"""tx.storms, the storm guard's window of each rule, on every store: a window counts from its
first notification for `per` seconds; the next one starts at the first notification after
it and remembers the window before's count only when it was the one just before."""

from __future__ import annotations

from typing import Any

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import run


def test_a_window_counts_then_the_next_remembers_it(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> list[tuple[float, int, int]]:
            c = tx.storms.count
            return [
                c("drops", 100.0, 60.0),  # opens the window at 100
                c("drops", 130.0, 60.0),
                c("drops", 159.9, 60.0),  # still inside [100, 160)
                c("other", 159.9, 60.0),  # another rule: its own window
                c("drops", 160.0, 60.0),  # the next window, 3 before it
                c("drops", 170.0, 60.0),
                c("drops", 400.0, 60.0),  # a window later than just after: nothing before
            ]

        return await store.transact(work)

    assert run(tx_url, go) == [
        (100.0, 1, 0),
        (100.0, 2, 0),
        (100.0, 3, 0),
        (159.9, 1, 0),
        (160.0, 1, 3),
        (160.0, 2, 3),
        (400.0, 1, 0),
    ]


def test_the_count_is_kept_between_transactions(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        for at in (10.0, 11.0, 12.0):
            await store.transact(lambda tx, at=at: tx.storms.count("r", at, 300.0))
        return await store.transact(lambda tx: tx.storms.count("r", 13.0, 300.0))

    assert run(tx_url, go) == (10.0, 4, 0)
