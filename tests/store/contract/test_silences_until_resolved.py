"""tx.silences keeps an until-resolved silence on every store: how long its alerts must stay
resolved and which alerts it matched when it was made; a plain silence has neither. And
store.silences, the one role that adds them, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

from receiver.dispatch.alerts import apply
from receiver.dispatch.silences import end_resolved
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.silences import add_silence
from tests.store.contract.common import event, run


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


def test_store_silences_adds_one_ending_with_the_open_alerts_it_matches(store_url: str) -> None:
    """store.silences, the role the CLI, the admin page and the API add silences through:
    until resolved, it notes the open alerts whose opening event its matchers match."""

    async def go(store: Store) -> Any:
        for i, (session, user) in enumerate((("s1", "u1"), ("s2", "u2"), ("s3", "u1"))):
            e, raw = event(i, sessionId=session, userId=user)
            await store.events.accept(e, raw)

        def route(tx: Tx) -> None:
            for row in tx.events.unrouted(10):
                apply(tx, json.loads(row.body), row.id, 100.0)
            tx.events.mark_routed([f"evt_{i}" for i in range(3)], 100.0)

        await store.transact(route)
        made = await store.silences.add({"userId": "u1"}, "known", 200.0, 900.0, after=60.0)
        plain = await store.silences.add({"userId": "u2"}, "plain", 200.0, 900.0)
        listed = [(s.id, s.alerts) for s in await store.silences.recent()]
        ended = await store.silences.expire(plain.id, 300.0)
        again = await store.silences.expire(plain.id, 301.0)
        missing = await store.silences.expire(999, 301.0)
        return made.alerts, listed, (ended[0], again[0], missing), ended[1].expired_at

    alerts, listed, expired, at = run(store_url, go)
    assert alerts == ("session:s1", "session:s3")
    assert listed == [(2, ()), (1, ("session:s1", "session:s3"))]
    assert expired == (True, False, (False, None)) and at == 300.0


def test_add_silence_notes_open_alerts_and_ends_with_them_on_every_store(tx_url: str) -> None:
    """add_silence in the routing transaction (how store.silences adds, and how the
    simulation's memory run now adds, seed 155), then end_resolved: on memory as on SQLite
    and PostgreSQL, one that matched no open alert ends after seconds after it was made;
    one that noted an open alert lasts while the alert is open."""

    async def go(store: Any) -> Any:
        for i, session in enumerate(("s1", "s2")):
            e, raw = event(i, sessionId=session, userId="u1")
            await store.events.accept(e, raw)

        def work(tx: Tx) -> Any:
            for row in tx.events.unrouted(10):
                apply(tx, json.loads(row.body), row.id, 100.0)
            tx.events.mark_routed(["evt_0", "evt_1"], 100.0)
            held = add_silence(tx, {"sessionId": "s1"}, "known", 200.0, 900.0, after=60.0)
            none = add_silence(tx, {"sessionId": "s9"}, "none", 200.0, 900.0, after=60.0)
            early = end_resolved(tx, 259.0)
            later = end_resolved(tx, 260.0)
            return held.alerts, none.alerts, early, later, [s.id for s in tx.silences.active(261.0)]

        return await store.transact(work)

    held, none, early, later, active = run(tx_url, go)
    assert held == ("session:s1",) and none == ()
    assert early == [] and later == [2] and active == [1]
