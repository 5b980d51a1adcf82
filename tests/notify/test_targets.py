"""Targets against real local servers: delivery, failures, timeouts, concurrency, no leaks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
from apprise.plugins.mattermost import NotifyMattermost

from receiver.notify.targets import DeliveryError, Targets, redact, url_secrets
from tests.servers import EndlessAnswer, HTTPSink, SMTPSink

TITLE = "Attention dropped: user_42"
BODY = "Session sess_1 at 20 (threshold 40)"


@pytest.fixture
def targets() -> Iterator[Targets]:
    t = Targets(timeout=5.0)
    yield t
    t.close(wait=True)


def send(targets: Targets, url: str, label: str = "oncall[0]") -> None:
    asyncio.run(targets.send(url, title=TITLE, body=BODY, label=label))


def send_error(targets: Targets, url: str, label: str = "oncall[0]") -> DeliveryError:
    with pytest.raises(DeliveryError) as info:
        send(targets, url, label)
    return info.value


def assert_clean(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text


# -- delivery --------------------------------------------------------------------------


def test_json_reaches_http_sink_with_title_and_body(targets: Targets, http_sink: HTTPSink) -> None:
    send(targets, http_sink.json_url("/notify"))

    [req] = http_sink.wait_for(1)
    assert (req.method, req.path) == ("POST", "/notify")
    assert req.json["title"] == TITLE
    assert req.json["message"] == BODY


def test_a_huge_answer_from_a_target_is_not_read_past_a_cap(targets: Targets) -> None:
    """requests, which apprise sends through, read a target's whole answer into memory: a
    target answering 200 with 300 MB took that much. Now 64 KiB, and the connection is
    dropped."""
    with EndlessAnswer() as target:
        send(targets, target.url.replace("http://", "json://") + "/in")
    # What the sockets' buffers hold, at most: nowhere near the 300 MB offered.
    assert target.written < 32 * 2**20, target.written
    with EndlessAnswer(status=500) as target:
        error = send_error(targets, target.url.replace("http://", "json://") + "/in")
    assert "500" in str(error) and target.written < 32 * 2**20, target.written


def test_mattermost_posts_slack_style_webhook(targets: Targets, http_sink: HTTPSink) -> None:
    send(targets, http_sink.mattermost_url(token="abc"))

    [req] = http_sink.wait_for(1)
    assert (req.method, req.path) == ("POST", "/hooks/abc")
    assert req.headers["Content-Type"].startswith("application/json")
    assert TITLE in req.json["text"] and BODY in req.json["text"]


def test_mailto_reaches_smtp_sink_after_login(targets: Targets, smtp_sink: SMTPSink) -> None:
    send(targets, smtp_sink.mailto_url(to="team@example.com"))

    [mail] = smtp_sink.wait_for(1)
    assert mail.subject == TITLE
    assert BODY in mail.body
    assert mail.to == ["team@example.com"]
    assert mail.envelope_from == "receiver@example.com"
    assert smtp_sink.logins == ["receiver"]


XSS = "<img src=x onerror=alert(1)>"


@pytest.mark.parametrize("extra", ["", "&format=html"], ids=["default", "format-html"])
def test_mail_carries_event_values_as_text_never_as_markup(
    targets: Targets, smtp_sink: SMTPSink, extra: str
) -> None:
    title, body = f"Attention dropped: {XSS}", f"user {XSS} & co\nscore 12"
    url = smtp_sink.mailto_url() + extra
    asyncio.run(targets.send(url, title=title, body=body, label="mail[0]"))

    [mail] = smtp_sink.wait_for(1)
    parts = mail.parts()
    assert mail.subject == title
    assert [p.strip() for p in parts["plain"]] == [body]  # the text part: the text as sent
    for html in parts["html"]:  # an HTML part, if any, shows the same text: escaped
        html = html.replace("&nbsp;", " ")  # apprise keeps runs of spaces this way
        assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&amp; co" in html
        assert "<img" not in html
    if extra:  # asked for HTML: there is an HTML part, and it is the escaped text
        assert len(parts["html"]) == 1


def test_console_logs_one_readable_line(targets: Targets, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="receiver.console"):
        send(targets, "console://")

    [record] = [r for r in caplog.records if r.name == "receiver.console"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == f"[oncall[0]] {TITLE} | {BODY}"


# -- failures --------------------------------------------------------------------------


def test_http_error_names_status_but_not_token(targets: Targets, http_sink: HTTPSink) -> None:
    http_sink.fail_with(500)
    url = http_sink.mattermost_url(token="tok-SECRET-123")

    err = send_error(targets, url)

    assert str(err) == "oncall[0]: mmost target answered HTTP 500"
    assert err.label == "oncall[0]" and not err.timed_out
    assert_clean(str(err), "tok-SECRET-123", url, str(http_sink.port))


def test_json_error_hides_password_and_query(targets: Targets, http_sink: HTTPSink) -> None:
    http_sink.fail_with(503)
    url = f"json://bot:pw-SECRET-9@127.0.0.1:{http_sink.port}/hooks/path-SECRET?+X-Token=hdr-SECRET"

    err = send_error(targets, url)

    [req] = http_sink.wait_for(1)
    assert req.headers["X-Token"] == "hdr-SECRET"  # the secrets did reach the target
    assert str(err) == "oncall[0]: json target answered HTTP 503"
    assert_clean(str(err), "pw-SECRET-9", "path-SECRET", "hdr-SECRET", url)


def test_target_down_says_connection_error(targets: Targets, http_sink: HTTPSink) -> None:
    url = http_sink.mattermost_url(token="tok-SECRET-123")
    http_sink.stop()

    err = send_error(targets, url)

    assert str(err).startswith("oncall[0]: mmost target failed: ")
    assert "connection" in str(err).lower()
    assert_clean(str(err), "tok-SECRET-123", url)


def test_smtp_login_refused_hides_password(targets: Targets, smtp_sink: SMTPSink) -> None:
    url = smtp_sink.mailto_url().replace(smtp_sink.password, "wrong-SECRET-pw")

    err = send_error(targets, url)

    assert str(err).startswith("oncall[0]: mailto target failed")
    assert_clean(str(err), "wrong-SECRET-pw", url)
    assert smtp_sink.messages == []


def test_invalid_url_is_a_delivery_error_without_the_url(targets: Targets) -> None:
    err = send_error(targets, "nosuchscheme://user:pw-SECRET@example.com/x")

    assert str(err) == "oncall[0]: invalid nosuchscheme URL, apprise could not load it"


def test_slow_target_times_out_promptly(http_sink: HTTPSink) -> None:
    http_sink.delay(10)
    targets = Targets(timeout=1.0)
    started = time.monotonic()
    try:
        err = send_error(targets, http_sink.json_url())
    finally:
        elapsed = time.monotonic() - started
        http_sink.stop()  # cut the sink's delay short so the abandoned thread ends
        targets.close(wait=True)

    assert err.timed_out
    assert str(err) == "oncall[0]: json target timed out after 1s"
    assert elapsed < 1.0 + 3


def test_send_after_close_is_a_delivery_error(http_sink: HTTPSink) -> None:
    targets = Targets()
    targets.close()

    err = send_error(targets, http_sink.json_url())

    assert str(err) == "oncall[0]: not sent, notifier is closed"
    assert http_sink.requests == []


# -- concurrency and apprise's throttle -------------------------------------------------


def test_concurrent_sends_overlap(http_sink: HTTPSink) -> None:
    http_sink.delay(1.0)
    targets = Targets(timeout=10.0)

    async def burst() -> None:
        await asyncio.gather(
            *(
                targets.send(http_sink.json_url(), title=TITLE, body=BODY, label=f"team[{i}]")
                for i in range(8)
            )
        )

    started = time.monotonic()
    try:
        asyncio.run(burst())
    finally:
        targets.close(wait=True)
    elapsed = time.monotonic() - started

    assert len(http_sink.requests) == 8
    assert http_sink.max_in_flight >= 4
    assert elapsed < 8 * 1.0 / 2  # serialized would take 8 s


def test_apprise_throttle_never_delays_a_send(
    targets: Targets, http_sink: HTTPSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plugin throttles between its own requests (Slack 1.2 s, email 5.5 s); give
    # Mattermost such a rate and two channels, so one send makes two requests.
    monkeypatch.setattr(NotifyMattermost, "request_rate_per_sec", 5.5)
    url = http_sink.mattermost_url(token="abc") + "?channels=alpha,beta"

    started = time.monotonic()
    send(targets, url)
    elapsed = time.monotonic() - started

    assert sorted(r.json["channel"] for r in http_sink.wait_for(2)) == ["alpha", "beta"]
    assert elapsed < 3.0


# -- secrets never reach a log line ----------------------------------------------------


def test_debug_logs_never_contain_secrets(
    http_sink: HTTPSink, smtp_sink: SMTPSink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "tok-LEAK-4242"
    mm = http_sink.mattermost_url(token=token)
    js = f"json://bot:pw-LEAK-77@127.0.0.1:{http_sink.port}/hooks/path-LEAK?+X-Token=hdr-LEAK"
    mail = smtp_sink.mailto_url()
    targets = Targets(timeout=1.0)
    try:
        send(targets, mm)
        send(targets, js)
        send(targets, mail)
        http_sink.fail_with(500)
        for url in (mm, js):
            send_error(targets, url)
        http_sink.delay(5)
        send_error(targets, mm)
        http_sink.stop()
        for url in (mm, js):
            send_error(targets, url)
    finally:
        http_sink.stop()
        targets.close(wait=True)

    text = caplog.text
    # apprise and urllib3 did log at DEBUG: the redaction had something to do
    assert "Mattermost webhook POST URL" in text and "urllib3" in text
    assert_clean(
        text, token, "pw-LEAK-77", "path-LEAK", "hdr-LEAK", smtp_sink.password, mm, js, mail
    )
    assert f":{http_sink.port}/" not in text


@pytest.mark.parametrize(
    ("text", "secrets", "expected"),
    [
        pytest.param("POST /hooks/tok123 500", ["tok123"], "POST /hooks/*** 500", id="token"),
        pytest.param("url mmost://h:1/abc?x=1 failed", [], "url mmost://*** failed", id="any-url"),
        pytest.param(
            "Sent notification", ["notify"], "Sent notification", id="short-secret-whole-word"
        ),
        pytest.param(
            "keyLONGSECRET99tail", ["LONGSECRET99"], "key***tail", id="long-secret-anywhere"
        ),
    ],
)
def test_redact(text: str, secrets: list[str], expected: str) -> None:
    assert redact(text, secrets) == expected


def test_url_secrets_keeps_behaviour_switches_public() -> None:
    secrets = url_secrets("mailto://u:p%40ss@smtp.example.com:25/?mode=insecure&to=a@b.c&key=k1")

    assert {"p@ss", "p%40ss", "k1"} <= secrets
    assert not {"insecure", "a@b.c", "smtp.example.com", "u"} & secrets
