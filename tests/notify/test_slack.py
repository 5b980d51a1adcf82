"""The Slack app channel's pure parts: its notifier URL (receiver.notify.slack.url), the
`receiver check` problems of its Kind, and its message (receiver.notify.slack.blocks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.app import create_app
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.notify import registry
from receiver.notify.slack import blocks
from receiver.notify.slack.url import SlackURL, parse
from receiver.settings import Settings


@pytest.mark.parametrize(
    ("url", "found"),
    [
        pytest.param("slack-app://C0123ABCD", SlackURL("C0123ABCD"), id="id"),
        pytest.param("slack-app://#alerts", SlackURL("#alerts"), id="name"),
        pytest.param(
            "slack-app://C0123ABCD?buttons=snooze,ack", SlackURL("C0123ABCD", ("ack", "snooze"))
        ),
        pytest.param("slack-app://#ops?buttons=none", SlackURL("#ops", ()), id="none"),
    ],
)
def test_a_slack_app_url_names_a_channel_and_its_buttons(url: str, found: SlackURL) -> None:
    assert parse(url) == found


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("slack-app://general", "the channel must be an id such as C0123ABCD"),
        ("slack-app://", "the channel must be an id"),
        ("slack-app://C0123ABCD?buttons=page", "unknown button 'page'"),
        ("slack-app://C0123ABCD?colour=red", "unknown option 'colour'"),
    ],
)
def test_a_bad_slack_app_url_is_a_check_problem(
    url: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECEIVER_SLACK_BOT_TOKEN", "xoxb-1")
    found = registry.problem(url, '"slack-app"')
    assert found is not None and problem in found
    assert registry.channel_of(url) == "slack-app"


def test_receiver_check_and_serve_need_the_bot_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        'notifiers:\n  oncall: "slack-app://#alerts"\n  mail: "console://"\n'
        "rules:\n  - name: all\n    notify: [oncall, mail]\n"
    )
    monkeypatch.delenv("RECEIVER_SLACK_BOT_TOKEN", raising=False)
    result = CliRunner().invoke(cli, ["check", str(rules)])
    assert result.exit_code == 1
    assert 'notifier "oncall": slack-app:// needs the Slack app\'s bot token' in result.output
    # --no-env checks the file alone, as for any secret.
    assert CliRunner().invoke(cli, ["check", "--no-env", str(rules)]).exit_code == 0
    with pytest.raises(ConfigError, match='notifier "oncall": slack-app:// needs'):
        create_app(Settings(db=str(tmp_path / "r.db"), rules=rules))
    monkeypatch.setenv("RECEIVER_SLACK_BOT_TOKEN", "xoxb-1")
    assert CliRunner().invoke(cli, ["check", str(rules)]).exit_code == 0
    create_app(Settings(db=str(tmp_path / "r.db"), rules=rules))


CARD = blocks.new_card(title="drop s1", body="score 8", alert="session:s1", episode=2, rule="r")
TOKENS = {"ack": "t-ack", "resolve": "t-resolve", "snooze": "t-snooze"}


def _buttons(found: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [
        (e["action_id"], e.get("value"))
        for b in found
        if b["type"] == "actions"
        for e in b["elements"]  # type: ignore[attr-defined]
    ]


def test_an_open_episode_has_its_buttons_each_carrying_its_token() -> None:
    text, found = blocks.render(CARD, tokens=TOKENS, link="https://a/admin/alerts/session:s1")
    assert text == "drop s1: :red_circle: Open"
    assert _buttons(found) == [
        ("ack", "t-ack"),
        ("resolve", "t-resolve"),
        ("snooze", "t-snooze"),
        ("open", None),
    ]


def test_acked_says_who_and_when_and_keeps_only_resolve() -> None:
    acked = blocks.with_state(CARD, state="open", acked_by="<@U123> (ada)", acked_at=0.0)
    text, found = blocks.render(acked, tokens=TOKENS)
    assert "Acknowledged by <@U123> at 1970-01-01 00:00 UTC" in text
    assert _buttons(found) == [("resolve", "t-resolve")]


def test_resolved_says_so_and_has_no_buttons() -> None:
    done = blocks.with_state(CARD, state="resolved", resolved_by="<@U9> (bo)")
    text, found = blocks.render(done, tokens=TOKENS, link="https://a/x")
    assert "Resolved by <@U9>" in text and _buttons(found) == []


def test_snoozed_says_until_when_and_the_buttons_are_the_notifiers_choice() -> None:
    card = blocks.new_card(title="t", body="", alert="a", episode=1, rule="r", buttons=["ack"])
    snoozed = blocks.with_state(card, state="open", snoozed_until=4_000_000_000.0)
    text, found = blocks.render(snoozed, tokens=TOKENS, now=0.0)
    assert "Snoozed until 2096-10-02 07:06 UTC" in text
    assert _buttons(found) == [("ack", "t-ack")]
