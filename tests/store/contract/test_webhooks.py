"""store.webhooks and tx.webhooks: subscriptions, their deliveries, and the side of its
threshold each session was last on."""

from __future__ import annotations

from typing import Any

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import run


def test_subscriptions_are_kept_changed_and_their_deliveries_listed(store_url: str) -> None:
    from receiver.store.records import subscriber_delivery

    async def go(store: Store) -> tuple[Any, ...]:
        hook = await store.webhooks.add(
            public_id="wh_1",
            url="https://a.example/h",
            events=["score.drop"],
            threshold=None,
            format="service",
            secret="s1",
            now=1.0,
        )
        other = await store.webhooks.add(
            public_id="wh_2",
            url="https://b.example/h",
            events=["score.drop"],
            threshold=40,
            format="standard",
            secret="whsec_x",
            now=2.0,
        )

        def queue(tx: Tx) -> list[int]:
            return [
                tx.outbox.add(
                    f"evt_{i}",
                    subscriber_delivery(hook.id, f"evt_{i}", "{}"),
                    state="pending",
                    now=3.0,
                    kind="webhook",
                )
                for i in range(3)
            ]

        ids = await store.transact(queue)
        page = await store.webhooks.deliveries(hook.id, limit=2)
        rest = await store.webhooks.deliveries(hook.id, limit=2, before=page[-1].id)
        rotated = await store.webhooks.update("wh_1", now=4.0, secret="s2")
        await store.outbox.mark_failed(ids[0], error="HTTP 500", now=5.0, retry_at=None)
        retried = await store.webhooks.retry_delivery(hook.id, ids[0], now=6.0)
        wrong = await store.webhooks.retry_delivery(other.id, ids[0], now=6.0)
        disabled = await store.webhooks.update("wh_2", now=7.0, status="disabled", reason="410")
        active = await store.webhooks.all(active_only=True)
        deleted = await store.webhooks.update("wh_1", now=8.0, status="deleted")
        after = await store.webhooks.deliveries(hook.id, limit=10)
        return (
            hook,
            page,
            rest,
            rotated,
            retried,
            wrong,
            disabled,
            active,
            deleted,
            after,
            await store.webhooks.get("wh_1"),
            await store.webhooks.all(),
        )

    hook, page, rest, rotated, retried, wrong, disabled, active, deleted, after, gone, listed = run(
        store_url, go
    )
    assert hook.events == ["score.drop"] and hook.status == "active" and hook.secret == "s1"
    assert [r.delivery_id for r in page] == ["evt_2", "evt_1"]
    assert [r.delivery_id for r in rest] == ["evt_0"]
    assert rotated.secret == "s2"
    assert retried.state == "pending" and retried.attempts == 0 and retried.next_at == 6.0
    assert wrong is None
    assert disabled.status == "disabled" and disabled.status_reason == "410"
    assert [h.public_id for h in active] == ["wh_1"]
    assert deleted.status == "deleted" and gone is None
    assert {r.state for r in after} == {"cancelled"}  # deleting cancels what is unsent
    assert [h.public_id for h in listed] == ["wh_2"]


def test_threshold_sides_are_kept_per_subscription_and_session(store_url: str) -> None:
    async def go(store: Store) -> Any:
        await store.transact(
            lambda tx: tx.webhooks.save_sides({(1, "s"): (True, "m1"), (2, "s"): (False, "m2")})
        )
        await store.transact(lambda tx: tx.webhooks.save_sides({(1, "s"): (False, "m3")}))
        return await store.transact(lambda tx: tx.webhooks.sides([1, 2, 3], ["s", "t"]))

    assert run(store_url, go) == {(1, "s"): (False, "m3"), (2, "s"): (False, "m2")}


def test_a_rotation_keeps_the_secret_before_only_with_an_overlap(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        await store.webhooks.add(
            public_id="wh_1",
            url="https://a.example/h",
            events=["score.drop"],
            threshold=None,
            format="standard",
            secret="s1",
            now=1.0,
        )
        overlapped = await store.webhooks.rotate("wh_1", secret="s2", now=2.0, overlap_until=9.0)
        active = await store.webhooks.all(active_only=True)
        cut = await store.webhooks.rotate("wh_1", secret="s3", now=3.0, overlap_until=None)
        missing = await store.webhooks.rotate("wh_9", secret="s", now=3.0, overlap_until=None)
        return overlapped, active, cut, missing

    overlapped, active, cut, missing = run(store_url, go)
    assert (overlapped.secret, overlapped.previous_secret, overlapped.previous_until) == (
        "s2",
        "s1",
        9.0,
    )
    assert [(h.secret, h.previous_secret) for h in active] == [("s2", "s1")]
    assert (cut.secret, cut.previous_secret, cut.previous_until) == ("s3", None, None)
    assert missing is None


def test_rate_slots_are_taken_one_after_another(store_url: str) -> None:
    async def go(store: Store) -> list[float]:
        hook = await store.webhooks.add(
            public_id="wh_1",
            url="https://a.example/h",
            events=["score.drop"],
            threshold=None,
            format="service",
            secret="s1",
            now=1.0,
            rate_limit=2.0,
        )
        assert hook is not None and hook.rate_limit == 2.0
        slots = [await store.webhooks.take_slot(hook.id, rate=2.0, now=100.0) for _ in range(3)]
        # Later than the last slot: the next is at once (no credit for the idle time).
        slots.append(await store.webhooks.take_slot(hook.id, rate=2.0, now=200.0))
        slots.append(await store.webhooks.take_slot(hook.id, rate=2.0, now=200.1))
        return slots

    assert run(store_url, go) == [100.0, 100.5, 101.0, 200.0, 200.5]


def test_configure_sets_or_removes_the_rate_limit_and_filter_and_keeps_the_rest(
    store_url: str,
) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        hook = await store.webhooks.add(
            public_id="wh_c", url="https://a.example/h", events=["score.drop"], threshold=None,
            format="service", secret="s1", now=1.0, rate_limit=5.0, filter={"userId": "u1"},
        )  # fmt: skip
        assert hook is not None
        rate = await store.webhooks.configure("wh_c", now=2.0, changes={"rate_limit": 50.0})
        wanted = {"cohort": {"in": ["beta"]}}
        both = await store.webhooks.configure(
            "wh_c", now=3.0, changes={"filter": wanted, "rate_limit": None}
        )
        cleared = await store.webhooks.configure("wh_c", now=4.0, changes={"filter": None})
        kept = await store.webhooks.get("wh_c")
        unknown = await store.webhooks.configure("wh_x", now=5.0, changes={"rate_limit": 1.0})
        await store.webhooks.update("wh_c", now=6.0, status="deleted")
        deleted = await store.webhooks.configure("wh_c", now=7.0, changes={"rate_limit": 1.0})
        return rate, both, cleared, kept, unknown, deleted

    rate, both, cleared, kept, unknown, deleted = run(store_url, go)
    assert (rate.rate_limit, rate.filter) == (50.0, {"userId": "u1"})
    assert (both.rate_limit, both.filter) == (None, {"cohort": {"in": ["beta"]}})
    assert (cleared.rate_limit, cleared.filter) == (None, None)
    assert (kept.rate_limit, kept.filter, kept.secret, kept.status) == (None, None, "s1", "active")
    assert unknown is None and deleted is None
