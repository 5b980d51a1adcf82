"""tx.silences keeps an until-resolved silence on every store: how long its alerts must stay
resolved and which alerts it matched when it was made; a plain silence has neither."""

from __future__ import annotations

from typing import Any

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import run


def test_an_until_resolved_silence_keeps_its_wait_and_its_alerts(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def work(tx: Tx) -> Any:
            plain = tx.silences.add({"userId": "u1"}, "plain", 10.0, 100.0)
            ends = tx.silences.add(
                {"sessionId": "s*"}, "known", 10.0, 1000.0, after=300.0,
                alerts=("session:s1", "session:s2"),
            )  # fmt: skip
            none = tx.silences.add({"sessionId": "x"}, "none", 10.0, 1000.0, after=60.0)
            found = {s.id: (s.after, s.alerts) for s in tx.silences.active(50.0)}
            return [found[plain], found[ends], found[none]], [
                s.reason for s in tx.silences.recent()
            ]

        return await store.transact(work)

    assert run(tx_url, go) == (
        [(None, ()), (300.0, ("session:s1", "session:s2")), (60.0, ())],
        ["none", "known", "plain"],
    )
