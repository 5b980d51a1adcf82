"""The admin page's alert page says when an alert is flapping: under which rule, since when,
when it settles unless it changes again, and its last change (the real app, a real SQLite
file, httpx's ASGI transport)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from receiver import events
from receiver.events import iso_epoch as iso
from tests.admin.test_views import RULES, running, until
from tests.servers import HTTPSink

FLAPPING = RULES + "    flap: {{changes: 4, within: 10m, quiet: 15m}}\n"


def test_the_alert_page_shows_an_alert_flapping(tmp_path: Path, http_sink: HTTPSink) -> None:
    async def main() -> None:
        async with running(tmp_path, http_sink.json_url("/hook"), rules_text=FLAPPING) as admin:
            start = time.time()
            for i in range(3):
                kind = "score.drop" if i % 2 == 0 else "score.recover"
                stamp = iso(start + i, digits=3)
                await admin.send(events.sample(kind, id=f"e{i}", sessionId="s1", timestamp=stamp))

            async def shown() -> str | None:  # 404 until the router has opened the alert
                answer = await admin.get("/admin/alerts/session:s1")
                return answer.text if answer.status_code == 200 else None

            page = await until(shown, "the alert page")
            assert "flapping" not in page  # three changes: not yet
            await admin.send(
                events.sample(
                    "score.recover", id="e3", sessionId="s1", timestamp=iso(start + 3, digits=3)
                )
            )

            async def flapping() -> str | None:
                found = await admin.page("/admin/alerts/session:s1")
                return found if "<dt>flapping</dt>" in found else None

            page = await until(flapping, "the alert page to say it flaps")
            assert "under rule page-oncall since" in page and 'href="/admin/events/e3"' in page

    asyncio.run(main())
