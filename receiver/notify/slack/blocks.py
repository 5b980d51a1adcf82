"""The Slack app's message of one alert episode, in Block Kit: what it shows is a card (a
plain dict, kept by store.threads), rendered again whenever the episode changes.

    card = new_card(title="Deep drop ada 12", body="sess_42", alert="session:sess_42",
                    episode=1, rule="deep-drop", buttons=("ack", "resolve", "snooze"))
    card = with_state(card, state="open", acked_by="<@U123> (ada)", acked_at=...)
    text, blocks = render(card, tokens={"resolve": "eyJ..."}, link="https://.../admin/...")

The message says its state in words ("Acknowledged by <@U123> at 10:14 UTC"); a resolved
one says so and carries no buttons. Each button's value is the episode's signed action
token (receiver.links), the same capability as the `/act` links.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

BUTTONS = ("ack", "resolve", "snooze")  # the default set, in this order
LABELS = {"ack": "Ack", "resolve": "Resolve", "snooze": "Snooze 1h"}
OPEN = "open"  # a link button's action_id: Slack calls back for it too, and we ignore it
# Block Kit's limits: a header's text 150 characters, a section's 3,000, a message's
# fallback text 4,000 (docs.slack.dev/reference/block-kit/blocks).
HEADER_MAX = 150
SECTION_MAX = 3000


def clock_time(at: float) -> str:
    """10:14 UTC, or with the date when not today (UTC)."""
    moment = time.gmtime(at)
    if time.strftime("%Y-%m-%d", moment) == time.strftime("%Y-%m-%d", time.gmtime()):
        return time.strftime("%H:%M UTC", moment)
    return time.strftime("%Y-%m-%d %H:%M UTC", moment)


def new_card(
    *,
    title: str,
    body: str,
    alert: str,
    episode: int,
    rule: str,
    buttons: Iterable[str] = BUTTONS,
) -> dict[str, Any]:
    """The card of an episode's first message (open, nobody acked yet)."""
    return {
        "title": title,
        "body": body,
        "alert": alert,
        "episode": episode,
        "rule": rule,
        "buttons": [b for b in BUTTONS if b in set(buttons)],
        "state": "open",
    }


def with_state(
    card: Mapping[str, Any],
    *,
    state: str,
    acked_by: str | None = None,
    acked_at: float | None = None,
    snoozed_until: float | None = None,
    resolved_by: str | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """card as the episode stands now. note: a line about the last click that changed
    nothing ("Already resolved: the click changed nothing")."""
    dropped = ("acked_by", "acked_at", "until", "note", "resolved_by")
    new = {k: v for k, v in card.items() if k not in dropped}
    new["state"] = state
    if acked_by is not None:
        new["acked_by"], new["acked_at"] = acked_by, acked_at
    if snoozed_until is not None:
        new["until"] = snoozed_until
    if resolved_by is not None:
        new["resolved_by"] = resolved_by
    if note:
        new["note"] = note
    return new


def status(card: Mapping[str, Any], now: float | None = None) -> str:
    """The card's state in words, for its status line."""
    now = time.time() if now is None else now
    if card.get("state") == "resolved":
        by = card.get("resolved_by")
        return f":white_check_mark: Resolved{f' by {mention(str(by))}' if by else ''}"
    if card.get("acked_by"):
        at = card.get("acked_at")
        when = f" at {clock_time(at)}" if isinstance(at, int | float) else ""
        return f":eyes: Acknowledged by {mention(str(card['acked_by']))}{when}"
    until = card.get("until")
    if isinstance(until, int | float) and until > now:
        return f":zzz: Snoozed until {clock_time(until)}"
    return ":red_circle: Open"


def mention(who: str) -> str:
    """How Slack shows who acted: a Slack user recorded as "<@U123> (ada)" is the mention
    alone (Slack shows the name); anyone else (a link, the API's key) as recorded."""
    head = who.split(" ", 1)[0]
    return head if head.startswith("<@") and head.endswith(">") else who


def live_buttons(card: Mapping[str, Any]) -> list[str]:
    """The buttons a card shows: none once resolved; no Ack or Snooze once acked."""
    if card.get("state") == "resolved":
        return []
    chosen = list(card.get("buttons") or [])
    if card.get("acked_by"):
        return [b for b in chosen if b == "resolve"]
    return chosen


def render(
    card: Mapping[str, Any],
    *,
    tokens: Mapping[str, str],
    link: str | None = None,
    now: float | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """The message's fallback text and blocks. tokens: each button's signed action token
    (a button without one is left out); link: the alert's admin page, as an Open button."""
    title = str(card.get("title") or card.get("alert") or "alert")
    said = status(card, now)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(title, HEADER_MAX)}},
    ]
    if card.get("body"):
        blocks.append(_section(str(card["body"])))
    fields = [
        ("Alert", f"`{card.get('alert')}`"),
        ("Episode", f"#{card.get('episode')}"),
        ("Rule", str(card.get("rule") or "-")),
    ]
    blocks.append(
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{_cut(v, 500)}"} for k, v in fields],
        }
    )
    context = [said, *([str(card["note"])] if card.get("note") else [])]
    blocks.append({"type": "context", "elements": [_mrkdwn(line) for line in context]})
    elements = [_button(b, tokens[b]) for b in live_buttons(card) if b in tokens]
    if link and card.get("state") != "resolved":
        elements.append({"type": "button", "action_id": OPEN, "text": _plain("Open"), "url": link})
    if elements:
        blocks.append({"type": "actions", "block_id": "actions", "elements": elements})
    return _cut(f"{title}: {said}", 4000), blocks


def reply(title: str, body: str) -> str:
    """A thread reply's text: one later notification of the episode, for the record."""
    return _cut(f"*{title}*\n{body}" if body else f"*{title}*", SECTION_MAX)


def plain(title: str, body: str) -> tuple[str, list[dict[str, Any]]]:
    """A message of no alert episode (a digest, a storm notice): posted as it is."""
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(title, HEADER_MAX)}}
    ]
    if body:
        blocks.append(_section(body))
    return _cut(title, 4000), blocks


def _button(action: str, token: str) -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "action_id": action,
        "text": _plain(LABELS[action]),
        "value": token,
    }
    if action == "ack":
        button["style"] = "primary"
    if action == "resolve":
        button["confirm"] = {
            "title": _plain("Resolve this alert?"),
            "text": _plain("It closes now; everyone it notified gets the resolved message."),
            "confirm": _plain("Resolve"),
            "deny": _plain("Cancel"),
        }
    return button


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(_cut(text, SECTION_MAX))}


def _mrkdwn(text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": text}


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text, "emoji": True}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
