"""The Slack app's message of one alert episode (receiver.notify.slack.blocks): its text, and
the buttons each state keeps, each carrying its action token."""

from __future__ import annotations

from receiver.notify.slack import blocks

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
