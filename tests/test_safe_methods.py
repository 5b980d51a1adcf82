"""GET, HEAD and OPTIONS change nothing, on every route of the app: the real server, on
SQLite and on PostgreSQL, with a store holding one of everything a route can name (an
alert and its one-click links, a silence, an event, a dead notification, a subscriber and
its delivery, a second API key), each route asked with the ids of those rows, signed in
to the admin page and with an admin API key, and every table of the store compared before
and after. Link checkers and mail scanners send HEAD; a HEAD on an action link or an admin
confirmation once acted.

The routes are read from the app itself (app.routes and its mounts), so a route added
later is walked too, or the test names the path parameter it cannot fill."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route

from receiver.admin.auth import COOKIE
from receiver.app import create_app
from receiver.events import sample
from receiver.settings import Settings
from tests.harness import SECRET, Receiver, eventually
from tests.servers import HTTPSink, free_port

pytestmark = pytest.mark.e2e

RULES = """
notifiers:
  hook: "{hook}"
  gone: "{gone}"
rules:
  - name: drop
    match: {{type: score.drop}}
    notify: [hook, gone]
    resolve: true
    title: "dropped {{{{ sessionId }}}}"
    body: |
      {{% if links.ack %}}
      ack: {{{{ links.ack }}}}
      resolve: {{{{ links.resolve }}}}
      snooze: {{{{ links.snooze }}}}
      {{% endif %}}
"""
SAFE = ("GET", "HEAD", "OPTIONS")
OTHER = ("PUT", "PATCH")  # no route answers them: 405 everywhere, changing nothing


def app_routes() -> dict[str, set[str]]:
    """Every path of the app with every part on (admin, action links), and the methods
    its routes answer (a mount's StaticFiles: GET and HEAD on a file under it)."""
    settings = Settings(db=":memory:", secrets=SECRET, public_url="http://receiver")
    found: dict[str, set[str]] = {}

    def walk(routes: list[BaseRoute], prefix: str) -> None:
        for route in routes:
            if isinstance(route, Mount):
                if route.routes:
                    walk(route.routes, prefix + route.path)
                else:
                    found.setdefault(prefix + route.path + "/{path}", set()).update({"GET", "HEAD"})
            else:
                assert isinstance(route, Route), route
                found.setdefault(prefix + route.path, set()).update(route.methods or ())

    walk(create_app(settings).routes, "")
    return found


def fill(path: str, ids: dict[str, list[str]]) -> list[str]:
    """path with its parameters filled by each of the ids given for it: the first by the
    path's start (its resource), the others by their name."""
    params = re.findall(r"\{(\w+)(?::\w+)?\}", path)
    if not params:
        return [path]
    filled = [path]
    for n, param in enumerate(params):
        starts = sorted((s for s in ids if path.startswith(s)), key=len, reverse=True)
        values = ids[starts[0]] if n == 0 and starts else ids.get(f"{{{param}}}")
        assert values, f"no real value for {{{param}}} in {path}: add one to the test's ids"
        filled = [
            re.sub(rf"\{{{param}(?::\w+)?\}}", value, done, count=1)
            for done in filled
            for value in values
        ]
    return filled


def snapshot(server: Receiver) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the server's store (SQLite or PostgreSQL)."""
    if server.db_url.startswith("postgresql://"):
        listed = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    else:
        listed = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    tables = [str(name) for (name,) in server.query(listed)]
    assert "alerts" in tables and "alert_actions" in tables, tables
    return {t: sorted(server.query(f'SELECT * FROM "{t}"'), key=repr) for t in tables}


@pytest.fixture
def server(tmp_path: Path, http_sink: HTTPSink, receiver_db: str | None) -> Iterator[Receiver]:
    gone = f"json://127.0.0.1:{free_port()}/gone"  # nothing listens: its sends die
    rules = RULES.format(hook=http_sink.json_url(), gone=gone)
    found = Receiver(tmp_path, rules=rules, db=receiver_db)
    found.env.update(
        RECEIVER_WEBHOOK_ALLOW_PRIVATE="on",
        RECEIVER_WEBHOOK_ALLOW_HTTP="on",
        RECEIVER_WEBHOOK_SCHEDULE="0.1",
        RECEIVER_RETRY_INITIAL="0.1",
        RECEIVER_RETRY_MAX="0.1",
        RECEIVER_RETRY_FOR="0.3",
    )
    found.env["RECEIVER_PUBLIC_URL"] = found.url
    found.start()
    try:
        yield found
    finally:
        found.stop()


def test_no_get_head_or_options_changes_the_store(server: Receiver, http_sink: HTTPSink) -> None:
    key = server.make_key("ops", role="admin")
    server.make_key("other", role="reader")  # a key the revoke page names
    bearer = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.url, timeout=15) as client:
        made = client.post(
            "/v1/webhooks",
            json={"url": http_sink.url + "/sub", "events": ["score.drop"]},
            headers=bearer,
        )
        assert made.status_code == 201, made.text
        hook = made.json()["id"]
        sent = server.send(sample("score.drop", id="evt_1", sessionId="sess_1", score=12))
        assert sent.status_code == 202, sent.text
        signed_in = client.post("/admin/login", data={"key": key})
        assert signed_in.status_code == 303, signed_in.text
        client.cookies.set(COOKIE, signed_in.cookies[COOKIE])
        page = client.get("/admin/silences").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None, page
        silenced = client.post(
            "/admin/silences",
            data={
                "matchers": "userId=user_9",
                "duration": "2h",
                "reason": "deploy",
                "csrf": csrf.group(1),
            },
        )
        assert silenced.status_code == 303, silenced.text

        message = eventually(
            lambda: next((r.json for r in http_sink.requests if r.path == "/notify"), None),
            "the drop's notification, with its links",
        )
        links = re.findall(r"^\w+: \S+/act/(\S+)$", message["message"], re.MULTILINE)
        assert len(links) == 3, message
        eventually(
            lambda: (
                server.query("SELECT id FROM outbox WHERE state NOT IN ('delivered', 'dead')") == []
                and server.query("SELECT id FROM outbox WHERE state = 'dead'")
            ),
            "every send settled, the closed port's dead",
        )
        [(dead,)] = server.query("SELECT id FROM outbox WHERE state = 'dead'")
        [(silence,)] = server.query("SELECT id FROM silences")
        [(delivery,)] = server.query("SELECT id FROM outbox WHERE kind = 'webhook'")
        ids = {
            "/act/": links,
            "/v1/sessions/": ["sess_1"],
            "/admin/sessions/": ["sess_1"],
            "/v1/events/": ["evt_1"],
            "/admin/events/": ["evt_1"],
            "/v1/webhooks/": [hook],
            "/admin/webhooks/": [hook],
            "/v1/alerts/": ["session:sess_1"],
            "/admin/alerts/": ["session:sess_1"],
            "/admin/notifications/": [str(dead)],
            "/admin/silences/": [str(silence)],
            "/v1/silences/": [str(silence)],
            "/admin/jobs/": ["1"],
            "/admin/keys/": ["other"],
            "/admin/static/": ["admin.css"],
            "{delivery}": [str(delivery)],
            "{job}": ["1"],
        }

        before = snapshot(server)
        asked: list[tuple[str, str, int]] = []
        wrong: list[str] = []
        for path, methods in app_routes().items():
            for url in fill(path, ids):
                got = {}
                for method in (*SAFE, *OTHER):
                    got[method] = answer = client.request(method, url, headers=bearer)
                    asked.append((method, url, answer.status_code))
                    if method in methods:
                        continue
                    code = answer.json()["error"]["code"] if method != "HEAD" else ""
                    if answer.status_code != 405 or code not in ("", "method_not_allowed"):
                        wrong.append(f"{method} {url}: {answer.status_code} {code}, not 405")
                head, get = got["HEAD"].status_code, got["GET"].status_code
                if "GET" in methods and head != get:
                    wrong.append(f"HEAD {url}: {head}, GET {get}")
                if "GET" in methods and got["HEAD"].content:
                    wrong.append(f"HEAD {url}: a body")
        after = snapshot(server)

    changed = sorted(t for t in before.keys() | after.keys() if before.get(t) != after.get(t))
    assert changed == [], f"{len(asked)} requests changed the tables {changed}: {wrong}"
    assert wrong == []
    # Each kind of row was found by its route, so the walk asked about real rows.
    found = {url for method, url, status in asked if method == "GET" and status == 200}
    for url in (
        f"/act/{links[0]}",
        f"/admin/silences/{silence}/expire",
        f"/admin/notifications/{dead}/retry",
        "/admin/events/evt_1/replay",
        "/admin/alerts/session:sess_1/resolve",
        f"/v1/webhooks/{hook}/deliveries/{delivery}",
        "/admin/keys/other/revoke",
    ):
        assert url in found, (url, sorted(found))
