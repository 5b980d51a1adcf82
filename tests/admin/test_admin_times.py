"""One time format on each admin page: every time shown, whether the store keeps it as
epoch seconds or as an event's ISO text (an alert's opened and last event, an escalation's
next look and log, an event's timestamp and routing, a later state in its Why table, a
session's score history, a subscriber's last delivery), reads "2026-11-23 10:02:00"
(UTC), never "2026-11-23T10:02:00Z" beside it. Payloads, messages and a form's example
JSON are shown as they came."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from receiver import events
from tests.admin.test_views import running, until
from tests.servers import HTTPSink

RULES = """
notifiers:
  hook: "{hook}"
escalations:
  wake:
    steps:
      - notify: [hook]
      - after: 1h
        notify: [hook]
rules:
  - name: held
    match: {{type: score.drop, sessionId: sess_h}}
    notify: [hook]
    hold: 1h
  - name: page-oncall
    match: {{type: score.drop}}
    escalate: wake
    notify: [hook]
    resolve: true
"""
# A date with a time in any of its forms: "2026-11-23 10:02:00", "2026-11-23T10:02:00.123Z"
A_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
SHOWN = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
# What is not a time shown: payloads, messages and a form's JSON as they came, and a
# field's example of what to type.
VERBATIM = re.compile(r"<(pre|textarea)[^>]*>.*?</\1>|placeholder=\"[^\"]*\"", re.DOTALL)


def times(page: str) -> set[str]:
    return set(A_TIME.findall(VERBATIM.sub("", page)))


def test_every_admin_page_shows_its_times_in_one_format(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    async def main() -> dict[str, set[str]]:
        async with running(tmp_path, http_sink.json_url(), rules_text=RULES) as admin:
            made = await admin.post(
                "/admin/webhooks", {"url": http_sink.url + "/sub", "events": "score.drop"}
            )
            assert made.status_code == 200, made.text
            drop = events.sample("score.drop", id="evt_t1", sessionId="sess_t", score=12)
            await admin.send(drop)
            await admin.send(events.sample("score.drop", id="evt_t2", sessionId="sess_t", score=9))

            async def escalating() -> bool:
                return "looks again at" in (await admin.get("/admin/alerts/session:sess_t")).text

            await until(escalating, "the escalation's next look")
            await until(lambda: len(http_sink.requests) >= 2, "the page and the delivery")
            acked = await admin.post("/admin/alerts/session:sess_t/ack", {})
            assert acked.status_code == 303
            # A recover cancels the held rule's row: the Why table's later state, timed.
            await admin.send(events.sample("score.drop", id="evt_h1", sessionId="sess_h"))
            await admin.send(events.sample("score.recover", id="evt_h2", sessionId="sess_h"))

            async def cancelled() -> bool:
                return "then cancelled at" in await admin.page("/admin/events/evt_h1")

            await until(cancelled, "the held row's cancel in the Why table")
            pages = {}
            for path in (
                "/admin/alerts",
                "/admin/alerts/session:sess_t",
                "/admin/events",
                "/admin/events/evt_t1",
                "/admin/events/evt_h1",
                "/admin/sessions",
                "/admin/sessions/sess_t",
                "/admin/notifications",
                "/admin/notifications/1",
                "/admin/webhooks",
                "/admin/keys",
                "/admin/rules",
            ):
                pages[path] = times(await admin.page(path))
            return pages

    pages = asyncio.run(main())
    # each page has times to show, ISO ones among them (the alert's, the event's...)
    assert all(pages.values()), pages
    odd = {p: sorted(t for t in found if not SHOWN.fullmatch(t)) for p, found in pages.items()}
    assert {p: found for p, found in odd.items() if found} == {}
