"""`receiver explain` tells the whole truth without a database or tokens: one notification per
notifier URL, and the resolved messages an event closing an alert would send if it is open."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from receiver import rules
from receiver.cli import cli
from receiver.errors import ConfigError

RULES = """
notifiers:
  hook: ["json://127.0.0.1:9/a", "json://127.0.0.1:9/b"]
  team: "json://127.0.0.1:9/c"
rules:
  - name: forward-all
    notify: team
    continue: true
  - name: interventions
    match: {type: intervention.fired}
    notify: team
    resolve: true
    continue: true
  - name: deep
    match: {type: score.drop, score: {lt: 20}}
    notify: team
    resolve: true
    continue: true
  - name: page
    match: {type: score.drop, sessionId: "sess_*"}
    notify: hook
    resolved_title: "all clear for {{ sessionId }}"
    resolve: true
  - name: never-reached
    match: {type: score.drop}
    notify: hook
    resolve: true
"""


def payload(kind: str) -> dict[str, object]:
    return {"id": "e2", "type": kind, "sessionId": "sess_1", "timestamp": "2026-11-23T10:05:00Z"}


def test_a_closing_event_lists_the_resolved_messages_it_may_send() -> None:
    explanation = rules.load_text(RULES).explain(payload("score.recover"))
    assert [d.notifier for d in explanation.decisions] == ["team"]
    assert [(r.rule, len(r.decisions), r.unknown) for r in explanation.resolved] == [
        ("deep", 1, ("score",)),
        ("page", 2, ()),
    ]
    assert explanation.resolved[1].title == "all clear for sess_1"
    text = explanation.format()
    assert "resolved messages, if an alert for session sess_1 is open" in text
    assert "   - page -> hook (2 urls): all clear for sess_1" in text
    assert text.endswith(
        "result: 1 notification: forward-all -> team\n"
        "        + if an alert for session sess_1 is open: up to 3 resolved messages"
        " (4 notifications in all)"
    )


def test_no_resolved_messages_from_rules_the_opener_could_not_match() -> None:
    other = {**payload("score.recover"), "sessionId": "web_1"}
    # page's sessionId condition fails for web_1, so the drop would reach never-reached
    assert [r.rule for r in rules.load_text(RULES).explain(other).resolved] == [
        "deep",
        "never-reached",
    ]
    stopped = rules.load_text(RULES).explain(payload("intervention.resolved"))
    assert [r.rule for r in stopped.resolved] == ["interventions"]
    assert stopped.alert == "intervention (none) of session sess_1"
    assert rules.load_text(RULES).explain(payload("score.drop")).resolved == ()


def test_each_notifier_url_is_a_notification() -> None:
    drop = {**payload("score.drop"), "userId": "u", "score": 12, "threshold": 40}
    text = rules.load_text(RULES).explain(drop).format()
    assert text.endswith(
        "result: 4 notifications: forward-all -> team, deep -> team, page -> hook (2 urls)"
    )


TOKENS = """
notifiers:
  oncall: ["slack://${SLACK_TOKEN_T}/#oncall", "ntfys://ntfy.sh/${NTFY_TOPIC_T}"]
rules:
  - name: page
    match: {type: score.drop}
    notify: oncall
    resolve: true
"""


@pytest.fixture
def token_rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(TOKENS)
    return path


def test_check_and_explain_run_without_the_tokens(token_rules: Path) -> None:
    unset = {"SLACK_TOKEN_T": None, "NTFY_TOPIC_T": None}
    result = CliRunner().invoke(cli, ["check", str(token_rules)], env=unset)
    assert result.exit_code == 0, result.output
    assert "notifiers: oncall (2 urls), console (built-in)" in result.output
    assert (
        "note: environment variables not set: NTFY_TOPIC_T (oncall), SLACK_TOKEN_T (oncall);"
        " their urls were not checked." in result.output
    )
    args = ["explain", "--rules", str(token_rules), "--score", "12", "--db", "none.db"]
    result = CliRunner().invoke(cli, args, env=unset)
    assert result.exit_code == 0, result.output
    assert "result: 2 notifications: page -> oncall (2 urls)" in result.output
    with pytest.raises(ConfigError, match="environment variable SLACK_TOKEN_T is not set"):
        rules.load_file(token_rules, env={})  # as the server loads them


def test_no_env_reads_no_variable_even_a_set_one(token_rules: Path) -> None:
    env = {"SLACK_TOKEN_T": "xoxb-secret-value", "NTFY_TOPIC_T": "topic"}
    result = CliRunner().invoke(cli, ["check", "--no-env", str(token_rules)], env=env)
    assert result.exit_code == 0, result.output
    assert "environment variables not read (--no-env): NTFY_TOPIC_T (oncall)," in result.output
    assert "xoxb-secret-value" not in result.output


def test_a_bad_variable_reference_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text('notifiers:\n  x: "json://${1BAD}/x"\nrules: []\n')
    result = CliRunner().invoke(cli, ["check", "--no-env", str(path)])
    assert result.exit_code == 1 and 'invalid variable reference "${1BAD}"' in result.output


ESCALATING = """
notifiers:
  chat: "json://127.0.0.1:9/chat"
  alice: "json://127.0.0.1:9/alice"
  bob: "json://127.0.0.1:9/bob"
schedules:
  primary:
    timezone: UTC
    rotation: daily
    handoff: "09:00"
    start: 2026-11-23
    members: [alice, bob]
escalations:
  wake:
    steps:
      - notify: [chat]
      - after: 30m
        notify: [schedule:primary]
    repeat: 1
    reack: 1h
rules:
  - name: deep
    match: {type: score.drop}
    escalate: wake
"""


def test_explain_shows_each_step_and_who_is_on_call_when_it_would_page() -> None:
    # 08:45 on the 23rd: step 2 comes at 09:15, after the handoff from bob to alice.
    explanation = rules.load_text(ESCALATING).explain(
        {**payload("score.drop"), "score": 10}, at=datetime(2026, 11, 23, 8, 45, tzinfo=UTC)
    )
    text = explanation.format()
    assert "1. deep: matched -> (no notifier of its own)" in text
    assert (
        "     escalate: wake, while the alert is open and nobody acknowledges:\n"
        "       +0s step 1 -> chat\n"
        "       +30m step 2 -> schedule:primary (alice then)\n"
        "       then the chain again, 1 more time, 30m after its last step\n"
        "       an ack still open after 1h pages the current step again\n"
        "result: no notification at once; escalation wake"
    ) in text
    early = rules.load_text(ESCALATING).explain(
        {**payload("score.drop"), "score": 10}, at=datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    )
    assert "+30m step 2 -> schedule:primary (bob then)" in early.format()


def test_explain_says_now_that_an_open_source_inhibits_the_event(tmp_path: Path) -> None:
    import asyncio

    from receiver.store import open_store
    from receiver.store.records import Alert, Inhibitor

    db = str(tmp_path / "receiver.db")
    source = Alert("intervention:sess_1:iv1", "open", 1, "2026-11-23T10:00:00.000000Z")

    async def prepare() -> None:
        store = open_store(db)
        await store.open()
        try:

            def work(tx: Any) -> None:
                tx.alerts.save(source, 1.0)
                tx.inhibitors.add(
                    Inhibitor("covers", '["sess_1"]', source.id, 1, "evt_src", 1795428000.0)
                )

            await store.transact(work)
        finally:
            await store.close()

    asyncio.run(prepare())
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(
        "inhibit:\n  - name: covers\n    source: {type: intervention.fired}\n"
        "    target: {type: score.drop}\n    equal: [sessionId]\n"
        "rules:\n  - name: drops\n    match: {type: score.drop}\n    notify: console\n"
    )
    args = ["explain", "--rules", str(rules_file), "--db", db, "--type", "score.drop"]
    done = CliRunner().invoke(cli, [*args, "--session", "sess_1"])
    assert done.exit_code == 0, done.output
    assert "  inhibited by covers (evt_src, open since 2026-11-23 10:00:00Z)" in done.output
    other = CliRunner().invoke(cli, [*args, "--session", "sess_2"])
    assert other.exit_code == 0 and "inhibited" not in other.output


def test_explain_says_now_whether_the_alert_flaps(tmp_path: Path) -> None:
    import asyncio

    from receiver.store import open_store
    from receiver.store.records import Alert

    db = str(tmp_path / "receiver.db")
    alert = Alert("session:sess_1", "open", 3, "2026-11-23T10:00:00.000000Z")
    spec = {"changes": 2, "within": 600.0, "quiet": 900.0}

    async def prepare() -> None:
        store = open_store(db)
        await store.open()
        try:

            def work(tx: Any) -> None:
                tx.alerts.save(alert, 1.0)
                tx.flaps.change("drops", alert.id, "resolved", "e1", 1795428000.0, **spec)
                tx.flaps.change("drops", alert.id, "open", "e2", 1795428060.0, **spec)

            await store.transact(work)
        finally:
            await store.close()

    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(
        "rules:\n  - name: drops\n    match: {type: score.drop}\n    notify: console\n"
        "    flap: {changes: 2, within: 10m, quiet: 15m}\n"
    )
    args = ["explain", "--rules", str(rules_file), "--db", db, "--type", "score.drop"]
    before = CliRunner().invoke(cli, [*args, "--session", "sess_1"])
    assert "flap detection: 2 changes in 10m make its alert flapping" in before.output
    asyncio.run(prepare())
    done = CliRunner().invoke(cli, [*args, "--session", "sess_1"])
    assert done.exit_code == 0, done.output
    assert "drops: flapping since 2026-11-23 10:01:00 UTC: its changes are kept" in " ".join(
        done.output.split()
    )
