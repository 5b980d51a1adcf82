"""tx.throttle, tx.digests, tx.silences and tx.state: what routing keeps between events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import note, run


def test_throttle_opens_a_window_and_holds_within_it(tx_url: str) -> None:
    async def go(store: Store) -> list[bool]:
        def check(now: float) -> Callable[[Tx], bool]:
            return lambda tx: tx.throttle.throttled("r", "user_1", now, 60.0)

        return [
            await store.transact(check(100.0)),  # opens [100, 160)
            await store.transact(check(159.0)),
            await store.transact(lambda tx: tx.throttle.throttled("r", "user_2", 159.0, 60.0)),
            await store.transact(check(160.0)),  # a new window
            await store.transact(check(200.0)),
        ]

    assert run(tx_url, go) == [False, True, False, False, True]


def test_digest_groups_open_fill_and_release(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        def first(tx: Tx) -> int:
            assert tx.digests.find_open("r", "k", 100.0) is None
            group = tx.digests.new("r", "k", 100.0, 160.0)
            tx.outbox.add("e1", note("r"), state="held", now=100.0, next_at=160.0, kind="digest",
                   group_id=group.id)  # fmt: skip
            group.members.append({"id": "e1"})
            tx.digests.update(group, title="1 event", body="e1", now=100.0, release=False)
            return group.id

        gid = await store.transact(first)

        def second(tx: Tx) -> Any:
            group = tx.digests.find_open("r", "k", 120.0)
            assert group is not None and group.id == gid and group.members == [{"id": "e1"}]
            tx.digests.update(group, title="2 events", body="e1 e2", now=130.0, release=True)
            return tx.digests.find_open("r", "k", 170.0)

        closed = await store.transact(second)
        return closed, await store.outbox.deliveries()

    closed, [row] = run(tx_url, go)
    assert closed is None
    assert (row.title, row.body, row.next_at, row.kind) == ("2 events", "e1 e2", 130.0, "digest")


def test_silences_added_listed_and_expired(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        sid = await store.transact(
            lambda tx: tx.silences.add({"userId": "u1"}, "maintenance", 100.0, 200.0)
        )
        active = await store.transact(lambda tx: tx.silences.active(150.0))
        expired = await store.transact(lambda tx: tx.silences.expire(sid, 160.0))
        again = await store.transact(lambda tx: tx.silences.expire(sid, 161.0))
        return (
            sid,
            active,
            expired,
            again,
            await store.transact(lambda tx: tx.silences.active(170.0)),
        )

    sid, [active], expired, again, after = run(tx_url, go)
    assert (active.id, active.matchers, active.reason) == (sid, {"userId": "u1"}, "maintenance")
    assert expired is True and again is False and after == []


def test_named_state_round_trips_json(tx_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(lambda tx: tx.state.set("heartbeat", {"firing": True}))
        await store.transact(lambda tx: tx.state.set("heartbeat", {"firing": False, "n": 2}))
        return await store.transact(lambda tx: (tx.state.get("heartbeat"), tx.state.get("x")))

    assert run(tx_url, go) == ({"firing": False, "n": 2}, None)
