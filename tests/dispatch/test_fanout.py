"""A subscription's filter in the fan-out: only the events its filter (a rule's match
mapping, {"in": [...]} for any of) matches make deliveries, derived ones included."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from receiver.dispatch.fanout import fan_out
from receiver.events import sample
from tests.notify.test_webhook import hook


def _events(*payloads: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(p["id"], json.dumps(p), p) for p in payloads]


def test_only_matching_events_are_delivered() -> None:
    wanted = replace(hook(1), filter={"userId": "u1", "cohort": {"in": ["beta", "gamma"]}})
    everyone = hook(2)
    found, _ = fan_out(
        [wanted, everyone],
        _events(
            sample("score.drop", id="e1", userId="u1", cohort="beta"),
            sample("score.drop", id="e2", userId="u1", cohort="alpha"),
            sample("score.drop", id="e3", userId="u2", cohort="beta"),
            sample("score.drop", id="e4", userId="u1", cohort="gamma"),
            sample("score.drop", id="e5", userId="u1"),  # no cohort: no match
        ),
        {},
    )
    assert [(d.webhook.id, d.event_id) for d in found if d.webhook.id == 1] == [
        (1, "e1"),
        (1, "e4"),
    ]
    assert len([d for d in found if d.webhook.id == 2]) == 5


def test_a_filter_with_a_threshold_moves_sides_only_on_matching_events() -> None:
    wanted = replace(hook(1), threshold=50, filter={"userId": "~^u1$", "score": {"lt": 100}})
    found, sides = fan_out(
        [wanted],
        _events(
            sample("score.drop", id="e1", userId="u2", score=10, sessionId="s"),
            sample("score.drop", id="e2", userId="u1", score=10, sessionId="s"),
        ),
        {},
    )
    assert [d.event_id for d in found] == ["e2"]
    assert list(sides) == [(1, "s")]
