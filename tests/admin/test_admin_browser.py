"""The admin page in a real browser: Debian's Chromium driven by Playwright, against the real
server under uvicorn (one for the module), with an HTTP sink catching the notifications.

Access (sign-in, cookie, CSRF, headers), the on-call flows (retry, silence, acknowledge,
explain, bulk retry), event values that look like markup, and the screenshots in
docs/screenshots/. Chromium missing: the tests skip with one loud reason (fail under CI=true).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import pytest

from receiver import events
from tests.harness import Receiver, eventually
from tests.servers import HTTPSink, free_port

pytestmark = pytest.mark.e2e

# `make screenshots` (SCREENSHOTS=1) writes README's pictures; a plain run takes them in a
# temporary folder, so the suite never changes the checkout.
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
WAIT = 15.0  # the longest any wait for the server or the sink may take
XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(1)>'
# The receiver gives up on a failing target after about a second: dead notifications fast.
FAST_DEATH = {
    "RECEIVER_RETRY_INITIAL": "0.2",
    "RECEIVER_RETRY_MAX": "0.2",
    "RECEIVER_RETRY_FOR": "1",
    # Subscribers on loopback, over http, given up on after one retry.
    "RECEIVER_WEBHOOK_ALLOW_PRIVATE": "1",
    "RECEIVER_WEBHOOK_ALLOW_HTTP": "1",
    "RECEIVER_WEBHOOK_SCHEDULE": "0.2",
}
# `resolve: true` makes the rule follow the alert lifecycle (a score.drop opens its alert);
# the title carries the event id, so each test finds its own request at the sink.
# A drop of a user "esc_..." escalates instead: the hook at once, again an hour later.
RULES = """
notifiers:
  hook: "{hook}"
escalations:
  wake-someone:
    steps:
      - notify: [hook]
      - after: 1h
        notify: [hook]
rules:
  - name: escalate
    match: {{type: score.drop, userId: "esc_*"}}
    escalate: wake-someone
    title: "drop {{{{ event.id }}}}"
  - name: page-oncall
    match: {{type: score.drop}}
    notify: [hook]
    resolve: true
    title: "drop {{{{ event.id }}}}"
    body: "{{{{ userId }}}} at {{{{ score }}}} in {{{{ sessionId }}}}"
"""

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Locator, Page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _unavailable() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if _chromium() is None:
        return "chromium is not installed (make chromium, or apt-get install chromium)"
    return None


def until(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """tests.harness.eventually() with this file's deadline."""
    return eventually(check, what, timeout)


def shot(page: Page, name: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5000, f"{name}: an empty picture"


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def drop(**fields: Any) -> dict[str, Any]:
    values = {"id": uid("evt"), "sessionId": uid("sess"), "userId": uid("user"), "score": 18}
    return events.sample("score.drop", **{**values, **fields})


# -- fixtures: one server, one browser, one sign-in for the module ---------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    why = _unavailable()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"admin browser tests cannot run: {why}")
        pytest.skip(f"admin browser tests SKIPPED: {why}")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        found = pw.chromium.launch(
            executable_path=_chromium(), headless=True, args=["--no-sandbox"]
        )
        try:
            yield found
        finally:
            found.close()
    finally:
        pw.stop()


@pytest.fixture(scope="module")
def sink() -> Iterator[HTTPSink]:
    with HTTPSink() as found:
        yield found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sink: HTTPSink) -> Iterator[Receiver]:
    found = Receiver(
        tmp_path_factory.mktemp("admin"),
        rules=RULES.format(hook=sink.json_url("/hook")),
        env=FAST_DEATH,
    ).start()
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture(scope="module")
def admin_key(server: Receiver) -> str:
    return server.make_key("ops", role="admin")


@pytest.fixture(scope="module")
def signed_in(browser: Browser, server: Receiver, admin_key: str) -> dict[str, Any]:
    """The storage state (the session cookie) of one sign-in as ops, for each test's context."""
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(f"{server.url}/admin/login")
        page.get_by_label("API key").fill(admin_key)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{server.url}/admin/events")
        return context.storage_state()
    finally:
        context.close()


class Tab:
    """A page in a fresh browser context, recording dialogs and console errors."""

    def __init__(self, context: BrowserContext, base: str) -> None:
        self.context = context
        self.base = base
        self.page = context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def go(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        assert response is not None
        return response

    def follow(self, target: Locator, url: str | re.Pattern[str] | None = None) -> None:
        """Click target and wait until the page it leads to has loaded. A click returns once
        the navigation has started, while the old page can still answer a locator; and
        wait_for_url returns at once when the new page has the old one's address."""
        with self.page.expect_navigation(url=url):
            target.click()

    def row(self, text: str) -> Any:
        """The table row holding text (exactly one), outside an event page's "Why" table
        (which names every rule)."""
        found = self.page.locator("table:not(.why) tbody tr").filter(has_text=text)
        assert found.count() == 1, f"{found.count()} rows hold {text!r}: {self.page.url}"
        return found


@pytest.fixture
def tab(browser: Browser, server: Receiver, signed_in: dict[str, Any]) -> Iterator[Tab]:
    """A signed-in page at desktop size; fails the test on a dialog or a console error."""
    context = browser.new_context(viewport=DESKTOP, storage_state=signed_in)
    try:
        found = Tab(context, server.url)
        yield found
        assert found.dialogs == []
        assert found.errors == []
    finally:
        context.close()


def outbox(server: Receiver, event_id: str) -> list[tuple[int, str]]:
    """The rules' notifications of an event (not its deliveries to the subscribers that
    the module's `subscribers` fixture may have made by then: tests run in any order)."""
    return server.query(
        "SELECT id, state FROM outbox WHERE event_id = ? AND notifier != '@subscriber' ORDER BY id",
        (event_id,),
    )


def routed(server: Receiver, event_id: str) -> bool:
    rows = server.query("SELECT routed_at FROM events WHERE id = ?", (event_id,))
    return bool(rows and rows[0][0] is not None)


def at_sink(sink: HTTPSink, event_id: str, status: int = 200) -> list[Any]:
    return [
        r
        for r in sink.requests
        if r.json and r.json.get("title") == f"drop {event_id}" and r.status == status
    ]


def dead(server: Receiver, sink: HTTPSink, count: int) -> list[str]:
    """Send count events while the sink answers 500; their ids, once their notifications
    are dead (the receiver gives up after about a second: FAST_DEATH)."""
    sink.fail_with(500)
    try:
        ids = []
        for _ in range(count):
            event = drop()
            assert server.send(event).status_code == 202
            ids.append(event["id"])
        for event_id in ids:
            until(
                lambda i=event_id: [s for _, s in outbox(server, i)] == ["dead"], f"{event_id} dead"
            )
    finally:
        sink.ok()
    return ids


# -- access ----------------------------------------------------------------------------------


def test_signed_out_visit_redirects_to_the_login_page(browser: Browser, server: Receiver) -> None:
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(f"{server.url}/admin/events")
        assert page.url == f"{server.url}/admin/login?next=%2Fadmin%2Fevents"
        assert page.get_by_role("heading", name="Sign in").is_visible()
        assert page.get_by_role("navigation").count() == 0  # nothing shown signed out
        folder = DOCS_SHOTS if os.environ.get("SCREENSHOTS") == "1" else Path(tempfile.mkdtemp())
        shot(page, "login", folder)
    finally:
        context.close()


def test_an_admin_key_signs_in_with_a_signed_httponly_strict_cookie(
    browser: Browser, server: Receiver, admin_key: str
) -> None:
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(f"{server.url}/admin/events")
        page.get_by_label("API key").fill(admin_key)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{server.url}/admin/events")  # back where it was going
        assert page.get_by_role("heading", name="Events").is_visible()
        assert page.get_by_role("button", name="Sign out ops").is_visible()
        [cookie] = context.cookies()
        assert cookie["name"] == "receiver_admin"
        assert cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Strict"
        assert cookie["path"] == "/admin"
        assert 11 * 3600 < cookie["expires"] - time.time() <= 12 * 3600
        assert admin_key not in cookie["value"] and admin_key[8:] not in cookie["value"]
        # Signed: a changed value is no session at all.
        forged = {
            **cookie,
            "value": cookie["value"][:-2] + ("AA" if cookie["value"][-2:] != "AA" else "BB"),
        }
        context.clear_cookies()
        context.add_cookies([forged])
        page.goto(f"{server.url}/admin/events")
        assert page.url.startswith(f"{server.url}/admin/login")
    finally:
        context.close()


@pytest.mark.parametrize(
    ("role", "message"),
    [
        pytest.param("reader", "has role reader; the admin page needs admin", id="reader"),
        pytest.param("writer", "has role writer; the admin page needs admin", id="writer"),
        pytest.param(None, "unknown or revoked API key", id="unknown-key"),
    ],
)
def test_a_key_that_is_not_admin_is_refused_with_a_message(
    browser: Browser, server: Receiver, tab: Tab, role: str | None, message: str
) -> None:
    key = "rk_" + "x" * 40
    if role is not None:  # made on the keys page, which shows it once
        name = uid(role)
        tab.go("/admin/keys")
        tab.page.get_by_label("Name").fill(name)
        tab.page.get_by_label("Role").select_option(role)
        tab.follow(tab.page.get_by_role("button", name="Create"))
        assert f"Key {name} made" in tab.page.get_by_role("status").inner_text()
        key = tab.page.locator("pre.secret").inner_text().strip()
        assert tab.row(name).locator("td").nth(2).inner_text() == role
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(f"{server.url}/admin/login")
        page.get_by_label("API key").fill(key)
        with page.expect_navigation(), page.expect_response(f"{server.url}/admin/login") as answer:
            page.get_by_role("button", name="Sign in").click()
        assert answer.value.status == 401
        assert message in page.get_by_role("alert").inner_text()
        assert context.cookies() == []
        page.goto(f"{server.url}/admin/events")
        assert page.url.startswith(f"{server.url}/admin/login")
    finally:
        context.close()


def test_a_post_without_the_csrf_token_is_refused(
    browser: Browser, server: Receiver, signed_in: dict[str, Any]
) -> None:
    [cookie] = signed_in["cookies"]
    form = {"matchers": "userId=csrf_victim", "duration": "1h", "reason": "forged"}
    with httpx.Client(base_url=server.url, cookies={cookie["name"]: cookie["value"]}) as client:
        assert client.get("/admin/silences").status_code == 200  # the cookie is a session
        for token in ({}, {"csrf": "not-the-token"}):
            answer = client.post("/admin/silences", data={**form, **token})
            assert answer.status_code == 403, answer.text
            assert "no valid CSRF token" in answer.text
    # Forms on other origins. Same site (127.0.0.1, another port): the Strict cookie goes
    # along, and the missing token refuses it. Another site (localhost): no cookie at all.
    fields = "".join(f'<input name="{k}" value="{v}">' for k, v in form.items())
    evil = f'<form method="post" action="{server.url}/admin/silences">{fields}<button>go</button>'
    context = browser.new_context(viewport=DESKTOP, storage_state=signed_in)
    try:
        page = context.new_page()
        for host, status, heading in [("127.0.0.1", 403, "Refused"), ("localhost", 303, "Sign in")]:
            origin = f"http://{host}:{free_port()}"
            page.route(
                f"{origin}/evil", lambda route: route.fulfill(content_type="text/html", body=evil)
            )
            page.goto(f"{origin}/evil")
            # The answer, then the page it leads to (or the page could still be loading).
            with (
                page.expect_navigation(),
                page.expect_response(f"{server.url}/admin/silences") as answer,
            ):
                page.get_by_role("button", name="go").click()
            assert answer.value.status == status, host
            assert page.get_by_role("heading", name=heading).is_visible(), host
    finally:
        context.close()
    assert server.query("SELECT 1 FROM silences WHERE reason = 'forged'") == []


def test_pages_carry_a_strict_csp_and_deny_framing(tab: Tab) -> None:
    for path in ("/admin/login", "/admin/events", "/admin/rules", "/admin/events/no-such"):
        headers = tab.go(path).all_headers()
        csp = headers["content-security-policy"]
        parts = (part.strip().partition(" ") for part in csp.split(";"))
        directives = {name: value for name, _, value in parts if name}
        script = directives.get("script-src", directives["default-src"])
        assert script == "'none'", csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert directives["frame-ancestors"] == "'none'"
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
    tab.errors.remove(  # the 404 of /admin/events/no-such, the only one expected
        "Failed to load resource: the server responded with a status of 404 (Not Found)"
    )
    # The stylesheet is allowed by the policy, and applied.
    tab.go("/admin/events")
    assert tab.page.evaluate("getComputedStyle(document.body).fontSize") == "15px"


def test_signing_out_ends_the_session_and_a_copy_of_its_cookie(
    browser: Browser, server: Receiver
) -> None:
    # A key of its own: signing out ends every session of the key, and the other tests
    # share one sign-in of "ops".
    key = server.make_key("night", role="admin")
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(f"{server.url}/admin/login")
        page.get_by_label("API key").fill(key)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{server.url}/admin/events")
        # Signed out at once, mostly within the second the cookie was issued in.
        copied = {c["name"]: c["value"] for c in context.cookies()}
        page.get_by_role("button", name="Sign out night").click()
        page.wait_for_url(f"{server.url}/admin/login")
        assert context.cookies() == []
        page.goto(f"{server.url}/admin/events")
        assert page.url.startswith(f"{server.url}/admin/login")
        # The cookie as it was before signing out: refused too, by the server.
        r = httpx.get(f"{server.url}/admin/events", cookies=copied)
        assert r.status_code == 303 and r.headers["location"].startswith("/admin/login")
    finally:
        context.close()


def test_receiver_admin_off_removes_the_page(tmp_path: Path) -> None:
    server = Receiver(tmp_path, env={"RECEIVER_ADMIN": "off"}).start()
    try:
        for path in ("/admin", "/admin/events", "/admin/login", "/admin/static/admin.css"):
            assert server.get(path).status_code == 404, path
        assert httpx.post(f"{server.url}/admin/login", data={"key": "x"}).status_code == 404
    finally:
        server.stop()


# -- flows -----------------------------------------------------------------------------------


def test_a_sent_event_is_listed_and_leads_to_its_notification(
    tab: Tab, server: Receiver, sink: HTTPSink
) -> None:
    event = drop()
    assert server.send(event).status_code == 202
    until(lambda: at_sink(sink, event["id"]), "the notification at the sink")
    until(lambda: outbox(server, event["id"])[0][1] == "delivered", "delivered")
    tab.go("/admin/events")
    tab.follow(
        tab.page.get_by_role("link", name=event["id"], exact=True), f"**/admin/events/{event['id']}"
    )
    assert tab.page.get_by_role("heading", name=f"Event {event['id']}").is_visible()
    assert f'"userId": "{event["userId"]}"' in tab.page.locator("pre.payload").inner_text()
    assert "page-oncall" in tab.page.locator("pre.explain").inner_text()
    # Why: what routing decided, from what it recorded (GET /v1/events/:id/explain's).
    decided = tab.page.locator("table.why tbody tr").filter(has_text="page-oncall")
    assert decided.locator("td").nth(1).inner_text() == "sent"
    skipped = tab.page.locator("table.why tbody tr").filter(has_text="escalate")
    assert skipped.locator("td").nth(1).inner_text() == "not matched"
    row = tab.row("page-oncall")
    assert row.locator(".state").inner_text() == "delivered"
    [(row_id, _)] = outbox(server, event["id"])
    tab.follow(tab.page.get_by_role("link", name="Notifications"))
    notification = tab.row(f"drop {event['id']}")
    assert notification.locator("td").first.inner_text() == str(row_id)
    assert notification.locator(".state").inner_text() == "delivered"
    # and back to its event
    tab.follow(notification.get_by_role("link", name=event["id"]), f"**/admin/events/{event['id']}")


def test_a_dead_notification_is_retried_from_the_page_and_delivered(
    tab: Tab, server: Receiver, sink: HTTPSink
) -> None:
    [event_id] = dead(server, sink, 1)
    assert at_sink(sink, event_id, status=500) and not at_sink(sink, event_id)
    [(row_id, _)] = outbox(server, event_id)
    tab.go("/admin/notifications?state=dead")
    row = tab.row(f"drop {event_id}")
    assert row.locator(".state").inner_text() == "dead"
    tab.follow(row.get_by_role("link", name="Retry"))
    assert tab.page.get_by_role("heading").inner_text() == f"Retry notification #{row_id}?"
    assert outbox(server, event_id) == [(row_id, "dead")]  # nothing happens before Confirm
    tab.follow(
        tab.page.get_by_role("button", name="Confirm"), f"**/admin/notifications?retried={row_id}"
    )
    assert tab.page.get_by_role("status").inner_text() == f"Notification #{row_id} queued again."
    until(lambda: at_sink(sink, event_id), "the retried notification at the sink")
    until(lambda: outbox(server, event_id) == [(row_id, "delivered")], "delivered")
    tab.go(f"/admin/events/{event_id}")
    assert tab.row("page-oncall").locator(".state").inner_text() == "delivered"


def test_a_silence_made_on_the_page_keeps_a_matching_event_from_notifying(
    tab: Tab, server: Receiver, sink: HTTPSink
) -> None:
    user, reason = uid("user_quiet"), "load test " + uid("run")
    tab.go("/admin/silences")
    tab.page.get_by_label("Matchers").fill(f"userId={user}")
    tab.page.get_by_label("For", exact=True).fill("15m")
    tab.page.get_by_label("Reason").fill(reason)
    tab.follow(tab.page.get_by_role("button", name="Silence"), "**/admin/silences")
    row = tab.row(reason)
    assert f"userId={user}" in row.inner_text() and "active" in row.inner_text()
    quiet, loud = drop(userId=user), drop()
    assert server.send(quiet).status_code == 202
    assert server.send(loud).status_code == 202
    until(lambda: at_sink(sink, loud["id"]), "the unsilenced event at the sink")
    until(lambda: routed(server, quiet["id"]), "the silenced event routed")
    tab.go(f"/admin/events/{quiet['id']}")
    state = tab.row("page-oncall")
    assert state.locator(".state").inner_text() == "silenced"
    assert reason in state.inner_text()
    # Notifications go to /hook; /subscriber is a subscriber's (not silenced: by design).
    assert not [r for r in sink.requests if r.path == "/hook" and quiet["id"] in json.dumps(r.json)]


def test_an_open_alert_is_acknowledged_by_ops(tab: Tab, server: Receiver, sink: HTTPSink) -> None:
    event = drop()
    assert server.send(event).status_code == 202
    alert = f"session:{event['sessionId']}"
    until(lambda: routed(server, event["id"]), "routing")
    tab.go("/admin/alerts")
    row = tab.row(alert)
    assert row.locator("td").nth(4).inner_text() == "no"
    tab.follow(row.get_by_role("link", name="Acknowledge"))
    assert tab.page.get_by_role("heading").inner_text() == f"Acknowledge {alert}?"
    tab.follow(tab.page.get_by_role("button", name="Confirm"), "**/admin/alerts")
    row = tab.row(alert)
    assert re.fullmatch(
        r"by ops at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row.locator("td").nth(4).inner_text()
    )
    assert row.get_by_role("link", name="Acknowledge").count() == 0


def test_an_alert_page_shows_its_escalation_and_the_ack_that_stopped_it(
    tab: Tab, server: Receiver, sink: HTTPSink, tmp_path: Path
) -> None:
    event = drop(userId=uid("esc"))
    assert server.send(event).status_code == 202
    alert = f"session:{event['sessionId']}"
    until(lambda: at_sink(sink, event["id"]), "step 1 at the sink")
    tab.go(f"/admin/alerts/{quote(alert)}")
    page = tab.page
    assert page.get_by_role("heading", name="Escalation wake-someone").is_visible()
    summary = page.locator("p.escalation").inner_text()
    assert "running, step 2 of 2; looks again at" in summary, summary
    paged = page.locator("table").first.locator("tbody tr").filter(has_text="paged")
    assert paged.locator("td").nth(3).inner_text() == "hook"
    folder = DOCS_SHOTS if os.environ.get("SCREENSHOTS") == "1" else tmp_path
    shot(page, "alert", folder)
    tab.follow(page.get_by_role("link", name="Acknowledge"))
    tab.follow(page.get_by_role("button", name="Confirm"))

    def stopped() -> bool:
        tab.go(f"/admin/alerts/{quote(alert)}")
        return "acked, step 2 of 2." in page.locator("p.escalation").inner_text()

    until(stopped, "the chain to stop at the ack")
    assert "acknowledged by ops" in page.locator("table").first.inner_text()


def test_the_rules_page_explains_a_pasted_event(tab: Tab) -> None:
    tab.go("/admin/rules")
    assert "page-oncall" in tab.page.locator("pre.payload").inner_text()  # the file
    tab.page.get_by_label("Event JSON").fill(json.dumps(drop(score=12)))
    tab.follow(tab.page.get_by_role("button", name="Explain"))
    explained = tab.page.locator("pre.explain").inner_text()
    assert "page-oncall" in explained and "hook" in explained
    tab.page.get_by_label("Event JSON").fill('{"type": "score.drop"')
    tab.follow(tab.page.get_by_role("button", name="Explain"))
    assert "not valid JSON" in tab.page.get_by_role("alert").inner_text()


def test_the_report_shows_a_periods_notifications_with_a_chart(
    tab: Tab, server: Receiver, sink: HTTPSink
) -> None:
    session, user = uid("sess_noisy"), uid("user_noisy")
    sent = [drop(sessionId=session, userId=user) for _ in range(7)]  # more than any other
    for event in sent:
        assert server.send(event).status_code == 202
    for event in sent:
        until(lambda i=event["id"]: at_sink(sink, i), "the noisy session's notifications")
    tab.go("/admin/report?since=1d")
    assert tab.page.get_by_role("heading", level=1).inner_text() == "Noise report"
    first = tab.page.locator("#top-sessions tbody tr").first
    assert first.locator("td").nth(0).inner_text() == session
    assert first.locator("td").nth(1).inner_text() == "7"
    assert tab.page.locator("#top-users tbody tr").first.locator("td").first.inner_text() == user
    delivered = server.query(
        "SELECT count(*) FROM outbox WHERE rule = 'page-oncall' AND state = 'delivered'"
    )[0][0]
    row = tab.page.locator("#per-rule tbody tr").filter(has_text="page-oncall")
    assert int(row.locator("td").nth(1).inner_text().replace(",", "")) >= delivered >= 7
    today = tab.page.locator("svg.chart.bars rect.bar").last
    assert today.locator("title").text_content().endswith(row.locator("td").nth(1).inner_text())
    assert "p50" in tab.page.locator("main p").first.inner_text()
    tab.page.get_by_label("since").fill("2h")
    tab.follow(tab.page.get_by_role("button", name="Show"), "**/admin/report?since=2h")
    assert (
        tab.page.locator("#top-sessions tbody tr").first.locator("td").first.inner_text() == session
    )


def test_bulk_retry_shows_the_count_first_then_its_progress_to_done(
    tab: Tab, server: Receiver, sink: HTTPSink
) -> None:
    ids = dead(server, sink, 3)
    dead_now = "SELECT count(*) FROM outbox WHERE state = 'dead'"
    [(before,)] = server.query(dead_now)
    assert before >= 3
    tab.go("/admin/notifications?state=dead")
    tab.follow(tab.page.get_by_role("link", name="Retry all dead"))
    heading = tab.page.get_by_role("heading").inner_text()
    [(after,)] = server.query(dead_now)  # earlier tests' rows may die meanwhile (one server)
    shown = re.fullmatch(r"Retry all ([\d,]+) dead notifications\?", heading)
    assert shown is not None, heading
    count = int(shown.group(1).replace(",", ""))
    assert before <= count <= after, (before, count, after)
    assert all(s == "dead" for i in ids for _, s in outbox(server, i))  # not before Confirm
    tab.follow(tab.page.get_by_role("button", name="Confirm"), re.compile(r".*/admin/jobs/\d+$"))
    # The page refreshes itself (a meta refresh, no script) until the job is done.
    # All it took at Confirm (at least what the heading counted) done.
    tab.page.get_by_text(re.compile(r"([\d,]+) of \1: done")).wait_for(timeout=WAIT * 1000)
    done = re.search(r"([\d,]+) of \1: done", tab.page.content())
    assert done is not None and int(done.group(1).replace(",", "")) >= count
    for event_id in ids:
        until(lambda i=event_id: at_sink(sink, i), f"{event_id} retried to the sink")


# -- event values that look like markup --------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(server: Receiver) -> dict[str, Any]:
    """Two events of one session whose values are markup: a chart of two points."""
    session = f"sess_{XSS_SCRIPT}"
    first = drop(
        id=f"evt_{uuid.uuid4().hex[:6]}{XSS_IMG}",
        sessionId=session,
        userId=f"user_{XSS_IMG}",
        page=XSS_SCRIPT,
        note=XSS_IMG,
        score=25,
    )
    second = drop(id=uid("evt"), sessionId=session, userId=first["userId"], score=11)
    for event in (first, second):
        assert server.send(event).status_code == 202
        until(lambda i=event["id"]: routed(server, i), "routing")
    return first


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("events", id="events-list"),
        pytest.param("event", id="event-page"),
        pytest.param("sessions", id="sessions-list"),
        pytest.param("session", id="session-chart"),
        pytest.param("explain", id="rules-explain"),
    ],
)
def test_markup_in_event_values_shows_as_text_and_never_runs(
    browser: Browser,
    server: Receiver,
    signed_in: dict[str, Any],
    hostile: dict[str, Any],
    where: str,
) -> None:
    # Without the CSP too: escaping alone must keep the markup inert.
    context = browser.new_context(viewport=DESKTOP, storage_state=signed_in, bypass_csp=True)
    try:
        tab = Tab(context, server.url)
        page = tab.page
        if where == "events":
            tab.go("/admin/events")
            shown = [hostile["id"], hostile["sessionId"], hostile["userId"]]
        elif where == "event":
            tab.go("/admin/events")
            tab.follow(page.get_by_role("link", name=hostile["id"], exact=True))
            shown = [hostile["id"], XSS_SCRIPT, XSS_IMG]
            payload = json.loads(page.locator("pre.payload").inner_text())
            assert payload == hostile
            assert hostile["sessionId"] in page.locator("pre.explain").inner_text()
        elif where == "sessions":
            tab.go("/admin/sessions")
            shown = [hostile["sessionId"], hostile["userId"]]
        elif where == "session":
            tab.go("/admin/sessions")
            tab.follow(page.get_by_role("link", name=hostile["sessionId"], exact=True))
            assert page.get_by_role("heading", name=f"Session {hostile['sessionId']}").is_visible()
            title = page.locator("svg.chart > title").text_content()
            assert title is not None and f"Score of {hostile['sessionId']}" in title
            assert page.locator("svg.chart circle").count() == 2
            shown = [hostile["sessionId"], hostile["userId"]]
        else:
            tab.go("/admin/rules")
            page.get_by_label("Event JSON").fill(json.dumps(hostile))
            tab.follow(page.get_by_role("button", name="Explain"))
            assert json.loads(page.get_by_label("Event JSON").input_value()) == hostile
            assert f"in {hostile['sessionId']}" in page.locator("pre.explain").inner_text()
            shown = [hostile["sessionId"]]
        for text in shown:
            assert page.get_by_text(text, exact=False).first.is_visible(), text
        assert page.locator("img").count() == 0
        assert page.locator("script").count() == 0
        assert tab.dialogs == []
        assert tab.errors == []
    finally:
        context.close()


# -- webhook subscribers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def answering() -> Iterator[HTTPSink]:
    """A subscriber that always answers 200: a sink of its own, since tests of this module
    make the notifiers' sink answer 500 (a loaded run saw its later deliveries fail there)."""
    with HTTPSink() as found:
        yield found


@pytest.fixture(scope="module")
def gone() -> Iterator[HTTPSink]:
    """A subscriber that answers 410 Gone: the receiver disables its subscription."""
    with HTTPSink() as found:
        found.fail_with(410)
        yield found


@pytest.fixture(scope="module")
def subscribers(
    browser: Browser,
    server: Receiver,
    signed_in: dict[str, Any],
    answering: HTTPSink,
    gone: HTTPSink,
) -> dict[str, str]:
    """Three subscribers made on the Webhooks page, once their first delivery is settled:
    one delivered to, one failing (nothing listens at its port), one disabled (410).
    Returns each one's URL by its kind."""
    urls = {
        "active": f"{answering.url}/subscriber",
        "failing": f"http://127.0.0.1:{free_port()}/down",
        "disabled": f"{gone.url}/gone",
    }
    context = browser.new_context(viewport=DESKTOP, storage_state=signed_in)
    try:
        tab = Tab(context, server.url)
        page = tab.page
        for url in urls.values():
            tab.go("/admin/webhooks")
            page.get_by_label("URL").fill(url)
            tab.follow(page.get_by_role("button", name="Subscribe"))
            note = page.get_by_role("status")
            assert "shown only now" in note.inner_text()
            assert len(page.locator("pre.secret").inner_text().strip()) >= 24
        assert server.send(drop()).status_code == 202

        def settled() -> bool:
            tab.go("/admin/webhooks")
            return (
                "delivered" in tab.row(urls["active"]).inner_text()
                # Its last attempt made, not just its first failed: the first one's error
                # ("All connection attempts failed") says "failed" too.
                and "2 attempts" in tab.row(urls["failing"]).inner_text()
                and "disabled" in tab.row(urls["disabled"]).inner_text()
            )

        until(settled, "the subscribers' first deliveries to settle")
        assert tab.dialogs == [] and tab.errors == []
    finally:
        context.close()
    return urls


def test_the_webhooks_page_shows_active_failing_and_disabled_subscribers(
    tab: Tab, subscribers: dict[str, str]
) -> None:
    def settled(kind: str, *words: str) -> str:
        """The subscriber's row once its newest delivery settled: other tests' events, sent
        since the fixture's, fan out to the module's subscribers too (a fresh-clone run saw
        the failing one's newest delivery pending, 1 attempt)."""

        def look() -> str | None:
            tab.go("/admin/webhooks")
            text = str(tab.row(subscribers[kind]).inner_text())
            return text if all(word in text for word in words) else None

        return str(until(look, f"the {kind} subscriber's newest delivery to settle"))

    settled("active", "active", "delivered")
    settled("failing", "active", "failed", "2 attempts")
    settled("disabled", "disabled", "410")
    # The secret was shown once, on the page that made it; never on the list.
    assert tab.page.locator("pre.secret").count() == 0
    tab.follow(tab.row(subscribers["failing"]).get_by_role("link", name="Delete"))
    assert tab.page.get_by_role("heading", level=1).inner_text().startswith("Delete webhook")


# -- screenshots -------------------------------------------------------------------------------


def test_screenshots_of_every_page(
    browser: Browser,
    tab: Tab,
    server: Receiver,
    sink: HTTPSink,
    tmp_path: Path,
    subscribers: dict[str, str],
) -> None:
    """Each page at 1280x800, and the events page at phone width: in docs/screenshots/
    with SCREENSHOTS=1 (`make screenshots`), else in a temporary folder."""
    folder = DOCS_SHOTS if os.environ.get("SCREENSHOTS") == "1" else tmp_path
    user, session = uid("user"), uid("sess")
    for score in (52, 44, 31, 23, 35, 18):
        event = events.sample(
            "score.drop", id=uid("evt"), sessionId=session, userId=user, score=score, threshold=40
        )
        assert server.send(event).status_code == 202
    until(lambda: at_sink(sink, event["id"]), "the last notification at the sink")
    page = tab.page
    tab.go(f"/admin/events?user={user}")
    shot(page, "events", folder)
    tab.follow(page.get_by_role("link", name=event["id"]))
    shot(page, "event", folder)
    tab.go(f"/admin/sessions?user={user}")
    shot(page, "sessions", folder)
    tab.follow(page.get_by_role("link", name=session))
    assert page.locator("svg.chart circle").count() == 6
    assert page.locator("svg.chart line.threshold").count() == 1
    shot(page, "session", folder)
    for name in ("notifications", "alerts", "report", "silences", "rules", "webhooks", "keys"):
        tab.go(f"/admin/{name}")
        assert page.get_by_role("heading", level=1).is_visible()
        shot(page, name, folder)
    phone = browser.new_context(viewport=PHONE, storage_state=tab.context.storage_state())
    try:
        small = phone.new_page()
        small.goto(f"{server.url}/admin/events?user={quote(user)}")
        width = small.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"the events page is {width}px wide on a phone"
        shot(small, "events-phone", folder)
    finally:
        phone.close()
