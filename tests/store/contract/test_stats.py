"""store.stats: the size on disk and the backlog gauges."""

from __future__ import annotations

from receiver.store import Notification, Store
from receiver.store.base import Tx
from receiver.store.records import Backlog, subscriber_delivery
from tests.store.contract.common import event, note, run


def test_backlog_counts_unrouted_events_and_waiting_rows_by_channel(store_url: str) -> None:
    """The backlog gauges: what is unrouted and what waits to be sent, with the ages of the
    oldest; rows held on purpose, delivered or dead are not waiting."""

    async def go(store: Store) -> list[Backlog]:
        seen = [await store.stats.backlog(1010.0)]
        for i in range(4):
            await store.events.accept(*event(i))  # received at 1000 (the store's clock)
        seen.append(await store.stats.backlog(1010.0))
        hook = subscriber_delivery(7, "1", "{}")
        # A channel the store has never heard of (receiver.notify.registry's names only).
        tiny = Notification("r", "room", 0, "t", "b", channel="tiny")

        def route(tx: Tx) -> None:
            tx.events.mark_routed(["evt_0", "evt_1"], 1004.0)
            for n in (note(), note(target=1)):
                tx.outbox.add("evt_0", n, state="pending", now=1004.0)
            tx.outbox.add("evt_1", note("digest", "mail"), state="held", now=1001.0, next_at=2000.0)
            tx.outbox.add_many([("evt_1", hook)], state="pending", now=1006.0, kind="webhook")
            tx.outbox.add("evt_1", tiny, state="pending", now=1007.0)

        await store.transact(route)
        seen.append(await store.stats.backlog(1010.0))
        [first, second] = await store.outbox.claim_due(
            now=1008.0, limit=0, lease=30, lanes={("console", 0): 1, ("console", 1): 1}
        )
        await store.outbox.mark_delivered(first.id, now=1009.0)
        await store.outbox.mark_failed(second.id, error="x", now=1009.0, retry_at=None)  # dead
        seen.append(await store.stats.backlog(1012.0))
        return seen

    empty, accepted, routed, sent = run(store_url, go)
    # By the channel each row records; a channel with nothing waiting is not named (the
    # gauges show the registry's channels at 0).
    assert empty == Backlog(lag=0.0, unrouted=0, pending={}, oldest={})
    assert (accepted.unrouted, accepted.lag, accepted.pending) == (4, 10.0, {})
    assert (routed.unrouted, routed.lag) == (2, 10.0)
    assert routed.pending == {"notify": 2, "webhook": 1, "tiny": 1}
    assert routed.oldest == {"notify": 6.0, "webhook": 4.0, "tiny": 3.0}
    assert sent.pending == {"webhook": 1, "tiny": 1}
    assert sent.oldest == {"webhook": 6.0, "tiny": 5.0}


def test_size_counts_the_bytes_the_store_takes(store_url: str) -> None:
    async def go(store: Store) -> tuple[int, int]:
        before = await store.stats.size()
        for i in range(50):
            await store.events.accept(*event(i))
        return before, await store.stats.size()

    before, after = run(store_url, go)
    assert before > 0 and after >= before
