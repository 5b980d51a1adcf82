"""store.webhooks' replay jobs: a step queues the subscription's events of the range in
event order, replaces a pending retry instead of doubling it, re-sends failed ones under
their own webhook-id, delivered ones only with all, and moves its cursor with them."""

from __future__ import annotations

from typing import Any

from receiver.dispatch.fanout import replayed
from receiver.store import Store
from receiver.store.base import Tx
from receiver.store.records import subscriber_delivery
from tests.store.contract.common import accept, ev, run


def test_a_replay_queues_each_event_once_in_order(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        hook = await store.webhooks.add(
            public_id="wh_1",
            url="https://a.example/h",
            events=["score.drop"],
            threshold=None,
            format="service",
            secret="s",
            now=1.0,
            filter={"userId": "~^u[0-4]$"},
        )
        assert hook is not None
        # Events 0..7 (received at the store's clock, 1000.0); 5 is another user the filter
        # leaves out, 6 is another type.
        payloads = [ev(i, userId="u9" if i == 5 else f"u{i % 5}") for i in range(6)]
        payloads.append(ev(6, kind="session.stopped"))
        payloads.append(ev(7, userId="u1"))
        await accept(store, *payloads)

        def made(tx: Tx) -> dict[str, int]:  # what fan-out made then, in four states
            ids = {}
            for i in (0, 1, 2, 3):
                ids[f"evt_{i}"] = tx.outbox.add(
                    f"evt_{i}",
                    subscriber_delivery(hook.id, f"evt_{i}", f'{{"n": {i}}}'),
                    state="pending",
                    now=1.0,
                    next_at=5000.0,
                    kind="webhook",
                )
            return ids

        ids = await store.transact(made)
        await store.outbox.mark_delivered(ids["evt_1"], now=2.0)
        await store.outbox.mark_failed(ids["evt_2"], error="HTTP 500", now=2.0, retry_at=None)
        job = await store.webhooks.start_replay(
            hook.id, since=0.0, until=2000.0, all=False, now=10.0
        )
        first = await store.webhooks.replay_step(hook, job.id, now=11.0, limit=5, pick=replayed)
        second = await store.webhooks.replay_step(hook, job.id, now=12.0, limit=5, pick=replayed)
        again = await store.webhooks.replay_step(hook, job.id, now=13.0, limit=5, pick=replayed)
        rows = await store.webhooks.deliveries(hook.id, limit=50)
        shown = await store.webhooks.replay_job(hook.id, job.id)
        return first, second, again, rows, shown, await store.webhooks.running_replays()

    first, second, again, rows, shown, running = run(store_url, go, clock=1000.0)
    # 0 and 3 pending (made due), 1 delivered (skipped), 2 failed and 4 never sent (queued)
    assert (first.state, first.queued, first.replaced, first.skipped) == ("running", 2, 2, 1)
    assert (second.state, second.queued, second.skipped) == ("done", 3, 3)  # the totals
    assert again is None and running == [] and shown == second
    by_id = {r.delivery_id: r for r in rows}
    # One row each (nothing doubled), the webhook-id the event's own.
    assert sorted(by_id) == ["evt_0", "evt_1", "evt_2", "evt_3", "evt_4", "evt_7"]
    assert len(rows) == 6
    assert by_id["evt_1"].state == "delivered"  # delivered, and no "all"
    assert by_id["evt_2"].state == "pending" and by_id["evt_2"].attempts == 0
    assert by_id["evt_0"].next_at < 5000.0  # the pending retry made due now
    due = sorted((r.next_at, r.delivery_id) for r in rows if r.state == "pending")
    assert [d for _, d in due] == ["evt_0", "evt_2", "evt_3", "evt_4", "evt_7"]  # event order
    assert "evt_4" in by_id["evt_4"].body  # the event as stored
