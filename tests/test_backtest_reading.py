"""The backtest's own reads and fast paths give what the general ones give: the period's
rows (receiver.store.replay) in store.history.between()'s order and pages."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from receiver import events
from receiver.store import open_store, replay

START = 1_795_000_000.0


def test_the_replay_rows_are_the_history_events_in_the_same_order(tmp_path: Path) -> None:
    clock = [START]
    # Ties in arrival time (ordered by id) across page boundaries, and events outside.
    arrivals = [START - 1, START, START, START, START + 1, START + 1, START + 2, START + 9]

    async def main() -> tuple[list[tuple[str, float, str]], list[tuple[str, float, str]]]:
        store = open_store(str(tmp_path / "receiver.db"), clock=lambda: clock[0])
        await store.open()
        try:
            for i, received in enumerate(arrivals):
                payload = events.sample("score.drop", id=f"e{(7 * i) % 8}")
                clock[0] = received
                await store.events.accept(events.validate(payload), json.dumps(payload).encode())
            end = START + 9
            read = []
            after = None
            while rows := await replay.page(store, START, end, after=after, limit=2):
                read += [(r[0], r[1], r[2]) for r in rows]
                after = (rows[-1][1], rows[-1][0])
            whole = await store.history.between(START, end, after=None, limit=100)
            return read, [(e.id, e.received_at, e.body) for e in whole]
        finally:
            await store.close()

    read, whole = asyncio.run(main())
    assert len(read) == 6
    assert read == whole
