"""store.webhooks.record_delivery: a subscription's endpoint health, its health events (one
per change, in the events table, unrouted), and what its circuit does to its deliveries."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from receiver.notify.health import health_event
from receiver.store import Store, open_store
from receiver.store.base import Tx
from receiver.store.records import Webhook, subscriber_delivery
from receiver.store.webhook_health import HealthPolicy
from tests.store.contract.common import run

POLICY = HealthPolicy(failures=5, failing_after=3600.0, disable_after=86400.0)


def _maker(now: float) -> Any:
    return lambda hook, change, owner: health_event(hook, change, owner, now)


async def _hook(store: Store, public_id: str = "wh_1", owner: int | None = None) -> Webhook:
    hook = await store.webhooks.add(
        public_id=public_id,
        url="https://a.example/hooks/token123?k=secret",
        events=["score.drop"],
        threshold=None,
        format="service",
        secret="s1",
        now=1.0,
        owner=owner,
    )
    assert hook is not None
    return hook


async def _fail(store: Store, hook: Webhook, now: float, **kw: Any) -> Any:
    return await store.webhooks.record_delivery(
        hook.id, ok=False, error="HTTP 500", now=now, policy=POLICY, make_event=_maker(now), **kw
    )


async def _health_events(store: Store) -> list[dict[str, Any]]:
    def select(tx: Tx) -> list[dict[str, Any]]:
        return [json.loads(e.body) for e in tx.events.unrouted(100)]

    return await store.transact(select)


def test_five_failures_make_it_failing_and_a_success_recovers_it(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        key = await store.keys.add(
            name="team-a", key_hash="h", prefix="p", plan="pro", role="writer", now=1.0
        )
        hook = await _hook(store, owner=key.id)
        changes = [(await _fail(store, hook, 100.0 + i))[1] for i in range(6)]
        failing = await store.webhooks.get("wh_1")
        ok = await store.webhooks.record_delivery(
            hook.id, ok=True, now=200.0, policy=POLICY, make_event=_maker(200.0)
        )
        return changes, failing, ok, await store.webhooks.get("wh_1"), await _health_events(store)

    changes, failing, ok, healthy, found = run(store_url, go)
    assert changes == [None, None, None, None, "webhook.failing", None]
    assert (failing.health, failing.failures, failing.failing_since) == ("failing", 6, 100.0)
    assert failing.last_error == "HTTP 500" and failing.status == "active"
    assert ok[1] == "webhook.recovered"
    assert (healthy.health, healthy.failures, healthy.failing_since) == ("healthy", 0, None)
    assert [e["type"] for e in found] == ["webhook.failing", "webhook.recovered"]
    first = found[0]
    assert first["webhookId"] == "wh_1" and first["owner"] == "team-a"
    assert first["lastError"] == "HTTP 500" and first["failures"] == 5
    assert "token123" not in first["url"] and "secret" not in first["url"]
    assert first["url"].startswith("https://a.example/")


def test_an_hour_of_failures_is_failing_and_the_limit_disables(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        hook = await _hook(store)
        await store.transact(
            lambda tx: tx.outbox.add(
                "evt_1",
                subscriber_delivery(hook.id, "evt_1", "{}"),
                state="pending",
                now=1.0,
                kind="webhook",
            )
        )
        first = (await _fail(store, hook, 1000.0))[1]
        hour = (await _fail(store, hook, 1000.0 + 3600))[1]
        before_limit = (await _fail(store, hook, 1000.0 + 86399))[1]
        disabled = await _fail(store, hook, 1000.0 + 86400)
        after = await _fail(store, hook, 1000.0 + 86401)
        rows = await store.webhooks.deliveries(hook.id, limit=10)
        return first, hour, before_limit, disabled, after, rows, await _health_events(store)

    first, hour, before_limit, disabled, after, rows, found = run(store_url, go)
    assert (first, hour, before_limit) == (None, "webhook.failing", None)
    hook, change = disabled
    assert change == "webhook.disabled"
    assert (hook.status, hook.health) == ("disabled", "disabled")
    assert "failing since" in (hook.status_reason or "")
    assert after is None  # a disabled subscription's outcomes count no more
    assert [r.state for r in rows] == ["cancelled"]
    assert [e["type"] for e in found] == ["webhook.failing", "webhook.disabled"]


def test_410_disables_at_once_and_the_circuit_holds_the_others(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        hook = await _hook(store)
        other = await _hook(store, "wh_2")
        ids = await store.transact(
            lambda tx: [
                tx.outbox.add(
                    f"evt_{i}",
                    subscriber_delivery(hook.id, f"evt_{i}", "{}"),
                    state="pending",
                    now=1.0,
                    kind="webhook",
                )
                for i in range(2)
            ]
        )
        for i in range(5):
            await _fail(store, hook, 10.0 + i, hold_until=500.0)
        held = await store.webhooks.deliveries(hook.id, limit=10)
        await store.webhooks.record_delivery(
            hook.id, ok=True, now=20.0, policy=POLICY, make_event=_maker(20.0)
        )
        freed = await store.webhooks.deliveries(hook.id, limit=10)
        gone = await _fail(store, other, 30.0, gone=True)
        return ids, held, freed, gone

    ids, held, freed, gone = run(store_url, go)
    assert {r.next_at for r in held} == {500.0}  # failing: wait for the next probe
    assert {r.next_at for r in freed} == {20.0}  # recovered: at once
    hook, change = gone
    assert change == "webhook.disabled" and hook.status == "disabled"
    assert hook.status_reason == "the subscriber answered 410 Gone"


def test_two_replicas_recording_at_once_store_each_change_once(pg_url: str) -> None:
    async def go() -> list[str]:
        a, b = open_store(pg_url, clock=lambda: 100.0), open_store(pg_url, clock=lambda: 100.0)
        await a.open()
        await b.open()
        try:
            hook = await _hook(a)
            # 40 failures recorded by two replicas at once: one webhook.failing only.
            await asyncio.gather(*(_fail(a if i % 2 else b, hook, 100.0 + i) for i in range(40)))
            await asyncio.gather(
                *(
                    (a if i % 2 else b).webhooks.record_delivery(
                        hook.id, ok=True, now=300.0, policy=POLICY, make_event=_maker(300.0)
                    )
                    for i in range(10)
                )
            )
            return [e["type"] for e in await _health_events(a)]
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(go()) == ["webhook.failing", "webhook.recovered"]


def test_enable_brings_back_a_disabled_one_once(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        hook = await _hook(store)
        active = await store.webhooks.enable("wh_1", now=5.0, make_event=_maker(5.0))
        await _fail(store, hook, 10.0, gone=True)
        first = await store.webhooks.enable("wh_1", now=20.0, make_event=_maker(20.0))
        second = await store.webhooks.enable("wh_1", now=21.0, make_event=_maker(21.0))
        return active, first, second, await _health_events(store)

    active, first, second, found = run(store_url, go)
    assert active is None and second is None
    assert (first.status, first.health, first.failures, first.status_reason) == (
        "active",
        "healthy",
        0,
        None,
    )
    assert [e["type"] for e in found] == ["webhook.disabled", "webhook.recovered"]
