"""Webhook subscribers end to end: the real server under uvicorn, keys made with the real
CLI, subscribers that are real local HTTP servers, and one receiver forwarding to another."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver import events, signature
from tests.harness import Receiver, eventually, http_client
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

ALLOW = {
    "RECEIVER_WEBHOOK_ALLOW_PRIVATE": "1",
    "RECEIVER_WEBHOOK_ALLOW_HTTP": "1",
    "RECEIVER_WEBHOOK_SCHEDULE": "0.3,0.3,0.3,0.3,0.3",
    "RECEIVER_WEBHOOK_TIMEOUT": "2",
}
STRICT = {"RECEIVER_WEBHOOK_ALLOW_PRIVATE": "0", "RECEIVER_WEBHOOK_ALLOW_HTTP": "0"}


def until(check: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    """tests.harness.eventually(), its looks further apart as the wait goes on."""
    return eventually(check, what, timeout)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Receiver]]:
    """Starts receivers, each in a folder of its own; stops them after the test."""
    started: list[Receiver] = []

    def _start(
        name: str = "a", *, env: dict[str, str] | None = None, run: bool = True, **kwargs: Any
    ) -> Receiver:
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        server = Receiver(folder, env=ALLOW if env is None else env, **kwargs)
        started.append(server)
        return server.start() if run else server

    yield _start
    for server in started:
        if server.proc is not None:
            server.stop()


class Client:
    """The /v1/webhooks API under one key; remembers the subscriptions it made."""

    def __init__(self, server: Receiver, key: str) -> None:
        self.server = server
        self.headers = {"Authorization": f"Bearer {key}"}
        self.created: list[str] = []

    def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        content = None if body is None else (body if isinstance(body, bytes) else json.dumps(body))
        return http_client.request(
            method,
            f"{self.server.url}/v1/webhooks{path}",
            content=content,
            headers=self.headers,
            timeout=10,
        )

    def add(self, url: str, events: list[str], **extra: Any) -> dict[str, Any]:
        r = self.request("POST", "", {"url": url, "events": events, **extra})
        assert r.status_code == 201, r.text
        found: dict[str, Any] = r.json()
        self.created.append(found["id"])
        return found

    def get(self, hook_id: str) -> dict[str, Any]:
        r = self.request("GET", f"/{hook_id}")
        assert r.status_code == 200, r.text
        found: dict[str, Any] = r.json()
        return found

    def deliveries(self, hook_id: str) -> list[dict[str, Any]]:
        r = self.request("GET", f"/{hook_id}/deliveries")
        assert r.status_code == 200, r.text
        found: list[dict[str, Any]] = r.json()["deliveries"]
        return found


def writer(server: Receiver) -> Client:
    return Client(server, server.make_key("hooks", role="writer"))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Receiver, str]]:
    """One receiver (SQLite, the allow settings) and a writer key, for the tests that need
    no settings of their own: a server start less for each."""
    server = Receiver(tmp_path_factory.mktemp("webhooks"), env=ALLOW).start()
    try:
        yield server, server.make_key("hooks", role="writer")
    finally:
        server.stop()


@pytest.fixture
def api(shared: tuple[Receiver, str]) -> Iterator[Client]:
    """The shared receiver's API; the subscriptions a test made are deleted after it, so
    the next test's events reach only its own."""
    client = Client(*shared)
    yield client
    for hook_id in client.created:
        client.request("DELETE", f"/{hook_id}")


def score(event_id: str, kind: str = "score.drop", **fields: Any) -> dict[str, Any]:
    return events.sample(kind, **{"id": event_id, "sessionId": "sess_w", **fields})


def sent_body(event: dict[str, Any]) -> bytes:
    """The bytes Receiver.send posts for event (and the receiver stores)."""
    return json.dumps(event).encode()


def error(r: httpx.Response) -> tuple[int, str, str]:
    return r.status_code, r.json()["error"]["code"], r.json()["error"]["message"]


def by_event_id(sink: HTTPSink, event_id: str) -> list[Any]:
    return [r for r in sink.requests if r.headers.get("X-Service-Event-Id") == event_id]


# -- a scripted subscriber ---------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what it was answered
    at: float  # time.monotonic() on arrival

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class Scripted:
    """A local HTTP server answering its nth request with answers[n] (the last answer once
    they run out): a subscriber down for exactly two attempts, or answering with headers
    (Retry-After, Location) that HTTPSink does not send."""

    def __init__(self, *answers: tuple[int, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.hits: list[Hit] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    status, headers = outer.answers[min(len(outer.hits), len(outer.answers) - 1)]
                    hit = Hit(self.path, dict(self.headers), body, status, time.monotonic())
                    outer.hits.append(hit)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": "0"}.items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, count: int, timeout: float = 10) -> list[Hit]:
        until(lambda: len(self.hits) >= count, timeout, f"{count} requests")
        return list(self.hits)

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


# -- registration ------------------------------------------------------------------------


def test_register_list_get_rotate_and_delete(api: Client) -> None:
    server = api.server
    url = "http://127.0.0.1:9/hook"
    created = api.add(url, ["score.drop", "score.recover"], threshold=40)
    secret = created.pop("secret")
    assert len(secret) == 64
    assert created.pop("createdAt").endswith("Z")
    hook_id = created.pop("id")
    assert hook_id.startswith("wh_")
    assert created == {
        "url": url,
        "events": ["score.drop", "score.recover"],
        "threshold": 40,
        "format": "service",
        "status": "active",
        "health": "healthy",
        "failingSince": None,
        "lastError": None,
        "rateLimit": None,
        "filter": None,
    }
    other = api.add(url, ["session.stopped"])
    assert other["threshold"] is None and other["secret"] != secret

    listed = api.request("GET", "")
    assert listed.status_code == 200
    assert [h["id"] for h in listed.json()["webhooks"]] == [hook_id, other["id"]]  # oldest first
    one = api.get(hook_id)
    assert one["events"] == ["score.drop", "score.recover"] and one["status"] == "active"
    for text in (listed.text, api.request("GET", f"/{hook_id}").text):
        assert "secret" not in text and secret not in text and other["secret"] not in text

    rotated = api.request("POST", f"/{hook_id}/rotate-secret")
    assert rotated.status_code == 200 and rotated.json()["id"] == hook_id
    assert len(rotated.json()["secret"]) == 64 and rotated.json()["secret"] != secret
    assert rotated.json()["secret"] not in api.request("GET", "").text

    admin = Client(server, server.make_key("root", role="admin"))
    assert api.request("DELETE", f"/{hook_id}").status_code == 204
    for path in (f"/{hook_id}", f"/{hook_id}/deliveries"):
        assert error(admin.request("GET", path))[:2] == (404, "webhook_not_found")
    assert error(admin.request("DELETE", f"/{hook_id}"))[:2] == (404, "webhook_not_found")
    assert [h["id"] for h in admin.request("GET", "").json()["webhooks"]] == [other["id"]]

    # The allow settings (ALLOW) admit plain http and private addresses.
    for private in ("http://localhost:9/", "https://10.0.0.1/", "https://169.254.169.254/"):
        assert api.add(private, ["session.stopped"])["url"] == private

    logs = server.logs()
    for shown in (secret, other["secret"], rotated.json()["secret"]):
        assert shown not in logs


def test_registration_errors_and_roles(api: Client) -> None:
    server = api.server
    ok = "http://127.0.0.1:9/hook"
    cases: list[tuple[Any, int, str, str]] = [
        ({"events": ["score.drop"]}, 400, "invalid_webhook", "url is required"),
        ({"url": ok}, 400, "invalid_webhook", "events is required"),
        ({"url": ok, "events": []}, 400, "invalid_webhook", "events is required"),
        ({"url": "not a url", "events": ["score.drop"]}, 400, "invalid_webhook", "url: "),
        ({"url": "ftp://x/y", "events": ["score.drop"]}, 400, "invalid_webhook", "url: "),
        ({"url": ok, "events": ["score.dropped"]}, 400, "invalid_webhook", "events: unknown"),
        ({"url": ok, "events": ["score.drop"], "format": "x"}, 400, "invalid_webhook", "format"),
        (b"{not json", 400, "invalid_webhook", "body must be JSON"),
        ({"url": ok + "\x00", "events": ["score.drop"]}, 400, "invalid_webhook", "\\x00"),
        ({"url": ok + "\r\nX: 1", "events": ["score.drop"]}, 400, "invalid_webhook", "\\x0d"),
    ]
    for body, status, code, words in cases:
        got = error(api.request("POST", "", body))
        assert got[:2] == (status, code) and words in got[2], (body, got)
    assert error(api.request("GET", "/wh_nope"))[:2] == (404, "webhook_not_found")
    assert error(api.request("POST", "/wh_nope/rotate-secret"))[:2] == (404, "webhook_not_found")

    reader = Client(server, server.make_key("dash"))  # role reader
    for method, path in (("POST", ""), ("GET", ""), ("GET", "/wh_x"), ("DELETE", "/wh_x")):
        body = {"url": ok, "events": ["score.drop"]} if method == "POST" else None
        assert error(reader.request(method, path, body))[:2] == (403, "forbidden"), path
    assert error(Client(server, "ar_nope").request("GET", ""))[:2] == (401, "unauthorized")
    assert api.request("GET", "").json() == {"webhooks": []}  # nothing refused was kept


def test_odd_cursors_and_delivery_ids_are_refused_not_a_500(api: Client) -> None:
    """cursor=99999999999999999999999999 was an OverflowError (a 500, logged twice)."""
    hook_id = api.add("http://127.0.0.1:9/hook", ["score.drop"])["id"]
    for cursor in ("99999999999999999999999999", "", "-1", "1.5", "\u00b2", "12a"):
        r = api.request("GET", f"/{hook_id}/deliveries?cursor={cursor}")
        got = error(r)
        assert got[:2] == (400, "invalid_parameter") and "cursor must be" in got[2], cursor
    assert api.request("GET", f"/{hook_id}/deliveries?cursor=999999999999999999").json() == {
        "deliveries": [],
        "cursor": None,
    }
    for delivery in ("99999999999999999999999999", "\u00b2"):
        r = api.request("POST", f"/{hook_id}/deliveries/{delivery}/retry")
        assert error(r)[:2] == (404, "webhook_not_found"), delivery
    assert "Traceback" not in api.server.logs() and "OverflowError" not in api.server.logs()


def test_api_bodies_have_a_small_limit(api: Client) -> None:
    """60 MB was accepted (+117 MB RSS): 413 payload_too_large, by Content-Length before
    reading, or while a body without one streams in."""
    big = json.dumps({"url": "http://127.0.0.1:9/hook", "events": ["score.drop"], "x": "y" * 20000})
    got = error(api.request("POST", "", big.encode()))
    assert got[:2] == (413, "payload_too_large") and "16384 bytes" in got[2]

    def chunks() -> Iterator[bytes]:
        yield b'{"url": "http://127.0.0.1:9/hook", "events": ["score.drop"], "x": "'
        for _ in range(2000):  # 60 MB offered; refused after the first 16 KB
            yield b"y" * 30000

    r = httpx.post(
        f"{api.server.url}/v1/webhooks", content=chunks(), headers=api.headers, timeout=30
    )
    assert error(r)[:2] == (413, "payload_too_large")
    assert api.request("GET", "").json() == {"webhooks": []}


def test_a_subscription_is_its_keys_and_an_admin_keys(api: Client, http_sink: HTTPSink) -> None:
    """Any writer key could list, delete and rotate every team's subscriptions."""
    server = api.server
    mine = api.add(f"{http_sink.url}/mine", ["score.drop"])
    other = Client(server, server.make_key("other-team", role="writer"))
    theirs = other.add(f"{http_sink.url}/theirs", ["score.drop"])
    assert [h["id"] for h in api.request("GET", "").json()["webhooks"]] == [mine["id"]]
    assert [h["id"] for h in other.request("GET", "").json()["webhooks"]] == [theirs["id"]]
    for method, path in (
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/rotate-secret"),
        ("GET", "/deliveries"),
        ("POST", "/deliveries/1/retry"),
    ):
        got = error(other.request(method, f"/{mine['id']}{path}"))
        assert got[:2] == (404, "webhook_not_found") and mine["id"] in got[2], (method, path)
    admin = Client(server, server.make_key("ops", role="admin"))
    listed = {h["id"] for h in admin.request("GET", "").json()["webhooks"]}
    assert {mine["id"], theirs["id"]} <= listed
    assert admin.request("POST", f"/{theirs['id']}/rotate-secret").status_code == 200
    assert admin.request("DELETE", f"/{theirs['id']}").status_code == 204
    assert other.request("GET", "").json() == {"webhooks": []}
    assert api.get(mine["id"])["id"] == mine["id"]  # untouched by the other key


def test_405_names_every_method_the_path_takes(api: Client) -> None:
    """/v1/webhooks said Allow: POST though GET works; /v1/webhooks/{id} said GET, HEAD
    though DELETE works."""
    hook_id = api.add("http://127.0.0.1:9/hook", ["score.drop"])["id"]
    for method, path, allowed in (
        ("PUT", "", {"GET", "HEAD", "POST"}),
        ("DELETE", "", {"GET", "HEAD", "POST"}),
        ("POST", f"/{hook_id}", {"GET", "HEAD", "DELETE"}),
        ("GET", f"/{hook_id}/rotate-secret", {"POST"}),
    ):
        r = api.request(method, path)
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert set(r.headers["allow"].replace(" ", "").split(",")) == allowed, (method, path)
    assert api.request("HEAD", "").status_code == 200
    assert api.request("HEAD", f"/{hook_id}").status_code == 200


def test_unsafe_subscribers_are_refused_unless_allowed(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    server = start(env=STRICT)
    api = writer(server)
    refused = {
        "http://hooks.example.com/in": "must use https",
        "https://127.0.0.1/hook": "127.0.0.1 is loopback",
        "https://10.0.0.1/hook": "10.0.0.1 is private",
        "https://169.254.169.254/latest/meta-data/": "169.254.169.254 is link-local",
        "https://localhost:8443/hook": "is loopback",
        f"https://127.0.0.1:{http_sink.port}/hook": "loopback",
        "https://[64:ff9b::7f00:1]/": "carries 127.0.0.1, which is loopback",
        "https://[2002:7f00:1::]/": "carries 127.0.0.1, which is loopback",
        "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/": "Teredo",
    }
    for url, words in refused.items():
        got = error(api.request("POST", "", {"url": url, "events": ["score.drop"]}))
        assert got[:2] == (400, "invalid_webhook") and got[2].startswith("url: "), url
        assert words in got[2], (url, got)
    done = server.cli("webhooks", "add", "--url", "https://10.0.0.1/x", "--event", "score.drop")
    assert done.returncode == 1 and "Error: url: " in done.stderr and "private" in done.stderr
    assert api.request("GET", "").json() == {"webhooks": []}


# -- delivery ----------------------------------------------------------------------------


# A rules notifier may be named "webhook", like the outbox's subscriber deliveries.
NAMED_WEBHOOK_RULES = """
notifiers:
  webhook: ["{zero}", "{one}"]
rules:
  - name: all
    notify: [webhook]
"""


def test_a_delivery_is_the_stored_body_signed(
    start: Callable[..., Receiver], http_sink: HTTPSink, receiver_db: str | None
) -> None:
    rules = NAMED_WEBHOOK_RULES.format(
        zero=http_sink.json_url("/rule0"), one=http_sink.json_url("/rule1")
    )
    server = start(db=receiver_db, rules=rules)
    api = writer(server)
    with HTTPSink() as subscriber:
        drops = api.add(f"{subscriber.url}/drops", ["score.drop"])
        everything = api.add(f"{subscriber.url}/all", list(events.EVENT_TYPES))

        drop = score("evt_d1", userId="u\u00e9", note="kept as sent")
        stop = events.sample("session.stopped", id="evt_s1", sessionId="sess_w")
        assert server.send(drop).status_code == 202
        assert server.send(stop).status_code == 202
        subscriber.wait_for(3)
        time.sleep(0.5)  # nothing more comes
        got = subscriber.requests
        assert sorted((r.path, r.headers["X-Service-Event-Id"]) for r in got) == [
            ("/all", "evt_d1"),
            ("/all", "evt_s1"),
            ("/drops", "evt_d1"),
        ]
        for request in got:
            sub = drops if request.path == "/drops" else everything
            event = drop if request.headers["X-Service-Event-Id"] == "evt_d1" else stop
            assert request.method == "POST"
            assert request.body == sent_body(event)  # the exact stored bytes
            assert request.headers["Content-Type"] == "application/json"
            header = request.headers["X-Service-Signature"]
            expected = hmac.new(sub["secret"].encode(), request.body, hashlib.sha256).hexdigest()
            assert header == f"sha256={expected}"
            signature.verify([sub["secret"].encode()], request.body, header)
        # The rules' notifier "webhook" got its notifications; no subscriber got them.
        notified = http_sink.wait_for(4)
        assert sorted(r.path for r in notified) == ["/rule0", "/rule0", "/rule1", "/rule1"]

        until(lambda: api.deliveries(drops["id"])[0]["state"] == "delivered", what="delivered")
        [delivered] = api.deliveries(drops["id"])
        assert delivered["eventId"] == delivered["sourceEventId"] == "evt_d1"
        assert delivered["attempts"] == 1 and delivered["nextAttemptAt"] is None
        assert len(api.deliveries(everything["id"])) == 2

        # Sent again on request: the same body under the same event id.
        again = api.request("POST", f"/{drops['id']}/deliveries/{delivered['id']}/retry")
        assert again.status_code == 202 and again.json()["state"] == "pending"
        missing = api.request("POST", f"/{drops['id']}/deliveries/99999/retry")
        assert error(missing)[:2] == (404, "webhook_not_found")
        # An event routed wakes the sender at once (else it looks again within 5 s).
        wake = events.sample("intervention.fired", id="evt_wake")
        assert server.send(wake).status_code == 202
        until(lambda: len(by_event_id(subscriber, "evt_d1")) == 3, what="the retry")
        first, second = [r for r in subscriber.requests if r.path == "/drops"]
        assert second.body == first.body and second.headers["X-Service-Event-Id"] == "evt_d1"
    logs = server.logs()
    assert drops["secret"] not in logs and everything["secret"] not in logs


CHAINED_RULES = """
notifiers:
  sink: "{url}"
rules:
  - name: chained
    notify: [sink]
    title: "from A: {{{{ id }}}}"
    body: "{{{{ type }}}} for {{{{ sessionId }}}} at {{{{ score }}}}"
"""


def test_chain_one_receiver_forwards_to_another(
    start: Callable[..., Receiver],
    http_sink: HTTPSink,
    receiver_db: str | None,
    request: pytest.FixtureRequest,
) -> None:
    """A forwards to B (and to a subscriber down for two attempts, and to one that never
    recovers); B checks A's signature with the secret A gave out and notifies its sink."""
    b_db = None if receiver_db is None else request.getfixturevalue("postgres").create_database()
    a = start("a", db=receiver_db)
    b = start("b", env={}, rules=CHAINED_RULES.format(url=http_sink.json_url("/b")), run=False)
    b.db_url = b.env["RECEIVER_DB"] = b_db or b.db_url
    api = writer(a)
    to_b = api.add(f"{b.url}/v1/events", ["score.drop"])
    b.secret = b.env["RECEIVER_SECRETS"] = to_b["secret"]
    b.start()

    with Scripted((503, {}), (503, {}), (200, {})) as flaky, HTTPSink() as dead:
        dead.fail_with(503)
        to_flaky = api.add(flaky.url, ["score.drop"])
        to_dead = api.add(f"{dead.url}/dead", ["score.drop"])

        event = score("evt_chain", score=12)
        assert a.send(event).status_code == 202

        # B accepted A's delivery (its signature checked) and notified its own sink.
        [notified] = http_sink.wait_for(1)
        assert notified.path == "/b"
        assert notified.json["title"] == "from A: evt_chain"
        assert notified.json["message"] == "score.drop for sess_w at 12"
        [(stored,)] = b.query("SELECT body FROM events WHERE id = ?", ("evt_chain",))
        assert stored.encode() == sent_body(event)
        until(lambda: api.deliveries(to_b["id"])[0]["state"] == "delivered", what="A to B")

        # Down for two attempts, up for the third: exactly one delivery answered 2xx.
        flaky.wait_for(3)
        until(lambda: api.deliveries(to_flaky["id"])[0]["state"] == "delivered", what="flaky")

        # Never up: failed once the schedule is spent, 6 attempts in all.
        dead.wait_for(6, timeout=15)
        until(lambda: api.deliveries(to_dead["id"])[0]["state"] == "failed", what="failed")
        time.sleep(0.6)  # twice the schedule's delay: a 4th, or a 7th, attempt would show

        assert [(h.headers["X-Service-Event-Id"], h.status) for h in flaky.hits] == [
            ("evt_chain", 503),
            ("evt_chain", 503),
            ("evt_chain", 200),
        ]
        assert all(h.body == sent_body(event) for h in flaky.hits)
        assert len(dead.requests) == len(by_event_id(dead, "evt_chain")) == 6
        [failed] = api.deliveries(to_dead["id"])
        assert failed["attempts"] == 6 and failed["lastStatus"] == 503
        assert failed["lastError"].startswith("HTTP 503") and failed["nextAttemptAt"] is None
        shown = a.cli("webhooks", "deliveries", to_dead["id"])
        assert shown.returncode == 0, shown.stderr
        assert f"{failed['id']}  failed  event evt_chain  attempts 6" in shown.stdout
        assert "failed for good after 6 attempts" in a.logs()

    assert len(http_sink.requests) == 1
    for server in (a, b):
        logs = server.logs()
        for secret in (to_b["secret"], to_flaky["secret"], to_dead["secret"]):
            assert secret not in logs


def test_a_redirect_is_not_followed_and_retry_after_is_waited(
    api: Client, http_sink: HTTPSink
) -> None:
    server = api.server
    elsewhere = {"Location": f"{http_sink.url}/elsewhere"}
    with (
        Scripted((302, elsewhere)) as redirects,
        Scripted((503, {"Retry-After": "1"}), (429, {"Retry-After": "1"}), (200, {})) as busy,
    ):
        to_redirect = api.add(redirects.url, ["score.drop"])
        to_busy = api.add(busy.url, ["score.drop"])
        assert server.send(score("evt_rd")).status_code == 202

        until(lambda: len(busy.hits) == 3, timeout=15, what="3 attempts at the busy subscriber")
        gaps = [b.at - a.at for a, b in zip(busy.hits, busy.hits[1:], strict=False)]
        assert min(gaps) >= 0.95, gaps  # not the schedule's 0.3 s
        until(lambda: api.deliveries(to_busy["id"])[0]["state"] == "delivered", what="busy")

        until(lambda: len(redirects.hits) >= 2, what="a redirect retried")
        [pending] = api.deliveries(to_redirect["id"])
        assert pending["lastStatus"] == 302 and pending["lastError"].startswith("HTTP 302")
        assert http_sink.requests == []  # never followed
        assert {h.headers["X-Service-Event-Id"] for h in redirects.hits + busy.hits} == {"evt_rd"}


def test_a_delivery_shows_every_attempt_and_its_last_status(api: Client) -> None:
    """Down for two attempts, up for the third: the delivery's attemptLog has all three,
    with their statuses and times, and lastStatus is the 200 (it used to say null)."""
    server = api.server
    with Scripted((503, {}), (500, {}), (200, {})) as flaky:
        hook = api.add(flaky.url, ["score.drop"])
        assert server.send(score("evt_log")).status_code == 202
        flaky.wait_for(3)
        until(lambda: api.deliveries(hook["id"])[0]["state"] == "delivered", what="delivered")
    [listed] = api.deliveries(hook["id"])
    assert listed["lastStatus"] == 200 and listed["attempts"] == 3
    r = api.request("GET", f"/{hook['id']}/deliveries/{listed['id']}")
    assert r.status_code == 200, r.text
    shown = r.json()
    assert {k: v for k, v in shown.items() if k != "attemptLog"} == listed
    log = shown["attemptLog"]
    assert [(a["attempt"], a["status"]) for a in log] == [(1, 503), (2, 500), (3, 200)]
    assert [a["error"] for a in log][:2] == [
        "HTTP 503 Service Unavailable",
        "HTTP 500 Internal Server Error",
    ]
    assert log[2]["error"] is None and all(a["durationMs"] >= 0 for a in log)
    assert [a["at"] for a in log] == sorted(a["at"] for a in log)
    missing = api.request("GET", f"/{hook['id']}/deliveries/{int(listed['id']) + 1000}")
    assert error(missing)[:2] == (404, "webhook_not_found")


def test_410_gone_disables_the_subscription(api: Client, http_sink: HTTPSink) -> None:
    server = api.server
    gone = api.add(f"{http_sink.url}/gone", ["score.drop"])
    http_sink.fail_with(410)
    assert server.send(score("evt_g1")).status_code == 202
    http_sink.wait_for(1)
    hook = until(lambda: (h := api.get(gone["id"]))["status"] == "disabled" and h, what="disabled")
    assert "410" in hook["statusReason"]
    until(lambda: api.deliveries(gone["id"])[0]["state"] == "failed", what="failed")
    assert api.deliveries(gone["id"])[0]["attempts"] == 1

    http_sink.ok()
    assert server.send(score("evt_g2")).status_code == 202
    until(lambda: server.query("SELECT 1 FROM events WHERE id = 'evt_g2' AND routed_at > 0"))
    time.sleep(0.6)
    assert len(http_sink.requests) == 1
    assert "410 Gone: subscription disabled" in server.logs()


def test_standard_webhooks_format(api: Client, http_sink: HTTPSink) -> None:
    server = api.server
    sub = api.add(f"{http_sink.url}/std", ["score.recover"], format="standard")
    assert sub["format"] == "standard" and sub["secret"].startswith("whsec_")
    event = score("evt_std", "score.recover")
    assert server.send(event).status_code == 202
    [request] = http_sink.wait_for(1)
    headers = request.headers
    assert request.body == sent_body(event)
    assert headers["Content-Type"] == "application/json"
    assert headers["webhook-id"] == "evt_std"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 30
    # Standard Webhooks: base64 HMAC-SHA256 of "id.timestamp.body", keyed by the secret's
    # base64 part; the header may list several "v1,<sig>" separated by spaces.
    key = base64.b64decode(sub["secret"].removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + request.body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert f"v1,{expected}" in headers["webhook-signature"].split(" ")


def test_odd_event_ids_are_delivered_with_percent_encoded_headers(
    api: Client, http_sink: HTTPSink
) -> None:
    """A non-ASCII id raised UnicodeEncodeError, an id with CR/LF made an illegal header:
    neither delivery could ever finish."""
    server = api.server
    plain = api.add(f"{http_sink.url}/odd", ["score.drop"])
    std = api.add(f"{http_sink.url}/std", ["score.drop"], format="standard")
    odd = {
        "evt_\u00e9t\u00e9": "evt_%C3%A9t%C3%A9",
        "evt_2\r\nX-Injected: 1": "evt_2%0D%0AX-Injected: 1",
    }
    for event_id in odd:
        assert server.send(score(event_id)).status_code == 202
    got = http_sink.wait_for(4)
    assert sorted(r.headers["X-Service-Event-Id"] for r in got if r.path == "/odd") == sorted(
        odd.values()
    )
    assert not any("X-Injected" in r.headers for r in got)
    key = base64.b64decode(std["secret"].removeprefix("whsec_"))
    for request in (r for r in got if r.path == "/std"):
        headers = request.headers
        assert headers["webhook-id"] in odd.values()
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + request.body
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert headers["webhook-signature"] == f"v1,{expected}"

    def states() -> list[str]:
        return [d["state"] for sub in (plain, std) for d in api.deliveries(sub["id"])]

    until(lambda: states() == ["delivered"] * 4, what="all four delivered")


def test_a_threshold_subscriber_gets_derived_drops_and_recovers(
    api: Client, http_sink: HTTPSink
) -> None:
    server = api.server
    both = ["score.drop", "score.recover"]
    # The first derived event's first attempt fails: redelivered.
    with Scripted((500, {}), (200, {})) as derived_sink:
        as_received = api.add(f"{http_sink.url}/raw", both)
        derived = api.add(derived_sink.url, both, threshold=50)
        assert derived["threshold"] == 50
        sequence = [
            ("evt_t1", "score.recover", 70),  # above: nothing derived
            ("evt_t2", "score.drop", 45),  # crosses below: score.drop
            ("evt_t3", "score.drop", 30),  # still below: nothing
            ("evt_t4", "score.recover", 50),  # at the threshold again: score.recover
        ]
        for i, (event_id, kind, value) in enumerate(sequence, start=1):
            event = score(event_id, kind, score=value, sessionId="sess_t")
            assert server.send(event).status_code == 202
            http_sink.wait_for(i)  # routed, in order
        derived_sink.wait_for(3)
        time.sleep(0.6)  # nothing more comes
        seen = list(derived_sink.hits)

    assert [r.json["id"] for r in http_sink.requests] == [e for e, _, _ in sequence]
    # The recover may overtake the drop's redelivery: deliveries carry no order.
    seen.sort(key=lambda r: (r.json["type"], r.at))
    assert [(r.json["type"], r.json["score"], r.status) for r in seen] == [
        ("score.drop", 45, 500),
        ("score.drop", 45, 200),
        ("score.recover", 50, 200),
    ]
    drop, drop_again, recover = seen
    assert drop.body == drop_again.body  # the same event, the same id, on a redelivery
    for r in seen:
        assert r.json["threshold"] == 50 and r.json["sessionId"] == "sess_t"
        assert r.headers["X-Service-Event-Id"] == r.json["id"]
        assert r.json["id"].startswith("evt_") and r.json["id"] not in {"evt_t2", "evt_t4"}
        signature.verify([derived["secret"].encode()], r.body, r.headers["X-Service-Signature"])
    assert drop.json["id"] != recover.json["id"]

    def both_delivered() -> list[dict[str, Any]] | None:
        found = api.deliveries(derived["id"])
        return found if [d["state"] for d in found] == ["delivered"] * 2 else None

    listed = until(both_delivered, what="both derived events delivered")
    assert [(d["sourceEventId"], d["eventId"]) for d in listed] == [
        ("evt_t4", recover.json["id"]),
        ("evt_t2", drop.json["id"]),
    ]
    assert len(api.deliveries(as_received["id"])) == 4


def test_a_hanging_subscriber_does_not_delay_another(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    # A send to the hanging subscriber times out after 10 s: a quick subscriber held up
    # by it would wait that long, far beyond what a busy machine adds (2.7 s seen with
    # both cores taken, against a timeout of 2 s this test once had).
    timeout = 10.0
    server = start(env={**ALLOW, "RECEIVER_WEBHOOK_TIMEOUT": f"{timeout:g}"})
    api = Client(server, server.make_key("hang", role="writer"))
    with HTTPSink() as hanging:
        hanging.delay(30)  # answers only when stopped, long after the timeout
        hang = api.add(f"{hanging.url}/hang", ["score.drop"])
        api.add(f"{http_sink.url}/quick", ["score.drop"])
        for i in range(12):  # more than a lane's 8 sends in flight
            assert server.send(score(f"evt_h{i}")).status_code == 202
        quick = http_sink.wait_for(12, timeout=60)
        first_hang = hanging.wait_for(1)[0].received_at
        # Every one arrived before the first send to the hanging subscriber timed out.
        waited = max(r.received_at for r in quick) - first_hang
        assert waited < timeout, f"the quick subscriber waited {waited:.1f}s"
        assert all(r.status == 200 for r in quick)
        assert 1 <= hanging.max_in_flight <= 8

        # A send that timed out is retried like any failure.
        def timed_out() -> bool:
            return any(
                d["lastError"] == f"no answer within {timeout:g}s" and d["state"] == "pending"
                for d in api.deliveries(hang["id"])
            )

        until(timed_out, timeout=timeout + 50, what="a timed-out send scheduled again")


def test_cli_add_list_deliveries_retry_rm(api: Client, http_sink: HTTPSink) -> None:
    server = api.server
    # The CLI's subscriptions are an operator's: no key owns them, admin keys manage them.
    admin = Client(server, server.make_key("cli-admin", role="admin"))
    try:
        _cli_add_list_deliveries_retry_rm(admin, http_sink)
    finally:
        for hook_id in admin.created:
            admin.request("DELETE", f"/{hook_id}")
    assert api.request("GET", "").json() == {"webhooks": []}  # none is the writer's


def _cli_add_list_deliveries_retry_rm(api: Client, http_sink: HTTPSink) -> None:
    server = api.server
    added = server.cli("webhooks", "add", "--url", f"{http_sink.url}/cli", "--event", "score.drop")
    assert added.returncode == 0, added.stderr
    secret = added.stdout.strip()
    assert len(secret) == 64 and added.stdout == secret + "\n"  # the secret, and only it
    assert "signing secret, shown only now" in added.stderr
    hook_id = added.stderr.split()[1]
    assert hook_id.startswith("wh_")
    api.created.append(hook_id)  # deleted after the test, whatever happens
    as_json = server.cli("webhooks", "add", "--url", f"{http_sink.url}/all", "--json")
    assert as_json.returncode == 0, as_json.stderr
    other = json.loads(as_json.stdout)
    api.created.append(other["id"])
    assert other["events"] == list(events.EVENT_TYPES) and len(other["secret"]) == 64

    # A running server picks up subscribers the CLI added.
    event = score("evt_cli")
    assert server.send(event).status_code == 202
    [mine] = [r for r in http_sink.wait_for(2) if r.path == "/cli"]
    assert mine.body == sent_body(event)
    signature.verify([secret.encode()], mine.body, mine.headers["X-Service-Signature"])
    delivered = (
        "SELECT id FROM outbox WHERE notifier = '@subscriber' AND state = 'delivered'"
        " AND event_id = 'evt_cli'"
    )
    until(lambda: len(server.query(delivered)) == 2, what="both delivered")

    listed = server.cli("webhooks", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"{hook_id}  active  healthy  {http_sink.url}/cli  score.drop, service format" in (
        listed.stdout
    )
    shown = server.cli("webhooks", "deliveries", hook_id, "--json")
    assert shown.returncode == 0, shown.stderr
    [delivery] = [json.loads(line) for line in shown.stdout.splitlines()]
    assert (delivery["eventId"], delivery["state"], delivery["attempts"]) == (
        "evt_cli",
        "delivered",
        1,
    )
    for text in (listed.stdout, listed.stderr, shown.stdout):
        assert secret not in text and other["secret"] not in text

    retried = server.cli("webhooks", "retry", hook_id, delivery["id"])
    assert retried.returncode == 0 and "queued again" in retried.stdout
    # An event routed wakes the sender at once (else it looks again within 5 s).
    assert server.send(events.sample("session.stopped", id="evt_wake_cli")).status_code == 202
    until(lambda: len(by_event_id(http_sink, "evt_cli")) == 3, what="the retry sent")
    assert [r.body for r in by_event_id(http_sink, "evt_cli")] == [sent_body(event)] * 3

    # A filter set on a running server's subscription decides from the next event on.
    changed = server.cli("webhooks", "set", hook_id, "--filter", '{"userId": "u_set"}')
    assert changed.returncode == 0 and 'filter {"userId": "u_set"}' in changed.stdout
    for eid, user in (("evt_set_no", "u_other"), ("evt_set_yes", "u_set")):
        assert server.send(score(eid, userId=user)).status_code == 202
    until(lambda: by_event_id(http_sink, "evt_set_yes"), what="the matching one sent")
    made = "SELECT event_id FROM outbox o JOIN webhooks w ON w.id = o.subscription_id"
    made += " WHERE w.public_id = ? AND o.event_id LIKE 'evt_set_%'"
    assert server.query(made, (hook_id,)) == [("evt_set_yes",)]

    removed = server.cli("webhooks", "rm", hook_id)
    assert removed.returncode == 0 and removed.stdout.strip() == f"deleted {hook_id}"
    assert [h["id"] for h in api.request("GET", "").json()["webhooks"]] == [other["id"]]
    assert secret not in server.logs() and other["secret"] not in server.logs()
