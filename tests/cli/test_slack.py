"""`receiver slack manifest` and `receiver slack check`, the latter against the Slack Web
API stand-in: it says what is wrong (token, scope, channel not joined) and posts nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from receiver.cli import cli
from receiver.simulator.slack_api import SlackAPI

TOKEN = "xoxb-cli-test-0123"
RULES = """
notifiers:
  oncall: "slack-app://#alerts"
  quiet: ["slack-app://C0QUIET?buttons=ack", "slack-app://#alerts"]
rules:
  - name: all
    notify: [oncall, quiet]
"""


@pytest.fixture
def slack() -> Iterator[SlackAPI]:
    api = SlackAPI(token=TOKEN, channels={"alerts": "C0123ABCD", "quiet": "C0QUIET"}).start()
    try:
        yield api
    finally:
        api.stop()


def run(tmp_path: Path, slack: SlackAPI, *args: str, token: str = TOKEN) -> tuple[int, str]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = {
        "RECEIVER_SLACK_BOT_TOKEN": token,
        "RECEIVER_SLACK_SIGNING_SECRET": "signing-secret-0123",
        "RECEIVER_SLACK_API_URL": slack.url,
    }
    result = CliRunner().invoke(cli, ["slack", *args, "--rules", str(rules)], env=env)
    return result.exit_code, result.output


def test_manifest_asks_for_chat_write_and_points_interactivity_here() -> None:
    result = CliRunner().invoke(cli, ["slack", "manifest", "--url", "https://alerts.example.com/"])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.output)
    assert doc["oauth_config"]["scopes"]["bot"] == ["chat:write"]
    assert doc["settings"]["interactivity"] == {
        "is_enabled": True,
        "request_url": "https://alerts.example.com/slack/interactivity",
    }


def test_manifest_needs_an_https_url() -> None:
    result = CliRunner().invoke(cli, ["slack", "manifest", "--url", "http://alerts.example.com"])
    assert result.exit_code == 1 and "must be https://" in result.output
    result = CliRunner().invoke(cli, ["slack", "manifest"], env={"RECEIVER_PUBLIC_URL": ""})
    assert result.exit_code == 1 and "give --url" in result.output


def test_check_says_all_is_well_and_posts_nothing(tmp_path: Path, slack: SlackAPI) -> None:
    slack.scopes = ("chat:write", "channels:read")
    code, output = run(tmp_path, slack, "check")
    assert code == 0, output
    assert "token OK: bot alerts in workspace Stand-in" in output
    assert "#alerts: OK (C0123ABCD)" in output and "C0QUIET: OK (C0QUIET)" in output
    assert [c.method for c in slack.calls] == [
        "auth.test",
        "conversations.info",
        "conversations.info",
    ]
    assert TOKEN not in output


def test_check_names_a_bad_token(tmp_path: Path, slack: SlackAPI) -> None:
    code, output = run(tmp_path, slack, "check", token="xoxb-wrong")
    assert code == 1
    assert "auth.test failed: invalid_auth" in output and "xoxb-wrong" not in output


def test_check_names_a_missing_scope_and_a_channel_not_joined(
    tmp_path: Path, slack: SlackAPI
) -> None:
    slack.scopes = ("channels:read",)
    slack.joined = {"C0123ABCD"}
    code, output = run(tmp_path, slack, "check")
    assert code == 1
    assert "lacks the chat:write scope" in output
    assert "C0QUIET: the bot is not in it (not_in_channel)" in output
    assert not slack.called("chat.postMessage")


def test_without_channels_read_check_says_it_cannot_tell(tmp_path: Path, slack: SlackAPI) -> None:
    code, output = run(tmp_path, slack, "check")  # the stand-in's token: chat:write only
    assert code == 0, output
    assert "cannot tell whether the bot is in it without the channels:read scope" in output
