"""Routing end to end: the real server, a real SQLite file, real HTTP and SMTP servers receiving."""

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from receiver import events
from tests.harness import Receiver, eventually
from tests.servers import HTTPSink, SMTPSink

pytestmark = pytest.mark.e2e


def rules_for(http: HTTPSink, smtp: SMTPSink | None = None, extra: str = "") -> str:
    mail = f'  mail: "{smtp.mailto_url()}"\n' if smtp else ""
    return f"""
notifiers:
  hook: "{http.json_url("/hook")}"
  chat: "{http.mattermost_url("chat-token")}"
{mail}rules:
  - name: deep-drop
    match:
      type: score.drop
      score: {{lt: 30}}
    notify: [hook, chat{", mail" if smtp else ""}]
    title: "Attention dropped: {{{{ userId }}}}"
    body: "Session {{{{ sessionId }}}} at {{{{ score }}}} (threshold {{{{ threshold }}}})"
{extra}"""


def until(check: Callable[[], bool], timeout: float = 10, what: str = "condition") -> None:
    """tests.harness.eventually(), its looks further apart as the wait goes on."""
    eventually(check, what, timeout)


def outbox(server: Receiver) -> list[tuple[str, str, str]]:
    return server.query("SELECT event_id, rule, state FROM outbox ORDER BY id")


@pytest.fixture
def start(tmp_path: Path, routing_db: str | None) -> Iterator[Callable[..., Receiver]]:
    """Starts the server on SQLite, again on PostgreSQL, and again on PostgreSQL through
    PgBouncer in transaction mode (routing_db)."""
    started: list[Receiver] = []

    def _start(rules: str, **env: str) -> Receiver:
        server = Receiver(tmp_path, rules=rules, env=env, db=routing_db).start()
        started.append(server)
        return server

    yield _start
    for server in started:
        if server.proc is not None:
            server.stop()


# Tests of what routing does, not of how the store keeps it: on SQLite and PostgreSQL,
# not again through PgBouncer (each PgBouncer run costs a server and a database; the
# tests left on all three are those that claim, retry, restart and lock).
STORES_ONLY = pytest.mark.parametrize("routing_db", ["sqlite", "postgres"], indirect=True)


def drop(event_id: str, **fields: object) -> dict[str, object]:
    values = {"sessionId": "sess_7", "userId": "user_42", "score": 12, "threshold": 40, **fields}
    return events.sample("score.drop", id=event_id, **values)


def test_a_drop_reaches_json_chat_and_email(
    start: Callable[..., Receiver], http_sink: HTTPSink, smtp_sink: SMTPSink
) -> None:
    server = start(rules_for(http_sink, smtp_sink))
    assert server.send(drop("evt_1")).status_code == 202
    requests = http_sink.wait_for(2)
    hook = next(r for r in requests if r.path == "/hook")
    chat = next(r for r in requests if r.path != "/hook")
    assert hook.json["title"] == "Attention dropped: user_42"
    assert hook.json["message"] == "Session sess_7 at 12 (threshold 40)"
    assert "Session sess_7 at 12" in chat.json["text"]
    [mail] = smtp_sink.wait_for(1)
    assert mail.subject == "Attention dropped: user_42" and "Session sess_7 at 12" in mail.body
    until(lambda: [s for _, _, s in outbox(server)] == ["delivered"] * 3, what="3 delivered rows")


@STORES_ONLY
@pytest.mark.parametrize("extra", ["", "&format=html"], ids=["default", "format-html"])
def test_event_values_reach_email_as_text_never_as_markup(
    start: Callable[..., Receiver], smtp_sink: SMTPSink, extra: str
) -> None:
    xss = "<img src=x onerror=alert(1)>"
    server = start(
        f"""
notifiers:
  mail: "{smtp_sink.mailto_url()}{extra}"
rules:
  - name: drop
    notify: mail
    title: "Attention dropped: {{{{ userId }}}}"
    body: "User {{{{ userId }}}} in {{{{ sessionId }}}}"
"""
    )
    assert server.send(drop("evt_xss", userId=xss)).status_code == 202
    [mail] = smtp_sink.wait_for(1)
    parts = mail.parts()
    assert mail.subject == f"Attention dropped: {xss}"
    assert [p.strip() for p in parts["plain"]] == [f"User {xss} in sess_7"]
    for html in parts["html"]:  # an HTML part, if any (format=html asks for one): escaped
        assert "&lt;img" in html and "<img" not in html
    if extra:
        assert len(parts["html"]) == 1


def test_a_duplicate_delivery_notifies_nobody_again(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    server = start(rules_for(http_sink))
    assert server.send(drop("evt_dup")).status_code == 202
    http_sink.wait_for(2)
    assert server.send(drop("evt_dup")).status_code == 200
    server.send(drop("evt_after"))  # a later event proves the pipeline is still moving
    http_sink.wait_for(4)
    time.sleep(0.5)
    assert len(http_sink.requests) == 4
    assert sorted(e for e, _, _ in outbox(server)) == ["evt_after"] * 2 + ["evt_dup"] * 2


@STORES_ONLY
def test_an_event_no_rule_matches_notifies_nobody(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    server = start(rules_for(http_sink))
    assert server.send(drop("evt_high", score=35)).status_code == 202
    until(lambda: server.metric("receiver_events_routed_total") == 1, what="routing")
    assert outbox(server) == [] and http_sink.requests == []


CONTINUE = """
notifiers:
  a: "{a}"
  b: "{b}"
rules:
  - name: first
    match: {{type: "score.*"}}
    notify: [a]
    continue: {cont}
  - name: second
    match: {{score: {{between: [0, 50]}}}}
    notify: [b]
"""


@STORES_ONLY
@pytest.mark.parametrize("cont", [True, False], ids=["continue", "first-match-wins"])
def test_continue_and_first_match(
    start: Callable[..., Receiver], http_sink: HTTPSink, cont: bool
) -> None:
    rules = CONTINUE.format(
        a=http_sink.json_url("/a"), b=http_sink.json_url("/b"), cont=str(cont).lower()
    )
    server = start(rules)
    server.send(drop("evt_c"))
    until(
        lambda: len(outbox(server)) > 0 and all(s == "delivered" for *_, s in outbox(server)),
        what="deliveries",
    )
    assert sorted(r.path for r in http_sink.requests) == (["/a", "/b"] if cont else ["/a"])


def test_throttle_sends_one_per_key_and_records_the_rest(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    rules = f"""
notifiers:
  hook: "{http_sink.json_url()}"
rules:
  - name: per-session
    notify: [hook]
    throttle: {{key: "{{{{ sessionId }}}}", every: 15m}}
"""
    server = start(rules)
    for i, session in enumerate(["s1", "s1", "s2", "s1"]):
        assert server.send(drop(f"evt_t{i}", sessionId=session)).status_code == 202
    until(lambda: len(outbox(server)) == 4, what="4 outbox rows")
    http_sink.wait_for(2)
    time.sleep(0.3)
    assert len(http_sink.requests) == 2
    assert [s for _, _, s in outbox(server)].count("throttled") == 2
    assert server.metric("receiver_notifications_total", 'outcome="throttled"') == 2


@STORES_ONLY
def test_a_template_that_fails_sends_a_fallback(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    rules = f"""
notifiers:
  hook: "{http_sink.json_url()}"
rules:
  - name: broken-template
    notify: [hook]
    title: "{{{{ score / 0 }}}}"
"""
    server = start(rules)
    server.send(drop("evt_tpl"))
    [request] = http_sink.wait_for(1)
    assert "broken-template" in request.json["title"] + request.json["message"]
    assert server.metric("receiver_notifications_total", 'outcome="fallback"') == 1


@STORES_ONLY
def test_hot_reload_takes_a_good_file_and_refuses_a_bad_one(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    server = start(rules_for(http_sink))
    digest = server.get("/readyz").json()["checks"]["rules"]["digest"]
    # A good file, picked up from the change on disk.
    server.rules.write_text(rules_for(http_sink).replace("lt: 30", "lt: 50"))
    until(
        lambda: server.get("/readyz").json()["checks"]["rules"]["digest"] != digest,
        what="reload on file change",
    )
    server.send(drop("evt_r1", score=45))
    http_sink.wait_for(2)
    # A bad file: refused, logged, and the rules in force keep running.
    reloads_ok = server.metric("receiver_rules_reloads_total", 'result="ok"')
    server.rules.write_text("rules:\n  - name: x\n    notify: [nobody]\n")
    until(
        lambda: server.metric("receiver_rules_reloads_total", 'result="error"') >= 1,
        what="refused reload",
    )
    status = server.get("/readyz").json()["checks"]["rules"]
    assert (
        status["last_reload"].startswith("error:")
        and 'undefined notifier "nobody"' in status["last_reload"]
    )
    assert server.metric("receiver_rules_last_reload_ok") == 0
    assert "rules reload refused" in server.logs()
    server.send(drop("evt_r2", score=45))
    http_sink.wait_for(4)
    # SIGHUP reloads too.
    server.rules.write_text(rules_for(http_sink))
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    until(
        lambda: server.metric("receiver_rules_reloads_total", 'result="ok"') > reloads_ok,
        what="reload on SIGHUP",
    )


def test_a_target_down_for_a_while_gets_it_exactly_once(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    http_sink.fail_with(503)
    server = start(rules_for(http_sink).replace("[hook, chat]", "[hook]"))
    server.send(drop("evt_down"))
    http_sink.wait_for(3)  # three failed attempts
    http_sink.ok()
    until(lambda: outbox(server) == [("evt_down", "deep-drop", "delivered")], what="delivery")
    time.sleep(1)
    succeeded = [r for r in http_sink.requests if r.status == 200]
    assert len(succeeded) == 1
    assert server.metric("receiver_notifications_total", 'outcome="retried"') >= 3
    # Every attempt is in the row's log, as `receiver deliveries --attempts` shows it: the
    # failed ones with the status the chat target answered, the last with its 200.
    shown = server.cli("deliveries", "--attempts", "--json")
    assert shown.returncode == 0, shown.stderr
    [row] = [json.loads(line) for line in shown.stdout.splitlines()]
    statuses = [a["status"] for a in row["attempt_log"]]
    assert statuses == [r.status for r in http_sink.requests], statuses
    assert statuses[-1] == 200 and set(statuses[:-1]) == {503} and row["last_status"] == 200
    assert [a["number"] for a in row["attempt_log"]] == list(range(1, len(statuses) + 1))
    assert (
        all(a["error"] for a in row["attempt_log"][:-1]) and row["attempt_log"][-1]["error"] is None
    )


@pytest.mark.slow
def test_killed_before_delivery_delivers_after_restart(
    start: Callable[..., Receiver], http_sink: HTTPSink
) -> None:
    http_sink.stop()  # the target is down, so nothing can be delivered before the crash
    server = start(rules_for(http_sink).replace("[hook, chat]", "[hook]"))
    assert server.send(drop("evt_crash")).status_code == 202
    until(lambda: len(outbox(server)) == 1, what="routing")
    server.kill()
    http_sink.start()
    server.start()
    # A kill that lands mid-send (claimed, outcome not written) leaves the row to its
    # lease, which runs out 16 s after the claim (tests/harness.py).
    [request] = http_sink.wait_for(1, timeout=25)
    assert request.json["title"] == "Attention dropped: user_42"
    until(lambda: outbox(server) == [("evt_crash", "deep-drop", "delivered")], what="delivered")


def test_an_event_stored_but_not_routed_is_routed_on_start(
    start: Callable[..., Receiver], http_sink: HTTPSink, tmp_path: Path
) -> None:
    # The state a crash leaves between the 202's commit and the routing commit.
    server = start(rules_for(http_sink).replace("[hook, chat]", "[hook]"))
    server.stop()
    event = drop("evt_unrouted")
    server.query(
        "INSERT INTO events (id, type, session_id, event_ts, received_at, body)"
        " VALUES (?, 'score.drop', 'sess_7', ?, ?, ?)",
        ("evt_unrouted", event["timestamp"], time.time(), json.dumps(event)),
    )
    server.start()
    [request] = http_sink.wait_for(1)
    assert request.json["message"] == "Session sess_7 at 12 (threshold 40)"


@STORES_ONLY
def test_logs_name_notifiers_never_their_urls(
    start: Callable[..., Receiver], smtp_sink: SMTPSink, http_sink: HTTPSink
) -> None:
    http_sink.fail_with(500)
    server = start(rules_for(http_sink, smtp_sink))
    server.send(drop("evt_secret"))
    http_sink.wait_for(2)
    smtp_sink.wait_for(1)
    until(lambda: "failed" in server.logs(), what="a failure log line")
    logs = server.logs()
    assert "deep-drop" in logs or "hook[0]" in logs
    for secret in (smtp_sink.password, "chat-token", server.secret):
        assert secret not in logs
    out = httpx.get(f"{server.url}/readyz").text + httpx.get(f"{server.url}/metrics").text
    assert smtp_sink.password not in out and "chat-token" not in out
