"""Time SQLOutbox.claim_due with and without the in-order check (issue 28, item 13).

    python -m bench.claim_order DB DUE DELIVERED

DB is a new SQLite path or an empty PostgreSQL URL. DUE rows wait to be sent and
DELIVERED rows are history, over 2,000 alerts and 10 targets of one notifier; each claim
asks for 8 rows a target (80), as the worker does, and gives them back. Figures in
docs/event-flow.md ("One alert's messages in order").
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from receiver import events
from receiver.store import Notification, open_store, outbox

ALERTS, TARGETS, ROUNDS = 2000, 10, 30


async def main(url: str, due: int, done: int) -> None:
    store: Any = open_store(url, clock=lambda: 1000.0)
    await store.open()
    sample = events.sample("score.drop", id="evt_b", timestamp="2026-01-01T00:00:00Z")
    event = events.validate(sample)
    await store.events.accept(event, event.model_dump_json().encode())

    def fill(tx: Any) -> None:
        tx.events.mark_routed(["evt_b"], 1.0)
        for i in range(done + due):
            n = Notification(f"r{i}", "mail", i % TARGETS, "t", "b")
            kind = "resolved" if i % 3 == 0 else "event"
            tx.outbox.add(
                "evt_b", n, state="pending", now=i / 100, kind=kind, alert=f"a{i % ALERTS}"
            )

    await store.transact(fill)
    await store.statements(
        lambda q: q("UPDATE outbox SET state = 'delivered' WHERE id <= ?", (done,))
    )
    lanes = {("mail", t): 8 for t in range(TARGETS)}
    checked = outbox.IN_ORDER
    for label, condition in [("in order", checked), ("without", "1 = 1")] * 2:
        outbox.IN_ORDER = condition
        took, got = [], 0
        for _ in range(ROUNDS):
            start = time.perf_counter()
            rows = await store.outbox.claim_due(now=1e6, limit=0, lease=30, lanes=lanes)
            took.append(time.perf_counter() - start)
            got = len(rows)
            await store.outbox.release([r.id for r in rows], now=0.0)
        print(
            f"due={due} delivered={done} {label:8} claim p50"
            f" {statistics.median(took) * 1000:.2f} ms, max {max(took) * 1000:.2f} ms,"
            f" {got} rows"
        )
    outbox.IN_ORDER = checked
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
