"""The admin Webhooks page sets a subscriber's rate limit and filter when it registers one
(refusing what POST /v1/webhooks refuses, with its message) and shows them beside its
health; the filter set there decides what the subscriber gets. Real headless Chromium on
the real server (the fixtures of tests/admin/test_admin_browser.py)."""

from __future__ import annotations

import pytest

from tests.admin import test_admin_browser as browser_tests
from tests.admin.test_admin_browser import Tab, drop, until
from tests.harness import Receiver
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

# The browser tests' fixtures, for this module (each module gets its own server).
browser = browser_tests.browser
sink = browser_tests.sink
server = browser_tests.server
admin_key = browser_tests.admin_key
signed_in = browser_tests.signed_in
tab = browser_tests.tab

BETA = '{"cohort": {"in": ["beta"]}}'


def _subscribe(page_tab: Tab, url: str, rate: str = "", wanted: str = "") -> str:
    """Fill the form and subscribe; the page's status or alert text."""
    page = page_tab.page
    page_tab.go("/admin/webhooks")
    page.get_by_label("URL").fill(url)
    page.get_by_label("Rate limit").fill(rate)
    page.get_by_label("Filter").fill(wanted)
    page_tab.follow(page.get_by_role("button", name="Subscribe"))
    note = page.get_by_role("status").or_(page.get_by_role("alert"))
    return str(note.inner_text())


def test_the_page_sets_a_rate_limit_and_filter_and_shows_them_with_health(
    tab: Tab, server: Receiver
) -> None:
    with HTTPSink() as subscriber:
        url = f"{subscriber.url}/beta"
        assert "shown only now" in _subscribe(tab, url, "50", BETA)
        row = tab.row(url).inner_text()
        assert "50/s" in row and '{"cohort": {"in": ["beta"]}}' in row and "healthy" in row
        plain = f"{subscriber.url}/all"
        assert "shown only now" in _subscribe(tab, plain)
        row = tab.row(plain).inner_text()
        assert "none" in row and "every event" in row

        # What the filter set on the page decides: only the beta cohort's drop is sent.
        beta, other = drop(cohort="beta"), drop(cohort="gamma")
        assert server.send(beta).status_code == 202
        assert server.send(other).status_code == 202
        until(lambda: len([r for r in subscriber.requests if r.path == "/all"]) == 2, "both")
        until(lambda: [r.json["id"] for r in subscriber.requests if r.path == "/beta"], "beta")
        assert [r.json["id"] for r in subscriber.requests if r.path == "/beta"] == [beta["id"]]
        assert tab.dialogs == [] and tab.errors == []


def test_the_page_refuses_a_rate_over_the_setting_and_a_filter_that_is_no_match(
    tab: Tab,
) -> None:
    url = "http://127.0.0.1:9/refused"
    said = _subscribe(tab, url, "5000")
    assert "rateLimit must be a number of deliveries a second from 1 to 1000" in said
    assert "filter is not JSON" in _subscribe(tab, url, "", "{cohort: beta}")
    assert 'filter.score: unknown operator "bogus"' in _subscribe(
        tab, url, "", '{"score": {"bogus": 1}}'
    )
    assert tab.page.locator("table tbody tr").filter(has_text=url).count() == 0


def test_edit_changes_a_subscriber_s_rate_limit_and_filter_or_says_why_not(
    tab: Tab, server: Receiver
) -> None:
    with HTTPSink() as subscriber:
        url = f"{subscriber.url}/edited"
        assert "shown only now" in _subscribe(tab, url, "5")
        page = tab.page
        tab.follow(tab.row(url).get_by_role("link", name="Edit"))
        assert page.get_by_label("Rate limit").input_value() == "5"
        assert page.get_by_label("Filter").input_value() == ""

        page.get_by_label("Rate limit").fill("5000")
        tab.follow(page.get_by_role("button", name="Save"))
        said = page.get_by_role("alert").inner_text()
        assert "rateLimit must be a number of deliveries a second from 1 to 1000" in said
        page.get_by_label("Rate limit").fill("")
        page.get_by_label("Filter").fill(BETA)
        tab.follow(page.get_by_role("button", name="Save"), "**/admin/webhooks")
        row = tab.row(url).inner_text()
        assert "none" in row and '{"cohort": {"in": ["beta"]}}' in row

        # The filter set there decides from the next event on.
        beta, other = drop(cohort="beta"), drop(cohort="gamma")
        assert server.send(other).status_code == 202
        assert server.send(beta).status_code == 202
        until(lambda: [r for r in subscriber.requests if r.path == "/edited"], "the beta one")
        assert [r.json["id"] for r in subscriber.requests if r.path == "/edited"] == [beta["id"]]
        routed = "SELECT routed_at FROM events WHERE id = ?"
        assert server.query(routed, (other["id"],))[0][0] is not None
        made = "SELECT count(*) FROM outbox o JOIN webhooks w ON w.id = o.subscription_id"
        made += " WHERE o.event_id = ? AND w.url = ?"
        assert server.query(made, (other["id"], url)) == [(0,)]
        assert tab.dialogs == [] and tab.errors == []
