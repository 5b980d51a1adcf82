"""The Slack app's manifest (`receiver slack manifest`) and what `receiver slack check`
finds wrong with the app as this receiver would use it: the bot token (auth.test), its
scope (chat:write, from the X-OAuth-Scopes header Slack answers with), and each
slack-app:// notifier's channel (conversations.info: found, and the bot a member). It
posts nothing.

    text = manifest("https://alerts.example.com")    # YAML to paste at api.slack.com/apps
    lines, ok = await check(messenger, ["#alerts"])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from receiver.notify.slack.channel import Messenger, SendError

SCOPE = "chat:write"
PATH = "/slack/interactivity"
_WHY = {
    "invalid_auth": "the bot token is not valid (invalid_auth): copy the Bot User OAuth Token"
    " (xoxb-...) from the app's OAuth & Permissions page",
    "not_authed": "no bot token reached Slack (not_authed)",
    "account_inactive": "the app was uninstalled or its token revoked (account_inactive):"
    " install it again",
    "token_revoked": "the bot token was revoked (token_revoked): install the app again",
    "channel_not_found": "no such channel, or the bot cannot see it (channel_not_found):"
    " for a private channel, invite the bot first",
}


def manifest(url: str, name: str = "attention-receiver") -> str:
    """The app manifest (YAML) of a receiver reached at url (its RECEIVER_PUBLIC_URL)."""
    doc: dict[str, Any] = {
        "display_information": {
            "name": name,
            "description": "Alerts from attention-receiver, with buttons that answer back",
        },
        "features": {"bot_user": {"display_name": name, "always_online": True}},
        "oauth_config": {"scopes": {"bot": [SCOPE]}},
        "settings": {
            "interactivity": {"is_enabled": True, "request_url": url.rstrip("/") + PATH},
            "org_deploy_enabled": False,
            "socket_mode_enabled": False,
            "token_rotation_enabled": False,
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


def why(error: str) -> str:
    """Slack's error code in words, with what to do."""
    return _WHY.get(error, f"Slack answered {error}")


async def check(messenger: Messenger, channels: Sequence[str]) -> tuple[list[str], bool]:
    """Lines saying how the app stands, and whether it can post to every channel."""
    if not messenger.token:
        return ["RECEIVER_SLACK_BOT_TOKEN is not set: the app's bot token (xoxb-...)"], False
    client = messenger.client()
    try:
        answer = await client.auth_test()
    except Exception as exc:  # SlackApiError, or the network
        return [f"auth.test failed: {_error(exc)}"], False
    lines = [f"token OK: bot {answer.get('user')} in workspace {answer.get('team')}"]
    ok = True
    scopes = _scopes(answer.headers)
    if scopes is not None and SCOPE not in scopes:
        lines.append(f"the token lacks the {SCOPE} scope: add it and reinstall the app")
        ok = False
    for channel in channels:
        line, fine = await _channel(client, channel)
        lines.append(line)
        ok = ok and fine
    if not channels:
        lines.append("no slack-app:// notifier in the rules")
    return lines, ok


async def _channel(client: Any, channel: str) -> tuple[str, bool]:
    try:
        answer = await client.conversations_info(channel=channel.lstrip("#"))
    except Exception as exc:
        error = _error(exc)
        if error.startswith("missing_scope"):
            return (
                f"{channel}: cannot tell whether the bot is in it without the channels:read"
                " scope; if posts fail with not_in_channel, /invite the app there",
                True,
            )
        return f"{channel}: {why(error)}", False
    found = answer.get("channel") or {}
    if found.get("is_member") is False:
        return f"{channel}: the bot is not in it (not_in_channel): /invite the app there", False
    return f"{channel}: OK ({found.get('id', '?')})", True


def _scopes(headers: Any) -> set[str] | None:
    raw = None
    for key, value in dict(headers or {}).items():
        if key.lower() == "x-oauth-scopes":
            raw = value[0] if isinstance(value, list) else value
    return None if raw is None else {s.strip() for s in str(raw).split(",") if s.strip()}


def _error(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    data = getattr(response, "data", None)
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])
    return str(SendError("call", type(exc).__name__).error)
