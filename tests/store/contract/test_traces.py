"""Trace contexts (receiver.tracing) on either store: an event keeps the one its ingest
gave it, routing reads it back, and an outbox row keeps the one of the decision that
queued it, for every claim and retry of the row."""

from __future__ import annotations

import dataclasses
from typing import Any

from receiver.store import Store
from tests.store.contract.common import event, note, run

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01\nvendor=opaque"


def test_an_event_keeps_its_first_trace_context_for_routing(store_url: str) -> None:
    async def go(store: Store) -> tuple[Any, ...]:
        first = await store.events.accept(*event(1), PARENT)
        again = await store.events.accept(*event(1), OTHER)  # a duplicate: the first stays
        await store.events.accept(*event(2))  # untraced
        await store.events.accept(*event(3), OTHER)
        unrouted = await store.transact(lambda tx: tx.events.unrouted(10))
        traces = await store.events.traces(["evt_1", "evt_2", "evt_3", "evt_404"])
        none = await store.events.traces([])
        return first, again, {e.id: e.trace for e in unrouted}, traces, none

    first, again, unrouted, traces, none = run(store_url, go)
    assert (first, again) == ("new", "duplicate")
    assert unrouted == {"evt_1": PARENT, "evt_2": None, "evt_3": OTHER}
    assert traces == {"evt_1": PARENT, "evt_3": OTHER}
    assert none == {}


def test_an_outbox_row_keeps_its_trace_context_through_claims_and_retries(store_url: str) -> None:
    async def go(store: Store) -> list[tuple[str, str | None]]:
        await store.events.accept(*event(1), PARENT)
        traced = dataclasses.replace(note("a"), trace=OTHER)
        fanned = dataclasses.replace(note("w", "@subscriber", 7), trace=PARENT)
        await store.transact(lambda tx: tx.outbox.add("evt_1", traced, state="pending", now=1.0))
        await store.transact(lambda tx: tx.outbox.add("evt_1", note("b"), state="pending", now=1.0))
        await store.transact(
            lambda tx: tx.outbox.add_many(
                [("evt_1", fanned)], state="pending", now=1.0, kind="webhook"
            )
        )
        claimed = await store.outbox.claim_due(now=2.0, limit=5, lease=30)
        for row in claimed:
            await store.outbox.mark_failed(row.id, error="503", now=3.0, retry_at=4.0)
        again = await store.outbox.claim_due(now=5.0, limit=5, lease=30)
        listed = await store.outbox.deliveries()
        return sorted((r.rule, r.trace) for r in [*claimed, *again, *listed])

    rows = run(store_url, go)
    assert rows == sorted(
        [("a", OTHER), ("b", None), ("w", PARENT)] * 3, key=lambda r: (r[0], r[1] or "")
    )
