"""Every admin page rendered against real data by the real app (httpx's ASGI transport, a
real SQLite file, a real subscriber): each template at least once, with the values that
make its branches differ (active, disabled and failing subscribers; odd stored rows such
as a silence ending after the year 9999), so an undefined name (StrictUndefined) or a time
no date can show fails here rather than as a 500 in production. Also the duration caps on
the admin forms and the sign-in limit per client address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jinja2
import pytest

from receiver import events, signature
from receiver.admin.auth import COOKIE, SIGN_IN_LIMIT
from receiver.api.auth import PREFIX, hash_key, new_key
from receiver.app import create_app
from receiver.settings import Settings
from tests.harness import SECRET
from tests.servers import HTTPSink, free_port

TEMPLATES = Path(__file__).resolve().parents[2] / "receiver" / "admin" / "templates"
DEADLINE = 20.0
RULES = """
notifiers:
  hook: "{hook}"
rules:
  - name: page-oncall
    match: {{type: score.drop}}
    notify: [hook]
    resolve: true
    title: "drop {{{{ event.id }}}}"
"""
BEYOND_DATES = 1e18  # seconds: some 31 billion years, past what a datetime can show


class Clock:
    """The real time, moved on by `offset` seconds when a test says so."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class Admin:
    """The app, a client signed in as an admin key, and the app's clock."""

    app: Any
    client: httpx.AsyncClient
    clock: Clock
    key: str = ""
    cookie: str = ""

    @property
    def store(self) -> Any:
        return self.app.state.store

    async def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.client.get(path, headers={"cookie": f"{COOKIE}={self.cookie}"}, **kwargs)

    async def page(self, path: str) -> str:
        answer = await self.get(path)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
        return answer.text

    async def post(self, path: str, data: dict[str, Any]) -> httpx.Response:
        form = await self.page("/admin/events")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        return await self.client.post(
            path,
            data={**data, "csrf": csrf.group(1)},
            headers={"cookie": f"{COOKIE}={self.cookie}"},
        )

    async def send(self, event: dict[str, Any]) -> None:
        body = json.dumps(event).encode()
        answer = await self.client.post(
            "/v1/events",
            content=body,
            headers={signature.SIGNATURE_HEADER: signature.sign(SECRET.encode(), body)},
        )
        assert answer.status_code == 202, answer.text


async def until(check: Callable[[], Any], what: str) -> Any:
    """check()'s first truthy result (awaited if need be), polled until the deadline."""
    deadline = time.monotonic() + DEADLINE
    while True:
        found = check()
        if asyncio.iscoroutine(found):
            found = await found
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out after {DEADLINE:g}s waiting for {what}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(
    tmp: Path, hook: str, address: str = "127.0.0.1", rules_text: str = RULES
) -> AsyncIterator[Admin]:
    rules = tmp / "rules.yaml"
    rules.write_text(rules_text.format(hook=hook))
    settings = Settings(
        db=str(tmp / "receiver.db"),
        rules=rules,
        secrets=SECRET,
        retry_initial=0.1,
        retry_max=0.1,
        retry_for=0.3,
        notify_timeout=3,
        webhook_allow_private=True,
        webhook_allow_http=True,
        webhook_schedule="0.1",
        max_clock_skew=0,
        max_event_age=0,
        public_url="http://receiver",  # the one-click action pages (act.html)
    )
    clock = Clock()
    app = create_app(settings, clock=clock)
    transport = httpx.ASGITransport(app=app, client=(address, 50000))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://receiver") as client,
    ):
        key = new_key()
        admin = Admin(app, client, clock, key)
        await admin.store.keys.add(
            name="ops", key_hash=hash_key(key), prefix=key[:PREFIX], plan="enterprise",
            role="admin", now=clock(),
        )  # fmt: skip
        signed_in = await client.post("/admin/login", data={"key": key})
        assert signed_in.status_code == 303, signed_in.text
        admin.cookie = signed_in.cookies[COOKIE]
        yield admin


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the admin templates rendered during the test."""
    names: set[str] = set()
    original = jinja2.Environment.get_template

    def recording(self: jinja2.Environment, name: Any, *args: Any, **kwargs: Any) -> Any:
        names.add(str(name))
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "get_template", recording)
    return names


def test_every_admin_template_renders_against_real_data(
    tmp_path: Path, rendered: set[str], http_sink: HTTPSink
) -> None:
    """Each page with the data that makes its branches differ; an undefined name in any
    template raises (StrictUndefined) and fails the request here."""
    closed = f"http://127.0.0.1:{free_port()}/gone"  # nothing listens: sends fail at once

    async def main() -> None:
        async with running(tmp_path, hook=closed.replace("http://", "json://")) as admin:
            store = admin.store
            # Subscribers: one delivered to, one failing, one disabled. Subscribing answers
            # the page with the secret shown once (it was a 500 once any was active).
            for url in (http_sink.url + "/sub", closed, http_sink.url + "/off"):
                made = await admin.post("/admin/webhooks", {"url": url, "events": "score.drop"})
                assert made.status_code == 200 and "shown only now" in made.text, made.text
            hooks = await store.webhooks.all()
            off = next(h for h in hooks if h.url.endswith("/off"))
            await store.webhooks.update(
                off.public_id, now=admin.clock(), status="disabled", reason="410 Gone"
            )
            first = events.sample("score.drop", id="evt_page_1", sessionId="sess_1", score=12)
            await admin.send(first)
            await admin.send(events.sample("score.recover", id="evt_page_2", sessionId="sess_1"))
            await admin.send(events.sample("score.drop", id="evt_page_3", sessionId="sess_2"))
            quarantined = json.dumps({"id": "evt_bad", "type": "score.drop"}).encode()
            await admin.client.post(
                "/v1/events",
                content=quarantined,
                headers={signature.SIGNATURE_HEADER: signature.sign(SECRET.encode(), quarantined)},
            )

            async def settled() -> bool:
                page = await admin.page("/admin/webhooks")
                return 'class="state delivered"' in page and 'class="state failed"' in page

            await until(settled, "a delivered and a failed subscriber delivery")
            page = await admin.page("/admin/webhooks")
            assert 'class="state disabled">disabled</span> (410 Gone)' in page
            assert page.count('class="state active"') == 2
            await _failing(store, next(h for h in hooks if h.url == closed), admin.clock())
            page = await admin.page("/admin/webhooks")
            assert 'class="state failing">failing</span>, failing since' in page, page
            assert ": HTTP 503 from the test" in page
            await until(
                lambda: store.outbox.count_dead(), "a dead notification (the closed notifier port)"
            )
            # Silences: one from the form, odd rows written as an older version could have.
            made = await admin.post(
                "/admin/silences",
                {"matchers": "userId=user_42", "duration": "2h", "reason": "deploy"},
            )
            assert made.status_code == 303
            now = admin.clock()
            for end in (BEYOND_DATES, float("inf"), 253402300800.0):
                await store.transact(
                    lambda tx, end=end: tx.silences.add({"userId": "u_odd"}, "odd", now, end)
                )
            silences = await admin.page("/admin/silences")
            assert silences.count("after 9999") == 3, silences
            odd = new_key()
            await store.keys.add(
                name="odd", key_hash=hash_key(odd), prefix=odd[:PREFIX], plan="free",
                role="reader", now=BEYOND_DATES,
            )  # fmt: skip
            assert "after 9999" in await admin.page("/admin/keys")
            await store.webhooks.add(
                public_id="wh_odd", url="https://odd.example/", events=["score.drop"],
                threshold=None, format="service", secret="s" * 32, now=BEYOND_DATES,
            )  # fmt: skip
            assert "wh_odd" in await admin.page("/admin/webhooks")
            failing = next(h for h in hooks if h.url == closed).public_id
            edit = await admin.page(f"/admin/webhooks/{failing}/edit")
            assert 'class="state failing">failing</span>: HTTP 503 from the test' in edit, edit
            assert (await admin.get("/admin/webhooks/wh_nope/edit")).status_code == 404
            # A disabled one is enabled after a test delivery that succeeds (its URL answers).
            await admin.page(f"/admin/webhooks/{off.public_id}/enable")
            enabled = await admin.post(f"/admin/webhooks/{off.public_id}/enable", {})
            assert enabled.status_code == 303
            assert [h.status for h in await store.webhooks.all() if h.id == off.id] == ["active"]
            await store.webhooks.update(failing, now=admin.clock(), status="disabled")
            kept = await admin.post(f"/admin/webhooks/{failing}/enable", {})
            assert kept.status_code == 409 and "stays disabled" in kept.text, kept.text
            # Pages that take an id, their confirmations, and messages.
            alerts = await admin.page("/admin/alerts")
            alert_id = re.search(r'href="/admin/alerts/([^"/]+)/ack"', alerts)
            assert alert_id is not None, alerts
            await admin.page(f"/admin/alerts/{alert_id.group(1)}/ack")
            acked = await admin.post(f"/admin/alerts/{alert_id.group(1)}/ack", {})
            assert acked.status_code == 303
            assert "ops" in await admin.page("/admin/alerts")
            again = await admin.post(f"/admin/alerts/{alert_id.group(1)}/ack", {})
            assert again.status_code == 409 and "acknowledged already, by ops" in again.text
            shown = await admin.page(f"/admin/alerts/{alert_id.group(1)}")
            assert "Who was paged" in shown and "<td>admin</td><td>ops</td>" in shown
            assert "/resolve" in shown and "/snooze" not in shown  # acked: no snooze
            await admin.page(f"/admin/alerts/{alert_id.group(1)}/resolve")
            assert (await admin.get("/admin/alerts/session:nope")).status_code == 404
            made = await admin.post("/admin/keys", {"name": "ci", "plan": "pro", "role": "reader"})
            assert made.status_code == 200 and "ar_" in made.text
            explained = await admin.post("/admin/rules", {"event": json.dumps(first)})
            assert explained.status_code == 200 and "page-oncall" in explained.text
            # Each notification's page shows its attempt log: a dead one's failed sends with
            # their error, a subscriber delivery's with the status it answered.
            dead = await admin.page("/admin/notifications?state=dead")
            dead_id = re.search(r'href="/admin/notifications/(\d+)" title="its attempt log"', dead)
            assert dead_id is not None, dead
            log_page = await admin.page(f"/admin/notifications/{dead_id.group(1)}")
            tried = re.findall(r"<tr><td>(\d+)</td><td>[^<]*</td><td>(\d*)</td>", log_page)
            assert tried and tried[0][0] == "1", log_page
            assert "Not tried yet" not in log_page and "ms</td>" in log_page
            event_page = await admin.page("/admin/events/evt_page_1")
            delivery_ids = re.findall(r'href="/admin/notifications/(\d+)"', event_page)
            statuses = set()
            for shown in delivery_ids:
                page = await admin.page(f"/admin/notifications/{shown}")
                statuses |= {
                    s
                    for _, s in re.findall(r"<tr><td>(\d+)</td><td>[^<]*</td><td>(\d*)</td>", page)
                }
            assert "200" in statuses, statuses  # the subscriber on the sink answered 200
            assert (await admin.get("/admin/notifications/999999")).status_code == 404
            started = await admin.post("/admin/bulk-retry", {})
            assert started.status_code == 303
            for path in (
                "/admin/events",
                "/admin/events?state=duplicates",
                "/admin/events?state=quarantined",
                "/admin/events/evt_page_1",
                "/admin/events/evt_page_1/replay",
                "/admin/sessions",
                "/admin/sessions/sess_1",
                "/admin/notifications",
                "/admin/notifications?state=dead",
                "/admin/notifications/1/retry",
                "/admin/bulk-retry",
                started.headers["location"],
                "/admin/report",
                "/admin/report?since=30d",
                "/admin/rules",
                "/admin/silences/1/expire",
                "/admin/webhooks",
                f"/admin/webhooks/{off.public_id}/delete",
                "/admin/keys",
                "/admin/keys/ci/revoke",
            ):
                await admin.page(path)
            missing = await admin.get("/admin/events/evt_none")
            assert missing.status_code == 404
            refused = await admin.client.post("/admin/login", data={"key": "ar_wrong"})
            assert refused.status_code == 401 and "unknown or revoked" in refused.text
            assert (await admin.client.get("/admin/login?next=/admin/keys")).status_code == 200
            assert (await admin.client.get("/act/not-a-token")).status_code == 404

    asyncio.run(main())
    every = {p.name for p in TEMPLATES.glob("*.html")}
    assert every - rendered == set(), f"templates no test rendered: {sorted(every - rendered)}"


def test_durations_past_a_year_are_refused_on_the_admin_forms(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    async def main() -> None:
        async with running(tmp_path, hook=http_sink.json_url("/hook")) as admin:
            for duration in ("99999999999d", "366d", "9" * 400 + "d"):
                made = await admin.post(
                    "/admin/silences",
                    {"matchers": "userId=user_42", "duration": duration, "reason": "typo"},
                )
                assert made.status_code == 200, made.text
                assert "longer than the limit of 365d" in made.text, made.text
            assert await admin.store.transact(lambda tx: tx.silences.recent()) == []
            made = await admin.post(
                "/admin/silences", {"matchers": "userId=u", "duration": "365d", "reason": "ok"}
            )
            assert made.status_code == 303
            report = await admin.page("/admin/report?since=99999999d")
            assert "longer than the limit of 365d; showing the last 7 days" in report
            assert 'name="since" value="7d"' in report

    asyncio.run(main())


def test_sign_ins_are_limited_and_logged_per_client_address(
    tmp_path: Path, http_sink: HTTPSink, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGN_IN_LIMIT attempts a minute from one address, then 429 with Retry-After (the
    right key too); other addresses are not held up; refusals log a few lines an address
    with it, never the key typed."""
    caplog.set_level(logging.WARNING, logger="receiver.admin")

    async def main() -> None:
        async with running(
            tmp_path, hook=http_sink.json_url("/hook"), address="198.51.100.7"
        ) as admin:
            wrong = "ar_" + "x" * 40
            for _ in range(SIGN_IN_LIMIT - 1):  # the fixture's sign-in was the first
                answer = await admin.client.post("/admin/login", data={"key": wrong})
                assert answer.status_code == 401
            limited = await admin.client.post("/admin/login", data={"key": wrong})
            assert limited.status_code == 429, limited.text
            assert 1 <= int(limited.headers["retry-after"]) <= 60
            assert "rate_limited" in limited.text
            lines = [r.getMessage() for r in caplog.records if "sign-in" in r.getMessage()]
            assert lines and all("198.51.100.7" in line for line in lines), lines
            assert len(lines) <= 5 + 1, lines  # LogLimiter's burst, then the limit's own line
            assert not any(wrong in r.getMessage() for r in caplog.records)
            # Another address signs in meanwhile.
            other = httpx.ASGITransport(app=admin.app, client=("203.0.113.9", 50001))
            async with httpx.AsyncClient(transport=other, base_url="http://receiver") as c:
                assert (await c.post("/admin/login", data={"key": wrong})).status_code == 401
            admin.clock.offset += 61
            answer = await admin.client.post("/admin/login", data={"key": wrong})
            assert answer.status_code == 401

    asyncio.run(main())


def test_a_cookie_issued_in_the_second_of_a_sign_out_ends_with_it(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    async def main() -> None:
        async with running(tmp_path, hook=http_sink.json_url("/hook")) as admin:
            # Sign in and out at once: almost always within one second, which the
            # cookie's own (whole-second) timestamp cannot tell apart.
            again = await admin.client.post("/admin/login", data={"key": admin.key})
            assert again.status_code == 303
            admin.cookie = copied = again.cookies[COOKIE]
            out = await admin.post("/admin/logout", {})
            assert out.status_code == 303
            admin.cookie = copied
            answer = await admin.get("/admin/events")
            assert answer.status_code == 303 and "/admin/login" in answer.headers["location"]
            # A sign-in after the sign-out works, in the same second too.
            again = await admin.client.post("/admin/login", data={"key": admin.key})
            admin.cookie = again.cookies[COOKIE]
            assert (await admin.get("/admin/events")).status_code == 200

    asyncio.run(main())


def test_odd_ids_in_admin_urls_answer_pages_not_500s(tmp_path: Path, http_sink: HTTPSink) -> None:
    """Ids past what a store's integer holds, or digits int() refuses ("²"); a threshold
    that is not a number."""
    huge = "9" * 30

    async def main() -> None:
        async with running(tmp_path, hook=http_sink.json_url("/hook")) as admin:
            for path in (
                f"/admin/notifications?before={huge}",
                "/admin/notifications?before=²",
                f"/admin/events?state=quarantined&before={huge}",
                "/admin/events?before_at=nan&before_id=x",
                "/admin/events?before_at=1e400&before_id=x",
                "/admin/events?since=0001-01-01&until=9999-12-31T23:59:59-12:00",
                "/admin/events?user=u&since=99999-01-01",
            ):
                await admin.page(path)
            for path in (f"/admin/notifications/{huge}/retry", "/admin/jobs/²"):
                assert (await admin.get(path)).status_code == 404, path
            assert (await admin.post(f"/admin/notifications/{huge}/retry", {})).status_code == 404
            assert (await admin.post(f"/admin/silences/{huge}/expire", {})).status_code == 303
            for threshold in ("abc", "nan", "1e999"):
                made = await admin.post(
                    "/admin/webhooks",
                    {"url": http_sink.url, "events": "score.drop", "threshold": threshold},
                )
                assert made.status_code == 200 and "threshold must be a number" in made.text

    asyncio.run(main())


def test_the_admin_form_and_the_cli_read_silence_matchers_alike(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    """`receiver silence add --match userId=42` stored the number 42 while the admin form
    stored the text "42": the same lines now make the same silence (one parser)."""
    from click.testing import CliRunner

    from receiver.cli import cli

    async def read(db: Path, keep: bool = True) -> Any:
        from receiver.store import open_store

        store = open_store(str(db))
        await store.open()
        try:
            if keep:
                [silence] = await store.transact(lambda tx: tx.silences.recent())
                return silence.matchers
        finally:
            await store.close()

    lines = ["userId=42", 'cohort="42"', "page=/checkout*", "signals=true", "sessionId=~^s_"]

    async def main() -> Any:
        async with running(tmp_path, hook=http_sink.json_url("/hook")) as admin:
            made = await admin.post(
                "/admin/silences",
                {"matchers": "\n".join(lines), "duration": "1h", "reason": "form"},
            )
            assert made.status_code == 303, made.text
            [silence] = await admin.store.transact(lambda tx: tx.silences.recent())
            return silence.matchers

    from_form = asyncio.run(main())
    db = tmp_path / "cli.db"
    asyncio.run(read(db, keep=False))  # a database for the CLI to add to
    args = ["silence", "add", "--db", str(db), "--for", "1h", "--reason", "cli"]
    for line in lines:
        args += ["--match", line]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output

    expected = {
        "userId": 42, "cohort": "42", "page": "/checkout*", "signals": True, "sessionId": "~^s_"
    }  # fmt: skip
    assert from_form == asyncio.run(read(db)) == expected


def test_a_traced_event_shows_its_trace_id(tmp_path: Path, http_sink: HTTPSink) -> None:
    """The id an operator pastes into their tracing backend, from the event's page; an
    event stored without tracing shows no such line."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"

    async def main() -> tuple[str, str]:
        async with running(tmp_path, hook=http_sink.json_url("/hook")) as admin:
            for event_id, kept in (
                ("evt_traced", f"00-{trace}-00f067aa0ba902b7-01"),
                ("evt_plain", None),
            ):
                payload = events.sample("score.drop", id=event_id)
                raw = json.dumps(payload).encode()
                assert await admin.store.events.accept(events.validate(payload), raw, kept) == "new"
            return await admin.page("/admin/events/evt_traced"), await admin.page(
                "/admin/events/evt_plain"
            )

    traced, plain = asyncio.run(main())
    assert f'<dt>trace</dt><dd><code class="trace">{trace}</code></dd>' in traced
    assert "<dt>trace</dt>" not in plain


async def _failing(store: Any, hook: Any, now: float) -> None:
    """hook made failing as five failed deliveries make it (endpoint health)."""
    from receiver.notify.health import health_event
    from receiver.store.webhook_health import HealthPolicy

    for _ in range(5):
        await store.webhooks.record_delivery(
            hook.id,
            ok=False,
            error="HTTP 503 from the test",
            now=now,
            policy=HealthPolicy(),
            make_event=lambda h, change, owner: health_event(h, change, owner, now),
        )
