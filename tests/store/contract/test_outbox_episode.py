"""store.outbox.episode: the alert episode an outbox row belongs to (receiver.notify.episodes
reads it), on SQLite and PostgreSQL alike."""

from __future__ import annotations

from receiver.store import Store
from receiver.store.base import Tx
from tests.store.contract.common import event, note, run


def test_a_row_names_the_episode_it_was_queued_for(store_url: str) -> None:
    async def go(store: Store) -> list[tuple[str, int] | None]:
        await store.events.accept(*event(1))

        def work(tx: Tx) -> list[int]:
            return [
                tx.outbox.add("evt_1", note(), state="pending", now=5.0, alert="a:1", episode=2),
                tx.outbox.add(
                    "evt_1", note(), state="pending", now=5.0, kind="escalation",
                    alert="a:1", episode=3,
                ),
                tx.outbox.add("evt_1", note(), state="pending", now=5.0),  # a plain rule's
                tx.outbox.add("-", note(), state="pending", now=5.0, alert="(heartbeat)"),
                tx.outbox.add("evt_1", note(), state="held", now=5.0, kind="digest"),
            ]  # fmt: skip

        ids = await store.transact(work)
        return [await store.outbox.episode(i) for i in [*ids, max(ids) + 100]]

    assert run(store_url, go) == [("a:1", 2), ("a:1", 3), None, None, None, None]
