"""tx.maintenance, the notices of maintenance windows, on every store: each (window, start,
kind) is claimed once, whichever transaction, replica or restart asks again; claims of
different windows, stretches and kinds are apart; old ones can be forgotten."""

from __future__ import annotations

import asyncio
from typing import Any

from receiver.store import Store, open_store
from receiver.store.base import Tx
from tests.store.contract.common import run


def test_a_notice_is_claimed_once(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def first(tx: Tx) -> list[Any]:
            return [
                tx.maintenance.claimed("deploy", 100.0, "start"),
                tx.maintenance.claim("deploy", 100.0, "start", 101.0),
                tx.maintenance.claim("deploy", 100.0, "start", 102.0),
                tx.maintenance.claimed("deploy", 100.0, "start"),
                tx.maintenance.claimed("deploy", 100.0, "end"),
            ]

        def again(tx: Tx) -> list[Any]:  # a later transaction (a restart, another replica)
            return [
                tx.maintenance.claim("deploy", 100.0, "start", 103.0),
                tx.maintenance.claim("deploy", 100.0, "end", 200.0),
                tx.maintenance.claim("deploy", 700.0, "start", 700.0),
                tx.maintenance.claim("other", 100.0, "start", 100.0),
                tx.maintenance.forget(500.0),
                tx.maintenance.claimed("deploy", 100.0, "end"),
                tx.maintenance.claimed("deploy", 700.0, "start"),
            ]

        return await store.transact(first), await store.transact(again)

    assert run(tx_url, go) == (
        [False, True, False, True, False],
        [False, True, True, True, 3, False, True],
    )


def test_two_replicas_claiming_at_once_claim_each_notice_once(pg_url: str) -> None:
    async def go() -> list[bool]:
        a, b = open_store(pg_url, clock=lambda: 100.0), open_store(pg_url, clock=lambda: 100.0)
        await a.open()
        await b.open()
        try:
            claims = [
                s.transact(lambda tx, k=kind: tx.maintenance.claim("w", 50.0, k, 100.0))
                for kind in ("start", "end")
                for s in (a, b)
            ]
            return list(await asyncio.gather(*claims))
        finally:
            await a.close()
            await b.close()

    found = asyncio.run(go())
    assert sorted(found[:2]) == [False, True] and sorted(found[2:]) == [False, True]
