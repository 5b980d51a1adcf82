"""The store's side of webhook subscribers, on SQLite and PostgreSQL alike: retention of
finished deliveries whose event went first, and subscriptions owned by the key that made them."""

from __future__ import annotations

from typing import Any

from receiver.store import Notification, Store
from receiver.store.records import WEBHOOK_NOTIFIER
from tests.test_store_contract import event, queue, run


def test_prune_deletes_failed_rows_whose_event_was_pruned_while_they_waited(
    store_url: str,
) -> None:
    """A delivery still being retried keeps its row but not its event; once it has failed
    for good (dead) or been delivered after all, a later pass prunes it: it belonged to no event any
    more, so the event-by-event pass never looked at it."""

    def hook_note(target: int) -> Notification:
        return Notification(
            rule="@subscriber", notifier=WEBHOOK_NOTIFIER, target=target, title="d", body="{}"
        )

    async def go(store: Store) -> Any:
        for i in range(3):
            await store.accept(*event(i))
            await queue(store, f"evt_{i}", [hook_note(i)], now=1.0)
        rows = await store.claim_due(now=1.0, limit=5, lease=30)
        assert len(rows) == 3
        first = await store.prune(before=2000.0, limit=100)  # all three still in flight
        dead, delivered, retrying = sorted(rows, key=lambda r: r.event_id)
        await store.mark_failed(dead.id, error="HTTP 500", now=50.0, retry_at=None)
        await store.mark_delivered(delivered.id, now=50.0)
        await store.mark_failed(retrying.id, error="HTTP 500", now=50.0, retry_at=3000.0)
        second = await store.prune(before=100.0, limit=100)
        left = [(r.event_id, r.state) for r in await store.deliveries()]
        return first, second, left

    first, second, left = run(store_url, go)
    assert first["events"] == 3 and first["outbox"] == 0
    # evt_0's row is dead and evt_1's delivered, both finished before 100: pruned; evt_2's
    # waits for a retry: kept.
    assert second["outbox"] == 2
    assert left == [("evt_2", "pending")]
