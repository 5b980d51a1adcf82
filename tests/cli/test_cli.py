"""The `receiver` command through click's CliRunner; send/deliveries against a real server."""

import importlib
import json
import pkgutil
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner

import receiver.cli
from receiver import events, signature
from receiver.cli import COMMANDS, cli
from receiver.settings import DEV_SECRET
from tests.harness import SECRET, Receiver, eventually
from tests.servers import HTTPSink

# A timestamp an hour ago: within RECEIVER_MAX_EVENT_AGE whenever the suite runs.
RECENT = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))


def invoke(*args: str, input: str | bytes | None = None, **env: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), input=input, env=env or None)
    return result.exit_code, result.output


def test_sign_prints_the_header_for_stdin_with_the_dev_secret_by_default() -> None:
    code, out = invoke("sign", input=b'{"a":1}', RECEIVER_SECRETS="", RECEIVER_SIGN_SECRET="")
    assert code == 0
    expected = signature.sign(DEV_SECRET.encode(), b'{"a":1}')
    assert out.strip() == f"X-Service-Signature: {expected}"


def test_sign_uses_the_first_configured_secret_and_never_prints_it(tmp_path: Path) -> None:
    body = tmp_path / "event.json"
    body.write_bytes(b'{"id":"x"}')
    code, out = invoke("sign", str(body), RECEIVER_SECRETS="first-secret,second")
    assert code == 0 and signature.sign(b"first-secret", b'{"id":"x"}') in out
    assert "first-secret" not in out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    receiver = Receiver(tmp_path_factory.mktemp("cli")).start()
    yield receiver
    receiver.stop()


@pytest.mark.e2e
def test_send_twice_is_accepted_then_duplicate(server: Receiver) -> None:
    url = f"{server.url}/v1/events"
    args = ("send", "--type", "score.drop", "--id", "evt_cli_1", "--url", url)
    assert invoke(*args, RECEIVER_SECRETS=SECRET) == (
        0,
        '202 {"id": "evt_cli_1", "status": "accepted"}\n',
    )
    assert invoke(*args, RECEIVER_SECRETS=SECRET) == (
        0,
        '200 {"id": "evt_cli_1", "status": "duplicate"}\n',
    )


@pytest.mark.e2e
def test_send_builds_every_field_from_flags(server: Receiver) -> None:
    code, _ = invoke(
        "send",
        "--type",
        "score.recover",
        "--id",
        "evt_cli_2",
        "--session",
        "s9",
        "--user",
        "u9",
        "--score",
        "55",
        "--threshold",
        "40",
        "--timestamp",
        RECENT,
        "--field",
        "context=checkout",
        "--field",
        'meta={"page": "/pay"}',
        "--url",
        f"{server.url}/v1/events",
        RECEIVER_SECRETS=SECRET,
    )
    assert code == 0
    with sqlite3.connect(server.db) as conn:
        (body,) = conn.execute("SELECT body FROM events WHERE id = 'evt_cli_2'").fetchone()
    assert json.loads(body) == {
        "id": "evt_cli_2",
        "type": "score.recover",
        "sessionId": "s9",
        "userId": "u9",
        "score": 55,
        "threshold": 40,
        "timestamp": RECENT,
        "context": "checkout",
        "meta": {"page": "/pay"},
    }


@pytest.mark.e2e
def test_send_exits_1_on_a_refusal(server: Receiver) -> None:
    code, out = invoke("send", "--url", f"{server.url}/v1/events", "--secret", "wrong")
    assert code == 1 and out.startswith("401 ") and "invalid_signature" in out
    assert "wrong" not in out.replace("invalid_signature", "")


def test_send_explains_an_unreachable_receiver() -> None:
    code, out = invoke("send", "--url", "http://127.0.0.1:9/v1/events")
    assert code == 1 and "Error: cannot reach http://127.0.0.1:9/v1/events" in out


def test_check_ok_prints_a_summary() -> None:
    code, out = invoke("check", "rules.yaml")
    assert code == 0 and "rules.yaml: OK" in out and "score-drop -> console" in out


def test_check_reports_problems_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text(
        "rules:\n  - name: deep-drop\n    notify: [ops]\n    match: {score: {less: 3}}\n"
    )
    code, out = invoke("check", "--rules", str(bad))
    assert code == 1
    assert 'undefined notifier "ops" used in rule "deep-drop"' in out
    assert 'unknown operator "less"' in out


def test_explain_shows_matches_and_why_others_did_not(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("""
rules:
  - name: deep-drop
    match: {type: score.drop, score: {lt: 30}}
    notify: console
    title: "Dropped {{ userId }}"
  - name: all
    notify: console
""")
    code, out = invoke("explain", "--rules", str(rules), "--score", "45")
    assert code == 0
    assert "deep-drop: not matched" in out and "score: 45 is not lt 30" in out
    assert "all: matched" in out
    code, out = invoke("explain", "--rules", str(rules), "--score", "12", "--user", "user_7")
    assert "deep-drop: matched" in out and "Dropped user_7" in out


def test_explain_refuses_an_invalid_event(tmp_path: Path) -> None:
    code, out = invoke("explain", "--file", "-", input='{"type": "score.drop"}')
    assert code == 1 and "not a valid event" in out and "id: field required" in out


@pytest.mark.e2e
def test_deliveries_retry_and_replay(tmp_path: Path, http_sink: HTTPSink) -> None:
    http_sink.fail_with(500)
    rules = (
        f'notifiers:\n  hook: "{http_sink.json_url()}"\nrules:\n  - name: all\n    notify: hook\n'
    )
    server = Receiver(tmp_path, rules=rules, env={"RECEIVER_RETRY_FOR": "1"}).start()
    db = str(server.db)
    try:
        server.send(
            {
                "id": "evt_r",
                "type": "session.stopped",
                "sessionId": "s",
                "timestamp": RECENT,
            }
        )
        http_sink.wait_for(1)
        deadline = 50
        while invoke("deliveries", "--db", db, "--state", "failed")[1].startswith("no deliveries"):
            deadline -= 1
            assert deadline, "the row never went dead"
            time.sleep(0.1)
        code, out = invoke("deliveries", "--db", db, "--json")
        [row] = [json.loads(line) for line in out.splitlines()]
        # "failed", as the API says of a subscriber's delivery: one word for one state
        assert (row["state"], row["notifier"], row["event_id"]) == ("failed", "hook", "evt_r")
        assert (
            invoke("deliveries", "--db", db, "--state", "dead")[1]
            == invoke("deliveries", "--db", db, "--state", "failed")[1]
        )
        assert " failed " in invoke("deliveries", "--db", db)[1]
        assert "answered HTTP 500" in row["last_error"] and "127.0.0.1" not in out
        http_sink.ok()
        attempts = len(http_sink.requests)
        assert invoke("retry", "--db", db, str(row["id"])) == (
            0,
            "1 notification(s) queued again\n",
        )
        assert http_sink.wait_for(attempts + 1)[-1].status == 200  # picked up by the server
        assert invoke("retry", "--db", db, "999")[0] == 1
        code, out = invoke("replay", "--db", db, "evt_r", "--wait", "20")
        assert code == 0 and "replay #1 of evt_r (sent regardless of the lifecycle)" in out
        assert "  sent      all -> hook[0]: [replay] [all] session.stopped for s" in out
        assert http_sink.wait_for(attempts + 2)[-1].status == 200
        code, out = invoke("replay", "--db", db, "nope")
        assert code == 1 and "no stored event with id 'nope'" in out
    finally:
        server.stop()


def test_outbox_commands_need_an_existing_database(tmp_path: Path) -> None:
    code, out = invoke("deliveries", "--db", str(tmp_path / "none.db"))
    assert code == 1 and "no database at" in out


def test_retry_needs_an_id_or_all_failed(tmp_path: Path) -> None:
    code, out = invoke("retry", "--db", str(tmp_path / "x.db"))
    assert code == 2 and "give a row id or --all-failed" in out


# --- issue 28, item 19 -----------------------------------------------------------------


def test_keys_create_json_gives_iso_times_as_the_api_does(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    code, out = invoke("keys", "create", "--db", db, "--name", "ci", "--plan", "free", "--json")
    assert code == 0
    made = json.loads(out)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", made["createdAt"])
    assert made["revokedAt"] is None
    assert invoke("keys", "revoke", "--db", db, "ci")[0] == 0
    [listed] = [json.loads(x) for x in invoke("keys", "list", "--db", db, "--json")[1].splitlines()]
    assert listed["createdAt"] == made["createdAt"] and listed["revokedAt"].endswith("Z")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        pytest.param("", "must not be empty", id="empty"),
        pytest.param("   ", "must not be empty", id="blank"),
        pytest.param("k" * 65, "must be at most 64 characters; got 65", id="65-characters"),
        pytest.param("a\x1b[2Jb", "must not contain control characters", id="escape"),
    ],
)
def test_keys_create_refuses_odd_names(tmp_path: Path, name: str, message: str) -> None:
    db = tmp_path / "k.db"
    code, out = invoke("keys", "create", "--db", str(db), "--name", name, "--plan", "free")
    assert code == 2 and "--name" in out and message in out
    assert not db.exists()  # refused before the store is opened
    assert invoke("keys", "create", "--db", str(db), "--name", "k" * 64, "--plan", "free")[0] == 0


@pytest.mark.parametrize("command", ["backtest", "check"])
def test_a_file_that_is_not_rules_is_not_echoed(tmp_path: Path, command: str) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$s3cretHash:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n")
    args = [command, str(shadow)] + (
        ["--db", str(tmp_path / "x.db")] if command == "backtest" else []
    )
    code, out = invoke(*args)
    assert code == 1
    assert "not a rules file: none of the top-level keys notifiers, rules" in out
    assert "(2 other keys, not shown)" in out
    assert "s3cretHash" not in out and "daemon" not in out and "root:" not in out


def test_db_copy_to_a_closed_port_says_connection_refused(tmp_path: Path) -> None:
    db = str(tmp_path / "src.db")
    assert invoke("keys", "create", "--db", db, "--name", "seed", "--plan", "free")[0] == 0
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        started = time.monotonic()
        code, out = invoke(
            "db", "copy", "--db", db, "--to", f"postgresql://u:pw@127.0.0.1:{port}/x"
        )
    assert code == 1
    assert f"Error: cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused" in out
    assert "pool" not in out and ":pw@" not in out
    assert time.monotonic() - started < 8  # not the pool's 10 s wait


@pytest.mark.e2e
def test_alerts_json_is_one_document_in_the_apis_shape(server: Receiver) -> None:
    server.send({**events.sample("score.drop", id="evt_alert_json"), "sessionId": "sess_aj"})
    server.send({**events.sample("score.drop", id="evt_acked"), "sessionId": "sess_ack"})

    def listed() -> list[dict[str, object]]:
        code, out = invoke("alerts", "--db", str(server.db), "--json")
        assert code == 0
        found = json.loads(out)  # the whole output: one document
        ids = {a.get("id") for a in found}
        return found if {"session:sess_aj", "session:sess_ack"} <= ids else []

    eventually(listed, "both alerts listed")
    key = server.make_key("json", role="writer")
    acked = httpx.post(
        f"{server.url}/v1/alerts/session:sess_ack/ack", headers={"Authorization": f"Bearer {key}"}
    )
    assert acked.json()["result"] == "done"
    found = listed()  # oldest first; the API's by id
    # The same names, times and nesting as GET /v1/alerts: id, openedAt, acked {by, at}
    api = server.get("/v1/alerts?state=open", key).json()["alerts"]
    assert sorted(found, key=lambda a: str(a["id"])) == api
    by_id = {a["id"]: a for a in found}
    assert by_id["session:sess_aj"]["openedEvent"] == "evt_alert_json"
    assert by_id["session:sess_aj"]["acked"] is None
    assert by_id["session:sess_ack"]["acked"]["by"] == "json"
    assert str(by_id["session:sess_ack"]["acked"]["at"]).endswith("Z")


# --- issue 28, item 18: what README says is true -----------------------------------------


@pytest.mark.e2e
def test_readme_demo_resends_the_same_bytes_without_a_conflict(
    server: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    demo = readme[: readme.index("and the server's log shows each notification")]
    sends = [
        x.split("#")[0].split()[2:] for x in demo.splitlines() if x.startswith("$ receiver send")
    ]
    assert len(sends) == 3 and "--save" in sends[1] and "--file" in sends[2]
    monkeypatch.chdir(tmp_path)
    url = f"{server.url}/v1/events"
    answers = [invoke(*args, "--url", url, RECEIVER_SECRETS=SECRET) for args in sends]
    assert [out.split()[0] for _, out in answers] == ["202", "202", "200"]
    assert '"status": "duplicate"' in answers[2][1]
    assert (tmp_path / "evt_1.json").exists()
    assert "conflict: event evt_1 " not in server.logs()


@pytest.mark.e2e
def test_admin_page_views_do_not_count_against_the_plan_limit(server: Receiver) -> None:
    """README: the plan limits /v1 requests, not admin page views."""
    key = server.make_key("admin-free", plan="free", role="admin")  # 60 requests a minute
    with httpx.Client(base_url=server.url, timeout=10) as client:
        signed_in = client.post("/admin/login", data={"key": key})
        assert signed_in.status_code == 303
        codes = {client.get("/admin/rules").status_code for _ in range(61)}
        assert codes == {200}
        api = [
            client.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"})
            for _ in range(61)
        ]
        assert api[-1].status_code == 429  # the plan limits the API


def test_readme_says_how_the_rules_page_shows_var_urls() -> None:
    from receiver.admin.rules import redact

    assert redact('hook: "json://u:${TOKEN}@hooks.example.com/x"') == (
        'hook: "json://u:${TOKEN}@hooks.example.com/x"'
    )
    assert redact('hook: "json://u:tok3n@hooks.example.com/x"') == 'hook: "json://…"'
    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]  # docs/admin.md says it
    docs = " ".join(" ".join(p.read_text().split()) for p in pages)
    assert "a URL holding a `${VAR}` reference is shown as written instead" in docs
    assert "Admin page views count against" not in docs


def test_receiver_help_lists_each_command_with_the_first_line_of_its_own_help() -> None:
    """`receiver --help` lists the commands from receiver.cli.COMMANDS without importing
    them: each line there must be what the command itself says, and every command a
    module under receiver/cli/ defines at the top (not inside a group) must be listed."""
    commands: list[click.Command] = []
    for module in pkgutil.iter_modules(receiver.cli.__path__, "receiver.cli."):
        found = vars(importlib.import_module(module.name)).values()
        commands += [value for value in found if isinstance(value, click.Command)]
    nested = {id(sub) for group in commands if isinstance(group, click.Group)
              for sub in group.commands.values()}  # fmt: skip
    defined = {c.name: c for c in commands if id(c) not in nested}
    assert sorted(defined) == sorted(COMMANDS)
    for name, (_, help) in COMMANDS.items():
        said = defined[name].get_short_help_str(1000)
        assert click.Command(name, help=help).get_short_help_str(1000) == said, name
    assert invoke("--help")[1].count("\n  ") >= len(COMMANDS)


def test_receiver_help_imports_no_command_module() -> None:
    """`receiver --help` (and a command's start) loads only what the command needs: here
    neither the store, the rules, the channels nor pydantic."""
    code = (
        "import sys; from receiver.cli import cli; cli(['--help'], standalone_mode=False);"
        " print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(done.stdout.split())
    assert {name for name in loaded if name.startswith("receiver")} == {"receiver", "receiver.cli"}
    assert not loaded & {"pydantic", "apprise", "httpx", "sqlite3", "psycopg"}
