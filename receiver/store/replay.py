"""The stored events of a period as `receiver backtest` reads them: (id, received_at, body)
rows, oldest first, in pages, and nothing else.

store.history.between() gives whole StoredEvent records with their type; a replay needs
only the id, the arrival time and the body (it decodes the body anyway), and a week is six
million rows: building a record for each and reading a column nobody uses took about a
third of what reading the week cost.

    rows = await page(store, start, end, after=None, limit=20_000)
    rows = await page(store, start, end, after=(rows[-1][1], rows[-1][0]), limit=20_000)
"""

from __future__ import annotations

from typing import Any

from receiver.store.base import Store
from receiver.store.history import SQLHistory

Row = tuple[str, float, Any]  # (id, received_at, body: str or bytes as stored)

_PERIOD = "SELECT id, received_at, body FROM events WHERE received_at >= ? AND received_at < ?"


async def page(
    store: Store, start: float, end: float, *, after: tuple[float, str] | None, limit: int
) -> list[Row]:
    """The events received in [start, end), oldest first (received_at, then id), after the
    (received_at, id) of the last one read: store.history.between()'s order and pages."""
    history = store.history
    if not isinstance(history, SQLHistory):  # a store without SQL (a test's): its records
        found = await history.between(start, end, after=after, limit=limit)
        return [(e.id, e.received_at, e.body) for e in found]
    sql = _PERIOD
    # After a page, its last time is the lower bound itself: the index then starts there.
    params: list[Any] = [start if after is None else max(start, after[0]), end]
    if after is not None:
        sql += " AND (received_at > ? OR id > ?)"
        params += [after[0], after[1]]
    sql += " ORDER BY received_at, id LIMIT ?"
    rows: list[Row] = await history.db.read(lambda q: q(sql, (*params, limit)).fetchall())
    return rows
