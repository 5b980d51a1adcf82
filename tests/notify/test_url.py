"""A slack-app:// notifier URL (receiver.notify.slack.url): the channel and buttons it names,
and the `receiver check` problems of its Kind (a bad URL, no bot token)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver.app import create_app
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.notify import registry
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
