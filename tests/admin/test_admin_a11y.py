"""The admin page's accessibility: axe-core (the axe-playwright-python package's copy) run
in Debian's Chromium over every page of the admin, at desktop and phone width, finds no
serious or critical violation; the alert page's tables fit a phone or scroll; subscriber
deliveries are named by their subscriber, not by an internal index.

The module's server, browser and sign-in are tests/admin/test_admin_browser.py's fixtures
(one server for this module too)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.admin import test_admin_browser as browser_tests
from tests.admin.test_admin_browser import DESKTOP, PHONE, Tab, at_sink, drop, uid, until
from tests.harness import Receiver, signed
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

# The browser tests' fixtures, for this module (each module gets its own server).
browser = browser_tests.browser
sink = browser_tests.sink
server = browser_tests.server
admin_key = browser_tests.admin_key
signed_in = browser_tests.signed_in
answering = browser_tests.answering
gone = browser_tests.gone
subscribers = browser_tests.subscribers
tab = browser_tests.tab

BLOCKING = ("serious", "critical")
# Of lesser impact, and still refused: a column whose header says nothing to a screen reader.
NAMED = ("empty-table-header",)


@pytest.fixture(scope="module")
def pages(
    browser: Any,
    server: Receiver,
    sink: HTTPSink,
    signed_in: dict[str, Any],
    subscribers: dict[str, str],
) -> list[str]:
    """A path of every page of the admin, with something on each: an event with its
    notification, subscriber deliveries and an alert with an escalation, a quarantined
    body, a silence, a bulk retry's job, the confirmations."""
    context = browser.new_context(viewport=DESKTOP, storage_state=signed_in)
    try:
        tab = Tab(context, server.url)
        tab.go("/admin/silences")
        tab.page.get_by_label("Matchers").fill(f"userId={uid('quiet')}")
        tab.page.get_by_label("Reason").fill("an accessibility check")
        tab.follow(tab.page.get_by_role("button", name="Silence"))
        tab.go("/admin/bulk-retry")
        tab.follow(tab.page.get_by_role("button", name="Confirm"), re.compile(r".*/jobs/\d+$"))
        job = tab.page.url.removeprefix(server.url)
    finally:
        context.close()
    ((silence,),) = server.query("SELECT max(id) FROM silences")
    esc, plain = drop(userId=uid("esc")), drop()
    for event in (esc, plain):
        assert server.send(event).status_code == 202
        until(lambda i=event["id"]: at_sink(sink, i), f"{event['id']} at the sink")
    body = json.dumps({"type": "score.drop", "id": uid("evt_bad")}).encode()
    assert server.post(body, signed(body, server.secret)).status_code == 422  # quarantined
    (notification,) = server.query(
        "SELECT min(id) FROM outbox WHERE event_id = ? AND notifier != '@subscriber'",
        (plain["id"],),
    )[0]
    (delivery,) = server.query(
        "SELECT min(id) FROM outbox WHERE notifier = '@subscriber' AND event_id = ?",
        (plain["id"],),
    )[0]
    until(
        lambda: server.query("SELECT id FROM alerts WHERE opened_event = ?", (esc["id"],)), "alert"
    )
    ((alert,),) = server.query("SELECT id FROM alerts WHERE opened_event = ?", (esc["id"],))
    ((hook,),) = server.query("SELECT public_id FROM webhooks LIMIT 1")
    return [
        "/admin/events",
        f"/admin/events/{plain['id']}",
        f"/admin/events/{plain['id']}/replay",
        "/admin/events?state=quarantined",
        "/admin/events?state=duplicates",
        "/admin/sessions",
        f"/admin/sessions/{plain['sessionId']}",
        "/admin/notifications",
        f"/admin/notifications/{notification}",
        f"/admin/notifications/{delivery}",
        f"/admin/notifications/{notification}/retry",
        "/admin/bulk-retry",
        "/admin/alerts",
        f"/admin/alerts/{alert}",
        f"/admin/alerts/{alert}/ack",
        "/admin/report",
        "/admin/silences",
        f"/admin/silences/{silence}/expire",
        job,
        "/admin/rules",
        "/admin/webhooks",
        f"/admin/webhooks/{hook}/delete",
        "/admin/keys",
        "/admin/keys/ops/revoke",
        "/admin/notifications/999999999",  # a page that is not there
    ]


def violations(page: Any) -> list[str]:
    """axe-core's serious and critical violations on page (and the NAMED ones), one line
    each: the rule, its impact, and the first elements it names."""
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page).response["violations"]
    return [
        f"{v['id']} ({v['impact']}) at {[n['target'] for n in v['nodes'][:3]]}: {v['help']}"
        for v in found
        if v["impact"] in BLOCKING or v["id"] in NAMED
    ]


@pytest.fixture(params=[DESKTOP, PHONE], ids=["1280px", "390px"])
def viewport(request: pytest.FixtureRequest) -> dict[str, int]:
    return dict(request.param)


@pytest.fixture
def wide_tab(
    browser: Any, server: Receiver, signed_in: dict[str, Any], viewport: dict[str, int]
) -> Iterator[Tab]:
    context = browser.new_context(viewport=viewport, storage_state=signed_in)
    try:
        yield Tab(context, server.url)
    finally:
        context.close()


def test_every_admin_page_has_no_serious_or_critical_axe_violation(
    browser: Any, server: Receiver, wide_tab: Tab, pages: list[str], viewport: dict[str, int]
) -> None:
    found = {}
    for path in pages:
        wide_tab.go(path)
        if bad := violations(wide_tab.page):
            found[path] = bad
    # The pages a form answers with: the rules' explanation of a pasted event, and a
    # message (a delivered notification is not retried: nothing changes).
    page = wide_tab.page
    wide_tab.go("/admin/rules")
    page.get_by_label("Event JSON").fill(json.dumps(drop()))
    wide_tab.follow(page.get_by_role("button", name="Explain"))
    if bad := violations(page):
        found["/admin/rules (explained)"] = bad
    wide_tab.go(next(p for p in pages if p.endswith("/retry")))
    wide_tab.follow(page.get_by_role("button", name="Confirm"))
    assert page.get_by_role("heading", name="Not retried").is_visible()
    if bad := violations(page):
        found["(message) Not retried"] = bad
    signed_out = browser.new_context(viewport=viewport)
    try:
        login = signed_out.new_page()
        login.goto(f"{server.url}/admin/login")
        if bad := violations(login):
            found["/admin/login"] = bad
    finally:
        signed_out.close()
    assert found == {}, "\n".join(f"{p}: {line}" for p, lines in found.items() for line in lines)
    assert wide_tab.dialogs == []


def test_the_alert_pages_tables_fit_a_phone(
    browser: Any, server: Receiver, signed_in: dict[str, Any], pages: list[str]
) -> None:
    """At 390 px nothing of the alert page's tables (its escalation's log, who was paged,
    what was done) is cut off: each fits the screen without scrolling."""
    context = browser.new_context(viewport=PHONE, storage_state=signed_in)
    try:
        page = context.new_page()
        page.goto(server.url + next(p for p in pages if p.startswith("/admin/alerts/sess")))
        assert page.get_by_role("heading", name="Who was paged").is_visible()
        cut = page.evaluate(
            """() => [...document.querySelectorAll('table')]
                .map(t => t.closest('.scroll') || t)
                .filter(box => box.scrollWidth > box.clientWidth)
                .map(box => [box.getAttribute('aria-label'), box.scrollWidth, box.clientWidth])"""
        )
        assert cut == []
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    finally:
        context.close()


def test_a_delivery_is_shown_as_its_subscriber_and_its_url_without_secrets(
    tab: Tab, server: Receiver, subscribers: dict[str, str]
) -> None:
    """Not "@subscriber[1]" (the outbox's index of a subscriber): its id, and its URL with
    every path segment and token replaced, on the notifications, a delivery's and an
    event's pages."""
    ((row, event, public_id),) = server.query(
        "SELECT o.id, o.event_id, w.public_id FROM outbox o JOIN webhooks w ON w.id = o.target"
        " WHERE o.notifier = '@subscriber' AND w.url = ? ORDER BY o.id LIMIT 1",
        (subscribers["active"],),
    )
    port = subscribers["active"].split(":")[2].split("/")[0]
    shown = f"{public_id} http://127.0.0.1:{port}/REDACTED"
    tab.go("/admin/notifications?notifier=%40subscriber")
    listed = tab.page.get_by_role("region", name="notifications and deliveries").inner_text()
    assert shown in listed and "@subscriber[" not in listed
    tab.go(f"/admin/notifications/{row}")
    assert tab.page.locator("dd.target").inner_text() == shown
    tab.go(f"/admin/events/{event}")
    deliveries = tab.page.get_by_role("region", name="webhook deliveries").inner_text()
    assert shown in deliveries and "@subscriber[" not in tab.page.content()
