"""The messages of one alert to one target go out in order (issue 28, item 13): a row is
not claimed while an earlier row of its alert to the same target is still to be sent, on
SQLite and on PostgreSQL."""

from __future__ import annotations

from typing import Any

from receiver.store import Notification, Store
from receiver.store.base import Tx
from tests.store.contract.common import event, run


def note(rule: str, target: int = 0, notifier: str = "mail") -> Notification:
    return Notification(rule=rule, notifier=notifier, target=target, title=rule, body="b")


async def add(store: Store, rule: str, *, now: float, alert: str, kind: str, **more: Any) -> int:
    def work(tx: Tx) -> None:
        n = note(rule, **more)
        tx.outbox.add("evt_1", n, state="pending", now=now, kind=kind, alert=alert, episode=1)

    await store.transact(work)
    [row] = [r for r in await store.outbox.deliveries(limit=100) if r.rule == rule]
    return row.id


def claimed(rows: list[Any]) -> list[str]:
    return sorted(row.rule for row in rows)


def test_a_resolved_message_waits_for_its_opener_after_an_outage(store_url: str) -> None:
    async def go(store: Store) -> list[list[str]]:
        await store.events.accept(*event(1))
        await store.transact(lambda tx: tx.events.mark_routed(["evt_1"], 100.0))
        opener = await add(store, "opener", now=100.0, alert="user:u1", kind="event")
        [first] = await store.outbox.claim_due(now=100.0, limit=10, lease=30)
        assert first.id == opener
        # The mail server is down: the opener waits for its retry at 500.
        await store.outbox.mark_failed(opener, error="smtp down", now=101.0, retry_at=500.0)
        await add(store, "resolved", now=200.0, alert="user:u1", kind="resolved")
        await add(store, "other-target", now=200.0, alert="user:u1", kind="resolved", target=1)
        await add(store, "other-alert", now=200.0, alert="user:u2", kind="event")
        rows = await store.outbox.claim_due(now=300.0, limit=10, lease=30)
        for row in rows:
            await store.outbox.mark_delivered(row.id, now=301.0)
        seen = [claimed(rows)]
        lanes = {("mail", 0): 8, ("mail", 1): 8}
        seen.append(
            claimed(await store.outbox.claim_due(now=400.0, limit=0, lease=30, lanes=lanes))
        )
        # At 500 the opener is due again; the resolved message still waits behind it...
        seen.append(claimed(await store.outbox.claim_due(now=500.0, limit=10, lease=30)))
        seen.append(claimed(await store.outbox.claim_due(now=501.0, limit=10, lease=30)))
        # ...until it is sent.
        await store.outbox.mark_delivered(opener, now=502.0)
        seen.append(claimed(await store.outbox.claim_due(now=502.0, limit=10, lease=30)))
        return seen

    assert run(store_url, go) == [
        ["other-alert", "other-target"],  # not the resolved message: its opener is pending
        [],
        ["opener"],
        [],  # the opener is sending: the resolved message waits
        ["resolved"],
    ]


def test_a_message_behind_one_that_failed_for_good_goes_out(store_url: str) -> None:
    """Waiting ends when the earlier row is done either way: delivered, or failed (dead)."""

    async def go(store: Store) -> list[list[str]]:
        await store.events.accept(*event(1))
        await store.transact(lambda tx: tx.events.mark_routed(["evt_1"], 100.0))
        opener = await add(store, "opener", now=100.0, alert="a", kind="event")
        await add(store, "repeat", now=100.0, alert="a", kind="repeat")
        seen = [claimed(await store.outbox.claim_due(now=100.0, limit=10, lease=30))]
        await store.outbox.mark_failed(opener, error="gone", now=101.0, retry_at=None)
        seen.append(claimed(await store.outbox.claim_due(now=101.0, limit=10, lease=30)))
        return seen

    assert run(store_url, go) == [["opener"], ["repeat"]]


def test_a_held_row_holds_back_only_its_own_rules_later_rows(store_url: str) -> None:
    """A row held for hours (an `active: {defer: true}` window, a hold) does not keep a
    later page of another rule to the same target waiting (the simulation's seed 78: an
    escalation page waited for a deferred notification until the window opened); a later
    row of its own rule still waits for it."""

    async def go(store: Store) -> list[list[str]]:
        await store.events.accept(*event(1))
        await store.transact(lambda tx: tx.events.mark_routed(["evt_1"], 100.0))

        def work(tx: Tx) -> None:
            where: dict[str, Any] = {"alert": "session:s3", "episode": 1}
            tx.outbox.add(
                "evt_1", note("deferred"), state="held", now=100.0, next_at=50_000.0, **where
            )
            tx.outbox.add("evt_1", note("page"), state="pending", now=100.0, kind="escalation",
                          **where)  # fmt: skip
            tx.outbox.add("evt_1", note("deferred"), state="pending", now=100.0,
                          kind="resolved", **where)  # fmt: skip

        await store.transact(work)
        rows = await store.outbox.claim_due(now=101.0, limit=10, lease=30)
        return [[f"{r.rule} {r.kind}" for r in rows]]

    assert run(store_url, go) == [["page escalation"]]
