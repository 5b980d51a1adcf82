"""One event's trace, end to end: the real server under uvicorn, a real HTTP sink (a JSON
chat notifier), a webhook subscriber on it, and a small OTLP/HTTP collector (tests/otlp.py)
decoding every span exported. The sender's traceparent is continued through ingest,
routing and each send; every outbound request carries our span as its parent; JSON log
lines join the trace; a retry after a restart is a span of the same trace; with tracing
off nothing is exported and no header is added."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from receiver import __version__, signature
from receiver.events import sample
from tests.harness import Receiver
from tests.otlp import OTLPSink, Span, tree
from tests.servers import HTTPSink, SMTPSink

pytestmark = pytest.mark.e2e

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"
UNSAMPLED = "0af7651916cd43dd8448eb211c80319c"
OTHER = "5b8aa5a2d2c872e8321cf37308d69df2"
# The namespaces of OpenTelemetry's semantic conventions that the spans use; the rest of
# their attributes are the receiver's own, under "receiver.".
SEMANTIC = ("http.", "url.", "server.", "error.")

RULES = """
notifiers:
  chat: "{chat}"
rules:
  - name: drops
    match: {{type: score.drop}}
    notify: [chat]
    title: "drop {{{{ sessionId }}}}"
    body: "score {{{{ score }}}}"
"""


def traced_env(otlp: OTLPSink, **more: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s (the default waits 5 s)
        "OTEL_SERVICE_NAME": "receiver-under-test",
        "RECEIVER_LOG_FORMAT": "json",
        "RECEIVER_WEBHOOK_ALLOW_HTTP": "true",
        "RECEIVER_WEBHOOK_ALLOW_PRIVATE": "true",
        **more,
    }


def send(server: Receiver, event: dict[str, Any], traceparent: str | None = None) -> None:
    body = json.dumps(event).encode()
    headers = {signature.SIGNATURE_HEADER: signature.sign(server.secret.encode(), body)}
    if traceparent is not None:
        headers |= {"traceparent": traceparent, "tracestate": "sender=abc"}
    assert server.post(body, headers).status_code == 202


def subscribe(server: Receiver, sink: HTTPSink) -> str:
    done = server.cli("webhooks", "add", "--url", f"{sink.url}/sub", "--json")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["id"])


def one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def trace_of(header: str) -> tuple[str, str, str]:
    """(trace id, parent span id, flags) of a traceparent header."""
    version, trace_id, parent, flags = header.split("-")
    assert version == "00"
    return trace_id, parent, flags


def test_one_event_is_one_trace_from_the_sender_to_each_send(
    tmp_path: Path, http_sink: HTTPSink, receiver_db: str | None
) -> None:
    with OTLPSink() as otlp:
        server = Receiver(
            tmp_path,
            rules=RULES.format(chat=http_sink.json_url()),
            env=traced_env(otlp),
            db=receiver_db,
        ).start()
        hook = subscribe(server, http_sink)
        event = sample("score.drop", id="evt_traced", sessionId="s-42", score=12)
        send(server, event, f"00-{TRACE}-{SENDER_SPAN}-01")
        # The chat message and the subscriber's delivery, each with our traceparent.
        requests = http_sink.wait_for(2)
        chat = next(r for r in requests if r.path == "/notify")
        delivery = next(r for r in requests if r.path == "/sub")
        spans = otlp.wait_for(
            lambda spans: {"notify chat", f"webhook {hook}"} <= {s.name for s in spans},
            "the send spans",
        )
        # The id to search for, from the event's explanation (API and CLI).
        key = server.make_key("ops", role="writer")
        explained = server.get("/v1/events/evt_traced/explain", key).json()
        assert explained["traceId"] == TRACE
        assert f"trace {TRACE}" in server.cli("explain", "--event", "evt_traced").stdout
        server.stop()
        spans = otlp.spans  # with what the stop flushed

    mine = [s for s in spans if s.trace_id == TRACE]
    ingest, route = one(mine, "POST /v1/events"), one(mine, "route")
    verify, store, rule = one(mine, "verify"), one(mine, "store"), one(mine, "rule drops")
    notify, webhook = one(mine, "notify chat"), one(mine, f"webhook {hook}")
    # The tree: the sender's span -> ingest -> verify, store, route -> decision -> sends.
    assert ingest.parent_id == SENDER_SPAN and ingest.kind == "server"
    assert ingest.trace_state == "sender=abc"  # the sender's tracestate goes on
    assert {verify.parent_id, store.parent_id, route.parent_id} == {ingest.span_id}
    assert rule.parent_id == route.span_id and webhook.parent_id == route.span_id
    assert notify.parent_id == rule.span_id
    assert ingest.service == "receiver-under-test"
    # The instrumentation scope names the receiver and its version.
    assert {(s.scope, s.scope_version) for s in mine} == {("receiver", __version__)}
    # What an operator filters on: the semantic conventions' names, and ours under receiver.
    port = int(http_sink.url.rsplit(":", 1)[1])
    assert ingest.attributes == {
        "http.request.method": "POST",
        "url.path": "/v1/events",
        "url.scheme": "http",
        "http.route": "/v1/events",
        "http.response.status_code": 202,
        "receiver.event.id": "evt_traced",
        "receiver.event.type": "score.drop",
        "receiver.session.id": "s-42",
        "receiver.result": "accepted",
    }
    assert verify.attributes == {} and store.attributes == {}
    assert route.attributes == {
        "receiver.event.id": "evt_traced",
        "receiver.event.type": "score.drop",
        "receiver.session.id": "s-42",
        "receiver.rules_matched": 1,  # receiver.replay too, for a replayed event
    }
    assert rule.attributes == {
        "receiver.rule": "drops",
        "receiver.decision": "pending",
        "receiver.notifier": "chat",
    }
    sent = {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": port,
        "http.response.status_code": 200,
        "receiver.event.id": "evt_traced",
        "receiver.attempt": 1,
        "receiver.outcome": "delivered",
    }
    assert notify.kind == "client" and notify.attributes == sent | {
        "url.full": f"http://127.0.0.1:{port}/REDACTED",  # a path can be a token
        "receiver.rule": "drops",
        "receiver.notifier": "chat",
        "receiver.notification.kind": "event",
        "receiver.outbox.id": notify.attributes["receiver.outbox.id"],
    }
    assert webhook.kind == "client" and webhook.attributes == sent | {
        "url.full": f"http://127.0.0.1:{port}/REDACTED",
        "receiver.subscriber": hook,
        "receiver.notifier": "@subscriber",
        "receiver.rule": "webhook",
        "receiver.notification.kind": "webhook",
        "receiver.outbox.id": webhook.attributes["receiver.outbox.id"],
    }
    assert all(
        k.startswith(SEMANTIC) or k.startswith("receiver.") for s in mine for k in s.attributes
    )
    # Each outbound request's parent is the span of its send: the target's tracing
    # continues ours.
    assert trace_of(chat.headers["traceparent"]) == (TRACE, notify.span_id, "01")
    assert trace_of(delivery.headers["traceparent"]) == (TRACE, webhook.span_id, "01")
    assert delivery.headers["tracestate"] == "sender=abc"
    print(tree(spans, TRACE))  # README's Tracing section shows this (pytest -s)
    shape = [line.split(" [")[0] for line in tree(spans, TRACE).splitlines()]
    assert shape == [
        "POST /v1/events",
        "  verify",
        "  store",
        "  route",
        "    rule drops",
        "      notify chat",
        f"    webhook {hook}",
    ]


def test_log_lines_of_an_event_carry_its_trace_and_span(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    with OTLPSink() as otlp:
        server = Receiver(
            tmp_path, rules=RULES.format(chat=http_sink.json_url()), env=traced_env(otlp)
        ).start()
        send(server, sample("score.drop", id="evt_logged"), f"00-{TRACE}-{SENDER_SPAN}-01")
        forged = json.dumps(sample("score.drop", id="evt_forged")).encode()
        refused = server.post(
            forged,
            {
                "X-Service-Signature": "sha256=" + "0" * 64,
                "traceparent": f"00-{OTHER}-{SENDER_SPAN}-01",
            },
        )
        assert refused.status_code == 401
        http_sink.wait_for(1)
        otlp.wait_for(
            lambda spans: (
                {"notify chat", "verify"} <= {s.name for s in spans if s.trace_id in (TRACE, OTHER)}
                and any(s.trace_id == OTHER and s.name == "POST /v1/events" for s in spans)
            ),
            "the send and the refusal",
        )
        server.stop()
        spans = otlp.spans
    # A refusal is a span too, failed at its step, with the code an operator searches for.
    refusal = [s for s in spans if s.trace_id == OTHER]
    assert one(refusal, "POST /v1/events").attributes["receiver.result"] == "invalid_signature"
    assert one(refusal, "POST /v1/events").attributes["http.response.status_code"] == 401
    assert one(refusal, "verify").error == "invalid_signature"
    assert not [s for s in refusal if s.name in ("store", "route")]
    lines = [json.loads(line) for line in server.logs().splitlines() if line.startswith("{")]
    by_span = {s.span_id: s.name for s in spans if s.trace_id == TRACE}
    accepted = next(line for line in lines if line["msg"].startswith("accepted"))
    delivered = next(line for line in lines if line["msg"].startswith("delivered"))
    assert accepted["trace_id"] == delivered["trace_id"] == TRACE
    assert by_span[accepted["span_id"]] == "POST /v1/events"
    assert by_span[delivered["span_id"]] == "notify chat"
    # A line that belongs to no event carries none.
    start = next(line for line in lines if line["msg"].startswith("receiving on"))
    assert "trace_id" not in start


def test_a_retry_hours_later_after_a_restart_is_in_the_same_trace(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    rules = RULES.format(chat=http_sink.json_url())
    with OTLPSink() as otlp:
        env = traced_env(otlp, RECEIVER_RETRY_INITIAL="1h")
        server = Receiver(tmp_path, rules=rules, env=env).start()
        http_sink.fail_with(503)
        send(server, sample("score.drop", id="evt_retried"), f"00-{TRACE}-{SENDER_SPAN}-01")
        otlp.wait_for(lambda spans: any(s.name == "notify chat" for s in spans), "attempt 1")
        server.stop()
        # An hour on: the retry is due (moved in the stopped server's store), the chat is up.
        with sqlite3.connect(server.db) as conn:
            conn.execute("UPDATE outbox SET next_at = 0 WHERE event_id = 'evt_retried'")
        http_sink.ok()
        server.start()
        otlp.wait_for(lambda spans: sum(s.name == "notify chat" for s in spans) == 2, "attempt 2")
        server.stop()
        spans = otlp.spans
    first, second = sorted(
        (s for s in spans if s.name == "notify chat"),
        key=lambda s: s.attributes["receiver.attempt"],
    )
    rule = one(spans, "rule drops")
    assert first.trace_id == second.trace_id == TRACE
    assert first.parent_id == second.parent_id == rule.span_id  # under the same decision
    assert (first.attributes["receiver.attempt"], second.attributes["receiver.attempt"]) == (1, 2)
    assert first.attributes["http.response.status_code"] == 503 and first.error
    assert first.attributes["receiver.outcome"] == "retry"
    assert first.attributes["error.type"] == "503"  # a failed answer's type is its status
    assert "http.request.resend_count" not in first.attributes
    assert second.attributes["receiver.outcome"] == "delivered" and second.error is None
    assert second.attributes["http.request.resend_count"] == 1
    assert "error.type" not in second.attributes
    assert trace_of(http_sink.requests[-1].headers["traceparent"])[:2] == (TRACE, second.span_id)


def test_an_unsampled_trace_exports_nothing_but_still_goes_out(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    """The sender decided not to sample (flags 00): no span of that trace is recorded, and
    the requests we send still carry its trace id, unsampled (W3C Trace Context)."""
    with OTLPSink() as otlp:
        server = Receiver(
            tmp_path, rules=RULES.format(chat=http_sink.json_url()), env=traced_env(otlp)
        ).start()
        send(server, sample("score.drop", id="evt_quiet"), f"00-{UNSAMPLED}-{SENDER_SPAN}-00")
        send(server, sample("score.drop", id="evt_loud"), f"00-{TRACE}-{SENDER_SPAN}-01")
        requests = http_sink.wait_for(2)
        otlp.wait_for(lambda spans: any(s.name == "notify chat" for s in spans), "the send")
        server.stop()
        spans = otlp.spans
    assert {s.trace_id for s in spans} == {TRACE}
    flags = {
        trace_of(r.headers["traceparent"])[0]: trace_of(r.headers["traceparent"])[2]
        for r in requests
    }
    assert flags == {UNSAMPLED: "00", TRACE: "01"}


def test_with_tracing_off_nothing_is_exported_and_no_header_is_added(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    with OTLPSink() as otlp:
        # The collector's address is set, and RECEIVER_TRACING=off wins over it.
        env = traced_env(otlp, RECEIVER_TRACING="off")
        server = Receiver(tmp_path, rules=RULES.format(chat=http_sink.json_url()), env=env)
        server.start()
        hook = subscribe(server, http_sink)
        send(server, sample("score.drop", id="evt_plain"), f"00-{TRACE}-{SENDER_SPAN}-01")
        requests = http_sink.wait_for(2)
        server.stop()  # a traced server exports what it holds when it stops
        assert otlp.exports == 0 and otlp.spans == []
    assert hook and all("traceparent" not in r.headers for r in requests)
    assert all("tracestate" not in r.headers for r in requests)
    assert server.query("SELECT trace FROM events") == [(None,)]
    assert server.query("SELECT DISTINCT trace FROM outbox") == [(None,)]
    lines = [json.loads(line) for line in server.logs().splitlines() if line.startswith("{")]
    assert lines and not any("trace_id" in line for line in lines)


ESCALATING = """
notifiers:
  chat: "{chat}"
escalations:
  page:
    steps:
      - notify: [chat]
rules:
  - name: deep
    match: {{type: score.drop}}
    escalate: page
"""


def test_a_step_the_timers_queue_is_a_child_of_its_events_ingest(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    """An escalation's page is queued by the chain, not by a rule's decision: its send is
    still in the event's trace, under the ingest span the event row keeps."""
    with OTLPSink() as otlp:
        server = Receiver(
            tmp_path, rules=ESCALATING.format(chat=http_sink.json_url()), env=traced_env(otlp)
        ).start()
        send(server, sample("score.drop", id="evt_paged"), f"00-{TRACE}-{SENDER_SPAN}-01")
        [page] = http_sink.wait_for(1)
        otlp.wait_for(lambda spans: any(s.name == "notify chat" for s in spans), "the page")
        server.stop()
        spans = otlp.spans
    ingest, notify = one(spans, "POST /v1/events"), one(spans, "notify chat")
    assert notify.trace_id == TRACE and notify.parent_id == ingest.span_id
    assert notify.attributes["receiver.notification.kind"] == "escalation"
    assert one(spans, "rule deep").attributes["receiver.decision"] == "pending"
    assert trace_of(page.headers["traceparent"])[:2] == (TRACE, notify.span_id)


class Hanging:
    """A collector that takes each connection and never answers."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def test_a_collector_that_hangs_costs_no_notification_and_no_time_past_the_grace(
    tmp_path: Path, http_sink: HTTPSink
) -> None:
    """Tracing is telemetry: a collector that never answers loses spans (counted), never
    a notification, and the stop still ends within the grace."""
    collector = Hanging()
    try:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",  # each export gives up after a second
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        server = Receiver(tmp_path, rules=RULES.format(chat=http_sink.json_url()), env=env)
        server.start()
        send(server, sample("score.drop", id="evt_lost"), f"00-{TRACE}-{SENDER_SPAN}-01")
        [chat] = http_sink.wait_for(1)
        assert trace_of(chat.headers["traceparent"])[0] == TRACE

        def failed() -> float:
            return server.metric("receiver_trace_spans_total", 'outcome="failed"')

        deadline = time.monotonic() + 60
        while failed() == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert failed() > 0
        assert server.stop() == 0  # the harness kills, and fails, a stop that outlasts the grace
    finally:
        collector.close()


SECRET_RULES = """
notifiers:
  chat: "{chat}"
rules:
  - name: drops
    match: {{type: score.drop}}
    notify: [chat]
    resolve: true
    title: "drop {{{{ sessionId }}}}"
    body: "ack: {{{{ links.ack }}}} resolve: {{{{ links.resolve }}}}"
"""


def test_no_secret_or_token_reaches_any_span(tmp_path: Path, http_sink: HTTPSink) -> None:
    """A notifier URL's password, path and query tokens, a subscriber URL's tokens, the
    signing secrets and the one-click links' tokens are in no attribute (nor status) of
    any span, a failed attempt's included; url.full shows where each request went."""
    port = http_sink.port
    chat = (
        f"json://ops:pw-hunter2@127.0.0.1:{port}/notify/chat-path-token"
        "?-key=param-token&+X-Token=header-token"
    )
    hook_url = f"{http_sink.url}/sub/sub-path-token?token=sub-query-token&format=json"
    with OTLPSink() as otlp:
        env = traced_env(
            otlp, RECEIVER_PUBLIC_URL="http://receiver.example", RECEIVER_RETRY_INITIAL="1h"
        )
        server = Receiver(tmp_path, rules=SECRET_RULES.format(chat=chat), env=env).start()
        added = server.cli("webhooks", "add", "--url", hook_url, "--json")
        assert added.returncode == 0, added.stderr
        hook = json.loads(added.stdout)
        http_sink.fail_with(500)  # each first attempt fails: the failure's span too
        send(server, sample("score.drop", id="evt_secret"), f"00-{TRACE}-{SENDER_SPAN}-01")
        sends = {"notify chat", f"webhook {hook['id']}"}
        otlp.wait_for(lambda spans: sends <= {s.name for s in spans}, "the failed attempts")
        server.stop()
        with sqlite3.connect(server.db) as conn:  # the retries are due (an hour on)
            conn.execute("UPDATE outbox SET next_at = 0 WHERE state = 'pending'")
        http_sink.ok()
        server.start()
        otlp.wait_for(
            lambda spans: (
                sends
                <= {s.name for s in spans if s.attributes.get("receiver.outcome") == "delivered"}
            ),
            "the delivered attempts",
        )
        server.stop()
        spans = otlp.spans
    bodies = [r.body.decode() for r in http_sink.requests if r.path.startswith("/notify")]
    tokens = {m for body in bodies for m in re.findall(r"/act/([A-Za-z0-9._~-]+)", body)}
    assert len(tokens) == 2, bodies  # the ack and resolve links went out
    secrets = {
        "pw-hunter2",
        "chat-path-token",
        "param-token",
        "header-token",
        "sub-path-token",
        "sub-query-token",
        hook["secret"],
        server.secret,
        *tokens,
    }
    shown = [
        (s.name, str(value))
        for s in spans
        for value in (*s.attributes.values(), s.error or "", s.name)
    ]
    leaks = [(name, value) for name, value in shown for secret in secrets if secret in value]
    assert leaks == []
    sends = [s for s in spans if s.kind == "client"]
    assert all(s.attributes["http.request.method"] == "POST" for s in sends)
    assert {s.attributes["url.full"] for s in sends if s.name == "notify chat"} == {
        f"http://127.0.0.1:{port}/REDACTED/REDACTED?key=REDACTED"
    }
    assert {s.attributes["url.full"] for s in sends if s.name.startswith("webhook ")} == {
        f"http://127.0.0.1:{port}/REDACTED/REDACTED?token=REDACTED&format=json"
    }
    failed = [s for s in sends if s.attributes["receiver.outcome"] == "retry"]
    assert {s.name for s in failed} == {"notify chat", f"webhook {hook['id']}"}
    assert all(s.attributes["error.type"] == "500" for s in failed)


def test_a_mail_send_names_its_server_and_no_http_method(
    tmp_path: Path, smtp_sink: SMTPSink
) -> None:
    """A target apprise reaches without HTTP (mail here): the span has the notifier's URL
    without its password, the SMTP server's address and port, and no HTTP method or
    status (none was observable)."""
    url = smtp_sink.mailto_url()
    with OTLPSink() as otlp:
        server = Receiver(tmp_path, rules=RULES.format(chat=url), env=traced_env(otlp)).start()
        send(server, sample("score.drop", id="evt_mailed"), f"00-{TRACE}-{SENDER_SPAN}-01")
        smtp_sink.wait_for(1)
        spans = otlp.wait_for(
            lambda spans: any(s.name == "notify chat" for s in spans), "the mail's span"
        )
        server.stop()
    mail = one(spans, "notify chat")
    assert {k: v for k, v in mail.attributes.items() if not k.startswith("receiver.")} == {
        "url.full": f"mailto://REDACTED:REDACTED@127.0.0.1:{smtp_sink.port}/"
        "?mode=insecure&from=receiver%40example.com&to=team%40example.com",
        "server.address": "127.0.0.1",
        "server.port": smtp_sink.port,
    }
    assert mail.attributes["receiver.outcome"] == "delivered"
    assert smtp_sink.password not in str(mail.attributes)
