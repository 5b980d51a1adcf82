"""Backfill: the upstream's sessions and score histories into the local session projection
(what the read API serves), page by page, inside the plan's budget.

    result = await backfill(client, store, start="2026-05-01", end=None, on_progress=show)

After each page, the cursor of the next one is kept in the store, so a sync stopped by
Ctrl-C or a crash continues from there when run again with the same --from and --to.
Importing merges (receiver.sessions.merge_remote): running it twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from receiver.errors import UpstreamError
from receiver.events import iso
from receiver.store import Store
from receiver.upstream.client import UpstreamClient

PAGE = 20  # sessions a page: the cursor is saved this often
MAX_PAGES = 1_000_000  # a bound on the loop, far above any real history


@dataclass
class Result:
    total: int = 0  # sessions matching, as the upstream counted them
    done: int = 0  # sessions read, this run and the runs it continues
    changed: int = 0  # sessions this run added or changed locally
    resumed: bool = False


def _points(history: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """Score points as the store keeps them: (score, iso() timestamp); bad ones skipped."""
    out = []
    for point in history:
        score, ts = point.get("score"), point.get("timestamp")
        if isinstance(score, bool) or not isinstance(score, int | float) or not isinstance(ts, str):
            continue
        try:
            out.append((float(score), iso(datetime.fromisoformat(ts.replace("Z", "+00:00")))))
        except ValueError:
            continue
    return out


async def backfill(
    client: UpstreamClient,
    store: Store,
    *,
    start: str | None,
    end: str | None,
    on_progress: Callable[[Result], None] = lambda result: None,
    page_size: int = PAGE,
) -> Result:
    """Import every session upstream started between start and end (ISO dates, either
    open); continues an unfinished run with the same range."""
    result = Result()
    cursor: str | None = None
    saved = await store.upstream.sync_cursor()
    if saved is not None and saved.get("from") == start and saved.get("to") == end:
        cursor, result.done, result.resumed = saved.get("cursor"), int(saved.get("done", 0)), True
    for _ in range(MAX_PAGES):
        try:
            page = await client.sessions(
                limit=page_size, cursor=cursor, **{"from": start, "to": end}
            )
        except UpstreamError as exc:
            if cursor is None or exc.code != "invalid_parameter" or not result.resumed:
                raise
            # The saved cursor's session is gone upstream: start over (merging is idempotent).
            cursor, result.done, result.resumed = None, 0, False
            continue
        result.total = int(page.get("total") or 0)
        on_progress(result)
        items = []
        for listed in page.get("sessions") or []:
            session_id = str(listed["id"])
            items.append(
                (await client.session(session_id), _points(await client.scores(session_id)))
            )
            result.done += 1
            on_progress(result)
        result.changed += await store.sessions.import_upstream(items)
        cursor = page.get("cursor") or None
        if cursor is None:
            await store.upstream.set_sync_cursor(None)
            return result
        await store.upstream.set_sync_cursor(
            {"from": start, "to": end, "cursor": cursor, "done": result.done}
        )
    raise UpstreamError(f"the upstream kept sending pages: stopped after {MAX_PAGES}")
